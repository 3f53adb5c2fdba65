"""The engine's wake-ups: a retry's backoff ended, a sleep ended, a step ran past its timeout, a
task step's heartbeat is due.

Each runs in the owning tenant's context (``scheduling.coordinator.wakeups``),
takes the run's row lock and then the step's (the order a tick takes them in),
and acts only if the step is still where the timer expects it and its run goes
on: a late or duplicate wake-up, or one of a run asked to cancel, changes
nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from ductor_project.core.context import current_tenant
from ductor_project.core.errors import StepErrorCode
from scheduling import circuit
from workflows.engine.attempts import Outcome, cancel_child, finish, node_of, refuse, waits_for_child
from workflows.engine.events import record_event
from workflows.engine.heartbeats import heartbeat_s_of
from workflows.engine.items import TASK, enqueue_step, enqueue_tick, release_on_commit, wakeup_on_commit
from workflows.engine.nodes import task_refusal
from workflows.engine.statements import chain_end
from workflows.models import StepRun, WorkflowRun

SStatus = StepRun.Status
# A sleep woken this close to its end is over (timers fire a few ms early or late).
SLEEP_SLACK = timedelta(milliseconds=50)


def _with_step(step_id: str, fn: Callable[[StepRun, WorkflowRun], None]) -> None:
    with transaction.atomic():
        run_id = StepRun.objects.filter(pk=step_id).values_list("run_id", flat=True).first()
        if run_id is None:
            return
        # The run row first, then the step: the order a tick takes them in.
        run = WorkflowRun.objects.select_for_update().filter(pk=run_id).first()
        step = StepRun.objects.select_for_update().filter(pk=step_id).first()
        if run is None or step is None or run.is_terminal or run.cancel_requested:
            return  # a run asked to cancel ends its steps as it ends: its cancel does not wait for them
        fn(step, run)


def retry_due(ref: str, data: dict[str, Any]) -> None:
    """A retry's backoff ended: its attempt goes to the queue, as its routing decision says."""

    def go(step: StepRun, run: WorkflowRun) -> None:
        if step.status != SStatus.SCHEDULED:
            return
        if step.routing is not None and not step.routing.get("allowed", True):
            refuse(run, step, StepErrorCode.ROUTING_DENIED, str(step.routing.get("reason", "")))
            enqueue_tick(run)
            return
        if step.node_type == TASK:
            refusal = task_refusal(node_of(run, step.node_id), step.input)
            if refusal is not None:  # the catalog changed since the first attempt
                refuse(run, step, refusal)
                enqueue_tick(run)
                return
        step.status = SStatus.QUEUED
        StepRun.objects.filter(pk=step.pk).update(status=step.status)
        enqueue_step(step, run)

    _with_step(ref, go)


def sleep_done(ref: str, data: dict[str, Any]) -> None:
    """A sleep ended (or a wake-up came early: it is scheduled again for the rest)."""

    def go(step: StepRun, run: WorkflowRun) -> None:
        if step.status != SStatus.SCHEDULED:
            return
        if step.scheduled_for and step.scheduled_for > timezone.now() + SLEEP_SLACK:
            wakeup_on_commit(ref, kind="sleep_done", delay_s=(step.scheduled_for - timezone.now()).total_seconds())
            return
        until = step.scheduled_for.isoformat() if step.scheduled_for else None
        finish(step, Outcome.succeeded({"slept_until": until}))
        record_event(run, "step_succeeded", step.node_id, attempt=step.attempt, error=None)
        enqueue_tick(run)

    _with_step(ref, go)


def step_timeout(ref: str, data: dict[str, Any]) -> None:
    """A running step passed its ``timeout_s``: it fails as retryable (``data["message"]`` says why,
    when the caller knows more); its late result is discarded.
    A task node's item is released too: its slots were held for the team's worker, which may have
    died with the task; and the timeout counts against its celery connection's breaker. A
    ``subworkflow`` step waiting for its child fails for good, and the child is asked to cancel;
    unless the child (the last run of its chain) ended meanwhile: the run's tick takes its end."""

    def go(step: StepRun, run: WorkflowRun) -> None:
        if step.status != SStatus.RUNNING and not waits_for_child(step):
            return
        left = _timeout_left(step, run)
        if left > SLEEP_SLACK.total_seconds():
            # The attempt began again since this timer was set (delivered again after its lease, its
            # clock starts anew), and the new timer was coalesced with this one: wait for the rest.
            wakeup_on_commit(ref, kind="step_timeout", delay_s=left)
            return
        if waits_for_child(step):
            final = chain_end(step.child_run_id)
            if final is not None and final.is_terminal:  # it ended first: its end wakes the run, which takes it
                enqueue_tick(run)
                return
            _time_out(step, run, f"child run {step.child_run_id} went on past the node's timeout_s: it is cancelled")
        else:
            _time_out(step, run, str(data.get("message") or "the step ran past its timeout_s"))

    _with_step(ref, go)


def heartbeat_due(ref: str, data: dict[str, Any]) -> None:
    """A running task step's heartbeat is due (``heartbeats``): it times out when none came within its
    ``heartbeat_s`` of the last one; otherwise this wakes again when the next one is due."""

    def go(step: StepRun, run: WorkflowRun) -> None:
        heartbeat_s = heartbeat_s_of(step)
        if step.status != SStatus.RUNNING or step.heartbeat_at is None or not heartbeat_s:
            return
        left = (step.heartbeat_at + timedelta(seconds=heartbeat_s) - timezone.now()).total_seconds()
        if left > SLEEP_SLACK.total_seconds():
            wakeup_on_commit(ref, kind="heartbeat_due", delay_s=left)
            return
        _time_out(step, run, f"no heartbeat from the task within its heartbeat_s of {heartbeat_s:g} s (the last "
                             f"came at {step.heartbeat_at.isoformat()}): its worker died with it, or it is stuck")

    _with_step(ref, go)


def _time_out(step: StepRun, run: WorkflowRun, message: str) -> None:
    """``step`` failed as retryable with a timeout, saying ``message``; a task node's item is released
    and its connection's breaker fed. A step waiting for its child fails not retryable (a sub-workflow
    node is not tried again: ``tick._retry_failed`` would enqueue it as an action), its child cancelled."""
    child = step.child_run_id if waits_for_child(step) else None
    finish(step, Outcome.failed(StepErrorCode.TIMEOUT, message, retryable=child is None))
    record_event(run, "step_timed_out", step.node_id, attempt=step.attempt)
    if child is not None:
        cancel_child(child)
    if step.node_type == TASK:
        release_on_commit(step)
        _breaker_failure_on_commit(step)
    enqueue_tick(run)


def _breaker_failure_on_commit(step: StepRun) -> None:
    """A task step that timed out had no answer from the worker group its message went to: a
    failure of the celery connection its trace names (the one its first message was sent through),
    as a retryable exception of the task is (``task_nodes``), once the timeout is kept. So a
    connection whose workers are gone (or stuck) opens its breaker, and a ``failover`` pool sends
    the retries to its next member. A task sent through no connection feeds no breaker."""
    connection = ((step.routing or {}).get("connection") or {}).get("id")
    if connection:
        tenant = current_tenant()
        transaction.on_commit(lambda: circuit.record_failure(connection, tenant=tenant))


def _timeout_left(step: StepRun, run: WorkflowRun) -> float:
    """Seconds left before an action step's attempt passes its node's ``timeout_s``, counted from
    the attempt's (latest) start; 0 when none is left or none is known. A task node's timeout is its
    item's lease, which its publisher checks (``task_nodes``): 0."""
    if step.node_type == TASK or step.started_at is None:
        return 0.0
    timeout_s = node_of(run, step.node_id).get("timeout_s")
    if not timeout_s:
        return 0.0
    deadline = step.started_at + timedelta(seconds=float(timeout_s))
    return max(0.0, (deadline - timezone.now()).total_seconds())


# kind -> wake-up, registered with the coordinator by the workflows app.
WAKEUPS: dict[str, Callable[[str, dict[str, Any]], None]] = {
    "step_retry": retry_due,
    "sleep_done": sleep_done,
    "step_timeout": step_timeout,
    "heartbeat_due": heartbeat_due,
}
