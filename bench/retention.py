"""History retention at scale: a million old runs deleted while a workload runs.

On the embedded services of ``DUCTOR_DATA_DIR`` (it FLUSHES that Redis, ends the runs left
unfinished there, and EMPTIES its run tables: runs, steps, events, signals, waits, deliveries),
with one ``celery -A ductor_project worker`` (concurrency ``CONCURRENCY``), one
``manage.py run_dispatcher`` and one ``manage.py run_coordinator`` (reconciling and
housekeeping on every pass, or every ``--reconcile-every`` seconds), all children of ``ductor_project.stack.Stack``:

1. **History.** ``--runs`` (default 1,000,000) finished runs, spread over ``TENANTS`` tenants,
   written by the tables' owner with one ``INSERT ... SELECT generate_series`` per table and
   tenant: of every ten runs, five lone roots and one tree of a root and four children; each run
   with one step and two events; ended between 120 and 35 days ago; one run in a thousand tagged
   ``audit``, one in a hundred of the fairness key ``acme``. Then ``VACUUM ANALYZE``.
2. **Active runs.** ``ACTIVE_RUNS`` runs of a one-node workflow that sleeps an hour, started
   through ``run_start``, created (on paper) 200 days ago; half of them are children of a root
   that ended 200 days ago, so their tree is old but must stay. Every one of them, its steps and
   its history are noted.
3. **Plans** (``--explain``): ``EXPLAIN (ANALYZE, BUFFERS)`` of the hot queries on that history,
   as the app's role under row-level security: the run list of a tenant (newest first, one page;
   all, one status, one tag, one fairness key), the run detail (the run, its first steps), the
   reconciler's pass (``stale_run_ids``) and retention's batch (``expired_roots``, from the oldest
   and from a cursor; the trees that ended). First without the indexes of ``workflows`` 0008 and
   after (migrated back), then with them (migrated forward, built concurrently on the million
   rows: 0008's build timed).
4. **Baseline.** A steady workload: ``RATE_PER_S`` runs a second of a two-step chain (noop),
   started through ``workflows.services.run_start`` in one of the tenants, for ``WINDOW_S``
   seconds; every tenant keeps its history ten years, so the coordinator deletes nothing. The
   step start latency is each step's ``started_at`` (the worker, right before its action) minus
   its ``created_at`` (when the tick made it due); p50, p99 over the window's steps.
5. **During.** The same workload, with every tenant's ``history_retention_days`` set to
   ``RETENTION_DAYS``: the coordinator deletes the history, batch after batch, until none of it
   is left (or ``--delete-budget`` seconds). Its per-batch log gives each delete transaction's length;
   ``pg_stat_activity``, sampled every second, the backends waiting on a lock.
6. **Checks.** The history left (0 expected), and each active run compared with its note: any
   run, step or event count changed or gone counts in ``active_runs_touched`` (0 expected).

Needs its own data dir: ``DUCTOR_DATA_DIR=.ductor/bench-retention .venv/bin/python
bench/retention.py [--runs N] [--explain]``. Progress on stderr; the last stdout line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_stack, bench_worker, flush_state, log, percentile, setup_django, wait_until
from ductor_project.stack import Stack

RUNS = 1_000_000
TENANTS = 4
CONCURRENCY = 2
ACTIVE_RUNS = 40
RETENTION_DAYS = 30
KEEP_DAYS = 3650  # the baseline's retention: nothing is old enough
RATE_PER_S = 8.0
WINDOW_S = 120.0
DELETE_BUDGET_S = 1500.0
DONE_TIMEOUT_S = 60.0
GOAL_GROWTH = 1.2  # p99 step start latency during retention over the baseline's
# By default the coordinator reconciles and housekeeps on every pass (a pass every 0.2 s), not
# every 10 s: retention works as fast as its rests let it, the worst case for the workload.
# ``--reconcile-every 10`` runs it as in production.
PASS_INTERVAL_S = 0.2
RECONCILE_EVERY_S = 0.0
HISTORY_TABLES = ("workflows_webhookdelivery", "workflows_eventwait", "workflows_runsignal", "workflows_runevent",
                  "workflows_steprun", "workflows_workflowrun")
CHAIN = {"nodes": [{"id": "a", "type": "action", "action": "noop"},
                   {"id": "b", "type": "action", "action": "noop", "depends_on": ["a"]}]}
NAP = {"nodes": [{"id": "nap", "type": "sleep", "duration_s": 3600}]}
INDEXES_MIGRATION = ("workflows", "0008_run_list_and_reconcile_indexes")
BEFORE_INDEXES = ("workflows", "0007_run_fairness_key")


def owner_connection() -> Any:
    """A connection as the tables' owner (not bound by row-level security), autocommit."""
    import psycopg
    from django.conf import settings

    return psycopg.connect(settings.DATABASE_OWNER_URL or settings.DATABASE_URL, autocommit=True)


def make_tenants() -> list[Any]:
    from ductor_project.core.context import tenant_context
    from tenants import services
    from workflows.services import workflow_put

    tenants = []
    tag = uuid.uuid4().hex[:6]
    for n in range(TENANTS):
        tenant = services.tenant_create(slug=f"bench-ret-{tag}-{n}", plan="enterprise")
        services.override_set(tenant=tenant, field="history_retention_days", value=KEEP_DAYS)
        with tenant_context(tenant):
            workflow_put(name="chain", spec=CHAIN)
            workflow_put(name="nap", spec=NAP)
        tenants.append(tenant)
    return tenants


# One statement per table and tenant. Run n of a tenant: n % 10 < 5 a lone root, 5 the root of a
# tree, 6..9 its children. Ids are md5s of the tenant and n, so children name their root.
RUN_ID = "md5(%(seed)s || ':r:' || {n})::uuid"
LOAD_RUNS = f"""
INSERT INTO workflows_workflowrun (tenant_id, id, workflow_id, workflow_name, status, input, output, error,
    idempotency_key, tier, tags, parent_run_id, parent_node_id, root_run_id, nesting_depth, continued_from_id,
    rerun_of_id, cancel_requested, fairness_key, lock_version, created_at, started_at, finished_at, updated_at)
SELECT %(tenant)s, {RUN_ID.format(n="n")}, %(version)s, 'chain',
    CASE WHEN n %% 13 = 0 THEN 'failed' ELSE 'succeeded' END,
    '{{}}', '{{"ok": true}}', NULL, NULL, 'standard',
    CASE WHEN n %% 1000 = 7 THEN '["audit"]' ELSE '[]' END::jsonb,
    CASE WHEN n %% 10 > 5 THEN {RUN_ID.format(n="(n - n %% 10 + 5)")} END,
    CASE WHEN n %% 10 > 5 THEN 'child' ELSE '' END,
    CASE WHEN n %% 10 > 5 THEN {RUN_ID.format(n="(n - n %% 10 + 5)")} ELSE {RUN_ID.format(n="n")} END,
    (n %% 10 > 5)::int, NULL, NULL, false, CASE WHEN n %% 100 = 7 THEN 'acme' ELSE '' END, 3,
    at, at + interval '100 ms', at + interval '2 s', at + interval '2 s'
FROM generate_series(0, %(count)s - 1) AS n,
     LATERAL (SELECT %(first)s::timestamptz + n * %(gap)s::interval AS at) AS t
"""  # noqa: S608 (the ids' expression, not input)
LOAD_STEPS = f"""
INSERT INTO workflows_steprun (tenant_id, id, run_id, node_id, node_type, attempt, status, input, output, error,
    routing, child_run_id, created_at, scheduled_for, started_at, finished_at)
SELECT %(tenant)s, md5(%(seed)s || ':s:' || n)::uuid, {RUN_ID.format(n="n")}, 'a', 'action', 1, 'succeeded',
    '{{}}', '{{"ok": true}}', NULL, NULL, NULL, at, NULL, at + interval '200 ms', at + interval '1 s'
FROM generate_series(0, %(count)s - 1) AS n,
     LATERAL (SELECT %(first)s::timestamptz + n * %(gap)s::interval AS at) AS t
"""  # noqa: S608 (the ids' expression, not input)
LOAD_EVENTS = f"""
INSERT INTO workflows_runevent (tenant_id, run_id, seq, type, node_id, data, created_at)
SELECT %(tenant)s, {RUN_ID.format(n="n")}, seq, CASE seq WHEN 1 THEN 'started' ELSE 'succeeded' END, '', '{{}}',
    %(first)s::timestamptz + n * %(gap)s::interval + seq * interval '1 s'
FROM generate_series(0, %(count)s - 1) AS n, generate_series(1, 2) AS seq
"""  # noqa: S608 (the ids' expression, not input)


def load_history(owner: Any, tenants: list[Any], runs: int) -> float:
    """Empty the run tables, write ``runs`` finished runs (see the module docs); returns seconds."""
    from ductor_project.core.context import tenant_context
    from workflows.models import WorkflowVersion

    started = time.perf_counter()
    owner.execute(f"TRUNCATE {', '.join(HISTORY_TABLES)} CASCADE")
    now = datetime.now().astimezone()
    first, span = now - timedelta(days=120), timedelta(days=85)
    for index, tenant in enumerate(tenants):
        count = runs // len(tenants) + (runs % len(tenants) if index == len(tenants) - 1 else 0)
        with tenant_context(tenant):
            version = WorkflowVersion.objects.get(definition__name="chain").pk
        params = {"tenant": tenant.pk, "seed": str(tenant.pk), "version": version, "count": count,
                  "first": first, "gap": span / max(count, 1)}
        for what, statement in (("runs", LOAD_RUNS), ("steps", LOAD_STEPS), ("events", LOAD_EVENTS)):
            began = time.perf_counter()
            with owner.transaction():
                owner.execute(statement, params)
            log(f"tenant {index}: {count} {what} in {time.perf_counter() - began:.1f}s")
    began = time.perf_counter()
    for table in HISTORY_TABLES[-3:]:
        owner.execute(f"VACUUM ANALYZE {table}")
    log(f"vacuum analyze in {time.perf_counter() - began:.1f}s")
    return time.perf_counter() - started


def start_active_runs(tenants: list[Any]) -> list[Any]:
    """``ACTIVE_RUNS`` sleeping runs, dated 200 days back, half of them children of an old ended
    root; returns the ids of every run of their trees."""
    from django.utils import timezone

    from ductor_project.core.context import tenant_context
    from workflows.models import WorkflowRun
    from workflows.services import run_start

    long_ago = timezone.now() - timedelta(days=200)
    ids = []
    for n in range(ACTIVE_RUNS):
        tenant = tenants[n % len(tenants)]
        with tenant_context(tenant):
            run, _ = run_start(workflow="nap")
            ids.append(run.pk)
            if n % 2:
                root = WorkflowRun.objects.create(
                    workflow=run.workflow, workflow_name="nap", status="succeeded", input={},
                    root_run_id=uuid.uuid4(), started_at=long_ago, finished_at=long_ago)
                WorkflowRun.objects.filter(pk=root.pk).update(root_run_id=root.pk, created_at=long_ago)
                WorkflowRun.objects.filter(pk=run.pk).update(parent_run=root, root_run_id=root.pk, nesting_depth=1,
                                                             parent_node_id="nap")
                ids.append(root.pk)
            WorkflowRun.objects.filter(pk=run.pk).update(created_at=long_ago)
    return ids


def note_active(ids: list[Any]) -> dict[str, Any]:
    """What must not change about the active runs: each run's status, lineage and end, each step's
    state, and how many events each has."""
    from workflows.models import RunEvent, StepRun, WorkflowRun

    runs = {str(row[0]): [str(value) for value in row[1:]] for row in WorkflowRun.all_tenants.filter(pk__in=ids)
            .values_list("pk", "status", "root_run_id", "parent_run_id", "finished_at")}
    steps = {str(row[0]): [str(value) for value in row[1:]] for row in StepRun.all_tenants.filter(run_id__in=ids)
             .values_list("pk", "run_id", "status", "attempt", "scheduled_for", "finished_at")}
    events = Counter(str(run) for run in RunEvent.all_tenants.filter(run_id__in=ids).values_list("run_id", flat=True))
    return {"runs": runs, "steps": steps, "events": dict(events)}


def touched(before: dict[str, Any], after: dict[str, Any]) -> int:
    """How many of the noted runs changed or went (a step or the event count of theirs included)."""
    changed = {run for run, row in before["runs"].items() if after["runs"].get(run) != row}
    changed |= {row[0] for step, row in before["steps"].items() if after["steps"].get(step) != row}
    changed |= {run for run, count in before["events"].items() if after["events"].get(run) != count}
    return len(changed)


def explain(query: Any, sql_params: tuple[str, list[Any]] | None = None) -> list[str]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of a queryset, or of ``sql_params``, as the app's role."""
    if sql_params is None:
        return str(query.explain(analyze=True, buffers=True)).splitlines()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql_params[0], sql_params[1])
        return [row[0] for row in cursor.fetchall()]


def hot_plans(tenant: Any) -> dict[str, list[str]]:
    """The plans of the hot queries (see the module docs), for ``tenant``'s history."""
    from django.conf import settings
    from django.utils import timezone

    from ductor_project.core.context import tenant_context
    from workflows import retention, selectors
    from workflows.engine.reconcile import RECONCILE_BATCH, stale_run_ids
    from workflows.models import WorkflowRun

    page = settings.REST_FRAMEWORK["PAGE_SIZE"] + 1  # the API's cursor pagination reads one more
    newest_first = ("-created_at", "-id")
    plans: dict[str, list[str]] = {}
    with tenant_context(tenant):
        plans["run_list"] = explain(selectors.run_list({}).order_by(*newest_first)[:page])
        plans["run_list_status"] = explain(selectors.run_list({"status": "failed"}).order_by(*newest_first)[:page])
        plans["run_list_tag"] = explain(selectors.run_list({"tag": ["audit"]}).order_by(*newest_first)[:page])
        plans["run_list_fairness_key"] = explain(
            selectors.run_list({"fairness_key": "acme"}).order_by(*newest_first)[:page])
        run = WorkflowRun.objects.filter(parent_run__isnull=False).order_by("created_at").first()
        assert run is not None
        plans["run_detail"] = explain(WorkflowRun.objects.select_related("workflow").filter(pk=run.pk))
        plans["run_detail_steps"] = explain(
            selectors.sized(selectors.run_steps(run))[:settings.DUCTOR_RUN_DETAIL_MAX_STEPS])
        cutoff = timezone.now() - timedelta(days=RETENTION_DAYS)
        plans["retention_roots"] = explain(retention.expired_roots(cutoff)[:retention.ROOTS_PER_BATCH])
        roots = list(retention.expired_roots(cutoff)[:retention.ROOTS_PER_BATCH * 100])
        middle = roots[len(roots) // 2]
        plans["retention_roots_from_cursor"] = explain(
            retention.expired_roots(cutoff, after=middle)[:retention.ROOTS_PER_BATCH])
        batch = [root for _, root in roots[-retention.ROOTS_PER_BATCH:]]
        plans["retention_ended_trees"] = explain(None, (retention.ENDED_TREES, [tenant.pk, batch, retention.ENDED,
                                                                                cutoff]))
    plans["reconciler_pass"] = explain(stale_run_ids(timezone.now() - timedelta(seconds=30))[:RECONCILE_BATCH])
    return plans


def plans_before_and_after(tenant: Any) -> dict[str, Any]:
    """The plans without the indexes of ``INDEXES_MIGRATION`` and those after it, then with them all;
    and how long the migration that builds the run list's first indexes took on this history."""
    from django.core.management import call_command

    call_command("migrate", *BEFORE_INDEXES, verbosity=0, interactive=False)
    before = hot_plans(tenant)
    began = time.perf_counter()
    call_command("migrate", *INDEXES_MIGRATION, verbosity=0, interactive=False)
    built = time.perf_counter() - began
    log(f"the indexes built concurrently in {built:.1f}s")
    call_command("migrate", "workflows", verbosity=0, interactive=False)  # and those after it: the code's schema
    with owner_connection() as owner:  # as autovacuum would after the builds: a partial index's statistics
        owner.execute("ANALYZE workflows_workflowrun")
    return {"before": before, "after": hot_plans(tenant), "index_build_s": round(built, 1)}


class LockWatch:
    """Samples ``pg_stat_activity`` every second on its own connection: the most backends seen
    waiting on a lock at once, and the longest such wait seen."""

    def __init__(self) -> None:
        self.most_waiting = 0
        self.longest_wait_ms = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        with owner_connection() as conn:
            while not self._stop.wait(1.0):
                waiting, longest = conn.execute(
                    "SELECT count(*), coalesce(max(extract(epoch FROM now() - state_change)) * 1000, 0) "
                    "FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
                ).fetchone()
                self.most_waiting = max(self.most_waiting, int(waiting))
                self.longest_wait_ms = max(self.longest_wait_ms, float(longest))

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        return {"most_backends_waiting_on_a_lock": self.most_waiting,
                "longest_lock_wait_seen_ms": round(self.longest_wait_ms, 1)}


class ExpiredLog:
    """The coordinator's ``runs_expired`` lines, read as they come: runs deleted, batches, the
    longest batch's transaction."""

    RUNS = re.compile(r"\bruns\W+(\d+)")
    BATCH_MS = re.compile(r"\bbatch_ms\W+([\d.]+)")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.runs = self.batches = 0
        self.batch_ms: list[float] = []

    def read(self) -> int:
        with self.path.open("rb") as lines:
            lines.seek(self.offset)
            chunk = lines.read()
        complete = chunk.rfind(b"\n") + 1
        self.offset += complete
        for line in chunk[:complete].decode(errors="replace").splitlines():
            runs, batch_ms = self.RUNS.search(line), self.BATCH_MS.search(line)
            if "runs_expired" in line and runs and batch_ms:
                self.runs += int(runs[1])
                self.batches += 1
                self.batch_ms.append(float(batch_ms[1]))
        return self.runs


def window(tenant: Any, seconds: float, until: Any = None) -> tuple[list[Any], float]:
    """Start ``RATE_PER_S`` runs a second of the chain for ``seconds`` (or until ``until()`` is
    true, checked every second, within ``seconds``); returns their ids and the window's length."""
    from ductor_project.core.context import tenant_context
    from workflows.services import run_start

    ids = []
    began = time.monotonic()
    next_check = began + 1.0
    with tenant_context(tenant):
        while (now := time.monotonic()) - began < seconds:
            if until is not None and now >= next_check:
                next_check = now + 1.0
                if until():
                    break
            due = began + len(ids) / RATE_PER_S
            if due > now:
                time.sleep(due - now)
            ids.append(run_start(workflow="chain")[0].pk)
    return ids, time.monotonic() - began


def step_latencies(tenant: Any, ids: list[Any]) -> dict[str, Any]:
    """Once the window's runs ended: each step's start latency (due -> started), p50/p99/max."""
    from ductor_project.core.context import tenant_context
    from workflows.models import StepRun, WorkflowRun

    with tenant_context(tenant):
        runs = WorkflowRun.objects.filter(pk__in=ids)
        wait_until(lambda: not runs.exclude(status__in=WorkflowRun.TERMINAL).exists(), what="the window's runs",
                   timeout=DONE_TIMEOUT_S, every=0.5)
        failed = runs.exclude(status="succeeded").count()
        rows = StepRun.objects.filter(run_id__in=ids).values_list("created_at", "started_at")
        # To a tenth of a millisecond: at a p99 of about 12 ms, whole milliseconds alone would move
        # the growth by 8% a step.
        latencies = [(started - created).total_seconds() * 1000 for created, started in rows]
    return {"steps": len(latencies), "runs_failed": failed, "p50_ms": round(percentile(latencies, 50), 1),
            "p99_ms": round(percentile(latencies, 99), 1), "max_ms": round(max(latencies), 1)}


def old_runs_left(owner: Any) -> int:
    return int(owner.execute("SELECT count(*) FROM workflows_workflowrun WHERE workflow_name = 'chain' "
                             "AND created_at < now() - interval '30 days'").fetchone()[0])


def measure(stack: Stack, tenants: list[Any], owner: Any, runs: int, budget_s: float) -> dict[str, Any]:
    """The baseline window, then the window during retention (see the module docs)."""
    from tenants import services

    workload_tenant = tenants[0]
    log(f"baseline: {RATE_PER_S} runs/s for {WINDOW_S:.0f}s, nothing deleted")
    ids, _ = window(workload_tenant, WINDOW_S)
    baseline = step_latencies(workload_tenant, ids)
    log(f"baseline: {json.dumps(baseline)}")

    expired = ExpiredLog(stack.log_dir / "coordinator-0.log")
    locks = LockWatch()
    for tenant in tenants:
        services.override_set(tenant=tenant, field="history_retention_days", value=RETENTION_DAYS)
    began = time.monotonic()
    progress = {"at": began}

    def all_deleted() -> bool:
        done = expired.read()
        if time.monotonic() - progress["at"] >= 15:
            progress["at"] = time.monotonic()
            log(f"  {done} runs deleted in {time.monotonic() - began:.0f}s")
        return done >= runs

    log(f"during: the same workload while the coordinator deletes {runs} runs")
    ids, _ = window(workload_tenant, budget_s, until=all_deleted)
    delete_s = time.monotonic() - began
    during = step_latencies(workload_tenant, ids)
    lock_figures = locks.stop()
    expired.read()
    log(f"during: {json.dumps(during)}; {expired.runs} runs deleted in {delete_s:.0f}s")
    return {"baseline": baseline, "during": during, "delete_s": delete_s, "expired": expired, "locks": lock_figures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS, help="old runs to load and delete")
    parser.add_argument("--explain", action="store_true", help="the hot queries' plans, without and with the indexes")
    parser.add_argument("--reconcile-every", type=float, default=RECONCILE_EVERY_S,
                        help="the coordinator's seconds between housekeeping passes (production: 10)")
    parser.add_argument("--delete-budget", type=float, default=DELETE_BUDGET_S,
                        help="seconds the deleting window lasts at most")
    options = parser.parse_args()
    setup_django("bench/retention.py")

    began = time.monotonic()
    flush_state()
    tenants = make_tenants()
    owner = owner_connection()
    load_s = load_history(owner, tenants, options.runs)
    log(f"{options.runs} runs loaded in {load_s:.0f}s")
    active = start_active_runs(tenants)
    plans = plans_before_and_after(tenants[1]) if options.explain else None
    coordinator_args = ["--interval", str(PASS_INTERVAL_S), "--reconcile-every", str(options.reconcile_every)]
    stack = bench_stack("retention")
    try:
        worker = bench_worker(stack, "worker-0", concurrency=CONCURRENCY)
        dispatcher = stack.dispatcher("dispatcher-0")
        coordinator = stack.coordinator("coordinator-0", extra=coordinator_args)
        stack.wait_ready(worker, dispatcher, coordinator)
        from ductor_project.celery import WORK_QUEUE
        from scheduling.dispatch import credits as broker

        wait_until(lambda: broker.worker_slots(WORK_QUEUE) >= CONCURRENCY, what="the worker's slots")
        noted = note_active(active)
        figures = measure(stack, tenants, owner, options.runs, options.delete_budget)
        left = old_runs_left(owner)
        active_touched = touched(noted, note_active(active))
    finally:
        stack.stop_all()
        owner.close()
    expired: ExpiredLog = figures["expired"]
    baseline, during = figures["baseline"], figures["during"]
    load = os.getloadavg()
    log(f"done in {time.monotonic() - began:.0f}s (load average {load[0]:.1f})")
    print(json.dumps({
        "runs_loaded": options.runs,
        "runs_deleted": expired.runs,
        "old_runs_left": left,
        "delete_s": round(figures["delete_s"], 1),
        "runs_per_s": round(expired.runs / figures["delete_s"], 1),
        "step_start_latency_ms_p99_baseline": baseline["p99_ms"],
        "step_start_latency_ms_p99_during": during["p99_ms"],
        "p99_growth": round(during["p99_ms"] / max(baseline["p99_ms"], 1), 3),
        "active_runs": len(active),
        "active_runs_touched": active_touched,
        "delete_batches": expired.batches,
        "longest_delete_transaction_ms": max(expired.batch_ms, default=0.0),
        "delete_transaction_ms_p99": percentile([round(ms) for ms in expired.batch_ms], 99) if expired.batch_ms else 0,
        **figures["locks"],
        "windows": {"baseline": baseline, "during": during},
        "load_s": round(load_s, 1),
        "plans": plans,
        "goals": {"p99_growth": GOAL_GROWTH, "active_runs_touched": 0, "old_runs_left": 0},
        "config": {"tenants": TENANTS, "rate_per_s": RATE_PER_S, "window_s": WINDOW_S,
                   "retention_days": RETENTION_DAYS, "coordinator": coordinator_args, "concurrency": CONCURRENCY,
                   "load_average_1m": round(load[0], 2), "cpus": os.cpu_count()},
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
