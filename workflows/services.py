"""Writes of the workflow engine: definitions, starting and cancelling runs."""

from __future__ import annotations

import json
from typing import Any

import structlog
from django.db import IntegrityError, transaction

from ductor_project.errors import ApiError, ErrorCode, NotFound
from tenants.context import current_tenant
from tenants.entitlements import effective_entitlements
from tenants.usage import enforce_ceiling, quota_consume
from workflows import engine
from workflows.models import WorkflowDefinition, WorkflowRun, WorkflowVersion
from workflows.spec import SpecError, validate_spec

log = structlog.get_logger(__name__)


def _payload_too_large(field: str, size: int, limit: int) -> ApiError:
    return ApiError(
        f"Invalid field(s): {field}. It is {size} bytes; the plan allows {limit}.",
        code=ErrorCode.PAYLOAD_TOO_LARGE, status_code=413,
        details={field: [f"{size} bytes is over the plan's max_payload_bytes ({limit})."]},
    )


def _validated(spec: Any) -> dict[str, Any]:
    """The spec validated and normalized (defaults filled, nodes in topological order)."""
    limit = effective_entitlements(current_tenant()).max_payload_bytes
    try:
        parsed = validate_spec(spec, max_bytes=limit)
    except SpecError as exc:
        details = {f"spec.{k}" if k != "spec" else k: v for k, v in exc.errors.items()}
        raise ApiError(str(exc), code=ErrorCode.INVALID, details=details) from exc
    return parsed.to_dict()


@transaction.atomic
def workflow_put(*, name: str, spec: Any, description: str = "") -> tuple[WorkflowVersion, bool]:
    """Create the workflow ``name`` or add a new version of it. Returns ``(version, created)``.

    Versions are immutable; runs keep the version they started on.
    """
    clean = _validated(spec)
    definition = WorkflowDefinition.objects.select_for_update().filter(name=name).first()
    created = definition is None
    if definition is None:
        enforce_ceiling("workflows", WorkflowDefinition.objects.all())
        definition = WorkflowDefinition.objects.create(name=name, description=description)
    elif description:
        definition.description = description
    definition.latest_version += 1
    definition.save()
    version = WorkflowVersion.objects.create(definition=definition, number=definition.latest_version, spec=clean)
    log.info("workflow_version_created", workflow=name, version=version.number)
    return version, created


def run_start(
    *,
    workflow: str,
    version: int | None = None,
    input: Any = None,
    idempotency_key: str | None = None,
    tier: str | None = None,
    tags: list[str] | None = None,
) -> tuple[WorkflowRun, bool]:
    """Start a run of the tenant in context. Returns ``(run, created)``.

    With an ``idempotency_key`` already used by this tenant, returns that run
    and starts nothing. Charges the monthly run quota (429 when used up) in the
    same transaction that creates the run: a refused start leaves nothing.
    """
    tenant = current_tenant()
    limits = effective_entitlements(tenant)
    if idempotency_key:
        existing = WorkflowRun.objects.filter(idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing, False
    size = len(json.dumps(input if input is not None else {}, separators=(",", ":")).encode())
    if size > limits.max_payload_bytes:
        raise _payload_too_large("input", size, limits.max_payload_bytes)
    tier = tier or "standard"
    if tier not in limits.allowed_tiers:
        raise ApiError(f"Invalid field(s): tier. Plan '{limits.plan}' allows {', '.join(limits.allowed_tiers)}.",
                       code=ErrorCode.INVALID, details={"tier": [f"Not allowed by plan '{limits.plan}'."]})
    versions = WorkflowVersion.objects.filter(definition__name=workflow)
    if version is not None:
        versions = versions.filter(number=version)
    found = versions.select_related("definition").order_by("-number").first()
    if found is None:
        raise NotFound(f"Workflow '{workflow}'" + (f" version {version}" if version else "") + " not found.")
    try:
        with transaction.atomic():
            quota_consume(runs=1)
            run = WorkflowRun(workflow=found, workflow_name=found.definition.name, input=input or {},
                              idempotency_key=idempotency_key or None, tier=tier, tags=tags or [])
            run.root_run_id = run.id
            run.save()
            engine.record_event(run, "created", version=found.number)
            engine.enqueue_tick(run)
    except IntegrityError:
        # Another request with the same idempotency key won the race.
        existing = WorkflowRun.objects.filter(idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return existing, False
    log.info("run_started", run_id=str(run.id), workflow=workflow, version=found.number)
    return run, True


@transaction.atomic
def run_cancel(*, run: WorkflowRun) -> WorkflowRun:
    """Ask a run (and its waiting children) to stop. Idempotent; a finished run is unchanged."""
    locked = WorkflowRun.objects.select_for_update().get(pk=run.pk)
    if not locked.is_terminal and not locked.cancel_requested:
        locked.cancel_requested = True
        locked.save(update_fields=["cancel_requested", "updated_at"])
        engine.record_event(locked, "cancel_requested")
        engine.enqueue_tick(locked)
    return locked
