"""Recovery after a Redis flush: how soon the runs that were active at a ``FLUSHALL`` all finish.

The goal: on an idle machine, every run active at the flush has finished within ``GOAL_RECOVERY_S``
of it. On the embedded services of ``DUCTOR_DATA_DIR`` (it FLUSHES that Redis), the pipeline of
``bench/workflows.py`` (``start_pipeline``: a worker, the dispatcher, the coordinator) plus a second
worker (``WORKERS`` x ``CONCURRENCY``), with the product's own settings (the lease included), runs
the workload twice, on fresh tenants each time:

1. **baseline**: ``TENANTS`` enterprise tenants start ``RUNS_PER_TENANT`` runs each of the chaos
   test's diamond (``tests/test_chaos.py``: two sleeps, a step that fails once and is retried after
   a backoff, a join) with ``workflows.services.run_start_many``. Once ``UNDER_WAY_FRACTION`` of
   all their steps have succeeded (the phase point: every run started, many still active), the
   runs active then are noted, and ``baseline_s`` is the time from that moment until the last of
   them finished (its ``finished_at``).
2. **flush**: the same, but at the phase point Redis is flushed (``FLUSHALL``: every queue, lease,
   timer, credit, worker registration and Celery message and binding). ``recovery_s`` is the
   time from the flush until the last run active at it finished; ``noticed_s`` the time until
   the coordinator logged ``redis_data_lost`` (the timestamp of its JSON log line);
   ``longest_stall_s`` the longest time after the flush in which none of those runs' steps started
   (``stall_ended_s``: when it ended); ``slots_back_s`` when every worker's slots were registered
   again (their heartbeat; the dispatcher has no credits without them).

The flush goes last, so that its aftermath cannot slow the baseline; ``recovery_s - baseline_s``
(``flush_cost_s``) is what the flush cost. It varies from run to run: mostly with where in the
workers' heartbeat (``HEARTBEAT_S``, 5 s) the flush falls, since until a worker registers its slots
again the dispatcher has no credit for it (a worker that finishes a step meanwhile still hands off
the next one), and a little with where in the coordinator's 1-s pass it falls.

Each phase then checks that every run succeeded, once (exactly one terminal event in its history,
in order; each node succeeded once), and that nothing is left in flight (the tenants' fair-queue
backlog and in-flight items, and their capacity slots, all 0). Anything else exits non-zero.

Needs its own data dir: ``DUCTOR_DATA_DIR=.ductor/bench-recovery .venv/bin/python bench/recovery.py``.
Progress on stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_stack, bench_worker, log, redis_client, setup_django
from bench.workflows import CONCURRENCY, make_tenant, start_pipeline, wait_pipeline, wait_until
from ductor_project.stack import Child, Stack

WORKERS = 2  # start_pipeline's worker and one more, as in the chaos test
TENANTS = 2
RUNS_PER_TENANT = 30
UNDER_WAY_FRACTION = 0.25  # of all the phase's steps succeeded: the phase point
UNDER_WAY_TIMEOUT_S = 60.0
FINISH_TIMEOUT_S = 90.0  # after the phase point, for every run active then to end
POLL_S = 0.1  # the figures come from the rows' timestamps: a lazy poll loses no precision
GOAL_RECOVERY_S = 20.0
TERMINAL_EVENTS = {"succeeded", "failed", "cancelled", "continued"}

# The chaos test's diamond: a and the join are quick, b sleeps, c fails once and is retried after 0.2 s.
DIAMOND: dict[str, Any] = {
    "nodes": [
        {"id": "a", "type": "action", "action": "sleep_ms", "input": {"ms": 150}},
        {"id": "b", "type": "action", "action": "sleep_ms", "input": {"ms": 250}, "depends_on": ["a"]},
        {"id": "c", "type": "action", "action": "fail", "input": {"succeed_on_attempt": 2}, "depends_on": ["a"],
         "retry": {"max_attempts": 5, "backoff_s": 0.2, "jitter": False}},
        {"id": "d", "type": "action", "action": "echo", "depends_on": ["b", "c"],
         "input": {"b": "$nodes.b.output", "c": "$nodes.c.output"}},
    ],
    "output": {"d": "$nodes.d.output"},
}
NODES = {node["id"] for node in DIAMOND["nodes"]}


class BenchFailure(RuntimeError):
    """A run did not end as it should, or something stayed in flight."""


@dataclass(frozen=True)
class Snapshot:
    """The phase point: when it was (``at``, epoch seconds), the runs active then, the steps done by then."""

    at: float
    active: dict[Any, list[Any]]  # tenant -> ids of its runs active at ``at``
    steps_succeeded: int

    @property
    def runs(self) -> int:
        return sum(len(ids) for ids in self.active.values())


def workload_tenants() -> list[Any]:
    """``TENANTS`` fresh enterprise tenants (``make_tenant``), each with the diamond."""
    from ductor_project.core.context import tenant_context
    from workflows.services import workflow_put

    tenants = [make_tenant()[0] for _ in range(TENANTS)]
    for tenant in tenants:
        with tenant_context(tenant):
            workflow_put(name="diamond", spec=DIAMOND)
    return tenants


def start_runs(tenants: list[Any]) -> None:
    from ductor_project.core.context import tenant_context
    from workflows.services import run_start_many

    for tenant in tenants:
        with tenant_context(tenant):
            run_start_many(runs=[{"workflow": "diamond"} for _ in range(RUNS_PER_TENANT)])


def succeeded_steps(tenants: list[Any]) -> int:
    from ductor_project.core.context import tenant_context
    from workflows.models import StepRun

    total = 0
    for tenant in tenants:
        with tenant_context(tenant):
            total += StepRun.objects.filter(status=StepRun.Status.SUCCEEDED).count()
    return total


def active_runs(tenants: list[Any]) -> dict[Any, list[Any]]:
    """Each tenant's runs that are not terminal, as PostgreSQL has them now."""
    from ductor_project.core.context import tenant_context
    from workflows.models import WorkflowRun

    active = {}
    for tenant in tenants:
        with tenant_context(tenant):
            active[tenant] = list(WorkflowRun.objects.exclude(status__in=WorkflowRun.TERMINAL)
                                  .values_list("pk", flat=True))
    return active


def still_active(snapshot: Snapshot) -> int:
    """How many of the runs active at the phase point are not terminal yet."""
    from ductor_project.core.context import tenant_context
    from workflows.models import WorkflowRun

    left = 0
    for tenant, ids in snapshot.active.items():
        with tenant_context(tenant):
            left += WorkflowRun.objects.filter(pk__in=ids).exclude(status__in=WorkflowRun.TERMINAL).count()
    return left


def last_finished(snapshot: Snapshot) -> float:
    """When the last of the runs active at the phase point finished (epoch seconds)."""
    from ductor_project.core.context import tenant_context
    from workflows.models import WorkflowRun

    moments = []
    for tenant, ids in snapshot.active.items():
        with tenant_context(tenant):
            moments += [run.finished_at or run.updated_at for run in WorkflowRun.objects.filter(pk__in=ids)]
    return max(moment.timestamp() for moment in moments)


def longest_stall(snapshot: Snapshot) -> tuple[float, float]:
    """The longest time after the phase point during which no step of the runs active then started:
    its length, and when it ended (seconds after the phase point). Unlike the first start after the
    flush (a task that took its message just before it), this shows how long dispatch stood still."""
    from ductor_project.core.context import tenant_context
    from workflows.models import StepRun

    moment = datetime.fromtimestamp(snapshot.at).astimezone()
    starts = [0.0]
    for tenant, ids in snapshot.active.items():
        with tenant_context(tenant):
            starts += [started.timestamp() - snapshot.at for started in
                       StepRun.objects.filter(run_id__in=ids, started_at__gte=moment)
                       .values_list("started_at", flat=True)]
    starts.sort()
    gap, ended = max(((later - earlier, later) for earlier, later in pairwise(starts)), default=(0.0, 0.0))
    return gap, ended


def check_histories(tenant: Any) -> None:
    """Every run of ``tenant`` succeeded, once, with its history in order; each node succeeded once
    (``tests/test_chaos.py``'s check). Raises ``BenchFailure`` otherwise."""
    from ductor_project.core.context import tenant_context
    from workflows.models import RunEvent, StepRun, WorkflowRun

    with tenant_context(tenant):
        runs = list(WorkflowRun.objects.all())
        statuses = Counter(run.status for run in runs)
        if set(statuses) != {"succeeded"}:
            raise BenchFailure(f"{tenant.slug}: not every run succeeded: {dict(statuses)}")
        for run in runs:
            events = list(RunEvent.objects.filter(run=run).order_by("seq"))
            types = [e.type for e in events]
            if [e.seq for e in events] != list(range(1, len(events) + 1)):
                raise BenchFailure(f"run {run.pk}: its history has gaps or is out of order")
            if types[0] != "created" or types[-1] != "succeeded":
                raise BenchFailure(f"run {run.pk}: its history starts with {types[0]!r}, ends with {types[-1]!r}")
            ended = [t for t in types if t in TERMINAL_EVENTS]
            if ended != ["succeeded"]:
                raise BenchFailure(f"run {run.pk} finished more than once: {ended}")
            times = [e.created_at for e in events]
            if times != sorted(times):
                raise BenchFailure(f"run {run.pk}: its events' times are out of order")
            wins = Counter(step.node_id for step in StepRun.objects.filter(run=run, status="succeeded"))
            if wins != dict.fromkeys(NODES, 1):
                raise BenchFailure(f"run {run.pk}: steps succeeded {dict(wins)} times")
            told = Counter(e.node_id for e in events if e.type == "step_succeeded")
            if told != wins:
                raise BenchFailure(f"run {run.pk}: step_succeeded events {dict(told)}, steps {dict(wins)}")


def in_flight(tenants: list[Any]) -> dict[str, dict[str, int]]:
    """What the tenants still have queued or in flight: fair-queue backlog and in-flight items, and
    capacity slots held; an empty dict when nothing."""
    from ductor_project.core import capacity
    from ductor_project.core.context import tenant_context
    from scheduling import fair_queue as fq

    left = {}
    for tenant in tenants:
        stats = fq.stats(tenant)
        with tenant_context(tenant):
            held = capacity.tenant_in_flight()
        if stats.backlog or stats.in_flight or held:
            left[tenant.slug] = {"backlog": stats.backlog, "in_flight": stats.in_flight, "slots_held": held}
    return left


def settled(tenants: list[Any], timeout: float) -> float:
    """Wait until nothing of ``tenants`` is queued or in flight, then check that it stays so for
    a second; returns how long it took. Raises ``BenchFailure`` with what is left otherwise."""
    began = time.monotonic()
    deadline = began + timeout
    while left := in_flight(tenants):
        if time.monotonic() > deadline:
            raise BenchFailure(f"still queued or in flight {timeout:g}s after the runs ended: {left}")
        time.sleep(POLL_S)
    took = time.monotonic() - began
    time.sleep(1.0)
    if left := in_flight(tenants):
        raise BenchFailure(f"in flight again after the runs ended: {left}")
    return took


def log_records(child: Child, event: str) -> list[dict[str, Any]]:
    """``child``'s JSON log records of ``event`` so far (other lines, and lines cut short, skipped)."""
    records = []
    for line in child.output().splitlines():
        if line.startswith("{") and f'"{event}"' in line:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == event:
                records.append(record)
    return records


def stamp(record: dict[str, Any]) -> float:
    """A log record's timestamp (ISO 8601, UTC) in epoch seconds."""
    return datetime.fromisoformat(str(record["timestamp"]).replace("Z", "+00:00")).timestamp()


def phase(name: str, *, flush: bool, coordinator: Child) -> dict[str, Any]:
    """Start the workload on fresh tenants; at the phase point flush Redis (with ``flush``); time
    until every run active then is terminal; check the runs and that nothing is left in flight."""
    from django.conf import settings

    from ductor_project.celery import WORK_QUEUE
    from scheduling.dispatch import credits as broker

    tenants = workload_tenants()
    start_runs(tenants)
    started = time.monotonic()
    target = round(UNDER_WAY_FRACTION * TENANTS * RUNS_PER_TENANT * len(NODES))
    wait_until(lambda: succeeded_steps(tenants) >= target, what=f"{name}: the workload under way",
               timeout=UNDER_WAY_TIMEOUT_S)
    noticed_before = len(log_records(coordinator, "redis_data_lost"))
    active = active_runs(tenants)
    at = time.time()
    if flush:
        redis_client().flushall()
    snapshot = Snapshot(at=at, active=active, steps_succeeded=succeeded_steps(tenants))
    log(f"{name}: phase point {time.monotonic() - started:.1f}s after the start: {snapshot.steps_succeeded} steps "
        f"succeeded, {snapshot.runs} runs active" + ("; Redis flushed" if flush else ""))

    slots_back: float | None = None
    deadline = time.monotonic() + FINISH_TIMEOUT_S
    while left := still_active(snapshot):
        if slots_back is None and broker.worker_slots(WORK_QUEUE) >= WORKERS * CONCURRENCY:
            slots_back = time.time() - at
        if time.monotonic() > deadline:
            raise BenchFailure(f"{name}: {left} of the {snapshot.runs} runs active at the phase point "
                               f"still active after {FINISH_TIMEOUT_S:g}s")
        time.sleep(POLL_S)
    took_s = last_finished(snapshot) - at
    stall_s, stall_ended_s = longest_stall(snapshot)
    noticed = log_records(coordinator, "redis_data_lost")[noticed_before:]
    for tenant in tenants:
        check_histories(tenant)
    settle_s = settled(tenants, timeout=2 * settings.DUCTOR_LEASE_MS / 1000 + 10)
    figures: dict[str, Any] = {
        "seconds": round(took_s, 2),
        "runs_active": snapshot.runs,
        "steps_succeeded_at_point": snapshot.steps_succeeded,
        "longest_stall_s": round(stall_s, 2),
        "stall_ended_s": round(stall_ended_s, 2),
        "settled_after_s": round(settle_s, 2),
    }
    if flush:
        figures["noticed_s"] = round(stamp(noticed[0]) - at, 2) if noticed else None
        figures["slots_back_s"] = None if slots_back is None else round(slots_back, 2)
    log(f"{name}: the {snapshot.runs} runs active at the phase point all ended {took_s:.2f}s after it; "
        f"{json.dumps(figures)}")
    return figures


def start_stack() -> tuple[Stack, Child]:
    """``start_pipeline`` and a second worker, all ready and every worker's slots registered;
    returns the stack and its coordinator."""
    from ductor_project.celery import WORK_QUEUE
    from scheduling.dispatch import credits as broker

    stack = bench_stack("recovery", DUCTOR_LOG_FORMAT="json")  # the coordinator's redis_data_lost, parsed
    worker, dispatcher = start_pipeline(stack)
    for n in range(1, WORKERS):
        bench_worker(stack, f"worker-{n}", concurrency=CONCURRENCY)
    stack.wait_ready()  # the coordinator and the other workers too
    wait_pipeline(stack, worker, dispatcher)
    wait_until(lambda: broker.worker_slots(WORK_QUEUE) >= WORKERS * CONCURRENCY, what="every worker's slots")
    coordinator = next(child for child in stack.children if child.name == "coordinator-0")
    return stack, coordinator


def main() -> int:
    setup_django("bench/recovery.py")
    for logger in ("workflows", "tenants"):  # a line per run (and per tenant) started: keep the progress
        logging.getLogger(logger).setLevel(logging.WARNING)
    from django.conf import settings

    began = time.monotonic()
    load_before = os.getloadavg()
    redis_client().flushall()
    stack, coordinator = start_stack()
    try:
        log(f"up in {time.monotonic() - began:.1f}s ({WORKERS} workers x {CONCURRENCY}); load average "
            f"{load_before[0]:.1f} before")
        baseline = phase("baseline", flush=False, coordinator=coordinator)
        flushed = phase("flush", flush=True, coordinator=coordinator)
        dead = [child.name for child in stack.children if not child.alive()]
        if dead:
            raise BenchFailure(f"died during the benchmark: {dead}")
    except BenchFailure as failure:
        log(f"FAILED: {failure}")
        return 1
    finally:
        stack.stop_all()
    load = os.getloadavg()
    recovery_s = flushed["seconds"]
    log(f"done in {time.monotonic() - began:.0f}s (load average {load[0]:.1f}): recovery {recovery_s}s, "
        f"baseline {baseline['seconds']}s, noticed {flushed['noticed_s']}s (goal: recovery <= {GOAL_RECOVERY_S:g}s)")
    print(json.dumps({
        "recovery_s": recovery_s,
        "baseline_s": baseline["seconds"],
        "flush_cost_s": round(recovery_s - baseline["seconds"], 2),
        "noticed_s": flushed["noticed_s"],
        "longest_stall_s": flushed["longest_stall_s"],
        "stall_ended_s": flushed["stall_ended_s"],
        "slots_back_s": flushed["slots_back_s"],
        "runs_active_at_flush": flushed["runs_active"],
        "runs_active_at_baseline_point": baseline["runs_active"],
        "goal_recovery_s": GOAL_RECOVERY_S,
        "phases": {"baseline": baseline, "flush": flushed},
        "config": {"runs": TENANTS * RUNS_PER_TENANT, "tenants": TENANTS, "runs_per_tenant": RUNS_PER_TENANT,
                   "workflow": "diamond (tests/test_chaos.py)", "workers": WORKERS, "concurrency": CONCURRENCY,
                   "phase_point": f"{UNDER_WAY_FRACTION:g} of all steps succeeded",
                   "lease_ms": settings.DUCTOR_LEASE_MS,
                   "load_average_1m_before": round(load_before[0], 2), "load_average_1m": round(load[0], 2),
                   "cpus": os.cpu_count()},
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
