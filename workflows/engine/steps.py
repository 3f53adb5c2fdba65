"""A step attempt on a worker: run its action, record its ``Outcome``, tick its run.

The fair queue admitted the item before handing it out: the tenant's slot and
rate, its pool's, and the connection its admission chose (``ctx.connection_id``),
all leased like the item and renewed with it while the action runs. So the
worker runs the action at once, without routing again, and records which
connection the attempt uses and why on the attempt's routing trace. A
duplicate or stale delivery, or an attempt cancelled or timed out meanwhile,
does nothing; a result that arrives after that is discarded. An attempt that
failed is reported to the item's Celery task (``Failed``), which Celery's tools
then show failed.

The path is short on purpose (``docs/performance.md``): the attempt is started by
one conditional ``UPDATE ... RETURNING``, which also reads its run's version (the
spec comes from the process's cache); its outcome is one transaction that locks
the run by touching it, finishes the attempt by another conditional ``UPDATE``
and reads the run's attempts, in one round trip (``statements``), then ticks the
run in a savepoint, whose writes go in one more (``journal``).
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from ductor_project.core import metrics
from ductor_project.core.context import current_tenant
from ductor_project.core.errors import StepErrorCode
from scheduling.action_errors import ActionError
from scheduling.coordinator.wakeups import schedule_wakeup
from scheduling.dispatch.handlers import Failed, ItemContext
from scheduling.models import Connection
from scheduling.routing_table import routing_table
from tenants.entitlements import effective_entitlements
from workflows.actions import ActionCall, get_action, is_registered
from workflows.engine.attempts import (
    Outcome,
    latest_of,
    node_in,
    outcome_fields,
    payload_refusal,
    version_spec,
)
from workflows.engine.events import jsonable, record_event
from workflows.engine.items import enqueue_tick
from workflows.engine.journal import journal
from workflows.engine.statements import ON_WORKER, Started, lock_and_finish, start_attempt
from workflows.engine.tick import advance_locked
from workflows.engine.timers import step_timeout
from workflows.models import StepRun, WorkflowRun

log = structlog.get_logger(__name__)

SStatus = StepRun.Status


class ActionNotRegistered(LookupError):
    """A step's action is not registered in the worker that took it: its item is delivered again."""


def execute_step(ctx: ItemContext, body: dict[str, Any]) -> Failed | None:
    """The ``step`` item handler: run one action attempt; an attempt that failed is reported
    (``Failed``: Celery's tools show its task failed). A duplicate or stale delivery does nothing."""
    with structlog.contextvars.bound_contextvars(step_id=str(body["step_id"])):
        return _execute(str(body["step_id"]), ctx)


def _execute(step_id: str, ctx: ItemContext) -> Failed | None:
    step = start_attempt(step_id, admission_trace(ctx.connection_id, ctx.admitted))
    if step is None:
        _cancel_if_run_ended(step_id)
        return None
    node = node_in(version_spec(step.version_id), step.node_id)
    if not is_registered(node["action"]):
        # This worker lacks the action's code (a module left out of DUCTOR_ACTION_MODULES, a deploy
        # half done): the step is not failed for it. The item is delivered again after its backoff,
        # to whichever worker takes it then, as a raising handler's is.
        log.error("action_not_registered", action=node["action"], step_id=step_id, run_id=str(step.run_id))
        raise ActionNotRegistered(f"action '{node['action']}' is not registered in this worker "
                                  f"(DUCTOR_ACTION_MODULES): its step is delivered again")
    # Bound for this step only: a plain bind would leak into the next task of the worker process.
    with structlog.contextvars.bound_contextvars(run_id=str(step.run_id), node_id=step.node_id):
        deadline = None
        if node.get("timeout_s"):
            deadline = time.monotonic() + float(node["timeout_s"])
            schedule_wakeup(current_tenant(), str(step.id), kind="step_timeout", delay_s=float(node["timeout_s"]))
        outcome = _call_action(node["action"], step, ctx.connection_id, str(step.run_id))
        if deadline is not None and time.monotonic() >= deadline:
            # Past its timeout: the attempt times out whether or not its timer has fired yet (it
            # waits for a worker slot like any item, and all of them may be busy), so its result
            # is discarded, as it would have been had the timer come first.
            step_timeout(str(step.id), {})
        _keep(step, outcome)
    return _failed(step, outcome)


def _failed(step: Started, outcome: Outcome) -> Failed | None:
    """What the item's task reports of an attempt that failed (its node, number and error)."""
    if outcome.status != SStatus.FAILED:
        return None
    error = outcome.error or {}
    return Failed(f"{step.node_id} attempt {step.attempt}: {error.get('code')}: {error.get('message')}"[:500])


def _cancel_if_run_ended(step_id: str) -> None:
    """The attempt did not start: cancel it if its run ended or is cancelled (a duplicate or a
    stale delivery, or an attempt that moved on, is left as it is)."""
    ended = Q(run__status__in=WorkflowRun.TERMINAL) | Q(run__cancel_requested=True)
    StepRun.objects.filter(ended, pk=step_id, status__in=ON_WORKER).update(
        status=SStatus.CANCELLED, finished_at=timezone.now()
    )


def _keep(step: Started, outcome: Outcome) -> None:
    """Record the outcome of an action that ran. Should the database connection have been lost
    meanwhile (a terminated backend, a failover), it is recorded once more on a new one, rather
    than the item put back and the action run again."""
    try:
        record_outcome(step.id, step.run_id, outcome)
    except (OperationalError, InterfaceError):
        if connection.in_atomic_block:
            raise
        log.warning("step_outcome_reconnecting", step_id=str(step.id), run_id=str(step.run_id))
        connection.close()
        # The lost connection may have taken only the COMMIT's answer: ``again`` finds it kept then.
        record_outcome(step.id, step.run_id, outcome, again=True)


def admission_trace(connection_id: str, admitted: str) -> dict[str, Any]:
    """What an attempt's admission chose (the connection, and why), as its routing trace takes it:
    added to the trace by the statement that starts or ends the attempt."""
    added: dict[str, Any] = {}
    if connection_id:
        added["connection"] = {"id": connection_id, "name": routing_table().connection_name(connection_id)}
    if admitted:
        added["admitted"] = admitted
    return added


def record_outcome(step_id: Any, run_id: Any, outcome: Outcome, *,
                   admission: tuple[str, str] | None = None, again: bool = False, worker: str = "") -> None:
    """Finish the step with ``outcome`` and tick its run in the same transaction, unless the step
    has moved on meanwhile (cancelled, timed out), or its run was asked to cancel: then the
    outcome is discarded, which the run's history records (and the run, asked to cancel, is
    cancelled in this transaction, the step with it). ``admission`` (the connection its admission
    chose, and why), when given, and ``worker`` (the Celery worker that ran a task node's task, as
    its outcome names it), go on the step's routing trace in the same ``UPDATE``. ``again``: this outcome's recording is
    made once more after its connection was lost, so that a step found ended with this very
    outcome was ended by the first try, whose commit went through: nothing is recorded twice.

    In a transaction of its own, the tick's writes travel with the ``COMMIT`` (two round trips in
    all: the outcome's batch, then the writes and the commit). Should one of them fail, nothing
    was written: the outcome is recorded again alone, and its run ticked through the queue."""
    added = {**(admission_trace(*admission) if admission else {}), **({"worker": worker} if worker else {})}
    if connection.in_atomic_block:  # the caller's transaction: its writes go in a batch of their own
        _record_outcome(step_id, run_id, outcome, added, with_commit=False, again=again)
        return
    try:
        _record_outcome(step_id, run_id, outcome, added, with_commit=True, again=again)
    except (OperationalError, InterfaceError):
        raise  # the connection may be lost: the caller decides (``_keep`` records it on a new one)
    except DatabaseError:
        log.exception("outcome_commit_failed", step_id=str(step_id), run_id=str(run_id))
        _record_outcome(step_id, run_id, outcome, added, with_commit=False, tick=False, again=again)


def _record_outcome(step_id: Any, run_id: Any, outcome: Outcome, added: dict[str, Any], *,
                    with_commit: bool, tick: bool = True, again: bool = False) -> None:
    with transaction.atomic(), journal(with_commit=with_commit):
        # The run row first, then the step: the order a tick takes them in (no deadlock with it).
        run, finished, attempts = lock_and_finish(run_id, step_id, outcome_fields(outcome), added or None)
        if run is None:
            return
        if finished is None:
            _discard(run, step_id, outcome, again=again)
            if run.cancel_requested and not run.is_terminal and tick:
                advance_locked(run, latest=latest_of(attempts))  # the cancel ends it now, this step with it
            return
        error = outcome.error or {}
        record_event(run, f"step_{outcome.status}", finished[0], attempt=finished[1],
                     error=error.get("code") if error else None)
        _observe(attempts, finished, outcome.status)
        if tick:
            advance_locked(run, latest=latest_of(attempts))
        else:
            enqueue_tick(run)


def _discard(run: WorkflowRun, step_id: Any, outcome: Outcome, *, again: bool) -> None:
    """The outcome of an attempt that moved on (cancelled, timed out, or ended by another delivery
    of it) changes nothing; the run's history records that it came. Unless ``again`` finds the
    attempt ended with this very outcome: it was kept by the first try."""
    found = StepRun.objects.filter(pk=step_id, run_id=run.pk).values_list(
        "node_id", "attempt", "status", "output", "error").first()
    if found is None:
        return
    node_id, attempt, status, output, error = found
    # Named here: a task node's outcome comes on a results worker, where no binding names its run.
    if again and (status, output, error) == (outcome.status, outcome.output, outcome.error):
        log.info("step_outcome_kept_already", step_id=str(step_id), run_id=str(run.pk))
        return
    log.info("step_result_discarded", step_id=str(step_id), run_id=str(run.pk))
    # What came, for the history: its output (held to the plan's payload limit, as any output) or error.
    came = {"output": outcome.output} if outcome.status == SStatus.SUCCEEDED else {"error": outcome.error}
    record_event(run, "step_result_discarded", node_id, attempt=attempt, result=outcome.status, **came)


def _observe(attempts: list[StepRun], finished: tuple[str, int], status: str) -> None:
    """The ended attempt's run time into ``metrics.STEP_DURATION`` (read from the attempts the
    outcome's statement returned: no query more)."""
    node_id, number = finished
    step = next((s for s in attempts if s.node_id == node_id and s.attempt == number), None)
    if step is not None and step.started_at is not None and step.finished_at is not None:
        metrics.STEP_DURATION.labels(step.node_type, status).observe(
            max(0.0, (step.finished_at - step.started_at).total_seconds()))


def _call_action(name: str, step: Started, connection_id: str, run_id: str) -> Outcome:
    connection = Connection.objects.filter(pk=connection_id).first() if connection_id else None
    call = ActionCall(input=step.input, connection=connection, attempt=step.attempt,
                      idempotency_key=f"{run_id}:{step.node_id}:{step.attempt}")
    # The plan's payload limit is read before the action runs, outside the errors that are the
    # action's: with Redis away, the read raises, the item fails and is delivered again, where
    # inside them it failed the step for good as ``action_crashed``.
    max_bytes = effective_entitlements(current_tenant()).max_payload_bytes
    try:
        output = get_action(name)(call)
        # An output over the plan's payload limit fails the step: a retry would return it again.
        return payload_refusal(output, "output", max_bytes=max_bytes) or Outcome.succeeded(jsonable(output))
    except ActionError as exc:
        return Outcome.from_error(exc.describe())
    except Exception as exc:  # an action's own bug fails the step, never the worker
        log.exception("action_crashed", action=name)
        return Outcome.failed(StepErrorCode.ACTION_CRASHED, str(exc)[:500])
