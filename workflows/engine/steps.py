"""A step attempt on a worker: run its action, record its ``Outcome``, tick its run.

The fair queue admitted the item before handing it out: the tenant's slot and
rate, its pool's, and the connection its admission chose (``ctx.connection_id``),
all leased like the item and renewed with it while the action runs. So the
worker runs the action at once, without routing again, and records which
connection the attempt uses and why on the attempt's routing trace. A
duplicate or stale delivery, or an attempt cancelled or timed out meanwhile,
does nothing; a result that arrives after that is discarded.
"""

from __future__ import annotations

from typing import Any

import structlog
from django.db import InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from ductor_project.core.context import current_tenant
from ductor_project.core.errors import StepErrorCode
from scheduling.action_errors import ActionError
from scheduling.coordinator.wakeups import schedule_wakeup
from scheduling.dispatch.handlers import ItemContext
from scheduling.models import Connection
from scheduling.routing_table import routing_table
from workflows.actions import ActionCall, get_action
from workflows.engine.attempts import ON_WORKER, Outcome, finish, node_of, payload_refusal
from workflows.engine.events import jsonable, record_event
from workflows.engine.tick import tick_now
from workflows.models import StepRun, WorkflowRun

log = structlog.get_logger(__name__)

SStatus = StepRun.Status


def execute_step(ctx: ItemContext, body: dict[str, Any]) -> None:
    """The ``step`` item handler: run one action attempt. A duplicate or stale delivery does nothing."""
    with structlog.contextvars.bound_contextvars(step_id=str(body["step_id"])):
        _execute(str(body["step_id"]), ctx)


def _execute(step_id: str, ctx: ItemContext) -> None:
    # A plain read, no lock: every write below is conditional on the step's status (one round
    # trip each, on the start path of every step).
    step = StepRun.objects.select_related("run", "run__workflow").filter(pk=step_id).first()
    if step is None or step.status not in ON_WORKER:
        return
    run = step.run
    if run.is_terminal or run.cancel_requested:
        StepRun.objects.filter(pk=step.pk, status__in=ON_WORKER).update(
            status=SStatus.CANCELLED, finished_at=timezone.now()
        )
        return
    node = node_of(run, step.node_id)
    # Bound for this step only: a plain bind would leak into the next task of the worker process.
    with structlog.contextvars.bound_contextvars(run_id=str(run.id), node_id=step.node_id):
        if _start(step, ctx):
            if node.get("timeout_s"):
                schedule_wakeup(current_tenant(), str(step.id), kind="step_timeout", delay_s=float(node["timeout_s"]))
            _keep(step, run, _call_action(node["action"], step, ctx.connection_id, str(run.id)))


def _keep(step: StepRun, run: WorkflowRun, outcome: Outcome) -> None:
    """Record the outcome of an action that ran. Should the database connection have been lost
    meanwhile (a terminated backend, a failover), it is recorded once more on a new one, rather
    than the item put back and the action run again."""
    try:
        record_outcome(step.id, run.pk, outcome)
    except (OperationalError, InterfaceError):
        if connection.in_atomic_block:
            raise
        log.warning("step_outcome_reconnecting", step_id=str(step.id))
        connection.close()
        record_outcome(step.id, run.pk, outcome)


def admitted_routing(routing: dict[str, Any] | None, connection_id: str, admitted: str) -> dict[str, Any]:
    """A step's routing trace with what its admission chose: the connection, and why."""
    routing = dict(routing or {})
    if connection_id:
        routing["connection"] = {"id": connection_id, "name": routing_table().connection_name(connection_id)}
    if admitted:
        routing["admitted"] = admitted
    return routing


def _start(step: StepRun, ctx: ItemContext) -> bool:
    """Mark the attempt running, with the connection its admission chose on its trace. False when
    it was cancelled or timed out since it was read: the action must not be called."""
    routing = admitted_routing(step.routing, ctx.connection_id, ctx.admitted)
    return bool(StepRun.objects.filter(pk=step.id, status__in=ON_WORKER).update(
        status=SStatus.RUNNING, started_at=timezone.now(), routing=routing
    ))


def record_outcome(step_id: Any, run_id: Any, outcome: Outcome, *,
                   admission: tuple[str, str] | None = None) -> None:
    """Finish the step with ``outcome`` and tick its run in the same transaction, unless the step
    has moved on meanwhile (cancelled, timed out): then the outcome is discarded, which the run's
    history records. ``admission`` (the connection its admission chose, and why), when given, goes
    on the step's routing trace in the same ``UPDATE``."""
    with transaction.atomic():
        # The run row first, then the step: the order a tick takes them in (no deadlock with it).
        run = WorkflowRun.objects.select_for_update().filter(pk=run_id).first()
        locked = StepRun.objects.select_for_update().filter(pk=step_id, run_id=run_id).first()
        if run is None or locked is None:
            return
        if locked.status not in ON_WORKER:
            log.info("step_result_discarded", step_id=str(step_id))
            record_event(run, "step_result_discarded", locked.node_id, attempt=locked.attempt,
                         result=outcome.status)
            return
        routing = admitted_routing(locked.routing, *admission) if admission else None
        finish(locked, outcome, routing=routing)
        error = outcome.error or {}
        record_event(run, f"step_{outcome.status}", locked.node_id, attempt=locked.attempt,
                     error=error.get("code") if error else None)
        tick_now(run)


def _call_action(name: str, step: StepRun, connection_id: str, run_id: str) -> Outcome:
    connection = Connection.objects.filter(pk=connection_id).first() if connection_id else None
    call = ActionCall(input=step.input, connection=connection, attempt=step.attempt,
                      idempotency_key=f"{run_id}:{step.node_id}:{step.attempt}")
    try:
        output = get_action(name)(call)
        # An output over the plan's payload limit fails the step: a retry would return it again.
        return payload_refusal(output, "output") or Outcome.succeeded(jsonable(output))
    except ActionError as exc:
        return Outcome.from_error(exc.describe())
    except Exception as exc:  # an action's own bug fails the step, never the worker
        log.exception("action_crashed", action=name)
        return Outcome.failed(StepErrorCode.ACTION_CRASHED, str(exc)[:500])
