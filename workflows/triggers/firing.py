"""Firing schedules: a tenant's ``schedules_due`` wake-up.

When a tenant's wake-up falls due, a ``ductor.system`` worker runs ``fire_due``
in that tenant's context (``scheduling.coordinator.wakeups``):

1. One transaction locks the tenant's active schedules whose ``wake_at`` has
   come (at most ``DUCTOR_SCHEDULE_FIRE_BATCH``, the earliest first), FOR UPDATE:
   two deliveries of one wake-up take turns, and the second finds the
   schedules already moved on.
2. ``plan_fires`` walks each one's fire times from ``next_fire_at`` up to now.
   A fire whose start (its time plus its jitter) is more than
   ``catchup_window_s`` ago is *missed* (counted, never started); so is every
   fire while the tenant is suspended. The others go to the overlap policy,
   which looks at the last run the schedule started (active while it, or a run
   of its lineage such as its ContinueAsNew successor, is): ``allow_all`` starts each;
   ``skip`` starts one only while no run of the schedule is active, and counts
   the rest as skipped; ``buffer_one`` keeps the first such fire (the others
   are skipped) and starts it once that run has ended, at the first wake after
   it (the schedule is looked at every ``DUCTOR_SCHEDULE_BUFFER_CHECK_S`` while it
   holds one).
3. Each fire to start becomes a run of the tenant with the idempotency key
   ``schedule:<id>:<fire time>``, started in bulk by ``run_start_many`` (charged
   to the monthly quota; a key that already has its run starts nothing). A
   refused start (quota, a workflow deleted since) fails that fire alone: it is
   counted and its error kept on the schedule.
   A schedule whose timing this process cannot read (a time zone its tzdata
   lacks) is put off alone, with the reason in ``last_error``.
4. The schedules' new state commits with their runs, in the same transaction:
   a fire is started and recorded, or neither. Then the wake-up is armed again
   at the earliest ``wake_at``.

Whatever happens around it, a fire starts at most one run (its key is unique
per tenant) and, while PostgreSQL keeps the schedule, a fire inside the
catch-up window is not lost: the schedule's ``next_fire_at`` only moves past a
fire in the transaction that starts or counts it, and a lost wake-up is put
back from ``wake_at`` (``workflows.triggers.reconcile``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ductor_project.core import tracing
from ductor_project.core.context import current_tenant
from ductor_project.core.errors import ApiError
from tenants.models import Tenant
from workflows.models import Schedule, WorkflowRun
from workflows.services import MAX_BULK_RUNS, run_start_many
from workflows.triggers.arming import arm_on_commit, due_at, earliest_wake, timing_of, wake_of
from workflows.triggers.statements import save_fired
from workflows.triggers.timing import UNREADABLE, fire_key

log = structlog.get_logger(__name__)

Overlap = Schedule.Overlap
# Fire times one schedule walks per wake-up; a longer catch-up goes on in the next wake-up, at once.
MAX_FIRES_PER_WAKE = 100
# How long a schedule whose timing this process cannot read waits before it is looked at again.
UNREADABLE_RETRY_S = 60


@dataclass
class FirePlan:
    """What one wake-up does with one schedule: the fires to start, in order, and what it counts."""

    start: list[datetime] = field(default_factory=list)
    skipped: int = 0
    missed: int = 0
    last_missed: datetime | None = None
    next_fire: datetime | None = None
    buffered: datetime | None = None
    more: bool = False  # it stopped at MAX_FIRES_PER_WAKE: look again at once

    def miss(self, fire: datetime, count: int = 1) -> None:
        self.missed += count
        self.last_missed = fire


@dataclass(frozen=True)
class Outcome:
    """How the start of one fire went: its run (``created`` False: the key had its run already), or
    why it was refused."""

    run: WorkflowRun | None
    created: bool = False
    error: dict[str, Any] | None = None


def plan_fires(schedule: Schedule, now: datetime, *, suspended: bool, active: bool) -> FirePlan:
    """The fires of ``schedule`` due by ``now`` and what becomes of each (see the module docs);
    ``active``: a run it started is still active. Reads nothing but the schedule."""
    timing, window = timing_of(schedule), timedelta(seconds=schedule.catchup_window_s)
    plan = FirePlan(buffered=schedule.buffered_fire_at)
    if plan.buffered is not None and (suspended or not active):
        if suspended:
            plan.miss(plan.buffered)
        else:
            plan.start.append(plan.buffered)
            active = True
        plan.buffered = None
    fire = schedule.next_fire_at
    if fire is not None:  # fires that even a jitter of 0 leaves past the window: jumped over, counted
        skipped = timing.skip_before(fire, now - window - timedelta(seconds=schedule.jitter_s))
        if skipped.fires and skipped.last is not None:
            plan.miss(skipped.last, skipped.fires)
        fire = skipped.following
    later = timing.after(fire) if fire is not None else iter(())
    walked = 0
    while fire is not None and due_at(schedule, fire) <= now:
        if walked == MAX_FIRES_PER_WAKE:
            plan.more = True
            break
        walked += 1
        if suspended or now - due_at(schedule, fire) > window:
            plan.miss(fire)
        elif schedule.overlap == Overlap.ALLOW_ALL or not active:
            plan.start.append(fire)
            active = True
        elif schedule.overlap == Overlap.BUFFER_ONE and plan.buffered is None:
            plan.buffered = fire
        else:
            plan.skipped += 1
        fire = next(later, None)
    plan.next_fire = fire
    return plan


def fire_due(ref: str, data: dict[str, Any]) -> None:
    """The ``schedules_due`` wake-up, in the tenant's context: ``fire_schedules`` now."""
    fire_schedules(now=timezone.now())


def fire_schedules(*, now: datetime) -> int:
    """Fire the schedules of the tenant in context that are due at ``now`` (see the module docs), then
    arm the wake-up again at the earliest ``wake_at``, once committed. Idempotent; returns how many
    schedules it looked at."""
    tenant = current_tenant()
    with tracing.span("ductor.schedules.fire"), transaction.atomic():
        due = list(Schedule.objects.select_for_update().filter(paused=False, wake_at__lte=now)
                   .order_by("wake_at", "id")[: settings.DUCTOR_SCHEDULE_FIRE_BATCH])
        if due:  # the tenant's status as stored now, not as the object in context was loaded
            status = Tenant.objects.filter(pk=tenant.pk).values_list("status", flat=True).first()
            _fire(due, now, suspended=status != Tenant.Status.ACTIVE)
        arm_on_commit(earliest_wake())
    return len(due)


def _fire(due: list[Schedule], now: datetime, *, suspended: bool) -> None:
    active = _active_runs(due)
    plans = {s.pk: plan for s in due
             if (plan := _plan(s, now, suspended=suspended, active=s.last_run_id in active)) is not None}
    readable = [s for s in due if s.pk in plans]
    wanted = [(s, fire) for s in readable for fire in plans[s.pk].start]
    outcomes = dict(zip([(s.pk, fire) for s, fire in wanted], start_fires(wanted), strict=True))
    for schedule in readable:
        plan = plans[schedule.pk]
        _record(schedule, plan, [(fire, outcomes[(schedule.pk, fire)]) for fire in plan.start], now)
    save_fired(due)
    _log(readable, plans, list(outcomes.values()), suspended=suspended)


def _plan(schedule: Schedule, now: datetime, *, suspended: bool, active: bool) -> FirePlan | None:
    """``plan_fires``, or None when this process cannot read the schedule's timing: a time zone its
    tzdata lacks or an expression its ``cronsim`` refuses (a host older than the one that took it).
    That schedule alone is put off, ``UNREADABLE_RETRY_S`` later, with the reason in ``last_error``;
    the tenant's other schedules fire (one raising here failed the whole wake-up, and all of them)."""
    try:
        return plan_fires(schedule, now, suspended=suspended, active=active)
    except UNREADABLE as exc:
        retry = now + timedelta(seconds=UNREADABLE_RETRY_S)
        message = (f"Its timing cannot be read here ({type(exc).__name__}: {exc}); it is looked at again at "
                   f"{retry.isoformat()}.")
        log.error("schedule_timing_unreadable", schedule_id=str(schedule.pk), timezone=schedule.timezone,
                  cron=schedule.cron, error=str(exc))
        fire = schedule.next_fire_at or now
        schedule.last_error = {"fire_at": fire.isoformat().replace("+00:00", "Z"), "code": "invalid",
                               "message": message}
        schedule.wake_at, schedule.updated_at = retry, now
        return None


def _log(due: list[Schedule], plans: dict[Any, FirePlan], outcomes: list[Outcome], *, suspended: bool) -> None:
    """One line per wake-up; a warning when fires were missed (past their window) or refused."""
    totals = {name: sum(getattr(plan, name) for plan in plans.values()) for name in ("skipped", "missed")}
    refused = [outcome.error for outcome in outcomes if outcome.run is None]
    log.info("schedules_fired", schedules=len(due), started=len(outcomes), **totals, suspended=suspended,
             existing=sum(1 for outcome in outcomes if outcome.run and not outcome.created), refused=len(refused))
    if totals["missed"] and not suspended:
        log.warning("schedule_fires_missed", missed=totals["missed"],
                    schedule_ids=[str(s.pk) for s in due if plans[s.pk].missed][:20])
    if refused:
        log.warning("schedule_fires_refused", refused=len(refused), first_error=refused[0])


def _active_runs(due: list[Schedule]) -> set[Any]:
    """The ids of the last runs of ``due`` (those whose overlap policy asks) that are still active: the
    run itself, or a run of its lineage (its ContinueAsNew successors, its children), whose root it is."""
    ids = [s.last_run_id for s in due if s.last_run_id is not None and s.overlap != Overlap.ALLOW_ALL]
    if not ids:
        return set()
    return set(WorkflowRun.objects.filter(root_run_id__in=ids).exclude(status__in=WorkflowRun.TERMINAL)
               .values_list("root_run_id", flat=True))


def _record(schedule: Schedule, plan: FirePlan, started: list[tuple[datetime, Outcome]], now: datetime) -> None:
    """Apply ``plan`` and the outcome of each fire it started to ``schedule`` (``save_fired`` writes it)."""
    schedule.next_fire_at, schedule.buffered_fire_at = plan.next_fire, plan.buffered
    schedule.skipped_count += plan.skipped
    schedule.missed_count += plan.missed
    if plan.last_missed is not None:
        schedule.last_missed_at = plan.last_missed
    for fire, outcome in started:
        if outcome.run is None:
            schedule.failed_count += 1
            schedule.last_error = outcome.error
            continue
        schedule.last_run_id, schedule.last_fire_at = outcome.run.pk, fire
        schedule.fired_count += int(outcome.created)
    schedule.wake_at = now if plan.more else wake_of(schedule, now)
    schedule.updated_at = now


def start_fires(fires: list[tuple[Schedule, datetime]]) -> list[Outcome]:
    """Start a run for each ``(schedule, fire)``, in order, with the fire's key: in bulk, and one by one
    for a batch that one of them got refused, so that a refused fire refuses no other. Each in a
    savepoint of the caller's transaction."""
    outcomes: list[Outcome] = []
    for chunk in _chunks(fires, MAX_BULK_RUNS):
        try:
            with transaction.atomic():
                started = run_start_many(runs=[fire_request(s, fire) for s, fire in chunk])
        except ApiError:
            outcomes.extend(_start_one(s, fire) for s, fire in chunk)
            continue
        outcomes.extend(Outcome(run, created) for run, created in started)
    return outcomes


def _chunks(items: list[tuple[Schedule, datetime]], size: int) -> Iterable[list[tuple[Schedule, datetime]]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def fire_request(schedule: Schedule, fire: datetime) -> dict[str, Any]:
    """The run start of one fire, as ``run_start_many`` takes it: tagged ``schedule:<its name>``, as an
    event's runs are ``event:<its name>``."""
    return {"workflow": schedule.workflow, "version": schedule.version, "input": schedule.input,
            "tags": [f"schedule:{schedule.name}"], "idempotency_key": fire_key(str(schedule.pk), fire)}


def _start_one(schedule: Schedule, fire: datetime) -> Outcome:
    try:
        with transaction.atomic():
            ((run, created),) = run_start_many(runs=[fire_request(schedule, fire)])
    except ApiError as exc:
        # The bulk start names the field (``runs[0].workflow``); the reason is in its details.
        reasons = [str(m) for value in exc.details.values() if isinstance(value, list) for m in value]
        error = {"fire_at": fire.isoformat().replace("+00:00", "Z"), "code": str(exc.error_code),
                 "message": " ".join(reasons) or str(exc.detail)}
        return Outcome(None, error=error)
    return Outcome(run, created)
