"""Starting a ready node, by its type, inside the tick's transaction (run row locked).

Every rendered input is held to the plan's payload limit first: one that is
over it fails the step with ``payload_too_large`` and is not kept.

- ``action``: routed once (``route_attempt``), recorded as a queued attempt with
  its decision, and enqueued as a step item where the decision sends it; a
  denied route fails the step at once.
- ``task``: the same, once the task catalog allows the call and the rendered
  input matches the task's schema (else the step fails for good); the decision
  also keeps what the dispatcher publishes it with (``task_call``).
- ``sleep``: a scheduled attempt and a coordinator wake-up at its end.
- ``wait_for_event``: a waiting attempt, resumed by an event, a signal or its timeout
  (``workflows.engine.waits``).
- ``subworkflow``: a child run (refused past the plan's ``max_nesting_depth`` or
  the monthly run quota, which it is charged to). Each is checked in its place
  (``child_of``); the children of the nodes ready together are charged and
  created after the tick's other nodes started, all or none (``start_children``).
- ``continue_as_new``: a successor run, charged to the monthly run quota; this
  run ends as ``continued`` and its other active steps are cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ductor_project.core.context import current_tenant
from ductor_project.core.errors import StepErrorCode
from scheduling.routing import RoutingDecision, route
from scheduling.rules import Step
from tenants.entitlements import effective_entitlements
from tenants.usage import QuotaExceeded, quota_consume
from workflows import catalog
from workflows.engine.attempts import (
    Outcome,
    abort_active,
    input_refusal,
    new_step,
    refuse,
    rendered_payload,
    run_input_problems,
)
from workflows.engine.events import record_event
from workflows.engine.items import enqueue_step, enqueue_tick, wakeup_on_commit
from workflows.engine.journal import add_state
from workflows.engine.statements import version_to_start
from workflows.engine.waits import WAIT, start_wait
from workflows.models import StepRun, WorkflowRun, WorkflowVersion
from workflows.schemas import under

SStatus = StepRun.Status
# The node types whose attempts are routed and go through the fair queue as step items.
ROUTED = ("action", "task")
# The node type that starts a child run (``start_children``).
CHILD = "subworkflow"


def route_attempt(run: WorkflowRun, node: dict[str, Any], rendered: Any) -> RoutingDecision:
    """Route one attempt of an action or task node: the one routing decision it keeps. Rules match
    a task node's task name as its action."""
    return route(Step(workflow=run.workflow_name, action=node.get("action") or node["task"],
                      tags=tuple(node.get("tags", [])), input=rendered, tier=run.tier, pool=node.get("pool")))


def attempt_routing(run: WorkflowRun, node: dict[str, Any], rendered: Any) -> tuple[RoutingDecision, dict[str, Any]]:
    """The routing decision of one attempt, and the trace its step keeps: for a task node, with
    the call the dispatcher publishes (``task_call``)."""
    decision = route_attempt(run, node, rendered)
    trace = decision.trace()
    if node["type"] == "task":
        trace["task"] = task_call(node)
    return decision, trace


def task_call(node: dict[str, Any]) -> dict[str, Any]:
    """How a task node's attempt is published: the task, how it takes its input, the catalog's
    default queue, its timeout (which is its lease) and its heartbeat timeout, if it has one. An
    entry the tenant may not call (another plan's or tenant's, a disabled one) is read as none:
    the attempt is refused, and its trace tells no more of the entry than of a task not in the
    catalog."""
    found = catalog.callable_task(node["task"]).entry
    call = {
        "name": node["task"],
        "arguments": found.arguments if found else "kwargs",
        "queue": found.queue if found else "",
        "timeout_s": catalog.timeout_s(found, node.get("timeout_s"), settings.DUCTOR_TASK_TIMEOUT_S),
    }
    if node.get("heartbeat_s"):
        call["heartbeat_s"] = min(float(node["heartbeat_s"]), float(call["timeout_s"]))
    return call


def start(run: WorkflowRun, node: dict[str, Any], latest: dict[str, StepRun], context: dict[str, Any],
          now: datetime) -> bool:
    """Start ``node``, recording its attempt in ``latest``. Returns True if the run continued as new.
    Sub-workflow nodes are checked (``child_of``) and started together (``start_children``)."""
    kind = node["type"]
    if kind in ROUTED:
        latest[node["id"]] = _start_routed(run, node, context)
    elif kind == "sleep":
        latest[node["id"]] = _start_sleep(run, node, now)
    elif kind == WAIT:
        latest[node["id"]] = start_wait(run, node, context, now)
    elif kind == "continue_as_new":
        return _continue_as_new(run, node, latest, context, now)
    else:
        raise ValueError(f"unknown node type {kind!r}")
    return False


def _rendered_input(node: dict[str, Any], context: dict[str, Any]) -> tuple[Any, Outcome | None]:
    """The node's input rendered, and the refusal of it when it is over the plan's payload limit."""
    return rendered_payload(node.get("input", {}), context, "input")


def _run_input(node: dict[str, Any], context: dict[str, Any]) -> tuple[Any, Outcome | None]:
    """A child's or a successor's input rendered, as a start takes it (``null`` is ``{}``), and its
    refusal, as ``_rendered_input`` gives them."""
    rendered, refusal = _rendered_input(node, context)
    return ({} if rendered is None else rendered), refusal


def _refused(run: WorkflowRun, node: dict[str, Any], status: str, refusal: Outcome) -> StepRun:
    """A step whose input was refused: recorded without it, failed for good."""
    step = new_step(run, node["id"], node["type"], status)
    refuse(run, step, refusal)
    return step


def task_refusal(node: dict[str, Any], rendered: Any) -> Outcome | None:
    """Why a task node's attempt may not be published (the catalog does not allow it to this
    tenant, or the rendered input does not match its schema), or None."""
    check = catalog.callable_task(node["task"])
    if check.entry is None:
        return Outcome.failed(StepErrorCode.TASK_NOT_ALLOWED, check.problem, field="task")
    problems = [(under("input", path), message) for path, message in catalog.input_problems(check.entry, rendered)]
    return input_refusal(problems) if problems else None


def _start_routed(run: WorkflowRun, node: dict[str, Any], context: dict[str, Any]) -> StepRun:
    rendered, refusal = _rendered_input(node, context)
    if refusal is not None:
        return _refused(run, node, SStatus.QUEUED, refusal)
    kind = node["type"]
    refusal = task_refusal(node, rendered) if kind == "task" else None
    decision, trace = attempt_routing(run, node, rendered)
    step = new_step(run, node["id"], kind, SStatus.QUEUED, input=rendered, routing=trace)
    if refusal is not None:
        refuse(run, step, refusal)
        return step
    if not decision.allowed:
        refuse(run, step, StepErrorCode.ROUTING_DENIED, decision.reason)
        return step
    enqueue_step(step, run)
    record_event(run, "step_queued", node["id"], tier=decision.tier, rule=trace["rule"],
                 pool=decision.pool.name if decision.pool else None)
    return step


def _sleep_until(node: dict[str, Any], now: datetime) -> datetime:
    if node.get("until"):
        parsed = parse_datetime(str(node["until"]))
        if parsed is not None:
            return parsed
    return now + timedelta(seconds=float(node.get("duration_s", 0)))


def _start_sleep(run: WorkflowRun, node: dict[str, Any], now: datetime) -> StepRun:
    until = _sleep_until(node, now)
    step = new_step(run, node["id"], "sleep", SStatus.SCHEDULED, scheduled_for=until)
    record_event(run, "step_sleeping", node["id"], until=until.isoformat())
    wakeup_on_commit(str(step.id), kind="sleep_done", delay_s=max(0.0, (until - now).total_seconds()))
    return step


@dataclass(frozen=True)
class Child:
    """A sub-workflow node that may start its child run: its input, the version and depth it runs at."""

    node: dict[str, Any]
    input: Any
    version: WorkflowVersion
    depth: int


def start_children(run: WorkflowRun, children: list[Child], latest: dict[str, StepRun]) -> bool:
    """Start the checked ``children`` (``child_of``) together, recording their attempts in
    ``latest``: all or none. They are charged to the monthly run quota in one statement, and
    their runs created only once it took them all. Returns False when it refused them: the first
    one's step fails with ``quota_exceeded``, and no child is created or charged."""
    try:
        quota_consume(runs=len(children))  # in the tick's transaction: charged only if the children are created
    except QuotaExceeded as exc:
        first = children[0]
        latest[first.node["id"]] = _refused_child(run, first.node, first.input, Outcome.failed(
            StepErrorCode.QUOTA_EXCEEDED, f"sub-workflow '{first.node.get('workflow')}' not started: {exc.detail}",
            details=exc.details))
        return False
    for child in children:
        latest[child.node["id"]] = _start_child(run, child)
    return True


def child_of(run: WorkflowRun, node: dict[str, Any], context: dict[str, Any]) -> Child | StepRun:
    """The child run the sub-workflow ``node`` would start (its input, its nesting, its workflow
    and that workflow's ``input_schema`` checked; nothing charged or created), or its step failed
    for good when it may not start one."""
    rendered, refusal = _run_input(node, context)
    if refusal is not None:
        return _refused(run, node, SStatus.WAITING, refusal)
    depth = run.nesting_depth + 1
    version = _child_version(node, rendered, depth)
    if isinstance(version, Outcome):
        return _refused_child(run, node, rendered, version)
    return Child(node=node, input=rendered, version=version, depth=depth)


def _child_version(node: dict[str, Any], rendered: Any, depth: int) -> WorkflowVersion | Outcome:
    """The version ``node``'s child run would run at ``depth``, or why it may not start one."""
    name = node.get("workflow")
    limits = effective_entitlements(current_tenant())
    if depth > limits.max_nesting_depth:
        return Outcome.failed(StepErrorCode.NESTING_TOO_DEEP, f"sub-workflow '{name}' would be nested {depth} "
                              f"levels deep; plan '{limits.plan}' allows {limits.max_nesting_depth}")
    version = version_to_start(str(name or ""), node.get("version") or None)
    if version is None:
        return Outcome.failed(StepErrorCode.UNKNOWN_WORKFLOW,
                              f"workflow '{name}' (version {node.get('version') or 'latest'}) does not exist")
    if version.definition.archived_at is not None:
        return Outcome.failed(StepErrorCode.WORKFLOW_ARCHIVED, f"workflow '{name}' is archived and starts no new run")
    problems = run_input_problems(version.pk, rendered)  # the child's workflow's input_schema refuses it
    return input_refusal(problems) if problems else version


def _refused_child(run: WorkflowRun, node: dict[str, Any], rendered: Any, refusal: Outcome) -> StepRun:
    """The step of a sub-workflow node that starts no child, with its input, failed for good."""
    step = new_step(run, node["id"], "subworkflow", SStatus.WAITING, input=rendered, started_at=timezone.now())
    refuse(run, step, refusal)
    return step


def _start_child(run: WorkflowRun, child: Child) -> StepRun:
    """Create the child run of a checked and charged sub-workflow node, and its step."""
    node, version = child.node, child.version
    node_id = node["id"]
    step = new_step(run, node_id, "subworkflow", SStatus.WAITING, input=child.input, started_at=timezone.now())
    created = WorkflowRun.objects.create(
        workflow=version, workflow_name=version.definition.name, input=child.input, tier=run.tier, tags=run.tags,
        parent_run=run, parent_node_id=node_id, root_run_id=run.root_run_id, nesting_depth=child.depth,
        fairness_key=run.fairness_key,
    )
    record_event(created, "created", parent=str(run.id), node_id=node_id)
    step.child_run = created  # the journal writes the attempt with its child
    if not node.get("wait", True):
        step.status, step.output, step.finished_at = SStatus.SUCCEEDED, {"run_id": str(created.id)}, timezone.now()
    elif node.get("timeout_s"):  # the child's time: past it, the child is cancelled (``timers.step_timeout``)
        wakeup_on_commit(str(step.id), kind="step_timeout", delay_s=float(node["timeout_s"]))
    record_event(run, "child_started", node_id, child_run=str(created.id))
    if step.status == SStatus.SUCCEEDED:  # it does not wait: its end is now, in the history too
        record_event(run, "step_succeeded", node_id, attempt=step.attempt, error=None, child_run=str(created.id))
    enqueue_tick(created)
    return step


def _continue_as_new(run: WorkflowRun, node: dict[str, Any], latest: dict[str, StepRun], context: dict[str, Any],
                     now: datetime) -> bool:
    node_id = node["id"]
    rendered, refusal = _run_input(node, context)
    problems = run_input_problems(run.workflow_id, rendered) if refusal is None else []
    if refusal is not None or problems:  # too large, or not what the workflow's input_schema takes
        latest[node_id] = _refused(run, node, SStatus.QUEUED, refusal or input_refusal(problems))
        return False  # the failed step fails the run
    try:
        quota_consume(runs=1)
    except QuotaExceeded as exc:
        step = new_step(run, node_id, "continue_as_new", SStatus.QUEUED, input=rendered)
        latest[node_id] = step
        refuse(run, step, StepErrorCode.QUOTA_EXCEEDED, f"no successor run started: {exc.detail}",
               details=exc.details)
        return False  # the failed step fails the run
    abort_active(latest, SStatus.CANCELLED)  # the other branches end with this run
    successor = WorkflowRun.objects.create(
        workflow=run.workflow, workflow_name=run.workflow_name, input=rendered, tier=run.tier,
        tags=run.tags, parent_run=run.parent_run, parent_node_id=run.parent_node_id,
        root_run_id=run.root_run_id, nesting_depth=run.nesting_depth, continued_from=run,
        fairness_key=run.fairness_key,
    )
    latest[node_id] = new_step(run, node_id, "continue_as_new", SStatus.SUCCEEDED, input=rendered,
                               output={"run_id": str(successor.id)}, finished_at=now)
    record_event(successor, "created", continued_from=str(run.id))
    run.status, run.finished_at = WorkflowRun.Status.CONTINUED, now
    run.output = {"continued_as": str(successor.id)}
    record_event(run, "continued", node_id, successor=str(successor.id))
    add_state(run)
    enqueue_tick(successor)
    return True


def finish_skipped(run: WorkflowRun, node: dict[str, Any], now: datetime) -> StepRun:
    """Record ``node`` as skipped (a false ``when``, or a skipped or cancelled dependency)."""
    step = new_step(run, node["id"], node["type"], SStatus.SKIPPED, finished_at=now)
    record_event(run, "step_skipped", node["id"])
    return step

