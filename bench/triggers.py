"""Triggers end to end: how late a trigger's run starts, and whether any started twice or not at all.

On the embedded services of ``DUCTOR_DATA_DIR`` (it FLUSHES that Redis, ends the runs left
unfinished there and deletes its schedules), with real processes, all children of
``ductor_project.stack.Stack``: one Celery worker on ``ductor.system`` (concurrency
``CONCURRENCY``), one ``manage.py run_dispatcher`` and two ``manage.py run_coordinator``. Each
scenario in ``SCENARIOS`` runs in turn on fresh tenants, and adds its figures to the one JSON
object printed last (``python bench/triggers.py schedules`` runs only the scenarios named).

**schedules**: ``SCHEDULES`` schedules firing every second (``interval_s`` 1, ``allow_all``, no
jitter), spread over ``TENANTS`` enterprise tenants, created through
``workflows.triggers.services.schedule_create``. After ``WARMUP_S``, every fire whose nominal time
falls in the next ``MEASURE_S`` seconds is measured from the rows, once the last of them has had
``SETTLE_S`` to start:

- ``schedule_fire_lag_ms_p50``, ``_p99``, ``_max``: from a fire's nominal time to its run's
  ``created_at`` (the wake-up, the dispatch on ``ductor.system``, the schedules' transaction);
- ``schedule_duplicates``: runs beyond the first of one (schedule, fire time), from their keys;
- ``schedule_lost``: fires of the window that started no run (and ``schedule_missed``: those the
  schedules counted as missed, past their catch-up window).

**events**: ``EVENTS`` events sent one at a time, each starting a one-node run through a trigger, with a
worker on ``ductor.work``: ``event_to_step_ms_p50`` and ``_p99`` (goal p50 <= 50 ms), from the event's
record to its run's step starting on the worker.

The runs the schedules' fires start are left queued: no worker consumes ``ductor.work`` then. A thousand runs a
second is more than the engine executes on a small machine (``bench/workflows.py`` measures
that); this measures the scheduler, which runs ahead of customer work on the system tier anyway.

Needs its own data dir: ``DUCTOR_DATA_DIR=.ductor/bench-triggers .venv/bin/python bench/triggers.py``.
Progress on stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_stack, coordinator_passed, flush_state, log, percentile, setup_django, wait_until
from ductor_project.stack import Stack

CONCURRENCY = 2
COORDINATORS = 2
SCHEDULES = 1000
TENANTS = 10
WARMUP_S = 3.0
MEASURE_S = 10
SETTLE_S = 3.0
GOAL_LAG_P99_MS = 1000.0
GOAL_DUPLICATES = 0
EVENTS, EVENT_GAP_S = 200, 0.02
GOAL_EVENT_P50_MS = 50.0


def start_stack() -> Stack:
    """The system worker, the dispatcher and the coordinators, ready."""
    from ductor_project.celery import SYSTEM_QUEUE
    from scheduling.dispatch import credits

    stack = bench_stack("triggers")
    worker = stack.worker("system-worker", concurrency=CONCURRENCY, hostname="system-worker@bench",
                          extra=["--pool", "prefork", "--without-heartbeat", "--queues", SYSTEM_QUEUE])
    stack.wait_ready(worker)
    wait_until(lambda: credits.worker_slots(SYSTEM_QUEUE) >= CONCURRENCY, what="the system worker's slots")
    started = [stack.dispatcher(), *(stack.coordinator(f"coordinator-{n}") for n in range(COORDINATORS))]
    stack.wait_ready(*started)
    coordinator_passed()
    return stack


def clear_schedules() -> None:
    """Schedules left in this data dir by an earlier run would fire during this one."""
    from workflows.models import Schedule

    Schedule.all_tenants.all().delete()


# --- schedules -------------------------------------------------------------------------------------


def make_schedules() -> list[Any]:
    """``TENANTS`` tenants with a one-node workflow and ``SCHEDULES`` schedules between them."""
    from ductor_project.core.context import tenant_context
    from tenants import services
    from workflows.services import workflow_put
    from workflows.triggers.services import schedule_create

    tenants = []
    for index in range(TENANTS):
        tenant = services.tenant_create(slug=f"bench-trig-{uuid.uuid4().hex[:8]}", plan="enterprise")
        with tenant_context(tenant):
            workflow_put(name="tick", spec={"nodes": [{"id": "a", "type": "action", "action": "noop"}]})
            for n in range(index, SCHEDULES, TENANTS):
                schedule_create(name=f"every-second-{n}", workflow="tick", interval_s=1, overlap="allow_all")
        tenants.append(tenant)
    return tenants


def fires_in(tenants: list[Any], start: datetime, end: datetime) -> tuple[list[tuple[str, datetime, datetime]], int]:
    """Every run a schedule started for a fire time in ``[start, end)``: (key, fire time, created_at); and
    how many fires the schedules counted as missed."""
    from django.db.models import Sum

    from ductor_project.core.context import tenant_context
    from workflows.models import Schedule, WorkflowRun
    from workflows.triggers.timing import fire_of_key

    found, missed = [], 0
    for tenant in tenants:
        with tenant_context(tenant):
            rows = WorkflowRun.objects.filter(idempotency_key__startswith="schedule:").values_list(
                "idempotency_key", "created_at")
            for key, created in rows.iterator(chunk_size=2000):
                parsed = fire_of_key(key or "")
                if parsed and start <= parsed[1] < end:
                    found.append((key, parsed[1], created))
            missed += Schedule.objects.aggregate(missed=Sum("missed_count"))["missed"] or 0
    return found, missed


def schedules_scenario() -> dict[str, Any]:
    from django.utils import timezone

    began = time.monotonic()
    tenants = make_schedules()
    log(f"{SCHEDULES} schedules over {TENANTS} tenants in {time.monotonic() - began:.1f}s")
    time.sleep(WARMUP_S)
    start = timezone.now().replace(microsecond=0) + timedelta(seconds=1)
    end = start + timedelta(seconds=MEASURE_S)
    log(f"measuring the fires from {start:%H:%M:%S} to {end:%H:%M:%S}")
    time.sleep(max(0.0, (end - timezone.now()).total_seconds() + SETTLE_S))
    found, missed = fires_in(tenants, start, end)
    lags = [int((created - fire).total_seconds() * 1000) for _, fire, created in found]
    keys = Counter(key for key, _, _ in found)
    expected = SCHEDULES * MEASURE_S
    result = {
        "schedule_fire_lag_ms_p50": percentile(lags, 50) if lags else None,
        "schedule_fire_lag_ms_p99": percentile(lags, 99) if lags else None,
        "schedule_fire_lag_ms_max": max(lags, default=None),
        "schedule_duplicates": sum(count - 1 for count in keys.values()),
        "schedule_lost": expected - len(keys),
        "schedule_missed": missed,
        "schedule_fires": len(found),
        "schedule_fires_expected": expected,
    }
    log(f"schedules: {json.dumps(result)}")
    return result


# --- events ------------------------------------------------------------------------------------------


def events_scenario() -> dict[str, Any]:
    """``EVENTS`` events of one tenant, sent one every ``EVENT_GAP_S`` (an idle system), each triggering a
    one-node workflow, with a worker of concurrency ``CONCURRENCY`` on ``ductor.work`` (a stack of its own);
    ``event_to_step_ms_p50`` and ``_p99``: from an event's ``created_at`` to the ``started_at`` of the first
    step of the run it started (the event's transaction, the run's first tick in it, the dispatch, the
    worker's start of the step)."""
    from ductor_project.celery import WORK_QUEUE
    from ductor_project.core.context import tenant_context
    from scheduling.dispatch import credits
    from tenants import services
    from workflows.models import Event, StepRun
    from workflows.services import workflow_put
    from workflows.triggers.events import events_send, trigger_create

    stack = bench_stack("triggers-events")
    try:
        worker = stack.worker("work-worker", concurrency=CONCURRENCY, hostname="work-worker@bench",
                              extra=["--pool", "prefork", "--without-heartbeat", "--queues", WORK_QUEUE])
        stack.wait_ready(worker)
        wait_until(lambda: credits.worker_slots(WORK_QUEUE) >= CONCURRENCY, what="the work worker's slots")
        tenant = services.tenant_create(slug=f"bench-events-{uuid.uuid4().hex[:8]}", plan="enterprise")
        with tenant_context(tenant):
            workflow_put(name="on-ping", spec={"nodes": [{"id": "a", "type": "action", "action": "noop"}]})
            trigger_create(workflow="on-ping", event="bench.ping")
            for _ in range(EVENTS):
                events_send([{"name": "bench.ping", "payload": {"at": time.time()}}])
                time.sleep(EVENT_GAP_S)

            def started() -> int:
                return StepRun.objects.filter(started_at__isnull=False).count()

            wait_until(lambda: started() >= EVENTS, what="every event's step to start")
            first_step = {run: at for run, at in StepRun.objects.values_list("run_id", "started_at")}
            lags = [int((first_step[uuid.UUID(event.runs[0])] - event.created_at).total_seconds() * 1000)
                    for event in Event.objects.all()]
    finally:
        stack.stop_all()
    result = {"event_to_step_ms_p50": percentile(lags, 50), "event_to_step_ms_p99": percentile(lags, 99),
              "events": len(lags)}
    log(f"events: {json.dumps(result)}")
    return result


# Each scenario: its name -> (what it measures, its goals by figure); more are added beside it.
SCENARIOS: dict[str, tuple[Callable[[], dict[str, Any]], dict[str, float]]] = {
    # Events first: the schedules' scenario leaves its runs queued, which a work worker would then run.
    "events": (events_scenario, {"event_to_step_ms_p50": GOAL_EVENT_P50_MS}),
    "schedules": (schedules_scenario, {"schedule_fire_lag_ms_p99": GOAL_LAG_P99_MS,
                                       "schedule_duplicates": GOAL_DUPLICATES}),
}


def main(argv: list[str]) -> int:
    setup_django("bench/triggers.py")
    for logger in ("workflows", "tenants"):  # a line per schedule created: keep the progress readable
        logging.getLogger(logger).setLevel(logging.WARNING)
    wanted = argv or list(SCENARIOS)
    unknown = [name for name in wanted if name not in SCENARIOS]
    if unknown:
        log(f"unknown scenario(s) {unknown}; known: {list(SCENARIOS)}")
        return 2
    began = time.monotonic()
    flush_state()
    clear_schedules()
    stack = start_stack()
    results: dict[str, Any] = {}
    goals: dict[str, float] = {}
    try:
        log(f"up in {time.monotonic() - began:.1f}s")
        for name in wanted:
            measure, scenario_goals = SCENARIOS[name]
            results.update(measure())
            goals.update(scenario_goals)
        dead = [child.name for child in stack.children if not child.alive()]
    finally:
        stack.stop_all()
        clear_schedules()
    load = os.getloadavg()
    log(f"done in {time.monotonic() - began:.0f}s (load average {load[0]:.1f})")
    print(json.dumps({
        **results,
        "goals": goals,
        "config": {"scenarios": wanted, "schedules": SCHEDULES, "tenants": TENANTS, "measure_s": MEASURE_S,
                   "warmup_s": WARMUP_S, "settle_s": SETTLE_S, "system_worker_concurrency": CONCURRENCY,
                   "coordinators": COORDINATORS, "run_workers": 0, "died": dead,
                   "load_average_1m": round(load[0], 2), "cpus": os.cpu_count()},
    }))
    return 1 if dead else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
