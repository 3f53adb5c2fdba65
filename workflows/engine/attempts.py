"""The rows of a run's step attempts: which are active, the latest of each node, how one ends.

An attempt ends with an ``Outcome``: succeeded with an output, or failed with
an error whose ``code`` is a ``StepErrorCode`` and which says whether the
node's retry policy may try again.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from cachetools import LRUCache
from django.conf import settings
from django.utils import timezone

from ductor_project.core.context import current_tenant
from ductor_project.core.errors import StepErrorCode
from ductor_project.core.keys import tenant_key
from ductor_project.core.payloads import describable, payload_excess, storable, unkeepable
from scheduling import templates
from tenants.entitlements import effective_entitlements
from workflows.engine.events import record_event
from workflows.engine.items import cancel_on_commit, release_on_commit
from workflows.engine.journal import add_step
from workflows.engine.statements import attempts_of, chain_end
from workflows.models import EventWait, StepRun, WorkflowRun, WorkflowVersion
from workflows.schemas import under, value_problems

SStatus = StepRun.Status
ACTIVE = frozenset({SStatus.SCHEDULED, SStatus.QUEUED, SStatus.RUNNING, SStatus.WAITING})


@dataclass(frozen=True)
class Outcome:
    """How a step attempt ended. ``error`` holds ``code``, ``message``, ``retryable`` and details."""

    status: str
    output: Any = None
    error: dict[str, Any] | None = field(default=None)

    @classmethod
    def succeeded(cls, output: Any = None) -> Outcome:
        return cls(SStatus.SUCCEEDED, output=output)

    @classmethod
    def failed(cls, code: StepErrorCode, message: str, *, retryable: bool = False, **details: Any) -> Outcome:
        """A failure: its message and details as text that can be stored (``storable``: an exception's
        message may quote a NUL character)."""
        return cls(SStatus.FAILED, error={"code": str(code), "message": storable(message), "retryable": retryable,
                                          **storable(details)})

    @classmethod
    def from_error(cls, error: dict[str, Any]) -> Outcome:
        """A failure described as an action error describes itself (``ActionError.describe()``), as
        it can be stored (``describable``: its details may hold what JSON does not carry)."""
        return cls(SStatus.FAILED, error=describable(error))


def rendered_payload(template: Any, context: Any, what: str) -> tuple[Any, Outcome | None]:
    """``template`` rendered from ``context`` (a node's input, a wait's default, a run's output), and
    its refusal (``payload_refusal``), None when it may be kept. Interpolations past the plan's
    payload limit are stopped before they build the text (``templates.TemplateTooLarge``): then
    nothing is rendered (None), and it is refused as ``payload_too_large``."""
    max_bytes = effective_entitlements(current_tenant()).max_payload_bytes
    try:
        rendered = templates.render(template, context, max_chars=max_bytes)
    except templates.TemplateTooLarge:
        return None, Outcome.failed(StepErrorCode.PAYLOAD_TOO_LARGE, f"the {what} is more than {max_bytes} bytes, "
                                    f"over the plan's max_payload_bytes ({max_bytes})", field=what)
    return rendered, payload_refusal(rendered, what, max_bytes=max_bytes)


def payload_refusal(value: Any, what: str, *, max_bytes: int | None = None) -> Outcome | None:
    """The failure of a step (or run) whose ``what`` (a rendered input, an output) is over the
    tenant's plan (larger than its ``max_payload_bytes``, or nested deeper than
    ``DUCTOR_MAX_JSON_DEPTH``: ``payload_too_large``), or holds what no payload keeps (a NUL
    character, a lone surrogate, bytes: ``invalid_payload``, naming where). None when it is fine.
    ``max_bytes``: the plan's limit, when the caller read it already; else it is read here (from
    the shared cache: this may raise when Redis is away)."""
    if max_bytes is None:
        max_bytes = effective_entitlements(current_tenant()).max_payload_bytes
    excess = payload_excess(value, max_bytes=max_bytes, max_depth=settings.DUCTOR_MAX_JSON_DEPTH)
    if excess is not None:
        return Outcome.failed(StepErrorCode.PAYLOAD_TOO_LARGE, f"the {what} is {excess}", field=what)
    flaw = unkeepable(value)
    if flaw is None:
        return None
    path, why = flaw
    field = f"{what}.{path}" if path else what
    return Outcome.failed(StepErrorCode.INVALID_PAYLOAD, f"the {what} cannot be kept: {field}: {why}", field=field)


# Workflow versions never change, so a process keeps the specs it read (by tenant and version).
_specs: LRUCache[str, dict[str, Any]] = LRUCache(maxsize=2048)
_specs_lock = threading.Lock()


def spec_of(run: WorkflowRun) -> dict[str, Any]:
    """The normalized spec of the run's workflow version (``version_spec``)."""
    if "workflow" in run._state.fields_cache and "spec" in run.workflow.__dict__:  # loaded, not deferred
        return version_spec(run.workflow_id, known=run.workflow.spec)
    return version_spec(run.workflow_id)


def version_spec(version_id: Any, *, known: dict[str, Any] | None = None) -> dict[str, Any]:
    """The normalized spec of the tenant's workflow version ``version_id``, from this process's
    cache (versions are immutable), else ``known`` or read once."""
    key = tenant_key("spec", version_id)
    with _specs_lock:
        spec = _specs.get(key)
    if spec is None:
        spec = known if known is not None else (
            WorkflowVersion.objects.filter(pk=version_id).values_list("spec", flat=True).get())
        with _specs_lock:
            _specs[key] = spec
    return spec


def run_input_problems(version_id: Any, value: Any) -> list[tuple[str, str]]:
    """Why ``value`` cannot be the input of a run of the workflow version ``version_id``: (its field,
    ``input.qty`` or ``input[0]``, and a message) for each field its spec's ``input_schema`` refuses; [] when none
    does, or when the spec has no schema."""
    schema = version_spec(version_id).get("input_schema")
    if not schema:
        return []
    problems = value_problems(schema, value, owner="the workflow's input_schema",
                              fix="a new version of the workflow must fix it")
    return [(under("input", path), message) for path, message in problems]


def input_refusal(problems: list[tuple[str, str]]) -> Outcome:
    """A step that may not start because its input does not match a schema (``problems``, each
    ``(field, message)``): ``invalid_input``, naming the first field."""
    return Outcome.failed(StepErrorCode.INVALID_INPUT, "; ".join(f"{field}: {message}" for field, message in problems),
                          field=problems[0][0])


def nodes_of(run: WorkflowRun) -> list[dict[str, Any]]:
    """The nodes of the run's workflow version (normalized spec, topological order)."""
    return list(spec_of(run).get("nodes", []))


def node_of(run: WorkflowRun, node_id: str) -> dict[str, Any]:
    """The spec node ``node_id`` of the run's version."""
    return node_in(spec_of(run), node_id)


def node_in(spec: dict[str, Any], node_id: str) -> dict[str, Any]:
    """The node ``node_id`` of ``spec``."""
    return next(node for node in spec.get("nodes", []) if node["id"] == node_id)


def latest_attempts(run: WorkflowRun) -> dict[str, StepRun]:
    """Each node's latest attempt, by node id (one query)."""
    return latest_of(attempts_of(run.pk))


def latest_of(attempts: list[StepRun]) -> dict[str, StepRun]:
    """Each node's latest attempt, by node id, of ``attempts`` (by node and attempt number)."""
    return {step.node_id: step for step in attempts}


def new_step(run: WorkflowRun, node_id: str, node_type: str, status: str, **fields: Any) -> StepRun:
    """A new attempt of ``node_id``: written with the tick's journal (``journal.add_step``). Its
    number is the next after the node's attempts before a retry of the run (``resumed_from``)
    when the caller does not give one."""
    fields.setdefault("attempt", resumed_from(run).get(node_id, 0) + 1)
    return add_step(StepRun(run=run, node_id=node_id, node_type=node_type, status=status, **fields))


def resumed_from(run: WorkflowRun) -> dict[str, int]:
    """The last attempt of each node a retry of ``run`` starts again (``workflows.services.run_retry``
    sets it on the run it resumes, for the tick that does so): their new attempts number on."""
    return getattr(run, "_resumed_from", {})


def resume(run: WorkflowRun, attempts: dict[str, int]) -> None:
    """Number the next attempts of these nodes after ``attempts`` (node -> its last attempt)."""
    run._resumed_from = attempts  # type: ignore[attr-defined]


def finish(step: StepRun, outcome: Outcome | str, *, routing: dict[str, Any] | None = None) -> None:
    """End ``step`` with ``outcome`` (or just a terminal status, such as cancelled or skipped),
    and with ``routing`` as its routing trace when given. An attempt the journal has not written
    yet is written so."""
    fields = outcome_fields(outcome)
    step.status, step.output, step.error, step.finished_at = (
        fields["status"], fields["output"], fields["error"], fields["finished_at"])
    if routing is not None:
        step.routing = fields["routing"] = routing
    if step._state.adding:
        return
    # A scoped UPDATE of the row (no foreign key changes): one round trip, where save() would
    # first re-check the tenant of the step's run.
    StepRun.objects.filter(pk=step.pk).update(**fields)


def outcome_fields(outcome: Outcome | str) -> dict[str, Any]:
    """The columns of an attempt that ends with ``outcome`` (or just a terminal status)."""
    if isinstance(outcome, str):
        outcome = Outcome(outcome)
    return {"status": outcome.status, "output": outcome.output, "error": outcome.error,
            "finished_at": timezone.now()}


def refuse(run: WorkflowRun, step: StepRun, code: StepErrorCode | Outcome, message: str = "",
           **details: Any) -> None:
    """Fail a step that could not start, for good (not retried): with ``code`` and ``message``,
    or with a failed ``Outcome`` such as ``payload_refusal`` gives."""
    outcome = code if isinstance(code, Outcome) else Outcome.failed(code, message, **details)
    finish(step, outcome)
    error = outcome.error or {}
    record_event(run, "step_failed", step.node_id, attempt=step.attempt, error=error.get("code"),
                 reason=error.get("message", ""))


def abort_active(latest: dict[str, StepRun], status: str) -> None:
    """End the steps still active with ``status``: their items leave the queue, their late results
    are discarded, their waits leave the index, and their child runs are asked to cancel."""
    for step in latest.values():
        if step.status not in ACTIVE:
            continue
        finish(step, status)
        release_on_commit(step)
        if step.node_type == "wait_for_event":
            EventWait.objects.filter(step_id=step.pk).delete()
        if step.child_run_id is not None:
            cancel_child(step.child_run_id)


def waits_for_child(step: StepRun) -> bool:
    """Whether ``step`` is a ``subworkflow`` attempt waiting for its child run (its ``timeout_s`` runs)."""
    return step.status == SStatus.WAITING and step.child_run_id is not None


def cancel_child(run_id: Any) -> None:
    """Ask the child run ``run_id`` to cancel: the active run of its chain, when it continued as
    new. A child that continues as new while this waits for its row is followed to its successor
    (each statement sees what committed before it)."""
    run = chain_end(run_id)
    while run is not None and not run.is_terminal:
        active = WorkflowRun.objects.filter(pk=run.pk).exclude(status__in=WorkflowRun.TERMINAL)
        if active.update(cancel_requested=True):
            cancel_on_commit([run])
            return
        run = chain_end(run.pk)  # it ended meanwhile: continued as new, or finished
