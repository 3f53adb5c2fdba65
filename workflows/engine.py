"""The tick engine: a run advances in idempotent ticks, under its tenant's context.

A **tick** loads the run with a row lock, applies what happened since the last
tick (finished steps, finished child runs, timers), starts the nodes that are
ready, and finishes the run when nothing is left. Every decision is derived
from the rows, so a duplicate tick changes nothing. A run's ticks share one
fair-queue partition (``run:<id>``), so they never overlap.

Nodes start as follows:
- ``action``: routed (``scheduling.routing.route``), recorded as a queued
  ``StepRun`` with its decision trace, and enqueued in the fair queue as a
  ``step`` item, in the tier and partition the routing gave it (its retries
  keep them); a worker runs it (``execute_step``) after admitting it through
  the pool and connection limits, and waits (the item is put back) while they
  are full; the step's slots are renewed while its action runs;
- ``sleep``, retry backoffs and step timeouts: coordinator wake-ups;
- ``subworkflow``: a child run (refused past the plan's ``max_nesting_depth``
  or the monthly run quota, which it is charged to);
- ``continue_as_new``: a successor run, charged to the monthly run quota; this
  run ends as ``continued`` and its other active steps are cancelled.

Rows are written in the transaction of the state change; fair-queue items are
enqueued on commit. A run's first tick (after its start commits) and the tick
after a step's outcome (in the transaction that records it, which holds the
run's row lock already) run at once in the same process (``tick_now``), not
through the queue; other ticks (timers, children, cancellation) are enqueued.
The coordinator's reconciler re-enqueues ticks of active runs that stopped
moving, so a crash between commit and enqueue loses nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import structlog
from django.conf import settings
from django.db import transaction
from django.db.models import F, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ductor_project.core import capacity
from ductor_project.core.context import current_tenant, tenant_context
from ductor_project.core.errors import ErrorCode
from scheduling import fair_queue
from scheduling.action_errors import ActionError
from scheduling.coordinator.reconcile import register_reconciler
from scheduling.coordinator.wakeups import register_wakeup, schedule_wakeup
from scheduling.dispatch.delivery import RetryLater
from scheduling.dispatch.handlers import ItemContext, register_handler
from scheduling.routing import admit, release, route
from scheduling.rules import Step
from tenants.entitlements import effective_entitlements
from tenants.models import Tenant
from tenants.usage import QuotaExceeded, quota_consume
from workflows import templates
from workflows.actions import ActionCall, get_action
from workflows.models import RunEvent, StepRun, WorkflowRun, WorkflowVersion
from workflows.spec import backoff_delay

log = structlog.get_logger(__name__)

Status = WorkflowRun.Status
SStatus = StepRun.Status
ACTIVE_STEP = frozenset({SStatus.SCHEDULED, SStatus.QUEUED, SStatus.RUNNING, SStatus.WAITING})
# The statuses of a step that a worker may (still) run.
ON_WORKER = (SStatus.QUEUED, SStatus.RUNNING)
STALE_RUN_S = 30.0
# Most stale runs one reconciler pass looks at (the longest-unchanged first).
RECONCILE_BATCH = 500
# How soon a step whose pool or connection is full is tried again.
BUSY_RETRY_S = 0.2


# -- fair-queue items -------------------------------------------------------------------------

def tick_item_id(run_id: Any) -> str:
    return f"tick:{run_id}"


def step_item_id(step_id: Any) -> str:
    return f"step:{step_id}"


def enqueue_tick(run: WorkflowRun) -> None:
    """Enqueue a tick of ``run`` once the surrounding transaction commits (coalesced if one waits)."""
    run_id, tier = str(run.id), run.tier

    def push() -> None:
        fair_queue.enqueue(tick_item_id(run_id), tier=tier, partition=f"run:{run_id}",
                           payload={"kind": "tick", "run_id": run_id})

    transaction.on_commit(push)


def tick_now(run: WorkflowRun) -> None:
    """Advance ``run`` at once, in this process, instead of through the queue: a hop saved.

    Inside a transaction that holds the run's row lock (a step recording its
    outcome), the tick runs in a savepoint of it and its writes commit with it.
    Should the tick fail, its writes are rolled back and the tick is enqueued.
    """
    try:
        tick(run.pk)
    except Exception:
        log.exception("inline_tick_failed", run_id=str(run.pk))
        enqueue_tick(run)


def _enqueue_step(step: StepRun, *, tier: str, partition: str | None) -> None:
    step_id = str(step.id)

    def push() -> None:
        fair_queue.enqueue(step_item_id(step_id), tier=tier, partition=partition or f"step:{step_id}",
                           payload={"kind": "step", "step_id": step_id})

    transaction.on_commit(push)


def _enqueue_routed(step: StepRun, run: WorkflowRun) -> None:
    """Enqueue ``step`` in the tier and partition of its stored routing decision (else the run's tier)."""
    routing = step.routing or {}
    _enqueue_step(step, tier=routing.get("tier") or run.tier, partition=routing.get("partition_key"))


# -- events -----------------------------------------------------------------------------------

def record_event(run: WorkflowRun, type_: str, node_id: str = "", **data: Any) -> None:
    """Append an event to the run's history (inside the caller's transaction, run row locked)."""
    # The next seq is computed inside the INSERT: one round trip (the run row lock orders writers).
    last = RunEvent.objects.filter(run=run).order_by("-seq").values("seq")[:1]
    RunEvent.objects.create(run=run, seq=Coalesce(Subquery(last), 0) + 1, type=type_, node_id=node_id,
                            data=_jsonable(data))
    log.info(f"run_{type_}", run_id=str(run.id), node_id=node_id or None)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


# -- the tick -----------------------------------------------------------------------------------

def _spec(run: WorkflowRun) -> dict[str, Any]:
    return dict(run.workflow.spec)


def _nodes(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("nodes", []))


def _on_commit_wakeup(ref: str, *, kind: str, delay_s: float) -> None:
    """Schedule a coordinator wake-up for the tenant in context once the transaction commits."""
    tenant = current_tenant()
    transaction.on_commit(lambda: schedule_wakeup(tenant, ref, kind=kind, delay_s=delay_s))


def _latest_steps(run: WorkflowRun) -> dict[str, StepRun]:
    latest: dict[str, StepRun] = {}
    for step in StepRun.objects.filter(run=run).order_by("node_id", "attempt"):
        latest[step.node_id] = step
    return latest


def _context(run: WorkflowRun, latest: dict[str, StepRun]) -> dict[str, Any]:
    return {
        "input": run.input,
        "nodes": {nid: {"output": s.output, "status": s.status} for nid, s in latest.items()},
        "run": {"id": str(run.id), "root_id": str(run.root_run_id)},
    }


def tick(run_id: Any) -> None:
    """Advance one run. Idempotent; runs in the run's tenant context with the run row locked."""
    with structlog.contextvars.bound_contextvars(run_id=str(run_id)), transaction.atomic():
        run = (
            WorkflowRun.objects.select_for_update(of=("self",))  # not the shared version row
            .select_related("workflow")
            .filter(pk=run_id)
            .first()
        )
        if run is None or run.is_terminal:
            return
        if run.cancel_requested:
            _cancel(run)
            return
        now = timezone.now()
        if run.status == Status.PENDING:
            run.status, run.started_at = Status.RUNNING, now
            record_event(run, "started")
        latest = _latest_steps(run)
        _apply_children(run, latest)
        _retry_failed(run, latest, now)
        if _start_ready(run, latest, now):
            return  # continued as new
        _finish_if_done(run, latest)
        run.lock_version = F("lock_version") + 1
        run.save()


def _retry_policy(node: dict[str, Any]) -> dict[str, Any]:
    retry = dict(node.get("retry") or {})
    retry.setdefault("max_attempts", 1)
    retry.setdefault("backoff_s", 1.0)
    retry.setdefault("max_backoff_s", 300.0)
    retry.setdefault("jitter", True)
    return retry


def _retry_failed(run: WorkflowRun, latest: dict[str, StepRun], now: datetime) -> None:
    nodes = {n["id"]: n for n in _nodes(_spec(run))}
    for node_id, step in list(latest.items()):
        if step.status != SStatus.FAILED or not (step.error or {}).get("retryable"):
            continue
        policy = _retry_policy(nodes[node_id])
        if step.attempt >= int(policy["max_attempts"]):
            continue
        delay = backoff_delay(policy, step.attempt)
        retry_after = (step.error or {}).get("retry_after_s")
        if isinstance(retry_after, int | float):
            delay = max(delay, float(retry_after))
        nxt = StepRun.objects.create(
            run=run, node_id=node_id, node_type=step.node_type, attempt=step.attempt + 1,
            status=SStatus.SCHEDULED, input=step.input, scheduled_for=now + timedelta(seconds=delay),
            routing=step.routing,  # the next attempt goes to the same tier and partition
        )
        latest[node_id] = nxt
        record_event(run, "step_retry_scheduled", node_id, attempt=nxt.attempt, delay_s=round(delay, 3))
        _on_commit_wakeup(str(nxt.id), kind="step_retry", delay_s=delay)


def _apply_children(run: WorkflowRun, latest: dict[str, StepRun]) -> None:
    for node_id, step in latest.items():
        if step.status != SStatus.WAITING or step.child_run_id is None:
            continue
        final = WorkflowRun.objects.filter(pk=step.child_run_id).first()
        while final is not None and final.status == Status.CONTINUED:
            final = WorkflowRun.objects.filter(continued_from=final).first()
        if final is None or not final.is_terminal:
            continue
        if final.status == Status.SUCCEEDED:
            _finish_step(step, SStatus.SUCCEEDED, output=final.output)
        else:
            error = {"code": f"child_{final.status}", "message": f"child run {final.id} {final.status}",
                     "child_error": final.error, "retryable": False}
            _finish_step(step, SStatus.FAILED, error=error)
        record_event(run, f"step_{step.status}", node_id, child_run=str(final.id))


def _finish_step(step: StepRun, status: str, *, output: Any = None, error: Any = None) -> None:
    step.status, step.output, step.error, step.finished_at = status, output, error, timezone.now()
    # A scoped UPDATE of the row (no foreign key changes): one round trip, where save() would
    # first re-check the tenant of the step's run.
    StepRun.objects.filter(pk=step.pk).update(status=status, output=output, error=error,
                                              finished_at=step.finished_at)


def _start_ready(run: WorkflowRun, latest: dict[str, StepRun], now: datetime) -> bool:
    """Start every node whose dependencies are done. Returns True if the run continued as new."""
    spec = _spec(run)
    progressed = True
    while progressed:  # skips can make more nodes ready within one tick
        progressed = False
        for node in _nodes(spec):
            if node["id"] in latest:
                continue
            deps = [latest.get(d) for d in node.get("depends_on", [])]
            if any(d is None or d.status not in StepRun.TERMINAL for d in deps):
                continue
            if any(d.status == SStatus.FAILED for d in deps if d is not None):
                continue  # the run is failing
            context = _context(run, latest)
            skip = any(d.status in (SStatus.SKIPPED, SStatus.CANCELLED) for d in deps if d is not None)
            if not skip and node.get("when") is not None and not templates.evaluate_when(node["when"], context):
                skip = True
            if skip:
                latest[node["id"]] = StepRun.objects.create(
                    run=run, node_id=node["id"], node_type=node["type"], status=SStatus.SKIPPED,
                    finished_at=now,
                )
                record_event(run, "step_skipped", node["id"])
                progressed = True
                continue
            if _start_node(run, node, latest, context, now):
                return True
            progressed = True
    return False


def _start_node(
    run: WorkflowRun, node: dict[str, Any], latest: dict[str, StepRun], context: dict[str, Any], now: datetime
) -> bool:
    kind = node["type"]
    node_id = node["id"]
    if kind == "action":
        rendered = templates.render(node.get("input", {}), context)
        decision = route(Step(workflow=run.workflow_name, action=node["action"], tags=tuple(node.get("tags", [])),
                              input=rendered, tier=run.tier, pool=node.get("pool")))
        step = StepRun.objects.create(run=run, node_id=node_id, node_type=kind, status=SStatus.QUEUED,
                                      input=rendered, routing=decision.trace())
        latest[node_id] = step
        if not decision.allowed and not decision.saturated:  # a busy pool is waited for, on a worker
            _refuse_step(run, step, "routing_denied", decision.reason)
            return False
        _enqueue_step(step, tier=decision.tier, partition=decision.partition_key)
        record_event(run, "step_queued", node_id, tier=decision.tier, rule=decision.trace()["rule"])
        return False
    if kind == "sleep":
        until = _sleep_until(node, now)
        step = StepRun.objects.create(run=run, node_id=node_id, node_type=kind, status=SStatus.SCHEDULED,
                                      scheduled_for=until)
        latest[node_id] = step
        delay = max(0.0, (until - now).total_seconds())
        record_event(run, "step_sleeping", node_id, until=until.isoformat())
        _on_commit_wakeup(str(step.id), kind="sleep_done", delay_s=delay)
        return False
    if kind == "subworkflow":
        latest[node_id] = _start_child(run, node, context)
        return False
    if kind == "continue_as_new":
        rendered = templates.render(node.get("input", {}), context)
        try:
            quota_consume(runs=1)
        except QuotaExceeded as exc:
            step = StepRun.objects.create(run=run, node_id=node_id, node_type=kind, status=SStatus.QUEUED,
                                          input=rendered)
            latest[node_id] = step
            _refuse_step(run, step, ErrorCode.QUOTA_EXCEEDED, f"no successor run started: {exc.detail}",
                         details=exc.details)
            return False  # the failed step fails the run
        _abort_active(run, latest, SStatus.CANCELLED)  # the other branches end with this run
        successor = WorkflowRun.objects.create(
            workflow=run.workflow, workflow_name=run.workflow_name, input=rendered, tier=run.tier,
            tags=run.tags, parent_run=run.parent_run, parent_node_id=run.parent_node_id,
            root_run_id=run.root_run_id, nesting_depth=run.nesting_depth, continued_from=run,
        )
        latest[node_id] = StepRun.objects.create(run=run, node_id=node_id, node_type=kind,
                                                 status=SStatus.SUCCEEDED, input=rendered,
                                                 output={"run_id": str(successor.id)}, finished_at=now)
        record_event(successor, "created", continued_from=str(run.id))
        run.status, run.finished_at = Status.CONTINUED, now
        run.output = {"continued_as": str(successor.id)}
        record_event(run, "continued", node_id, successor=str(successor.id))
        run.lock_version = F("lock_version") + 1
        run.save()
        enqueue_tick(successor)
        return True
    raise ValueError(f"unknown node type {kind!r}")


def _sleep_until(node: dict[str, Any], now: datetime) -> datetime:
    if node.get("until"):
        parsed = parse_datetime(str(node["until"]))
        if parsed is not None:
            return parsed
    return now + timedelta(seconds=float(node.get("duration_s", 0)))


def _start_child(run: WorkflowRun, node: dict[str, Any], context: dict[str, Any]) -> StepRun:
    node_id = node["id"]
    rendered = templates.render(node.get("input", {}), context)
    step = StepRun.objects.create(run=run, node_id=node_id, node_type="subworkflow", status=SStatus.WAITING,
                                  input=rendered)
    limits = effective_entitlements(current_tenant())
    depth = run.nesting_depth + 1
    if depth > limits.max_nesting_depth:
        message = (f"sub-workflow '{node.get('workflow')}' would be nested {depth} levels deep; "
                   f"plan '{limits.plan}' allows {limits.max_nesting_depth}")
        _refuse_step(run, step, "nesting_too_deep", message)
        return step
    versions = WorkflowVersion.objects.filter(definition__name=node.get("workflow"))
    if node.get("version"):
        versions = versions.filter(number=node["version"])
    version = versions.order_by("-number").first()
    if version is None:
        message = f"workflow '{node.get('workflow')}' (version {node.get('version') or 'latest'}) does not exist"
        _refuse_step(run, step, "unknown_workflow", message)
        return step
    try:
        quota_consume(runs=1)  # in the tick's transaction: charged only if the child is created
    except QuotaExceeded as exc:
        _refuse_step(run, step, ErrorCode.QUOTA_EXCEEDED,
                     f"sub-workflow '{node.get('workflow')}' not started: {exc.detail}", details=exc.details)
        return step
    child = WorkflowRun.objects.create(
        workflow=version, workflow_name=version.definition.name, input=rendered, tier=run.tier, tags=run.tags,
        parent_run=run, parent_node_id=node_id, root_run_id=run.root_run_id, nesting_depth=depth,
    )
    record_event(child, "created", parent=str(run.id), node_id=node_id)
    step.child_run = child
    if node.get("wait", True):
        step.save(update_fields=["child_run"])
    else:
        step.status, step.output, step.finished_at = SStatus.SUCCEEDED, {"run_id": str(child.id)}, timezone.now()
        step.save(update_fields=["child_run", "status", "output", "finished_at"])
    record_event(run, "child_started", node_id, child_run=str(child.id))
    enqueue_tick(child)
    return step


def _refuse_step(run: WorkflowRun, step: StepRun, code: str, message: str, **extra: Any) -> None:
    """Fail a step that could not start, for good (not retried): ``code`` is its stable error code."""
    _finish_step(step, SStatus.FAILED, error={"code": str(code), "message": message, "retryable": False, **extra})
    record_event(run, "step_failed", step.node_id, reason=message)


def _finish_if_done(run: WorkflowRun, latest: dict[str, StepRun]) -> None:
    spec = _spec(run)
    failed = [s for s in latest.values() if s.status == SStatus.FAILED]
    if failed:
        first = failed[0]
        _abort_active(run, latest, SStatus.CANCELLED)
        run.status, run.finished_at = Status.FAILED, timezone.now()
        run.error = {"node": first.node_id, "attempt": first.attempt, "error": first.error}
        record_event(run, "failed", first.node_id)
        _notify_parent(run)
        return
    if len(latest) < len(_nodes(spec)) or any(s.status not in StepRun.TERMINAL for s in latest.values()):
        return
    run.output = _jsonable(templates.render(spec.get("output"), _context(run, latest)))
    run.status, run.finished_at = Status.SUCCEEDED, timezone.now()
    record_event(run, "succeeded")
    _notify_parent(run)


def _abort_active(run: WorkflowRun, latest: dict[str, StepRun], status: str) -> None:
    """Cancel steps still active: their items leave the queue; late results are discarded."""
    tenant = current_tenant()
    for step in latest.values():
        if step.status not in ACTIVE_STEP:
            continue
        _finish_step(step, status)
        transaction.on_commit(partial(_remove_item, tenant, step_item_id(step.id)))
        if step.child_run_id is not None:
            WorkflowRun.objects.filter(pk=step.child_run_id).exclude(status__in=WorkflowRun.TERMINAL).update(
                cancel_requested=True
            )
            child = WorkflowRun.objects.get(pk=step.child_run_id)
            enqueue_tick(child)


def _remove_item(tenant: Tenant, item_id: str) -> None:
    with tenant_context(tenant):
        fair_queue.remove(item_id)


def _cancel(run: WorkflowRun) -> None:
    latest = _latest_steps(run)
    _abort_active(run, latest, SStatus.CANCELLED)
    run.status, run.finished_at = Status.CANCELLED, timezone.now()
    record_event(run, "cancelled")
    run.lock_version = F("lock_version") + 1
    run.save()
    _notify_parent(run)


def _notify_parent(run: WorkflowRun) -> None:
    if run.parent_run_id is not None:
        parent = WorkflowRun.objects.filter(pk=run.parent_run_id).first()
        if parent is not None and not parent.is_terminal:
            enqueue_tick(parent)


# -- steps on workers ---------------------------------------------------------------------------

def execute_step(ctx: ItemContext, body: dict[str, Any]) -> None:
    """Run one action attempt on a worker. A duplicate or stale delivery does nothing."""
    step_id = body["step_id"]
    with structlog.contextvars.bound_contextvars(step_id=str(step_id)):
        _execute_step(step_id)


def _execute_step(step_id: str) -> None:
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
    node = next(n for n in _nodes(_spec(run)) if n["id"] == step.node_id)
    # Bound for this step only: a plain bind would leak into the next task of the worker process.
    with structlog.contextvars.bound_contextvars(run_id=str(run.id), node_id=step.node_id):
        _run_action(step, run, node)


def _run_action(step: StepRun, run: WorkflowRun, node: dict[str, Any]) -> None:
    decision = route(Step(workflow=run.workflow_name, action=node["action"], tags=tuple(node.get("tags", [])),
                          input=step.input, tier=run.tier, pool=node.get("pool")))
    if decision.saturated:
        raise RetryLater(BUSY_RETRY_S, decision.reason)
    if not decision.allowed:
        _record_outcome(step, run, (SStatus.FAILED, None, {"code": "routing_denied", "message": decision.reason,
                                                           "retryable": False}))
        return
    holder = step_item_id(step.id)
    lease_s = settings.DUCTOR_LEASE_MS / 1000
    admitted, retry_after = admit(decision, holder, lease_s=lease_s, tenant_admitted=True)
    if not admitted:
        raise RetryLater(max(retry_after, BUSY_RETRY_S), "pool or connection at its limit")
    try:
        with capacity.keep_alive(holder, lease_s):  # a step longer than the lease keeps its slots
            started = StepRun.objects.filter(pk=step.id, status__in=ON_WORKER).update(
                status=SStatus.RUNNING, started_at=timezone.now(), routing=decision.trace()
            )
            if not started:  # cancelled or timed out since it was read: do not call the action
                return
            if node.get("timeout_s"):
                schedule_wakeup(current_tenant(), str(step.id), kind="step_timeout",
                                delay_s=float(node["timeout_s"]))
            outcome = _call_action(node["action"], step, decision.connection_id, str(run.id))
    finally:
        release(holder)
    _record_outcome(step, run, outcome)


def _record_outcome(step: StepRun, run: WorkflowRun, outcome: tuple[str, Any, Any]) -> None:
    """Finish the step with ``(status, output, error)`` and tick its run in the same
    transaction, unless the step has moved on meanwhile (cancelled, timed out): then the
    outcome is discarded."""
    with transaction.atomic():
        # The run row first, then the step: the order a tick takes them in (no deadlock with it).
        run = WorkflowRun.objects.select_for_update().get(pk=run.pk)
        locked = StepRun.objects.select_for_update().filter(pk=step.id, status__in=ON_WORKER).first()
        if locked is None:
            log.info("step_result_discarded", step_id=str(step.id))
            return
        status, output, error = outcome
        _finish_step(locked, status, output=output, error=error)
        record_event(run, f"step_{status}", locked.node_id, attempt=locked.attempt,
                     error=(error or {}).get("code") if error else None)
        tick_now(run)


def _call_action(name: str, step: StepRun, connection_id: str | None, run_id: str) -> tuple[str, Any, Any]:
    from scheduling.models import Connection

    connection = Connection.objects.filter(pk=connection_id).first() if connection_id else None
    call = ActionCall(input=step.input, connection=connection, attempt=step.attempt,
                      idempotency_key=f"{run_id}:{step.node_id}:{step.attempt}")
    try:
        output = _jsonable(get_action(name)(call))
    except ActionError as exc:
        return SStatus.FAILED, None, exc.describe()
    except Exception as exc:  # an action's own bug fails the step, never the worker
        log.exception("action_crashed", action=name)
        return SStatus.FAILED, None, {"code": "action_crashed", "message": str(exc)[:500], "retryable": False}
    return SStatus.SUCCEEDED, output, None


# -- timers -------------------------------------------------------------------------------------

def _with_step(step_id: str, fn: Callable[[StepRun, WorkflowRun], None]) -> None:
    with transaction.atomic():
        run_id = StepRun.objects.filter(pk=step_id).values_list("run_id", flat=True).first()
        if run_id is None:
            return
        # The run row first, then the step: the order a tick takes them in.
        run = WorkflowRun.objects.select_for_update().filter(pk=run_id).first()
        step = StepRun.objects.select_for_update().filter(pk=step_id).first()
        if run is None or step is None or run.is_terminal:
            return
        fn(step, run)


def _retry_due(ref: str, data: dict[str, Any]) -> None:
    def go(step: StepRun, run: WorkflowRun) -> None:
        if step.status != SStatus.SCHEDULED:
            return
        step.status = SStatus.QUEUED
        StepRun.objects.filter(pk=step.pk).update(status=step.status)
        _enqueue_routed(step, run)

    _with_step(ref, go)


def _sleep_done(ref: str, data: dict[str, Any]) -> None:
    def go(step: StepRun, run: WorkflowRun) -> None:
        if step.status != SStatus.SCHEDULED:
            return
        if step.scheduled_for and step.scheduled_for > timezone.now() + timedelta(milliseconds=50):
            delay = (step.scheduled_for - timezone.now()).total_seconds()
            _on_commit_wakeup(ref, kind="sleep_done", delay_s=delay)
            return
        _finish_step(step, SStatus.SUCCEEDED, output={"slept_until": str(step.scheduled_for)})
        enqueue_tick(run)

    _with_step(ref, go)


def _step_timeout(ref: str, data: dict[str, Any]) -> None:
    def go(step: StepRun, run: WorkflowRun) -> None:
        if step.status != SStatus.RUNNING:
            return
        _finish_step(step, SStatus.FAILED, error={"code": "timeout", "message": "step timed out",
                                                  "retryable": True})
        record_event(run, "step_timed_out", step.node_id, attempt=step.attempt)
        enqueue_tick(run)

    _with_step(ref, go)


def reconcile_runs() -> int:
    """Put back the Redis side of active runs that stopped moving (a crash between commit and
    enqueue, a Redis flush): their tick, the items of their queued and running steps, and the
    timers of their sleeps, retry backoffs and step timeouts. Each of those is idempotent (an
    item already queued or in flight is coalesced, a waiting timer is kept), so repairing a run
    that was only slow costs at most a no-op delivery. A run whose tick is still waiting or in
    flight is moving: it is only touched, not repaired. Looks at ``RECONCILE_BATCH`` runs at
    most, the longest-unchanged first; returns how many it repaired. Crosses tenants by design:
    it is the system's housekeeping."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=STALE_RUN_S)
    stale = list(
        WorkflowRun.all_tenants.select_related("tenant", "workflow")
        .exclude(status__in=WorkflowRun.TERMINAL)
        .filter(updated_at__lt=cutoff)
        .order_by("updated_at")[:RECONCILE_BATCH]
    )
    moving = _ticks_pending(stale)
    if moving:  # touched, so that the next passes look at other runs first
        WorkflowRun.all_tenants.filter(pk__in=moving).update(updated_at=now)
    count = 0
    for run in stale:
        if run.pk in moving:
            continue
        with tenant_context(run.tenant), transaction.atomic():
            enqueue_tick(run)
            nodes = {n["id"]: n for n in _nodes(_spec(run))}
            for step in StepRun.objects.filter(run=run, status__in=ACTIVE_STEP):
                _repair_step(step, run, nodes.get(step.node_id, {}), now)
            WorkflowRun.objects.filter(pk=run.pk).update(updated_at=timezone.now())
        count += 1
    return count


def _ticks_pending(runs: list[WorkflowRun]) -> set[Any]:
    """The ids of the ``runs`` whose tick item is waiting or in flight: one Redis round trip."""
    found = fair_queue.pending([(run.tenant, tick_item_id(run.pk)) for run in runs])
    return {run.pk for run, pending in zip(runs, found, strict=True) if pending}


def _repair_step(step: StepRun, run: WorkflowRun, node: dict[str, Any], now: datetime) -> None:
    def due_in(moment: datetime | None) -> float:
        return max(0.0, ((moment or now) - now).total_seconds())

    if step.status in (SStatus.QUEUED, SStatus.RUNNING):
        # A running step's item may be gone with its worker and the queue (a crash and a flush).
        _enqueue_routed(step, run)
    if step.status == SStatus.RUNNING and node.get("timeout_s") and step.started_at:
        deadline = step.started_at + timedelta(seconds=float(node["timeout_s"]))
        _on_commit_wakeup(str(step.id), kind="step_timeout", delay_s=due_in(deadline))
    if step.status == SStatus.SCHEDULED:
        kind = "sleep_done" if step.node_type == "sleep" else "step_retry"
        _on_commit_wakeup(str(step.id), kind=kind, delay_s=due_in(step.scheduled_for))


def _tick_handler(ctx: ItemContext, body: dict[str, Any]) -> None:
    tick(body["run_id"])


register_handler("tick", _tick_handler)
register_handler("step", execute_step)
register_wakeup("step_retry", _retry_due)
register_wakeup("sleep_done", _sleep_done)
register_wakeup("step_timeout", _step_timeout)
register_reconciler(reconcile_runs)
