"""Run every benchmark in bench/ against fresh embedded services and combine their results.

Each benchmark prints one JSON object as its last stdout line. This prints one
combined JSON object (last line) and writes a markdown table of each figure
next to its same-run baseline and goal to ``<data dir>/bench-results.md``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("DUCTOR_BENCH_DATA_DIR", ROOT / ".ductor" / "bench"))

Check = Callable[[dict[str, Any]], bool] | None

# benchmark -> [(figure, same-run baseline figure or None, goal text, check)]. Each figure is measured
# by one benchmark only: the fair queue's core by dispatch_core, the end-to-end figures by dispatch.
GOALS: dict[str, list[tuple[str, str | None, str, Check]]] = {
    "admission": [
        ("deliveries_per_item", "baseline_deliveries_per_item", "== 1.0",
         lambda r: r["deliveries_per_item"] == 1.0),
        ("suspended_deliveries", None, "== 0", lambda r: r["suspended_deliveries"] == 0),
        ("reactivated_first_step_ms", None, "", None),
    ],
    "reshard": [
        ("pause_ms.median", None, "", None),
        ("move_ms.median", None, "", None),
    ],
    "capacity": [
        ("acquire_release_per_s", "baseline_incr_decr_per_s", "ratio >= 0.5", lambda r: r["ratio"] >= 0.5),
        ("gcra_checks_per_s", "baseline_incr_decr_per_s", "", None),
    ],
    "routing": [
        ("warm_decisions_per_s", "cold_decisions_per_s", "", None),
        ("warm_db_queries_per_decision", None, "== 0", lambda r: r["warm_db_queries_per_decision"] == 0),
    ],
    "dispatch_core": [
        ("cycles_per_s", "baseline_lpush_rpop_per_s", "", None),
        ("dequeue_cost_ratio_100k_vs_10", None, "<= 1.5",
         lambda r: r["dequeue_cost_ratio_100k_vs_10"] <= 1.5),
    ],
    "fairness": [
        ("ductor.worst_share_per_weight", "celery_baseline.worst_share_per_weight", ">= 0.95",
         lambda r: r["ductor"]["worst_share_per_weight"] >= 0.95),
        ("ductor.jain", "celery_baseline.jain", ">= 0.99", lambda r: r["ductor"]["jain"] >= 0.99),
        ("ductor.trickle_wait_p99", "celery_baseline.trickle_wait_p99", "<= 2 x ductor.active_tenants",
         lambda r: r["ductor"]["trickle_wait_p99"] <= 2 * r["ductor"]["active_tenants"]),
        ("ductor.trickle_wait_p50", "celery_baseline.trickle_wait_p50", "", None),
        ("ductor.trickle_wait_max", "celery_baseline.trickle_wait_max", "", None),
    ],
    "dispatch": [
        ("e2e_tasks_per_s", "baseline_celery_tasks_per_s", "e2e_ratio >= 0.8", lambda r: r["e2e_ratio"] >= 0.8),
        ("without_handoff.e2e_tasks_per_s", "without_handoff.baseline_celery_tasks_per_s", "", None),
    ],
    "scale": [
        ("cluster_tasks_per_s", "single_tasks_per_s", "cluster_vs_single_ratio >= 0.9",
         lambda r: r["cluster_vs_single_ratio"] >= 0.9),
        ("crossslot_errors", None, "== 0", lambda r: r["crossslot_errors"] == 0),
        ("redis_cpu_us_per_item.cluster", "redis_cpu_us_per_item.single", "", None),
    ],
    "workflows": [
        ("steps_per_s_10node", "baseline_celery_tasks_per_s", "step_ratio >= 0.5", lambda r: r["step_ratio"] >= 0.5),
        ("runs_per_s_1node", "baseline_celery_tasks_per_s", "run_ratio >= 0.3", lambda r: r["run_ratio"] >= 0.3),
        ("steps_per_s_10node", "stock_celery.tasks_per_s", "", None),
        ("runs_per_s_1node", "stock_celery.tasks_per_s", "", None),
        ("start_latency_ms_p50", None, "<= 15 (idle system)", lambda r: r["start_latency_ms_p50"] <= 15),
        ("start_latency_ms_p99", None, "<= 40", lambda r: r["start_latency_ms_p99"] <= 40),
        ("pg_roundtrips_per_step", None, "", None),
        ("redis_roundtrips_per_step", None, "", None),
    ],
    "step_cost": [
        ("cpu_ms_per_step", None, "", None),
        ("cpu_ms_per_start", None, "", None),
    ],
    "row_security": [
        ("ratio", None, ">= 0.9", lambda r: r["ratio"] >= 0.9),
        ("runs_per_s_with", "runs_per_s_without", "", None),
        ("runs_per_s_1node_with", "runs_per_s_1node_without", "", None),
        ("cpu_ratio", None, "", None),
    ],
    "tasks": [
        ("task_steps_per_s", "baseline_send_task_per_s", "ratio >= 0.3", lambda r: r["ratio"] >= 0.3),
        ("worst_share_per_weight", None, ">= 0.95", lambda r: r["worst_share_per_weight"] >= 0.95),
    ],
    "triggers": [
        ("event_to_step_ms_p50", None, "<= 50", lambda r: r["event_to_step_ms_p50"] <= 50),
        ("event_to_step_ms_p99", None, "", None),
        ("schedule_fire_lag_ms_p99", None, "<= 1000", lambda r: r["schedule_fire_lag_ms_p99"] <= 1000),
        ("schedule_duplicates", None, "== 0", lambda r: r["schedule_duplicates"] == 0),
        ("schedule_lost", None, "== 0", lambda r: r["schedule_lost"] == 0),
        ("schedule_fire_lag_ms_p50", None, "", None),
    ],
    "retention": [
        ("step_start_latency_ms_p99_during", "step_start_latency_ms_p99_baseline", "p99_growth <= 1.2",
         lambda r: r["p99_growth"] <= 1.2),
        ("active_runs_touched", None, "== 0", lambda r: r["active_runs_touched"] == 0),
        ("old_runs_left", None, "== 0", lambda r: r["old_runs_left"] == 0),
        ("runs_per_s", None, "", None),
        ("longest_delete_transaction_ms", None, "", None),
    ],
    "recovery": [
        ("recovery_s", "baseline_s", "<= 20 (idle machine)", lambda r: r["recovery_s"] <= 20),
        ("noticed_s", None, "", None),
    ],
}


def _run(script: Path, env: dict[str, str]) -> dict[str, Any]:
    print(f"==> {script.name}", file=sys.stderr, flush=True)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, check=False
    )
    lines = [line for line in proc.stdout.strip().splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}"}
    result = json.loads(lines[-1])
    print(f"    done in {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    return dict(result)


def _lookup(result: dict[str, Any], figure: str) -> Any:
    """A figure of a result; a dotted name reaches into a nested object (``ductor.jain``)."""
    value: Any = result
    for part in figure.split("."):
        value = value.get(part, "n/a") if isinstance(value, dict) else "n/a"
    return value


def _table(results: dict[str, dict[str, Any]]) -> str:
    rows = ["| benchmark | figure | value | same-run baseline | goal | met |", "|---|---|---|---|---|---|"]
    for name, result in results.items():
        for figure, baseline, goal, check in GOALS.get(name, []):
            value = _lookup(result, figure)
            base = f"{baseline} = {_lookup(result, baseline)}" if baseline else ""
            met = ""
            if check is not None:
                try:
                    met = "yes" if check(result) else "no"
                except (KeyError, TypeError):
                    met = "n/a"
            rows.append(f"| {name} | {figure} | {value} | {base} | {goal} | {met} |")
    return "\n".join(rows) + "\n"


def main() -> int:
    from ductor_project import embedded

    embedded.destroy(DATA_DIR)
    env = dict(os.environ, DUCTOR_DATA_DIR=str(DATA_DIR))
    for name in ("DATABASE_URL", "DATABASE_OWNER_URL", "REDIS_URL", "DUCTOR_QUEUE_REDIS_URL", "CACHE_REDIS_URL",
                 "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):  # the benchmarks' own embedded servers
        env.pop(name, None)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    results: dict[str, dict[str, Any]] = {}
    try:
        for script in sorted((ROOT / "bench").glob("*.py")):
            if script.name in ("run_all.py", "__init__.py") or script.name.startswith("_"):
                continue
            results[script.stem] = _run(script, env)
    finally:
        embedded.stop(DATA_DIR)
    table = _table(results)
    (DATA_DIR / "bench-results.md").write_text(table)
    print(table, file=sys.stderr)
    print(f"table written to {DATA_DIR / 'bench-results.md'}", file=sys.stderr)
    print(json.dumps(results))
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
