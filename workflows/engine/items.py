"""The engine's fair-queue items and timers, all sent once the surrounding transaction commits.

- A run's tick: item ``tick:<run id>``, partition ``run:<run id>``, in the run's
  tier (coalesced while one waits).
- A step attempt: item ``step:<step id>``, in the tier and partition of its
  routing decision (its own partition ``step:<step id>`` by default) and with
  its pool as the scope the dequeue admits, with the pool's current limits.
  An action's item (kind ``step``) runs on a Ductor worker; a task node's (kind
  ``task``, with the call its routing kept) is published by the dispatcher to
  the team's queue (``workflows.engine.task_nodes``).
- Timers (sleeps, retry backoffs, step timeouts): coordinator wake-ups.

A run's items are ordered among its tenant's by the run's start (``order_ms``):
a tenant's older runs go first, so a backlog of new runs' first ticks does not
hold up the steps of the runs already ticked. They carry the run's fairness key
(a step: its routing decision's, if a rule set one), the fair queue's second
level inside the tenant.

Each carries the trace context of whatever enqueued it, taken when it is
enqueued (``ductor_project.core.tracing``; nothing while tracing is off).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import transaction

from ductor_project.core import tracing
from ductor_project.core.context import current_tenant, tenant_context
from scheduling import admission, fair_queue
from scheduling.coordinator.wakeups import schedule_wakeup
from scheduling.routing_table import routing_table
from tenants.entitlements import effective_entitlements
from workflows.engine import brokers
from workflows.models import StepRun, WorkflowRun

TICK = "tick"
STEP = "step"
TASK = "task"
# The wake-up that ends a run asked to cancel (``tick.run_cancel``).
RUN_CANCEL = "run_cancel"


def tick_item_id(run_id: Any) -> str:
    return f"tick:{run_id}"


def step_item_id(step_id: Any) -> str:
    return f"step:{step_id}"


def run_order_ms(run: WorkflowRun) -> float | None:
    """The order key of ``run``'s items in the fair queue: when it was started (Unix ms, to the µs,
    so that the runs of one bulk start keep their order)."""
    return run.created_at.timestamp() * 1000 if run.created_at else None


def queue_tier(tier: str) -> str:
    """The tier an item of the tenant in context asked for ``tier`` goes in (``Entitlements.queue_tier``):
    a run whose plan has lost its tier since it started still ticks, so it can be cancelled, end its
    waits and fail the steps its routing now refuses."""
    return effective_entitlements(current_tenant()).queue_tier(tier)


def enqueue_tick(run: WorkflowRun) -> None:
    """Enqueue a tick of ``run`` once the surrounding transaction commits (coalesced if one waits)."""
    enqueue_ticks([run])


def enqueue_ticks(runs: list[WorkflowRun]) -> None:
    """Enqueue a tick of each of ``runs`` (the tenant's in context) once the surrounding transaction
    commits: in one call (``enqueue_soon``: a round trip per ``ITEMS_PER_CALL`` items, not one each;
    on a worker, in its next handoff's)."""
    # The trace context now, not at the commit: the span of what enqueues it may have ended by then.
    ticks = [fair_queue.NewItem(tick_item_id(run.id), run.tier, f"run:{run.id}",
                                tracing.inject({"kind": TICK, "run_id": str(run.id)}), order_ms=run_order_ms(run),
                                key=run.fairness_key)
             for run in runs]
    if ticks:
        # The tier at the commit, as the enqueue reads the plan: nothing of Redis before it.
        transaction.on_commit(lambda: fair_queue.enqueue_soon(
            [dataclasses.replace(tick, tier=queue_tier(tick.tier)) for tick in ticks]))


def cancel_on_commit(runs: list[WorkflowRun]) -> None:
    """End ``runs``, asked to cancel, once the surrounding transaction commits: a tick of each, and a
    wake-up of each (``RUN_CANCEL``), an item of the system tenant, which no limit of theirs holds
    up. A tick waits for one of its tenant's slots, and a tenant whose slots its running tasks hold
    (for as long as they run) would otherwise keep a cancelled run going, and its queued steps
    waiting, until one of them ends. Whichever comes first ends the run; the other changes nothing."""
    enqueue_ticks(runs)
    for run in runs:
        wakeup_on_commit(str(run.pk), kind=RUN_CANCEL, delay_s=0)


def enqueue_step(step: StepRun, run: WorkflowRun) -> None:
    """Enqueue ``step`` once the surrounding transaction commits, where its stored routing decision
    sends it: its tier (else the run's), its partition, and its pool, whose limits (and whose
    connections') the dequeue admits it by."""
    step_id, routing = str(step.id), step.routing or {}
    tier = routing.get("tier") or run.tier
    partition = routing.get("partition_key") or f"step:{step_id}"
    pool_id = (routing.get("pool") or {}).get("id")
    # The run, node, attempt and workflow only name the item in Celery's tools (task_events).
    payload: dict[str, Any] = {"kind": STEP, "step_id": step_id, "run_id": str(step.run_id), "node_id": step.node_id,
                               "attempt": step.attempt, "workflow": run.workflow_name}
    if step.node_type == TASK:
        payload = {"kind": TASK, "step_id": step_id, "workflow": run.workflow_name, **(routing.get("task") or {})}
    tracing.inject(payload)
    order_ms, key = run_order_ms(run), routing.get("fairness_key") or run.fairness_key

    def push() -> None:
        table = routing_table()
        pool = table.pool_by_id(pool_id) if pool_id else None  # None: deleted since it was routed
        scope, scopes = (pool.id, admission.scope_confs(pool, table)) if pool else (None, {})
        if pool is None and payload["kind"] == TASK:
            # No pool: the catalog queue's own scope, when its slots are shared.
            scope, scopes = admission.queue_scope(str(payload.get("queue") or "")) or (None, {})
        item = fair_queue.NewItem(step_item_id(step_id), queue_tier(tier), partition, payload, scope=scope,
                                  order_ms=order_ms, key=key)
        fair_queue.enqueue_soon([item], scopes=scopes)  # on a worker, with its next handoff

    transaction.on_commit(push)


def release_on_commit(step: StepRun) -> None:
    """The step ended before its item did: withdraw the item if it waits, and, for a task node's
    (whose item is held while the team's worker runs it, not by a Ductor worker), end its lease,
    freeing its slots, and revoke its messages, so that a worker that has not started the task
    does not (``brokers.revoke``); a worker that runs it, as its heartbeats named it, is told
    (``brokers.tell_ended``). Once the surrounding transaction commits."""
    tenant, item_id, held = current_tenant(), step_item_id(step.id), step.node_type == TASK
    sent = held and step.started_at is not None  # a task step starts as its message is published
    # The connection its messages went through, and the worker that runs it (its trace is read for a
    # sent task's alone).
    connection = brokers.sent_through(step) if sent else ""
    worker = str((step.routing or {}).get("worker") or "") if sent else ""

    def release() -> None:
        with tenant_context(tenant):
            fair_queue.remove(item_id)
            if held:
                fair_queue.ack(item_id)
            if sent:
                brokers.revoke(step, connection)
            if worker:
                brokers.tell_ended(step, connection, worker)

    transaction.on_commit(release)


def wakeup_on_commit(ref: str, *, kind: str, delay_s: float) -> None:
    """Schedule a coordinator wake-up for the tenant in context once the transaction commits."""
    tenant = current_tenant()
    transaction.on_commit(tracing.bound(lambda: schedule_wakeup(tenant, ref, kind=kind, delay_s=delay_s)))
