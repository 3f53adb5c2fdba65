"""Admission at dequeue, end to end: a full pool's steps wait parked, a suspended tenant waits held.

On the embedded services of ``DUCTOR_DATA_DIR`` (it FLUSHES that Redis), with one
``celery -A ductor_project worker`` (concurrency ``CONCURRENCY``), one dispatcher and
the coordinator, all children of ``ductor_project.stack.Stack``:

1. **A full pool.** ``STEPS`` one-step runs whose step (``sleep_ms`` of ``STEP_MS``)
   routes to a pool of concurrency 1, all started at once: every step but one waits for
   the pool's slot. ``deliveries_per_item`` is the number of times step items were
   handed to a worker process (a Celery message, or a handoff: every ``dispatched``
   record the dispatcher and the worker logged) per step attempt. The goal is exactly
   1.0: a parked step is not dispatched until its slot is free. The same-run baseline is
   the same workload through a pool without a limit (``baseline_deliveries_per_item``).
2. **A suspended tenant.** A suspended tenant's ``SUSPENDED_RUNS`` runs are started (their
   first ticks run in this process and queue their steps) and left for ``HOLD_S``
   seconds: ``suspended_deliveries`` counts the dispatches of its items meanwhile (goal
   0). It is then reactivated: ``reactivated_first_step_ms`` is how long its first step
   took to start after the reactivation (woken at once, not polled), and every run must
   succeed.

Needs its own data dir: ``DUCTOR_DATA_DIR=.ductor/bench-a .venv/bin/python bench/admission.py``.
Progress on stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_stack, bench_worker, coordinator_passed, log, redis_client, setup_django, wait_until
from ductor_project.stack import Stack

CONCURRENCY = 2
STEPS = 50
STEP_MS = 10
SUSPENDED_RUNS = 20
HOLD_S = 3.0
DONE_TIMEOUT_S = 120.0



def set_up() -> tuple[Any, Any]:
    """Two enterprise tenants: one with a pool of concurrency 1 and one without a limit, each with a
    one-step workflow routed to it; one with a workflow that needs no pool."""
    from ductor_project.core.context import tenant_context
    from scheduling import services as routing
    from tenants import services
    from workflows.services import workflow_put

    tag = uuid.uuid4().hex[:8]  # a data dir may hold an earlier run's tenants
    pooled = services.tenant_create(slug=f"admission-pooled-{tag}", plan="enterprise")
    held = services.tenant_create(slug=f"admission-held-{tag}", plan="enterprise")
    step = {"id": "work", "type": "action", "action": "sleep_ms", "input": {"ms": STEP_MS}}
    with tenant_context(pooled):
        routing.connection_create(name="api", kind="http", config={"base_url": "https://api.example.com"})
        members = [routing.MemberSpec("api")]
        routing.pool_create(name="one", max_concurrency=1, members=members)
        routing.pool_create(name="free", members=members)
        workflow_put(name="limited", spec={"nodes": [{**step, "pool": "one"}]})
        workflow_put(name="unlimited", spec={"nodes": [{**step, "pool": "free"}]})
    with tenant_context(held):
        workflow_put(name="plain", spec={"nodes": [step]})
    return pooled, held


def start_runs(tenant: Any, workflow: str, count: int) -> list[Any]:
    from ductor_project.core.context import tenant_context
    from workflows.services import run_start

    with tenant_context(tenant):
        return [run_start(workflow=workflow)[0].pk for _ in range(count)]


def all_succeeded(tenant: Any, run_ids: list[Any]) -> bool:
    from ductor_project.core.context import tenant_context
    from workflows.models import WorkflowRun

    with tenant_context(tenant):
        statuses = set(WorkflowRun.objects.filter(pk__in=run_ids).values_list("status", flat=True))
    if statuses & {"failed", "cancelled"}:
        raise RuntimeError(f"a run did not succeed: {statuses}")
    return statuses == {"succeeded"}


def step_items(tenant: Any, run_ids: list[Any]) -> set[str]:
    from ductor_project.core.context import tenant_context
    from workflows.engine.items import step_item_id
    from workflows.models import StepRun

    with tenant_context(tenant):
        return {step_item_id(pk) for pk in StepRun.objects.filter(run_id__in=run_ids).values_list("pk", flat=True)}


def dispatches(stack: Stack, tenant: Any) -> list[dict[str, Any]]:
    """Every ``dispatched`` record of ``tenant``'s items the dispatcher and the worker logged."""
    found = []
    for child in stack.children:
        for line in child.output().splitlines():
            if '"dispatched"' not in line or str(tenant.pk) not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "dispatched" and record.get("tenant_id") == str(tenant.pk):
                found.append(record)
    return found


def deliveries_per_item(stack: Stack, tenant: Any, workflow: str) -> tuple[float, float]:
    """Start ``STEPS`` runs of ``workflow`` at once; (deliveries per step attempt, seconds to finish)."""
    started = time.perf_counter()
    run_ids = start_runs(tenant, workflow, STEPS)
    wait_until(lambda: all_succeeded(tenant, run_ids), f"{STEPS} runs of {workflow}")
    elapsed = time.perf_counter() - started
    time.sleep(1.0)  # the last records reach the logs
    items = step_items(tenant, run_ids)
    delivered = [r for r in dispatches(stack, tenant) if r["item_id"] in items]
    return len(delivered) / len(items), elapsed


def first_step_started(tenant: Any, run_ids: list[Any]) -> datetime | None:
    from ductor_project.core.context import tenant_context
    from workflows.models import StepRun

    with tenant_context(tenant):
        return StepRun.objects.filter(run_id__in=run_ids).exclude(started_at=None).order_by("started_at").values_list(
            "started_at", flat=True).first()


def suspension(stack: Stack, tenant: Any) -> dict[str, Any]:
    """Suspend, start runs, hold, reactivate: the dispatches while held, and the wake-up's delay."""
    from tenants import services
    from tenants.models import Tenant

    services.tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)
    run_ids = start_runs(tenant, "plain", SUSPENDED_RUNS)
    time.sleep(HOLD_S)
    held = len(dispatches(stack, tenant))
    reactivated = time.time()
    services.tenant_set_status(tenant=tenant, status=Tenant.Status.ACTIVE)
    first = wait_until(lambda: first_step_started(tenant, run_ids), "the reactivated tenant's first step")
    wait_until(lambda: all_succeeded(tenant, run_ids), "the reactivated tenant's runs")
    waited_ms = (first.timestamp() - reactivated) * 1000
    return {"suspended_deliveries": held, "reactivated_first_step_ms": round(waited_ms, 1)}


def main() -> None:
    setup_django("bench/admission.py")
    redis_client().flushdb()
    pooled, held = set_up()
    stack = bench_stack("admission")
    try:
        worker = bench_worker(stack, "admission-worker", concurrency=CONCURRENCY, tasks=False)
        stack.wait_ready(worker)
        stack.wait_ready(stack.dispatcher("admission-dispatcher"), stack.coordinator("admission-coordinator"))
        coordinator_passed()
        log(f"==> {STEPS} steps through a pool of concurrency 1, and through one without a limit")
        limited, limited_s = deliveries_per_item(stack, pooled, "limited")
        baseline, baseline_s = deliveries_per_item(stack, pooled, "unlimited")
        log(f"    deliveries per step: {limited:.3f} (limited, {limited_s:.1f}s), {baseline:.3f} (no limit, "
            f"{baseline_s:.1f}s)")
        log(f"==> a suspended tenant's {SUSPENDED_RUNS} runs, held {HOLD_S:g}s, then reactivated")
        held_figures = suspension(stack, held)
        log(f"    {held_figures}")
    finally:
        stack.stop_all()
    result = {
        "steps": STEPS,
        "deliveries_per_item": round(limited, 3),
        "baseline_deliveries_per_item": round(baseline, 3),
        "limited_seconds": round(limited_s, 2),
        "baseline_seconds": round(baseline_s, 2),
        **held_figures,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
