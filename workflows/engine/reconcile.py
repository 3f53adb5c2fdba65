"""The engine's reconciler: put back the Redis side of active runs that stopped moving.

PostgreSQL is the source of truth. A crash between a commit and its enqueue,
or a Redis flush, can leave an active run with nothing queued for it. Every
pass of the coordinator's reconcilers looks at the runs unchanged for
``STALE_RUN_S`` (``RECONCILE_BATCH`` at most, each tenant's longest-unchanged
first, in turns: ``stale_run_ids``) and puts back their tick, the items of their
queued and running steps, the
timers of their sleeps, retry backoffs, step timeouts and task heartbeats, the
run's own timeout (its spec's ``timeout_s``), and what their waits need (a
timeout's wake-up, an arming: ``waits.repair``). Each of those is
idempotent (an item already queued or in flight is coalesced, a waiting timer
is kept), so repairing a run that was only slow costs at most a no-op
delivery. A run whose tick is still waiting or in flight is moving: it is
only touched, not repaired. After Redis lost its data (``full``), every
active run is repaired at once, batch after batch, however recently it moved:
their steps whose items and leases vanished with it among them; that pass walks
the active runs oldest first, once (``_active_from``), not in turns. Crosses
tenants by design: it is the system's housekeeping.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import structlog
from django.db import DataError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from ductor_project.core.context import tenant_context
from scheduling import fair_queue
from tenants.scoping import in_tenant_turns
from workflows.engine.attempts import ACTIVE, nodes_of, spec_of, waits_for_child
from workflows.engine.heartbeats import heartbeat_s_of
from workflows.engine.items import TASK, enqueue_step, enqueue_tick, tick_item_id, wakeup_on_commit
from workflows.engine.tick import RUN_TIMEOUT
from workflows.engine.waits import WAIT
from workflows.engine.waits import repair as repair_wait
from workflows.models import StepRun, WorkflowRun

log = structlog.get_logger(__name__)

SStatus = StepRun.Status
STALE_RUN_S = 30.0
# Most stale runs one reconciler pass looks at (the longest-unchanged first).
RECONCILE_BATCH = 500


def reconcile_runs(*, full: bool = False) -> int:
    """Repair the stale active runs of every tenant, or with ``full`` every active run (see the
    module docs); returns how many."""
    # One cutoff for the whole pass: a run it repaired or found moving is touched past it.
    cutoff = timezone.now() - timedelta(seconds=0.0 if full else STALE_RUN_S)
    if not full:
        return _reconcile_batch(list(stale_run_ids(cutoff)[:RECONCILE_BATCH]))
    # Every active run, batch after batch: the turns serve a pass that takes one batch; this one takes
    # them all, so it walks the active runs' index from where its last batch ended, once.
    count, after = 0, None
    while True:
        batch = list(_active_from(cutoff, after)[:RECONCILE_BATCH])
        count += _reconcile_batch([pk for _, pk in batch])
        if len(batch) < RECONCILE_BATCH:
            return count
        after = batch[-1]


def _active_from(cutoff: datetime, after: tuple[datetime, Any] | None) -> QuerySet[WorkflowRun, Any]:
    """The ``(created_at, id)`` of every tenant's active runs unchanged since before ``cutoff``, oldest
    first, after ``after``: a walk of the index ``run_active``, entered there."""
    active = (WorkflowRun.all_tenants.exclude(status__in=WorkflowRun.TERMINAL).filter(updated_at__lt=cutoff)
              .order_by("created_at", "pk"))
    if after is not None:
        active = active.filter(created_at__gte=after[0]).filter(Q(created_at__gt=after[0]) | Q(pk__gt=after[1]))
    return active.values_list("created_at", "pk")


def _reconcile_batch(ids: list[Any]) -> int:
    """Repair the active runs ``ids`` (those still there); each one repaired or found moving is
    touched, so the next batch takes others. Returns how many it repaired."""
    now = timezone.now()
    found = WorkflowRun.all_tenants.select_related("tenant", "workflow").in_bulk(ids)
    stale = [found[pk] for pk in ids if pk in found]
    moving = _ticks_pending(stale)
    if moving:
        WorkflowRun.all_tenants.filter(pk__in=moving).update(updated_at=timezone.now())
    repaired = 0
    for run in stale:
        if run.pk not in moving:
            repaired += _repair_or_skip(run, now)
    return repaired


def _repair_or_skip(run: WorkflowRun, now: datetime) -> int:
    """``_repair_run``, 1; or 0 when its rows cannot be read or repaired (data no code path expects:
    a time out of a ``datetime``'s range, say). Logged, and touched so that the next batches take
    others: one run never stops the repair of all of them. A lost database still fails the pass."""
    try:
        _repair_run(run, now)
    except (DataError, ValueError, TypeError, KeyError):
        log.exception("run_repair_failed", run_id=str(run.pk), tenant_id=str(run.tenant_id))
        WorkflowRun.all_tenants.filter(pk=run.pk).update(updated_at=timezone.now())
        return 0
    return 1


def stale_run_ids(cutoff: datetime) -> QuerySet[WorkflowRun, Any]:
    """The ids of every tenant's active runs unchanged since before ``cutoff``, in turns: each
    tenant's longest-unchanged run, then each one's next, and so on (the longest-unchanged first
    within a turn). A tenant's backlog of runs waiting their turn looks stale too: taken the
    longest-unchanged first whatever their tenant, a flood of them took every batch until each had
    had its turn, and another tenant's run that lost its tick waited that long to be repaired.
    The turns are dealt over the ids alone, and a batch's runs read by id afterwards: dealt over
    whole rows (each with its workflow version's spec), a backlog of 200,000 runs spilled 120 MB
    to disk and took 0.75 s at every batch of a pass, where the ids take a tenth of that."""
    return in_tenant_turns(WorkflowRun.all_tenants.exclude(status__in=WorkflowRun.TERMINAL)
                           .filter(updated_at__lt=cutoff), "updated_at").values_list("pk", flat=True)


def _repair_run(run: WorkflowRun, now: datetime) -> None:
    with tenant_context(run.tenant), transaction.atomic():
        enqueue_tick(run)
        _repair_run_timeout(run, now)
        by_id = {n["id"]: n for n in nodes_of(run)}
        for step in StepRun.objects.filter(run=run, status__in=ACTIVE):
            _repair_step(step, run, by_id.get(step.node_id, {}), now)
        WorkflowRun.objects.filter(pk=run.pk).update(updated_at=timezone.now())


def _repair_run_timeout(run: WorkflowRun, now: datetime) -> None:
    """Arm the wake-up of ``run``'s own ``timeout_s``, if its spec has one and its first tick armed it
    (it started), due at its start plus ``timeout_s``: the wake-up counts a retry's rest itself
    (``tick.run_timeout``)."""
    timeout_s = spec_of(run).get("timeout_s")
    if timeout_s and run.started_at is not None:
        deadline = run.started_at + timedelta(seconds=float(timeout_s))
        wakeup_on_commit(str(run.pk), kind=RUN_TIMEOUT, delay_s=max(0.0, (deadline - now).total_seconds()))


def _ticks_pending(runs: list[WorkflowRun]) -> set[Any]:
    """The ids of the ``runs`` whose tick item is waiting or in flight: one Redis round trip."""
    found = fair_queue.pending([(run.tenant, tick_item_id(run.pk)) for run in runs])
    return {run.pk for run, pending in zip(runs, found, strict=True) if pending}


def _repair_step(step: StepRun, run: WorkflowRun, node: dict[str, Any], now: datetime) -> None:
    def due_in(moment: datetime | None) -> float:
        return max(0.0, ((moment or now) - now).total_seconds())

    if step.status in (SStatus.QUEUED, SStatus.RUNNING):
        # A running step's item may be gone with its worker and the queue (a crash and a flush).
        enqueue_step(step, run)
    if (step.status == SStatus.RUNNING or waits_for_child(step)) and node.get("timeout_s") and step.started_at:
        deadline = step.started_at + timedelta(seconds=float(node["timeout_s"]))
        wakeup_on_commit(str(step.id), kind="step_timeout", delay_s=due_in(deadline))
    heartbeat_s = heartbeat_s_of(step) if step.node_type == TASK else 0.0
    if step.status == SStatus.RUNNING and heartbeat_s and step.heartbeat_at:
        # Its first heartbeat armed it; the later ones count on it.
        beat_due = step.heartbeat_at + timedelta(seconds=heartbeat_s)
        wakeup_on_commit(str(step.id), kind="heartbeat_due", delay_s=due_in(beat_due))
    if step.status == SStatus.WAITING and step.node_type == WAIT:
        repair_wait(step)
    if step.status == SStatus.SCHEDULED:
        kind = "sleep_done" if step.node_type == "sleep" else "step_retry"
        wakeup_on_commit(str(step.id), kind=kind, delay_s=due_in(step.scheduled_for))
