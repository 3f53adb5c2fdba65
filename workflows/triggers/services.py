"""Writes of schedules: create, change, pause, resume, delete.

Guarantees of every function here:
- it acts for the tenant in context (``TenantScopeError`` without one) and is one
  transaction: a refused request (``ApiError``) leaves no row behind;
- bad input is ``400 invalid`` naming the field (``cron``, ``interval_s``, ``timezone``,
  ``workflow``, ``version``, ``name``); an ``input`` over the plan's ``max_payload_bytes``
  is ``413 payload_too_large``; a create past ``max_schedules`` is ``403 plan_limit_reached``;
- the next fire time is computed here, from now, when a schedule is created, when its
  timing changes and when it resumes (the fires of an old timing not yet started are
  dropped; a resumed schedule does not catch up on its pause), and the tenant's wake-up is
  armed once the change commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import structlog
from django.db import IntegrityError, transaction
from django.utils import timezone

from ductor_project.core.context import current_tenant
from ductor_project.core.errors import ApiError, Conflict, ErrorCode, NotFound
from ductor_project.core.payloads import json_size
from tenants.entitlements import effective_entitlements
from tenants.usage import enforce_ceiling
from workflows.engine.attempts import run_input_problems
from workflows.engine.statements import lock_definitions, version_to_start
from workflows.models import Schedule, WorkflowVersion
from workflows.triggers.arming import arm_on_commit, timing_of, wake_of
from workflows.triggers.timing import TimingError, checked_timing

log = structlog.get_logger(__name__)

# The fields a write may set; changing one of the first group moves the next fire time.
TIMING_FIELDS = frozenset({"cron", "interval_s", "timezone"})
FIELDS = frozenset({"name", "workflow", "version", "input", "overlap", "catchup_window_s", "jitter_s", "paused"}
                   | TIMING_FIELDS)


def invalid(errors: Mapping[str, str]) -> ApiError:
    """``400 invalid`` naming each bad field, in the shape the API uses for validation errors; a
    message said of several fields (give cron or interval_s) is said once."""
    messages = " ".join(dict.fromkeys(errors.values()))
    return ApiError(f"Invalid field(s): {', '.join(errors)}. {messages}", code=ErrorCode.INVALID,
                    details={field: [message] for field, message in errors.items()})


def _check(schedule: Schedule, changed: Iterable[str] | None = None) -> None:
    """The tenant-data checks of a schedule about to be written: its timing (normalized in place),
    its input's size when new or when ``changed`` holds its input and, when new or when ``changed``
    holds its workflow, version or input, its workflow (and version: there, not archived) and its
    input as that version's ``input_schema`` takes it. A schedule of a workflow archived or deleted
    since can still be paused or retimed, and so can one whose input is over a plan's
    ``max_payload_bytes`` lowered since: its fires are refused meanwhile, and a pause stops them."""
    try:
        schedule.cron = checked_timing(cron=schedule.cron, interval_s=schedule.interval_s,
                                       timezone=schedule.timezone).cron
    except TimingError as exc:
        raise invalid(exc.errors) from exc
    if changed is None or "input" in changed:
        _check_size(schedule)
    if changed is not None and not {"workflow", "version", "input"} & set(changed):
        return
    lock_definitions(schedule.workflow)  # until the schedule is written: a deletion waits, or is waited for
    version = version_to_start(schedule.workflow, schedule.version)
    if version is None and schedule.version is None:
        raise invalid({"workflow": f"Workflow '{schedule.workflow}' not found."})
    if version is None:
        if not WorkflowVersion.objects.filter(definition__name=schedule.workflow).exists():
            raise invalid({"workflow": f"Workflow '{schedule.workflow}' not found."})
        raise invalid({"version": f"Workflow '{schedule.workflow}' has no version {schedule.version}."})
    if version.definition.archived_at is not None:
        raise invalid({"workflow": f"Workflow '{schedule.workflow}' is archived and starts no new run."})
    # The input its runs will start with, as the version it starts on now takes it (a later version's
    # schema is checked at each fire: a refused fire is counted, with the reason, in last_error).
    problems = run_input_problems(version.pk, schedule.input)
    if problems:
        raise invalid(dict(problems))


def _check_size(schedule: Schedule) -> None:
    """``413 payload_too_large`` naming ``input`` when its input is over the plan's ``max_payload_bytes``."""
    limit = effective_entitlements(current_tenant()).max_payload_bytes
    size = json_size(schedule.input)
    if size > limit:
        raise ApiError(f"Invalid field(s): input. It is {size} bytes; the plan allows {limit}.",
                       code=ErrorCode.PAYLOAD_TOO_LARGE, status_code=413,
                       details={"input": [f"{size} bytes is over the plan's max_payload_bytes ({limit})."]})


def _restart_timing(schedule: Schedule) -> None:
    """Its next fire from now (none while paused), and when it is looked at next."""
    now = timezone.now()
    schedule.buffered_fire_at = None
    schedule.next_fire_at = None if schedule.paused else timing_of(schedule).next_after(now)
    schedule.wake_at = wake_of(schedule, now)


def _save(schedule: Schedule) -> None:
    """Save in a savepoint; a taken name is ``409 conflict`` naming ``name``. Arms the tenant's wake-up."""
    try:
        with transaction.atomic():
            schedule.save()
    except IntegrityError as exc:
        if getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None) != "schedule_unique_name":
            raise
        message = f"A schedule named '{schedule.name}' already exists."
        raise Conflict(message, details={"name": [message]}) from exc
    arm_on_commit(schedule.wake_at)


@transaction.atomic
def schedule_create(*, name: str, workflow: str, **fields: Any) -> Schedule:
    """Create a schedule of the tenant in context; ``fields`` are the others of ``FIELDS`` (defaults
    for those not given). Its first fire is the first fire time after now."""
    enforce_ceiling("schedules", Schedule.objects.all())
    schedule = Schedule(name=name, workflow=workflow)
    for field, value in fields.items():
        if field not in FIELDS:
            raise TypeError(f"unknown schedule field '{field}'")
        setattr(schedule, field, value)
    _check(schedule)
    _restart_timing(schedule)
    _save(schedule)
    log.info("schedule_created", schedule_id=str(schedule.pk), workflow=workflow, next_fire_at=schedule.next_fire_at)
    return schedule


def _locked(schedule: Schedule) -> Schedule:
    row: Schedule | None = Schedule.objects.select_for_update().filter(pk=schedule.pk).first()
    if row is None:
        raise NotFound()
    return row


@transaction.atomic
def schedule_update(*, schedule: Schedule, changes: Mapping[str, Any]) -> Schedule:
    """Change the fields in ``changes`` (the others stay). Giving ``cron`` drops the interval and
    giving ``interval_s`` drops the cron expression, unless both are given."""
    unknown = set(changes) - FIELDS
    if unknown:
        raise TypeError(f"unknown schedule field(s) {sorted(unknown)}")
    if {"workflow", "version", "input"} & set(changes):
        # Its workflows before its row, in the order of their deletion, which locks a workflow and
        # then removes its schedules: never one of each held by the other.
        lock_definitions(schedule.workflow, changes.get("workflow"))
    row = _locked(schedule)
    before = {field: getattr(row, field) for field in (*TIMING_FIELDS, "paused", "jitter_s")}
    if changes.get("cron") and "interval_s" not in changes:
        row.interval_s = None
    if changes.get("interval_s") is not None and "cron" not in changes:
        row.cron = ""
    for field, value in changes.items():
        setattr(row, field, value)
    _check(row, changes)
    moved = any(getattr(row, field) != before[field] for field in (*TIMING_FIELDS, "paused"))
    if moved:
        _restart_timing(row)
    elif row.jitter_s != before["jitter_s"]:
        row.wake_at = wake_of(row, timezone.now())
    _save(row)
    log.info("schedule_updated", schedule_id=str(row.pk), fields=sorted(changes), next_fire_at=row.next_fire_at)
    return row


def schedule_pause(*, schedule: Schedule) -> Schedule:
    """Pause: nothing fires (a buffered fire is dropped) until it resumes. Idempotent."""
    return schedule_update(schedule=schedule, changes={"paused": True})


def schedule_resume(*, schedule: Schedule) -> Schedule:
    """Resume: the next fire is the first fire time after now; the paused time is not caught up.
    Idempotent: a schedule that is not paused keeps its next fire."""
    return schedule_update(schedule=schedule, changes={"paused": False})


@transaction.atomic
def schedule_delete(*, schedule: Schedule) -> None:
    """Delete a schedule; runs it started are kept. A wake-up already due for it changes nothing."""
    row = _locked(schedule)
    schedule_id = str(row.pk)
    row.delete()
    log.info("schedule_deleted", schedule_id=schedule_id)
