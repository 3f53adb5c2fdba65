"""The firing path's write, written out: every fired schedule's new state in one ``UPDATE``.

A wake-up may fire hundreds of schedules in one transaction. ``bulk_update`` would build one
``CASE`` per column and row, which costs far more to build than PostgreSQL takes to run it; this
sends one ``UPDATE ... FROM (VALUES ...)``, in one round trip. It names the tenant in context
(``current_tenant()``, which raises without one), and row-level security holds it to that tenant
as it holds every query.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import connection

from ductor_project.core.context import current_tenant
from workflows.models import Schedule

SCHEDULES = Schedule._meta.db_table
# The columns a fire changes, with their SQL types.
FIRED_STATE: tuple[tuple[str, str], ...] = (
    ("next_fire_at", "timestamptz"), ("wake_at", "timestamptz"), ("buffered_fire_at", "timestamptz"),
    ("last_fire_at", "timestamptz"), ("last_run_id", "uuid"), ("fired_count", "bigint"),
    ("skipped_count", "bigint"), ("missed_count", "bigint"), ("failed_count", "bigint"),
    ("last_missed_at", "timestamptz"), ("last_error", "jsonb"), ("updated_at", "timestamptz"),
)


def _value(schedule: Schedule, column: str) -> Any:
    value = getattr(schedule, column)
    if column == "last_error":
        return None if value is None else json.dumps(value)
    return value


def save_fired(schedules: Sequence[Schedule]) -> int:
    """Write the ``FIRED_STATE`` columns of ``schedules`` (rows of the tenant in context, locked by
    the caller); returns how many rows changed."""
    if not schedules:
        return 0
    row = "(%s::uuid, " + ", ".join(f"%s::{kind}" for _, kind in FIRED_STATE) + ")"
    names = ", ".join(column for column, _ in FIRED_STATE)
    assignments = ", ".join(f"{column} = v.{column}" for column, _ in FIRED_STATE)
    params: list[Any] = []
    for schedule in schedules:
        params.append(schedule.pk)
        params.extend(_value(schedule, column) for column, _ in FIRED_STATE)
    params.append(current_tenant().pk)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {SCHEDULES} AS s SET {assignments} "  # noqa: S608 - no value in the text
            f"FROM (VALUES {', '.join([row] * len(schedules))}) AS v(id, {names}) "
            "WHERE s.id = v.id AND s.tenant_id = %s",
            params,
        )
        return int(cursor.rowcount)
