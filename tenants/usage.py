"""Usage and the limits enforced on it: the monthly run quota and object ceilings.

PostgreSQL is the truth for the run quota: one atomic upsert per run start,
which only increments while under the quota. Redis holds a fast-path flag once
a month is used up, so refused starts do not touch PostgreSQL; a process whose
last upsert for the tenant's month left room under the same quota does not ask
for the flag (the upsert decides anyway: at worst one more refused upsert per
process once the month is used up elsewhere). The flag records
the quota it was set for and is honoured only while that is still the tenant's
quota, so any change of the limit (override, plan change, plan edit) lifts it at
once; it also expires at the month's reset and is cleared when the tenant's
limits are invalidated.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any

from django.db import connection
from django.db.models import QuerySet
from django.dispatch import receiver
from django.utils import timezone

from ductor_project.core.context import current_tenant
from ductor_project.core.errors import ApiError, ErrorCode
from ductor_project.core.keys import redis_key
from ductor_project.core.redis import get_redis
from tenants.entitlements import CEILING_FIELDS, effective_entitlements, limits_changed
from tenants.models import MonthlyUsage, Tenant


class QuotaExceeded(ApiError):
    status_code = 429
    error_code = ErrorCode.QUOTA_EXCEEDED
    default_detail = "Monthly run quota exceeded."


class PlanLimitReached(ApiError):
    status_code = 403
    error_code = ErrorCode.PLAN_LIMIT_REACHED
    default_detail = "Plan limit reached."


def month_start(now: datetime | None = None) -> date:
    now = (now or timezone.now()).astimezone(UTC)
    return date(now.year, now.month, 1)


def next_reset(now: datetime | None = None) -> datetime:
    """When the monthly quota resets: midnight UTC on the first of next month."""
    start = month_start(now)
    year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)


# (tenant id, month) -> (the quota, the month's runs) that this process's last upsert of them
# returned: while that left room, the flag is not read. Cleared whole beyond ``_ROOM_SEEN_MAX``.
_room_seen: dict[tuple[Any, date], tuple[int, int]] = {}
_ROOM_SEEN_MAX = 10_000


def _flag_key(tenant: Tenant, month: date) -> str:
    return redis_key("quota-exhausted", f"{month:%Y-%m}", tenant=tenant)


@receiver(limits_changed)
def clear_quota_flag(sender: Any, tenant: Tenant, **kwargs: Any) -> None:
    """The tenant's limits changed: its "month used up" flag goes (it is only a shortcut)."""
    get_redis().delete(_flag_key(tenant, month_start()))


def _quota_error(tenant: Tenant, quota: int) -> QuotaExceeded:
    reset = next_reset()
    retry_after = max(1, int((reset - timezone.now()).total_seconds()))
    return QuotaExceeded(
        f"Monthly run quota of {quota} runs is used up; it resets at {reset.isoformat()}.",
        details={"limit": "monthly_run_quota", "quota": quota, "plan": tenant.plan_id,
                 "resets_at": reset.isoformat()},
        headers={"Retry-After": str(retry_after)},
    )


def quota_consume(*, runs: int = 1) -> int:
    """Charge ``runs`` run starts to the tenant in context; returns the month's new total.

    Raises ``QuotaExceeded`` (429) when the quota would be passed, changing nothing,
    and ``ValueError`` when ``runs < 1``.
    Atomic under concurrency (one conditional upsert). Call it inside the
    transaction that creates the run, so a failed start rolls the charge back.
    """
    if runs < 1:
        raise ValueError(f"runs must be at least 1, not {runs!r}")
    tenant = current_tenant()
    quota = effective_entitlements(tenant).monthly_run_quota
    month = month_start()
    flag, seen = _flag_key(tenant, month), _room_seen.get((tenant.pk, month))
    if seen is None or seen[0] != quota or seen[1] + runs > quota:
        flagged = get_redis().get(flag)
        if flagged is not None and int(flagged) == quota:
            raise _quota_error(tenant, quota)
    # One statement, atomic on its own: no savepoint inside the caller's transaction (two round trips).
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {MonthlyUsage._meta.db_table} (tenant_id, month, runs_started)
            SELECT %(tenant)s, %(month)s, %(runs)s WHERE %(runs)s <= %(quota)s
            ON CONFLICT (tenant_id, month) DO UPDATE
                SET runs_started = {MonthlyUsage._meta.db_table}.runs_started + EXCLUDED.runs_started
                WHERE {MonthlyUsage._meta.db_table}.runs_started + EXCLUDED.runs_started <= %(quota)s
            RETURNING runs_started
            """,  # noqa: S608 - table name from model meta, values are parameters
            {"tenant": tenant.pk, "month": month, "runs": runs, "quota": quota},
        )
        row = cursor.fetchone()
    if row is None:
        _room_seen.pop((tenant.pk, month), None)
        if runs == 1:  # only a refused single run proves the month is used up
            ttl = max(1, int((next_reset() - timezone.now()).total_seconds()))
            get_redis().set(flag, quota, ex=ttl)
        raise _quota_error(tenant, quota)
    if len(_room_seen) >= _ROOM_SEEN_MAX:
        _room_seen.clear()
    _room_seen[(tenant.pk, month)] = (quota, int(row[0]))
    return int(row[0])


def runs_this_month() -> int:
    """Runs started by the tenant in context this month."""
    usage = MonthlyUsage.objects.filter(month=month_start()).first()
    return usage.runs_started if usage else 0


# kind -> a function counting the tenant's objects of that kind. Apps register
# their models in AppConfig.ready() (for example "pools" -> Pool.objects.count).
_CEILING_COUNTERS: dict[str, Callable[[], int]] = {}


def register_ceiling_counter(kind: str, counter: Callable[[], int]) -> None:
    if kind not in CEILING_FIELDS:
        raise ValueError(f"unknown ceiling kind '{kind}'")
    _CEILING_COUNTERS[kind] = counter


def object_counts() -> dict[str, int]:
    """Objects per ceiling kind for the tenant in context (0 for kinds not yet registered)."""
    return {kind: (_CEILING_COUNTERS[kind]() if kind in _CEILING_COUNTERS else 0) for kind in CEILING_FIELDS}


def enforce_ceiling(kind: str, existing: QuerySet[Any]) -> None:
    """Refuse creating one more ``kind`` object past the plan's ceiling (403 plan_limit_reached).

    Locks the tenant row first, so concurrent creates of one tenant are
    serialized and cannot overshoot. Call it inside the creating transaction.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("enforce_ceiling() must run inside the creating transaction")
    if kind not in CEILING_FIELDS:
        raise ValueError(f"unknown ceiling kind '{kind}'")
    tenant = current_tenant()
    field = CEILING_FIELDS[kind]
    # FOR NO KEY UPDATE: serializes the tenant's ceiling checks without blocking
    # (or waiting for) inserts of its rows, whose foreign keys take FOR KEY SHARE.
    list(Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk).values_list("pk"))
    limit = getattr(effective_entitlements(tenant), field)
    current = existing.count()
    if current >= limit:
        raise PlanLimitReached(
            f"Plan '{tenant.plan_id}' allows at most {limit} {kind} ({field}).",
            details={"limit": field, "plan": tenant.plan_id, "maximum": limit, "current": current},
        )
