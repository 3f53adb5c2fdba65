"""Reads of schedules. Every lookup is scoped to the tenant in context: another tenant's id, or a
malformed one, is ``NotFound`` like one that never existed."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from tenants.selectors import first_or_404, parse_uuid
from workflows.models import Schedule
from workflows.triggers.arming import timing_of
from workflows.triggers.timing import UNREADABLE

# How many fire times a schedule's detail shows.
NEXT_FIRES = 5


def schedule_list() -> QuerySet[Schedule]:
    """The tenant's schedules, by name."""
    return Schedule.objects.order_by("name")


def get_schedule_for_tenant(schedule_id: Any) -> Schedule:
    """A schedule of the tenant in context, or ``NotFound``."""
    return first_or_404(Schedule.objects.filter(pk=parse_uuid(schedule_id)))


def next_fires(schedule: Schedule, count: int = NEXT_FIRES) -> list[datetime]:
    """Its next ``count`` nominal fire times, the next one first (none while paused, nor while this
    host cannot read its timing: its ``last_error`` says why it does not fire)."""
    if schedule.paused:
        return []
    try:
        return timing_of(schedule).upcoming(schedule.next_fire_at, count)
    except UNREADABLE:
        return []
