"""Usage and the limits enforced on it: the monthly run quota and object ceilings.

PostgreSQL is the truth for the run quota: one atomic upsert per run start,
which only increments while under the quota. A start that is a transaction of
its own sends its charge with its ``COMMIT`` (``quota_consume_at_commit``), so
that the month's row, which every start of the tenant updates, stays locked for
the commit alone rather than for the whole start; a charge past the quota then
fails the commit on the row's check constraint. Redis holds a fast-path flag once
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
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet
from django.dispatch import receiver
from django.utils import timezone

from ductor_project.core.context import current_tenant
from ductor_project.core.errors import ApiError, ErrorCode
from ductor_project.core.keys import redis_key
from ductor_project.core.redis import get_redis
from tenants.entitlements import CEILING_FIELDS, effective_entitlements, limits_changed
from tenants.models import WITHIN_RUN_QUOTA, MonthlyUsage, Tenant


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


_TABLE = MonthlyUsage._meta.db_table


@dataclass
class Charge:
    """One charge of the tenant's month: what it is made under, and what its answer means. Called,
    it is the charge sent with a ``COMMIT`` (``quota_consume_at_commit``)."""

    tenant: Tenant
    month: date
    quota: int
    runs: int
    pending: int = 0  # runs the transaction charges with its COMMIT, besides this charge's
    cursor: Any = None  # the one its statement was sent on, read once the commit is back

    def params(self) -> dict[str, Any]:
        return {"tenant": self.tenant.pk, "month": self.month, "runs": self.runs, "quota": self.quota}

    def __call__(self) -> None:
        # Unconditional: past the quota, the row's check constraint fails the statement, and the commit.
        self.cursor = connection.cursor()
        self.cursor.execute(
            f"""
            INSERT INTO {_TABLE} (tenant_id, month, runs_started, run_quota)
            VALUES (%(tenant)s, %(month)s, %(runs)s, %(quota)s)
            ON CONFLICT (tenant_id, month) DO UPDATE
                SET runs_started = {_TABLE}.runs_started + EXCLUDED.runs_started, run_quota = EXCLUDED.run_quota
            RETURNING runs_started
            """,  # noqa: S608 - table name from model meta, values are parameters
            self.params(),
        )

    def committed(self) -> None:
        with self.cursor as cursor:
            self.room_left(int(cursor.fetchone()[0]))

    def room_left(self, total: int) -> int:
        """Note the month's new ``total`` (the flag is not read while it leaves room); returns it."""
        if len(_room_seen) >= _ROOM_SEEN_MAX:
            _room_seen.clear()
        _room_seen[(self.tenant.pk, self.month)] = (self.quota, total)
        return total

    def refused(self) -> QuotaExceeded:
        """PostgreSQL refused the charge: the refusal, remembered in Redis when it proves the month
        is used up (a single run refused with no other charge of the transaction still to commit)."""
        _room_seen.pop((self.tenant.pk, self.month), None)
        if self.runs == 1 and not self.pending:
            ttl = max(1, int((next_reset() - timezone.now()).total_seconds()))
            get_redis().set(_flag_key(self.tenant, self.month), self.quota, ex=ttl)
        return _quota_error(self.tenant, self.quota)

    def refusal(self, exc: IntegrityError) -> QuotaExceeded | None:
        """The refusal when ``exc``, a commit's failure, is the row's check constraint."""
        if getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None) != WITHIN_RUN_QUOTA:
            return None
        return self.refused()

    @classmethod
    def of(cls, runs: int) -> Charge:
        """A charge of ``runs`` for the tenant in context, refused at once when the flag says the
        month is used up under the same quota (read only when this process has not seen room)."""
        if runs < 1:
            raise ValueError(f"runs must be at least 1, not {runs!r}")
        tenant = current_tenant()
        quota = effective_entitlements(tenant).monthly_run_quota
        month = month_start()
        pending = _pending_runs(tenant, month)
        seen = _room_seen.get((tenant.pk, month))
        if seen is None or seen[0] != quota or seen[1] + runs + pending > quota:
            flagged = get_redis().get(_flag_key(tenant, month))
            if flagged is not None and int(flagged) == quota:
                raise _quota_error(tenant, quota)
        return cls(tenant, month, quota, runs, pending)


def _pending_runs(tenant: Tenant, month: date) -> int:
    """Runs of the tenant's month that the transaction in progress charges with its ``COMMIT``."""
    if not connection.in_atomic_block:
        return 0
    writes = connection.writes_with_commit()  # type: ignore[attr-defined]
    charges = [write for write in writes if isinstance(write, Charge)]
    return sum(charge.runs for charge in charges if charge.tenant.pk == tenant.pk and charge.month == month)


def quota_consume(*, runs: int = 1) -> int:
    """Charge ``runs`` run starts to the tenant in context; returns the month's new total.

    Raises ``QuotaExceeded`` (429) when the quota would be passed, changing nothing,
    and ``ValueError`` when ``runs < 1``.
    Atomic under concurrency (one conditional upsert). Call it inside the
    transaction that creates the run, so a failed start rolls the charge back. What
    the transaction charges with its commit counts as charged already.
    """
    charge = Charge.of(runs)
    # One statement, atomic on its own: no savepoint inside the caller's transaction (two round trips).
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {_TABLE} (tenant_id, month, runs_started, run_quota)
            SELECT %(tenant)s, %(month)s, %(runs)s, %(quota)s WHERE %(runs)s + %(pending)s <= %(quota)s
            ON CONFLICT (tenant_id, month) DO UPDATE
                SET runs_started = {_TABLE}.runs_started + EXCLUDED.runs_started, run_quota = EXCLUDED.run_quota
                WHERE {_TABLE}.runs_started + EXCLUDED.runs_started + %(pending)s <= %(quota)s
            RETURNING runs_started
            """,  # noqa: S608 - table name from model meta, values are parameters
            {**charge.params(), "pending": charge.pending},
        )
        row = cursor.fetchone()
    if row is None:
        raise charge.refused()
    return charge.room_left(int(row[0]))


def quota_consume_at_commit(*, runs: int = 1) -> Charge:
    """Charge ``runs`` run starts to the tenant in context with the ``COMMIT`` of the transaction
    in progress, after its other writes (``send_with_commit``): the month's row, which every
    start of the tenant updates, is locked from there to the commit's end only, not for the
    whole transaction. For a start that is a transaction of its own; charges made before the
    commit (``quota_consume``: a child run its first tick starts) count it as made.

    Raises ``QuotaExceeded`` at once when the month is known to be used up (the flag). A charge
    past the quota fails the commit on the row's check constraint (``WITHIN_RUN_QUOTA``) and
    nothing of the transaction is kept: the caller turns that ``IntegrityError`` into the
    refusal with the charge's ``refusal``."""
    charge = Charge.of(runs)
    connection.send_with_commit(charge, last=True)  # type: ignore[attr-defined]
    transaction.on_commit(charge.committed, robust=True)  # only a shortcut's note: never the start's failure
    return charge


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
    if kind not in CEILING_FIELDS:
        raise ValueError(f"unknown ceiling kind '{kind}'")
    tenant = _locked_tenant()
    field = CEILING_FIELDS[kind]
    limit = getattr(effective_entitlements(tenant), field)
    current = existing.count()
    if current >= limit:
        raise PlanLimitReached(
            f"Plan '{tenant.plan_id}' allows at most {limit} {kind} ({field}).",
            details={"limit": field, "plan": tenant.plan_id, "maximum": limit, "current": current},
        )


def enforce_setting_limit(what: str, limit: int, existing: QuerySet[Any], *, kind: str, setting: str) -> None:
    """Refuse creating one more of ``existing``'s objects past a deployment's ``limit`` (the
    ``setting`` that holds it), not a plan's: ``403 plan_limit_reached``, as ``enforce_ceiling``
    answers and serialized as it is. ``what`` names them in the message, ``kind`` in its details."""
    _locked_tenant()
    current = existing.count()
    if current >= limit:
        raise PlanLimitReached(f"A tenant may have at most {limit} {what} ({setting}).",
                               details={"limit": kind, "maximum": limit, "current": current})


def lock_tenant_row() -> None:
    """Lock the tenant in context's row as a ceiling check does (``enforce_ceiling``), for a
    transaction that locks other rows of the tenant before its check, or that must run one at a time
    with the tenant's others (a default pool's switch): the tenant's row comes first in every such
    transaction (a webhook's, a schedule's or a trigger's create takes it, then the workflows it
    names), else two of them at once each wait for the other."""
    _locked_tenant()


def _locked_tenant() -> Tenant:
    """The tenant in context, its row locked ``FOR NO KEY UPDATE``: its ceiling checks run one at a
    time, without blocking (or waiting for) inserts of its rows, whose foreign keys take ``FOR KEY
    SHARE``. Inside the creating transaction."""
    if not connection.in_atomic_block:
        raise RuntimeError("a ceiling is checked inside the creating transaction")
    tenant = current_tenant()
    list(Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk).values_list("pk"))
    return tenant
