"""A tenant's schedule wake-up: when it is due, and putting it in the queue.

Each tenant with active schedules has one coordinator wake-up (``schedules_due``,
a system-tier item of ``scheduling.coordinator.wakeups``) due at the earliest
``wake_at`` of its schedules. Arming it again keeps the earlier due time (the
fair queue coalesces a waiting wake-up; one in flight runs once more after its
ack), so every write that may bring a schedule's wake forward simply arms it,
once its transaction commits.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Min

from ductor_project.core.context import current_tenant
from scheduling.coordinator.wakeups import schedule_wakeup
from tenants.models import Tenant
from workflows.models import Schedule
from workflows.triggers.timing import Timing, jitter_delay

WAKE_KIND = "schedules_due"
WAKE_REF = "schedules"


def timing_of(schedule: Schedule) -> Timing:
    """The stored schedule's timing (checked when it was written)."""
    return Timing(cron=schedule.cron, interval_s=schedule.interval_s, timezone=schedule.timezone)


def due_at(schedule: Schedule, fire: datetime) -> datetime:
    """When the fire ``fire`` of ``schedule`` starts: its nominal time plus its jitter, spread over
    ``jitter_s`` or the time to the next fire, whichever is shorter (as Temporal caps it). A longer
    jitter would start a fire after the next one was due: the fires, started in order, then waited
    for it, and on a healthy system those it held past their catch-up window were missed."""
    jitter_s = schedule.jitter_s
    if jitter_s > 0:
        following = timing_of(schedule).next_after(fire)
        if following is not None:
            jitter_s = min(jitter_s, (following - fire).total_seconds())
    return fire + jitter_delay(str(schedule.pk), fire, jitter_s)


def wake_of(schedule: Schedule, now: datetime) -> datetime | None:
    """When ``schedule`` is looked at next: its next fire plus jitter, or within
    ``DUCTOR_SCHEDULE_BUFFER_CHECK_S`` while a fire is buffered; None while paused."""
    if schedule.paused:
        return None
    wake = due_at(schedule, schedule.next_fire_at) if schedule.next_fire_at is not None else None
    if schedule.buffered_fire_at is not None:
        soon = now + timedelta(seconds=settings.DUCTOR_SCHEDULE_BUFFER_CHECK_S)
        wake = soon if wake is None else min(wake, soon)
    return wake


def arm(tenant: Tenant, at: datetime | None) -> None:
    """Wake ``tenant``'s schedules at ``at`` (or earlier, if a wake-up already says so); None: nothing."""
    if at is not None:
        schedule_wakeup(tenant, WAKE_REF, at, kind=WAKE_KIND)


def arm_on_commit(at: datetime | None) -> None:
    """``arm`` the tenant in context at ``at``, once the surrounding transaction commits."""
    if at is not None:
        tenant = current_tenant()
        transaction.on_commit(lambda: arm(tenant, at))


def earliest_wake() -> datetime | None:
    """The earliest ``wake_at`` of the active schedules of the tenant in context (one indexed query)."""
    first: datetime | None = Schedule.objects.filter(paused=False).aggregate(first=Min("wake_at"))["first"]
    return first
