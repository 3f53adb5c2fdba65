"""Task nodes end to end: the team's own Celery tasks as steps, against plain send_task.

On the embedded services of ``DUCTOR_DATA_DIR`` (it FLUSHES that Redis and ends the
runs left unfinished there: ``flush_state``): Ductor's processes as ``manage.py up`` starts
them (one worker of steps, of concurrency ``CONCURRENCY``, and ``RESULTS_WORKERS`` results
workers, one per core: the outcomes are recorded there), one dispatcher and the coordinator;
and the team's own Celery worker (``bench/_team_tasks.py``: its own app, no Django, queue
``team``) of concurrency ``CONCURRENCY``; all children of ``ductor_project.stack.Stack``.

1. **Throughput.** ``RUNS`` runs of a ``CHAIN``-step chain of ``team.noop`` task nodes,
   at most ``OUTSTANDING`` unfinished at a time: ``task_steps_per_s`` is the task steps
   completed (published by the dispatcher, run by the team's worker, their outcome
   recorded by a results worker and the run ticked) per second, from the first start until
   every run succeeded. The same-run baseline, ``baseline_send_task_per_s``, is
   ``BASELINE_TASKS`` plain ``send_task`` calls of the same task on the same team
   worker, timed until each has run. ``ratio`` = the first over the second (goal >= 0.3).
2. **One chain alone.** ``LATENCY_RUNS`` runs of the same chain, one at a time: of each
   step, ``step_ms`` from its publish to its outcome's record (the team's worker's message
   and the callback's), and ``between_steps_ms`` from one step's outcome to the next
   step's publish (the tick, and the publish by the results worker that kept the outcome),
   by the steps' own timestamps; ``task_chain_latency`` has their p50 and p99.
3. **Fair where the work starts.** Three tenants of weights 1, 2 and 4 each start
   ``FAIR_RUNS`` one-node runs of ``team.record`` (``FAIR_MS`` ms) on the team queue
   ``team-fair``, whose slots are shared (``DUCTOR_TASK_QUEUE_SLOTS=team-fair=CONCURRENCY``;
   the throughput phase's queue ``team`` is bounded by the tenant's plan only), before the
   team's worker is up: all three are backlogged from its first task. The worker logs
   which tenant each task started for; over starts ``FAIR_SKIP`` to
   ``FAIR_SKIP + FAIR_WINDOW`` (every tenant still backlogged), each tenant's share of
   the starts over its weight's share: ``worst_share_per_weight`` is the smallest (goal
   >= 0.95; 1.0 is exact).

Needs its own data dir: ``DUCTOR_DATA_DIR=.ductor/bench-t .venv/bin/python bench/tasks.py``.
Progress on stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    bench_stack,
    coordinator_passed,
    flush_state,
    log,
    percentile,
    redis_client,
    setup_django,
    wait_until,
)
from bench._costs import Costs
from bench.workflows import runs_per_s
from ductor_project.management.commands.up import start_workers
from ductor_project.stack import Child, Stack

CONCURRENCY = 2
RESULTS_WORKERS = os.cpu_count() or 1
CHAIN, RUNS, OUTSTANDING = 10, 200, 8  # 2,000 task steps: a steady state, not the ramp and the tail
LATENCY_RUNS = 20  # 200 steps of one chain at a time
BASELINE_TASKS = 3000  # a few seconds too, as the phase it is compared with
# 280 starts: the weight-1 tenant's share is 40 of them, so that a start more or less at the
# window's edges moves its figure by 2.5% (by 5% with 140, which made 0.95 a coin's toss).
FAIR_RUNS, FAIR_MS, FAIR_SKIP, FAIR_WINDOW = 300, 20, 10, 280
WEIGHTS = (1, 2, 4)
TEAM_QUEUE, FAIR_QUEUE = "team", "team-fair"
SLOTS = f"{FAIR_QUEUE}={CONCURRENCY}"
COUNT_KEY, STARTS_KEY = "bench:team:count", "bench:team:starts"
DONE_TIMEOUT_S = 120.0
POLL_S = 0.05



def team_env() -> dict[str, str]:
    from django.conf import settings

    from bench._common import child_env

    env = {k: v for k, v in child_env().items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(TEAM_BROKER_URL=settings.CELERY_BROKER_URL, TEAM_RESULT_BACKEND=settings.CELERY_RESULT_BACKEND,
               BENCH_COUNT_KEY=COUNT_KEY, BENCH_STARTS_KEY=STARTS_KEY)
    return env


def team_worker(stack: Stack, name: str) -> Child:
    return stack.worker(name, app="bench._team_tasks", concurrency=CONCURRENCY, hostname=f"{name}@bench",
                        env=team_env(),
                        extra=["-Q", f"{TEAM_QUEUE},{FAIR_QUEUE}", "--pool", "prefork", "--without-heartbeat"])


def tenant(weight: int, spec: dict[str, Any]) -> Any:
    from ductor_project.core.context import tenant_context
    from tenants import services
    from workflows.services import workflow_put

    created = services.tenant_create(slug=f"bench-t-{uuid.uuid4().hex[:8]}", plan="enterprise")
    services.override_set(tenant=created, field="weight", value=weight)
    with tenant_context(created):
        workflow_put(name="w", spec=spec)
    return created


def throughput(stack: Stack) -> dict[str, Any]:
    """Task steps completed per second: chains of team.noop, a fixed number outstanding (the
    workflow benchmark's ``runs_per_s``, counted in steps)."""
    chain = [{"id": f"n{i}", "type": "task", "task": "team.noop", "depends_on": [f"n{i - 1}"] if i else []}
             for i in range(CHAIN)]
    runs = runs_per_s(tenant(1, {"nodes": chain}), "w", RUNS, OUTSTANDING, steps_per_run=CHAIN)
    return {"task_steps_per_s": round(runs["runs_per_s"] * CHAIN, 1), "steps": runs["completed"] * CHAIN,
            "seconds": runs["seconds"], "costs": runs["costs"]}


def chain_latency() -> dict[str, Any]:
    """One chain at a time: each task step's time from its publish to its outcome, and the time
    between one step's outcome and the next step's publish (p50 and p99, ms)."""
    from ductor_project.core.context import tenant_context
    from workflows.models import StepRun

    chain = [{"id": f"n{i}", "type": "task", "task": "team.noop", "depends_on": [f"n{i - 1}"] if i else []}
             for i in range(CHAIN)]
    owner = tenant(1, {"nodes": chain})
    runs_per_s(owner, "w", LATENCY_RUNS, 1, steps_per_run=CHAIN)
    steps: list[float] = []
    between: list[float] = []
    with tenant_context(owner):
        rows = StepRun.objects.filter(status="succeeded")
        by_run: dict[Any, list[Any]] = {}
        for row in rows.values("run_id", "node_id", "started_at", "finished_at"):
            by_run.setdefault(row["run_id"], []).append(row)
    for run in by_run.values():
        run.sort(key=lambda row: int(row["node_id"][1:]))
        steps += [(row["finished_at"] - row["started_at"]).total_seconds() * 1000 for row in run]
        between += [(after["started_at"] - before["finished_at"]).total_seconds() * 1000
                    for before, after in pairwise(run)]
    if not steps:
        raise SystemExit("no task step of the one-chain phase succeeded")
    return {"step_ms_p50": round(percentile(steps, 50), 1), "step_ms_p99": round(percentile(steps, 99), 1),
            "between_steps_ms_p50": round(percentile(between, 50), 1),
            "between_steps_ms_p99": round(percentile(between, 99), 1), "runs": len(by_run), "steps": len(steps)}


def baseline() -> tuple[float, dict[str, Any]]:
    """Plain send_task of team.noop on the same team worker: tasks run per second, and what a task
    cost each kind of process (the benchmark's own is the publisher's)."""
    from ductor_project.celery import app  # the same broker the team's worker consumes

    redis = redis_client()
    redis.delete(COUNT_KEY)
    costs = Costs.start()
    began = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for _ in range(BASELINE_TASKS):
            app.send_task("team.noop", queue=TEAM_QUEUE, producer=producer)
    wait_until(lambda: int(redis.get(COUNT_KEY) or 0) >= BASELINE_TASKS, what="the plain tasks")
    return BASELINE_TASKS / (time.perf_counter() - began), costs.per(BASELINE_TASKS)


def fairness(stack: Stack) -> dict[str, Any]:
    """Shares of the team worker's task starts, per weight, of three backlogged tenants."""
    from ductor_project.core.context import tenant_context
    from workflows.services import run_start

    redis = redis_client()
    redis.delete(STARTS_KEY)
    tenants = []
    for weight in WEIGHTS:
        slug_spec = {"nodes": [{"id": "r", "type": "task", "task": "team.record",
                                "input": {"slug": "$input.slug", "ms": FAIR_MS}}]}
        tenants.append((tenant(weight, slug_spec), weight))
    for _ in range(FAIR_RUNS):  # interleaved: no tenant's backlog starts first
        for owner, _weight in tenants:
            with tenant_context(owner):
                run_start(workflow="w", input={"slug": owner.slug})
    log("backlogs queued; starting the team's worker")
    worker = team_worker(stack, "team-fair")
    stack.wait_ready(worker)
    wait_until(lambda: redis.llen(STARTS_KEY) >= FAIR_SKIP + FAIR_WINDOW, what="the fair window's starts")
    window = [s.decode() for s in redis.lrange(STARTS_KEY, FAIR_SKIP, FAIR_SKIP + FAIR_WINDOW - 1)]
    counts = Counter(window)
    total_weight = sum(WEIGHTS)
    shares = {owner.slug: (counts[owner.slug] / len(window)) / (weight / total_weight) for owner, weight in tenants}
    stack.stop(worker)
    for owner, _weight in tenants:
        cancel_active(owner)
    return {"worst_share_per_weight": round(min(shares.values()), 3),
            "starts": {str(w): counts[o.slug] for o, w in tenants}, "window": len(window)}


def cancel_active(owner: Any) -> None:
    """Cancel the tenant's unfinished runs and wait for them to end (a later phase, or a later run
    of the benchmark on this data dir, must not find them)."""
    from ductor_project.core.context import tenant_context
    from workflows.models import WorkflowRun
    from workflows.services import run_cancel

    with tenant_context(owner):
        for run in WorkflowRun.objects.exclude(status__in=WorkflowRun.TERMINAL):
            run_cancel(run=run)
        wait_until(lambda: not WorkflowRun.objects.exclude(status__in=WorkflowRun.TERMINAL).exists(),
                   what="the cancellations")


def catalog() -> None:
    from workflows.models import TaskCatalogEntry

    TaskCatalogEntry.objects.update_or_create(name="team.noop", defaults={"queue": TEAM_QUEUE})
    TaskCatalogEntry.objects.update_or_create(name="team.record", defaults={"queue": FAIR_QUEUE})


def main() -> int:
    os.environ["DUCTOR_TASK_QUEUE_SLOTS"] = SLOTS
    setup_django("bench/tasks.py")
    began = time.monotonic()
    flush_state()
    catalog()
    stack = bench_stack("tasks", DUCTOR_TASK_QUEUE_SLOTS=SLOTS)
    try:
        workers = start_workers(stack, workers=1, concurrency=CONCURRENCY, results_workers=RESULTS_WORKERS)
        dispatcher = stack.dispatcher("dispatcher-0")
        stack.coordinator("coordinator-0")
        team = team_worker(stack, "team-0")
        stack.wait_ready(*workers, dispatcher, team)
        coordinator_passed()
        log(f"up in {time.monotonic() - began:.1f}s; task chains")
        steps = throughput(stack)
        log(f"task steps: {json.dumps(steps)}")
        latency = chain_latency()
        log(f"one chain alone: {json.dumps(latency)}")
        plain, plain_costs = baseline()
        log(f"plain send_task: {plain:.0f} tasks/s, {json.dumps(plain_costs)}")
        stack.stop(team)
        fair = fairness(stack)
        log(f"fairness at task start: {json.dumps(fair)}")
    finally:
        stack.stop_all()
    load = os.getloadavg()
    log(f"done in {time.monotonic() - began:.0f}s (load average {load[0]:.1f})")
    print(json.dumps({
        "task_steps_per_s": steps["task_steps_per_s"],
        "baseline_send_task_per_s": round(plain, 1),
        "ratio": round(steps["task_steps_per_s"] / plain, 3),
        "worst_share_per_weight": fair["worst_share_per_weight"],
        "fairness": fair,
        "throughput": steps,
        "task_chain_latency": latency,
        "baseline_costs_per_task": plain_costs,
        "config": {"concurrency": CONCURRENCY, "results_workers": RESULTS_WORKERS, "chain": CHAIN, "runs": RUNS,
                   "outstanding": OUTSTANDING,
                   "latency_runs": LATENCY_RUNS,
                   "baseline_tasks": BASELINE_TASKS, "weights": list(WEIGHTS), "fair_task_ms": FAIR_MS,
                   "load_average_1m": round(load[0], 2), "cpus": os.cpu_count()},
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
