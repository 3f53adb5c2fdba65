"""Writes of the workflow engine: definitions; starting, cancelling, rerunning and retrying runs."""

from __future__ import annotations

from typing import Any

import structlog
from django.db import IntegrityError, connection, transaction
from django.dispatch import Signal
from django.utils import timezone

from ductor_project.core import tracing
from ductor_project.core.context import current_tenant
from ductor_project.core.errors import (
    ApiError,
    Conflict,
    ErrorCode,
    NotFound,
    again_while_keys_are_taken,
    check_key_reuse,
)
from ductor_project.core.payloads import json_size
from scheduling.models import MAX_FAIRNESS_KEY
from tenants.entitlements import effective_entitlements
from tenants.selectors import first_or_404
from tenants.usage import enforce_ceiling, lock_tenant_row, quota_consume, quota_consume_at_commit
from workflows.engine import waits
from workflows.engine.attempts import latest_attempts, resume, run_input_problems
from workflows.engine.events import record_event
from workflows.engine.items import cancel_on_commit, enqueue_ticks
from workflows.engine.journal import add_run, add_state, journal
from workflows.engine.statements import chain_end, lock_run, version_to_start
from workflows.engine.tick import advance_locked, arm_run_timeout
from workflows.models import (
    RunEvent,
    RunSignal,
    Schedule,
    StepRun,
    WorkflowDefinition,
    WorkflowRun,
    WorkflowVersion,
)
from workflows.selectors import run_list, waited_on_by_parent
from workflows.spec import SpecError, validate_spec

log = structlog.get_logger(__name__)

FAIRNESS_KEY_RULE = f"A string of at most {MAX_FAIRNESS_KEY} characters."


def _fairness_key_ok(key: Any) -> bool:
    return key is None or (isinstance(key, str) and len(key) <= MAX_FAIRNESS_KEY)


# Most runs one bulk start may hold.
MAX_BULK_RUNS = 500


def payload_too_large(field: str, size: int, limit: int, measured: str = "") -> ApiError:
    """The ``413`` of ``field``, ``size`` bytes over ``limit``; ``measured`` says what was measured
    when it is more than the field itself."""
    return ApiError(
        f"Invalid field(s): {field}. {measured}It is {size} bytes; the plan allows {limit}.",
        code=ErrorCode.PAYLOAD_TOO_LARGE, status_code=413,
        details={field: [f"{measured}{size} bytes is over the plan's max_payload_bytes ({limit})."]},
    )


def check_payload(payload: Any, field: str, measured: str = "") -> None:
    """Refuse a ``payload`` over the plan's ``max_payload_bytes``: ``413`` naming ``field`` (and
    saying ``measured``: what ``payload`` is, when more than that field)."""
    limit = effective_entitlements(current_tenant()).max_payload_bytes
    size = json_size(payload)
    if size > limit:
        raise payload_too_large(field, size, limit, measured)


def run_signal(run_id: Any, *, name: str, payload: Any = None,
               idempotency_key: str | None = None) -> tuple[RunSignal, bool]:
    """Send the signal ``name`` to one of the tenant's active runs (``workflows.engine.waits``)."""
    check_payload(payload if payload is not None else {}, "payload")
    return waits.signal_send(run_id, name=name, payload=payload if payload is not None else {},
                             idempotency_key=idempotency_key)


def _validated(spec: Any) -> dict[str, Any]:
    """The spec validated and normalized (defaults filled, nodes in topological order)."""
    limit = effective_entitlements(current_tenant()).max_payload_bytes
    size = json_size(spec)
    if size > limit:  # over the payload limit: 413, like an oversized run input
        raise payload_too_large("spec", size, limit)
    try:
        parsed = validate_spec(spec, max_bytes=limit)
    except SpecError as exc:
        details = {f"spec.{k}" if k != "spec" else k: v for k, v in exc.errors.items()}
        raise ApiError(str(exc), code=ErrorCode.INVALID, details=details) from exc
    return parsed.to_dict()


@transaction.atomic
def workflow_put(*, name: str, spec: Any, description: str = "",
                 if_version: int | None = None) -> tuple[WorkflowVersion, bool]:
    """Create the workflow ``name`` or add a new version of it. Returns ``(version, created)``.

    Versions are immutable; runs keep the version they started on. With ``if_version`` (the latest
    version the caller read; 0: none), only if that is still the latest (409 naming ``if_version``
    otherwise): so concurrent puts of one change (a service's replicas applying their workflows as
    they start) add one version, and each other learns it lost.
    """
    clean = _validated(spec)
    # Puts of one name take turns from here: the row lock below locks nothing while the name is new,
    # and two creations of it would both insert it (one answered with the unique name's error).
    waits.lock_in_order({waits.name_lock_id("workflow", name)})
    definition = WorkflowDefinition.objects.select_for_update().filter(name=name).first()
    latest = definition.latest_version if definition is not None else 0
    if if_version is not None and if_version != latest:
        message = (f"Workflow '{name}' is at version {latest}, not {if_version}: read it again."
                   if latest else f"Workflow '{name}' does not exist, so it is at no version {if_version}.")
        raise Conflict(message, details={"if_version": [message]})
    created = definition is None
    if definition is None:
        enforce_ceiling("workflows", active_workflows())
        definition = WorkflowDefinition.objects.create(name=name, description=description)
    elif definition.archived_at is not None:
        raise archived(definition, "name", "takes no new version")
    elif description:
        definition.description = description
    definition.latest_version += 1
    definition.save()
    version = WorkflowVersion.objects.create(definition=definition, number=definition.latest_version, spec=clean)
    log.info("workflow_version_created", workflow=name, version=version.number)
    return version, created


@transaction.atomic
def workflow_describe(*, name: str, description: str) -> WorkflowDefinition:
    """Change the description of the tenant's workflow ``name`` (404 when it has none), archived or
    not; no new version: a description is not part of what a run runs."""
    definition = first_or_404(WorkflowDefinition.objects.select_for_update().filter(name=name))
    if definition.description != description:
        definition.description = description
        definition.save(update_fields=["description", "updated_at"])
        log.info("workflow_described", workflow=name)
    return definition


def active_workflows() -> Any:
    """The tenant's workflows that are not archived: those the plan's ``max_workflows`` counts."""
    return WorkflowDefinition.objects.filter(archived_at__isnull=True)


def archived(definition: WorkflowDefinition, field: str, refused: str) -> Conflict:
    """The 409 of a change an archived workflow refuses, naming ``field``."""
    message = f"Workflow '{definition.name}' is archived and {refused}: unarchive it first."
    return Conflict(message, details={field: [message]})


@transaction.atomic
def workflow_archive(*, name: str) -> WorkflowDefinition:
    """Archive the tenant's workflow ``name`` (404 when it has none): it starts no new run (by the
    API, a schedule, an event trigger or a parent's sub-workflow step) and takes no new version, and
    it leaves the plan's ``max_workflows`` count. Its runs in flight go on. Idempotent."""
    definition = first_or_404(WorkflowDefinition.objects.select_for_update().filter(name=name))
    if definition.archived_at is None:
        definition.archived_at = timezone.now()
        definition.save(update_fields=["archived_at", "updated_at"])
        log.info("workflow_archived", workflow=name)
    return definition


@transaction.atomic
def workflow_unarchive(*, name: str) -> WorkflowDefinition:
    """Make the archived workflow ``name`` active again, if the plan's ``max_workflows`` leaves room
    for it (403 ``plan_limit_reached`` otherwise). Idempotent."""
    lock_tenant_row()  # the ceiling's row before the workflow's, in the order a webhook's create takes them
    definition = first_or_404(WorkflowDefinition.objects.select_for_update().filter(name=name))
    if definition.archived_at is not None:
        enforce_ceiling("workflows", active_workflows())
        definition.archived_at = None
        definition.save(update_fields=["archived_at", "updated_at"])
        log.info("workflow_unarchived", workflow=name)
    return definition


# Sent (with ``name``) in the transaction that deletes a workflow of the tenant in context, for
# what refers to it by name to let go of it (a webhook's ``workflows``).
workflow_deleted = Signal()


@transaction.atomic
def workflow_delete(*, name: str) -> None:
    """Delete the workflow ``name`` with its versions, event triggers and schedules, if none of its
    versions has a run left (409 naming ``runs`` otherwise: archive it instead; runs go when the
    plan's history retention removes them). Its name is free again: a schedule kept would start
    runs of whatever workflow takes the name next."""
    definition = first_or_404(WorkflowDefinition.objects.select_for_update().filter(name=name))
    # Its schedules before its versions, in the order a firing takes them (its schedule's row, then, at
    # its commit, its run's reference to the version): taken the other way, a firing at this moment and
    # the deletion each waited for the other, and PostgreSQL aborted one of them as a deadlock. Among
    # them, in the order a firing locks its due schedules (earliest wake first), for the same reason.
    list(Schedule.objects.select_for_update().filter(workflow=name).order_by("wake_at", "id")
         .values_list("pk", flat=True))
    lock_versions(definition)
    count = WorkflowRun.objects.filter(workflow__definition=definition).count()
    if count:
        message = (f"Workflow '{name}' has {count} run(s) in its history and cannot be deleted: archive it "
                   "instead (its runs are kept until the plan's history retention removes them).")
        raise Conflict(message, details={"runs": [message]})
    schedules, _ = Schedule.objects.filter(workflow=name).delete()
    workflow_deleted.send(sender=WorkflowDefinition, name=name)
    definition.delete()
    log.info("workflow_deleted", workflow=name, schedules=schedules)


def lock_versions(definition: WorkflowDefinition) -> None:
    """Lock the versions of ``definition``, as its deletion does before it counts its runs: a start
    in flight, whose run's reference to its version is checked at its commit, has committed then,
    and its run is counted; or it waits for the deletion and finds the workflow gone (404)."""
    list(WorkflowVersion.objects.select_for_update().filter(definition=definition).values_list("pk", flat=True))


def run_start(
    *,
    workflow: str,
    version: int | None = None,
    input: Any = None,
    idempotency_key: str | None = None,
    tier: str | None = None,
    tags: list[str] | None = None,
    fairness_key: str = "",
) -> tuple[WorkflowRun, bool]:
    """Start a run of the tenant in context. Returns ``(run, created)``.

    ``fairness_key`` (at most ``MAX_FAIRNESS_KEY`` characters, "" for none) puts its work under that key of the
    tenant's: its keys share the tenant's dispatches by weight (``docs/fair-queue.md``).

    With an ``idempotency_key`` already used by this tenant, returns that run
    and starts nothing. Charges the monthly run quota (429 when used up) in the
    same transaction that creates the run: a refused start leaves nothing. The
    run's first tick runs in that transaction too, in a savepoint of it
    (``workflows.engine.tick.advance_locked``): the run commits with its first
    steps queued, its events in one ``INSERT``. Its trace starts here (a
    ``ductor.run.start`` span, in the request's).
    """
    tenant = current_tenant()
    limits = effective_entitlements(tenant)
    if idempotency_key:
        existing = _run_of_key(idempotency_key)
        if existing is not None:
            _check_same_start(existing, "idempotency_key", workflow, version, input)
            return existing, False
    size = json_size(input if input is not None else {})
    if size > limits.max_payload_bytes:
        raise payload_too_large("input", size, limits.max_payload_bytes)
    if not _fairness_key_ok(fairness_key):
        raise ApiError("Invalid field(s): fairness_key.", code=ErrorCode.INVALID,
                       details={"fairness_key": [FAIRNESS_KEY_RULE]})
    tier = tier or limits.default_tier
    if tier not in limits.allowed_tiers:
        raise ApiError(f"Invalid field(s): tier. Plan '{limits.plan}' allows {', '.join(limits.allowed_tiers)}.",
                       code=ErrorCode.INVALID, details={"tier": [f"Not allowed by plan '{limits.plan}'."]})
    found = version_to_start(workflow, version)
    if found is None:
        named, missing = _not_found(workflow, version)
        raise NotFound(missing, details={named: [missing]})
    if found.definition.archived_at is not None:
        raise archived(found.definition, "workflow", "starts no new run")
    _check_input(found, input)
    run, created = _start(found, input=input, idempotency_key=idempotency_key, tier=tier, tags=tags,
                          fairness_key=fairness_key)
    if not created:  # a concurrent start with the key won
        _check_same_start(run, "idempotency_key", workflow, version, input)
    return run, created


def _run_of_key(key: str) -> WorkflowRun | None:
    """The tenant's run that ``key`` started, if any (with its version, to compare a request with)."""
    return WorkflowRun.objects.select_related("workflow").filter(idempotency_key=key).first()


def _check_same_start(run: WorkflowRun, field: str, workflow: str, version: int | None, input: Any,
                      first: str = "") -> None:
    """``409 idempotency_key_reused`` unless a start of ``workflow`` (``version``, if named) with
    ``input`` is the one that started ``run`` with its key (``first`` names that start, when it is
    not a run that exists: an earlier item of the same batch). A rerun's key is not a start's."""
    compared = {"workflow": (run.workflow_name, workflow), "input": (run.input, {} if input is None else input),
                "rerun_of": (None if run.rerun_of_id is None else str(run.rerun_of_id), None)}
    if version is not None:
        compared["version"] = (run.workflow.number, version)
    check_key_reuse(field, str(run.idempotency_key), first or f"run {run.pk}", compared)


def _input_errors(found: WorkflowVersion, value: Any, prefix: str = "") -> dict[str, list[str]]:
    """What the workflow's ``input_schema`` finds wrong in a run's input, by field (``input.qty``,
    under ``prefix``, such as ``runs[3].``)."""
    given = {} if value is None else value
    return {prefix + field: [message] for field, message in run_input_problems(found.pk, given)}


def _check_input(found: WorkflowVersion, value: Any) -> None:
    """``400 invalid`` naming each field of the input the workflow's ``input_schema`` refuses."""
    errors = _input_errors(found, value)
    if errors:
        raise ApiError(f"Invalid field(s): {', '.join(errors)}. The workflow's input_schema refuses them.",
                       code=ErrorCode.INVALID, details=errors)


def _start(found: WorkflowVersion, *, input: Any, idempotency_key: str | None, tier: str, tags: list[str] | None,
           rerun_of: WorkflowRun | None = None, fairness_key: str = "") -> tuple[WorkflowRun, bool]:
    """Create and start a run of ``found`` (checked by the caller), charging the quota: see ``run_start``."""
    workflow = found.definition.name
    # In a transaction of its own, the run's row and its first tick's writes travel with the COMMIT,
    # and the quota's charge after them (the month's row stays locked for the commit alone).
    owned = not connection.in_atomic_block
    charge = None
    try:
        with (tracing.span("ductor.run.start", workflow=workflow) as span, transaction.atomic(),
              journal(with_commit=owned)):
            if owned:
                charge = quota_consume_at_commit(runs=1)
            else:
                quota_consume(runs=1)
            # Written as started (what its first tick would make it first): one UPDATE of every index less;
            # created when it started, before its events and its first steps, though its row is written after them.
            now = timezone.now()
            run = WorkflowRun(workflow=found, workflow_name=workflow, input={} if input is None else input,
                              idempotency_key=idempotency_key or None, tier=tier, tags=tags or [],
                              rerun_of=rerun_of, fairness_key=fairness_key or "",
                              status=WorkflowRun.Status.RUNNING, started_at=now, created_at=now)
            run.root_run_id = run.id
            span.set_attribute("run_id", str(run.id))
            add_run(run)  # written with the tick's writes; this transaction's until it commits: the tick's lock
            if rerun_of is None:
                record_event(run, "created", version=found.number)
            else:
                record_event(run, "created", version=found.number, rerun_of=str(rerun_of.pk))
            record_event(run, "started")
            advance_locked(run, latest={})  # a new run: no attempts yet
    except IntegrityError as exc:
        if charge is not None and (refused := charge.refusal(exc)) is not None:
            raise refused from None
        if not WorkflowVersion.objects.filter(pk=found.pk).exists():  # deleted while this run started
            raise NotFound(f"Workflow '{workflow}' not found: it was deleted.") from None
        # Another request with the same idempotency key won the race.
        existing = _run_of_key(idempotency_key) if idempotency_key else None
        if existing is None:
            raise
        return existing, False
    log.info("run_started", run_id=str(run.id), workflow=workflow, version=found.number,
             rerun_of=str(rerun_of.pk) if rerun_of else None)
    return run, True


def run_rerun(*, run: WorkflowRun, input: Any = None, idempotency_key: str | None = None) -> tuple[WorkflowRun, bool]:
    """Start a new run of ``run``'s version, with its input (or ``input``), tier (the plan's default
    tier when the plan no longer allows it) and tags; the new run records that it is a rerun of
    ``run`` (``rerun_of``, and its ``created`` event). Charged to the quota like any start;
    idempotent with ``idempotency_key``. Returns ``(run, created)``."""
    given = run.input if input is None else input
    if idempotency_key:
        existing = _run_of_key(idempotency_key)
        if existing is not None:
            _check_same_rerun(existing, run, given)
            return existing, False
    limits = effective_entitlements(current_tenant())
    size = json_size(given)
    if size > limits.max_payload_bytes:
        raise payload_too_large("input", size, limits.max_payload_bytes)
    found = WorkflowVersion.objects.select_related("definition").get(pk=run.workflow_id)
    if found.definition.archived_at is not None:
        raise archived(found.definition, "workflow", "starts no new run")
    _check_input(found, given)
    # In the run's tier while the plan allows it: one it has lost since (a downgrade) would refuse every step.
    again, created = _start(found, input=given, idempotency_key=idempotency_key, tier=limits.queue_tier(run.tier),
                            tags=run.tags, rerun_of=run, fairness_key=run.fairness_key)
    if not created:  # a concurrent start with the key won
        _check_same_rerun(again, run, given)
    return again, created


def _check_same_rerun(existing: WorkflowRun, run: WorkflowRun, given: Any) -> None:
    """``409 idempotency_key_reused`` unless ``existing`` is the rerun of ``run`` with ``given`` as input."""
    check_key_reuse("idempotency_key", str(existing.idempotency_key), f"run {existing.pk}",
                    {"rerun_of": (str(existing.rerun_of_id), str(run.pk)), "input": (existing.input, given)})


# Attempts a retry starts again: those that failed, and those the failure cancelled.
RETRIED = frozenset({StepRun.Status.FAILED, StepRun.Status.CANCELLED})


def run_retry(*, run: WorkflowRun) -> WorkflowRun:
    """Resume a failed run where it failed: the same run, running again, with a new attempt of each
    node that failed or that the failure cancelled, and then the nodes that never ran, as their
    dependencies finish. The nodes that succeeded (or were skipped) keep their attempts and outputs,
    and are not run again. One transaction, with the run's row locked: a run retried twice at once
    is retried once; should its tick fail, nothing changes. A run that has not failed (409), or a
    child run its parent's node waits for (409: retry its parent, which starts the child again), is
    refused; a child started with ``"wait": false`` runs on by itself, and is retried as a root run
    is. A run whose tier its plan no longer allows goes on in the plan's default tier."""
    with transaction.atomic(), journal():
        locked = lock_run(run.pk)
        if locked is None:
            raise NotFound("Run not found.")
        if locked.parent_run_id is not None and waited_on_by_parent(locked):
            raise Conflict(f"Run {locked.pk} is a child of run {locked.parent_run_id}: retry that run, which starts "
                           "this node's child again.", details={"parent_run_id": [str(locked.parent_run_id)]})
        if locked.status != WorkflowRun.Status.FAILED:
            raise Conflict(f"Run {locked.pk} is {locked.status}: only a failed run can be retried.",
                           details={"status": [f"Is {locked.status}, not failed."]})
        tier = effective_entitlements(current_tenant()).queue_tier(locked.tier)
        if tier != locked.tier:  # one its plan has lost since it started (a downgrade) would refuse every step
            locked.tier = tier
            WorkflowRun.objects.filter(pk=locked.pk).update(tier=tier)
        latest = latest_attempts(locked)
        again = {node: step.attempt for node, step in latest.items() if step.status in RETRIED}
        for node in again:
            del latest[node]
        resume(locked, again)
        locked.status, locked.finished_at, locked.error, locked.output = WorkflowRun.Status.RUNNING, None, None, None
        add_state(locked)
        record_event(locked, "retried", nodes=sorted(again))
        arm_run_timeout(locked)  # its timeout_s counts again from now
        advance_locked(locked, latest=latest, queued_again=False)  # it fails, and the retry with it
    log.info("run_retried", run_id=str(locked.pk), nodes=sorted(again))
    return locked


def run_retry_many(*, filters: dict[str, Any], limit: int) -> tuple[list[WorkflowRun], bool]:
    """Retry up to ``limit`` of the tenant's failed runs that match ``filters`` (the run list's, and
    ``ids``), oldest first, each as ``run_retry`` does, in a transaction of its own; and whether more
    match. A child run is not taken: its root is, and starts it again. A run retried meanwhile (by
    another call) is left out of the answer."""
    matching = run_list(filters).filter(status=WorkflowRun.Status.FAILED, parent_run_id__isnull=True)
    if filters.get("ids"):
        matching = matching.filter(pk__in=filters["ids"])
    found = list(matching.order_by("created_at", "id").only("id")[:limit + 1])
    retried = []
    for run in found[:limit]:
        try:
            retried.append(run_retry(run=run))
        except (Conflict, NotFound):  # no longer failed, or gone: retried or removed meanwhile
            continue
    log.info("runs_retried", runs=len(retried), more=len(found) > limit)
    return retried, len(found) > limit


def _not_found(workflow: str, version: int | None) -> tuple[str, str]:
    """The field a start of no such ``workflow``, or no such ``version`` of it, names, and what it
    says: ``version`` when the workflow exists, ``workflow`` otherwise."""
    missing = f"Workflow '{workflow}'" + (f" version {version}" if version else "") + " not found."
    named = "version" if version and WorkflowDefinition.objects.filter(name=workflow).exists() else "workflow"
    return named, missing


def run_start_many(*, runs: list[dict[str, Any]], same_keys: bool = False) -> list[tuple[WorkflowRun, bool]]:
    """Start many runs of the tenant in context at once, all or none. Returns ``(run, created)`` per item, in order.

    Each item holds what ``run_start`` takes. An item whose ``idempotency_key``
    this tenant already used, or that an earlier item of the batch uses, gets
    that run and starts nothing (with ``same_keys``, as the API asks: only if it
    is the same start, ``409 idempotency_key_reused`` naming it otherwise;
    schedules and triggers own their keys). Every item is checked before anything is
    written: a bad item is a 400 naming it (``runs[3].tier``) and starts
    nothing. The new runs are charged to the monthly quota together, in the
    transaction that creates them (429 when they do not all fit). A few
    queries for the whole batch, plus one fair-queue push per new run on commit.
    """
    if not runs or len(runs) > MAX_BULK_RUNS:
        raise ApiError(f"Invalid field(s): runs. Give 1 to {MAX_BULK_RUNS} runs.", code=ErrorCode.INVALID,
                       details={"runs": [f"Give 1 to {MAX_BULK_RUNS} runs, not {len(runs)}."]})
    limits = effective_entitlements(current_tenant())
    versions: dict[tuple[str, int | None], WorkflowVersion | None] = {}
    errors: dict[str, list[str]] = {}
    for index, item in enumerate(runs):
        field = f"runs[{index}]"
        size = json_size({} if item.get("input") is None else item["input"])
        if size > limits.max_payload_bytes:
            raise payload_too_large(f"{field}.input", size, limits.max_payload_bytes)
        if (item.get("tier") or limits.default_tier) not in limits.allowed_tiers:
            errors[f"{field}.tier"] = [f"Not allowed by plan '{limits.plan}'."]
        if not _fairness_key_ok(item.get("fairness_key")):
            errors[f"{field}.fairness_key"] = [FAIRNESS_KEY_RULE]
        wanted = (item["workflow"], item.get("version"))
        if wanted not in versions:
            versions[wanted] = version_to_start(*wanted)
        found = versions[wanted]
        if found is None:
            named, missing = _not_found(*wanted)
            errors[f"{field}.{named}"] = [missing]
        elif found.definition.archived_at is not None:
            errors[f"{field}.workflow"] = [f"Workflow '{wanted[0]}' is archived and starts no new run."]
        else:
            errors.update(_input_errors(found, item.get("input"), f"{field}."))
    if errors:
        raise ApiError(f"Invalid field(s): {', '.join(errors)}.", code=ErrorCode.INVALID, details=errors)
    runs = [{**item, "tier": item.get("tier") or limits.default_tier} for item in runs]
    return again_while_keys_are_taken(lambda: _start_many(runs, versions, same_keys), len(runs))


def _start_many(
    runs: list[dict[str, Any]], versions: dict[tuple[str, int | None], WorkflowVersion | None], same_keys: bool
) -> list[tuple[WorkflowRun, bool]]:
    keys = [item["idempotency_key"] for item in runs if item.get("idempotency_key")]
    by_key: dict[str, WorkflowRun] = {}
    if keys:
        by_key = {run.idempotency_key: run for run in WorkflowRun.objects.select_related("workflow")
                  .filter(idempotency_key__in=keys) if run.idempotency_key}
    results: list[tuple[WorkflowRun, bool]] = []
    new: list[WorkflowRun] = []
    first_in_batch: dict[str, int] = {}  # a key's first item, where this batch starts its run
    for index, item in enumerate(runs):
        key = item.get("idempotency_key") or None
        if key is not None and key in by_key:
            if same_keys:
                earlier = first_in_batch.get(key)
                _check_same_start(by_key[key], f"runs[{index}].idempotency_key", item["workflow"],
                                  item.get("version"), item.get("input"),
                                  first=f"runs[{earlier}]" if earlier is not None else "")
            results.append((by_key[key], False))
            continue
        version = versions[(item["workflow"], item.get("version"))]
        assert version is not None  # checked by run_start_many
        given = {} if item.get("input") is None else item["input"]
        run = WorkflowRun(workflow=version, workflow_name=version.definition.name, input=given,
                          idempotency_key=key, tier=item["tier"], tags=item.get("tags") or [],
                          fairness_key=item.get("fairness_key") or "")
        run.root_run_id = run.id
        new.append(run)
        results.append((run, True))
        if key is not None:
            by_key[key] = run
            first_in_batch[key] = index
    if new:
        with transaction.atomic():
            # The runs, their keys in one order, before the month's charge: a start in a transaction of
            # its own writes its run (its key), then charges the month with its commit, and two bulk
            # starts sharing keys take them in turn. Charged first, the month's row was held while a
            # key was waited for, by a start that held the key and waited for the row: a deadlock.
            WorkflowRun.objects.bulk_create(sorted(new, key=lambda run: run.idempotency_key or ""))
            quota_consume(runs=len(new))
            # The history's first event, as record_event writes it for one run.
            RunEvent.objects.bulk_create(
                [RunEvent(run=run, seq=1, type="created", data={"version": run.workflow.number}) for run in new]
            )
            for run in new:  # and logged as record_event logs one: every event of a history is
                log.info("run_created", run_id=str(run.id), node_id=None)
            enqueue_ticks(new)
    log.info("runs_started", count=len(new), existing=len(runs) - len(new))
    return results


@transaction.atomic
def run_cancel(*, run: WorkflowRun) -> WorkflowRun:
    """Ask a run (and its waiting children) to stop. Idempotent; a finished run is unchanged. A run
    that continued as new stands for its chain, as a workflow's id does for its runs: the last run
    of the chain is asked instead, and answered (followed again if it continued meanwhile)."""
    locked = WorkflowRun.objects.select_for_update().get(pk=run.pk)
    if locked.status == WorkflowRun.Status.CONTINUED:
        last = chain_end(locked.pk)
        if last is not None and last.pk != locked.pk:
            return run_cancel(run=last)
    if not locked.is_terminal and not locked.cancel_requested:
        locked.cancel_requested = True
        locked.save(update_fields=["cancel_requested", "updated_at"])
        record_event(locked, "cancel_requested")
        cancel_on_commit([locked])
    return locked


# How many times a cancel of many looks again for runs that started while it waited for a lock.
CANCEL_PASSES = 3


def _lock_matching(matching: Any, wanted: int) -> list[WorkflowRun]:
    """Up to ``wanted`` of the runs ``matching`` finds, oldest first, locked. A run locked by its
    tick when the statement came is left out if the tick ended it (ContinueAsNew: ``continued``),
    and the successor the tick started was not in the statement's snapshot: while it has fewer than
    wanted, another pass looks again, in a snapshot of its own, for the runs that started meanwhile
    (a loop's next run), until one finds none, ``CANCEL_PASSES`` at most."""
    runs: list[WorkflowRun] = []
    for again in range(CANCEL_PASSES):
        found = list(matching.exclude(pk__in=[run.pk for run in runs]).order_by("created_at", "id")
                     .select_for_update()[:wanted - len(runs)])
        runs += found
        if len(runs) >= wanted or (again and not found):
            break
    return runs


def _chain_ends(ids: list[Any]) -> list[Any]:
    """The last run of the chain of each of ``ids`` that continued as new: a cancel of it is its chain's."""
    continued = WorkflowRun.objects.filter(pk__in=ids, status=WorkflowRun.Status.CONTINUED).values_list("pk", flat=True)
    return [last.pk for pk in continued if (last := chain_end(pk)) is not None]


@transaction.atomic
def run_cancel_many(*, filters: dict[str, Any], limit: int) -> tuple[list[WorkflowRun], bool]:
    """Ask up to ``limit`` of the tenant's active runs that match ``filters`` (the run list's, and
    ``ids``: one that continued as new names the last run of its chain) to stop, oldest first, as
    ``run_cancel`` does each; and whether more match. Locked in
    one order, so two such calls never wait on each other in a cycle."""
    matching = run_list(filters).filter(cancel_requested=False).exclude(status__in=WorkflowRun.TERMINAL)
    if filters.get("ids"):
        matching = matching.filter(pk__in=[*filters["ids"], *_chain_ends(filters["ids"])])
    runs = _lock_matching(matching, limit + 1)
    runs, more = runs[:limit], len(runs) > limit
    WorkflowRun.objects.filter(pk__in=[run.pk for run in runs]).update(cancel_requested=True,
                                                                     updated_at=timezone.now())
    for run in runs:
        run.cancel_requested = True
        record_event(run, "cancel_requested")
    cancel_on_commit(runs)
    log.info("runs_cancel_requested", runs=len(runs), more=more)
    return runs, more
