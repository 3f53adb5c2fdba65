"""What a tenant may do: the one resolver of effective limits.

``effective_entitlements(tenant)`` = the tenant's plan, with the tenant's
overrides applied field by field. It is the only place limits come from. The
result is cached under the tenant's cache key and invalidated when the plan,
the tenant's plan choice, or one of its overrides changes (signals below, so
admin edits invalidate too). A plan edit bumps a global plan version, which is
part of every tenant's cache key.

Each process also keeps what it read, for as long as the tenant's stamp is the same
(``tenants.freshness``): the hot paths (enqueue, tick, step) read the limits several times per
item. A change is seen at once by the process that made it, and by every other within
``freshness.LOCAL_TTL_S``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import Signal, receiver

from ductor_project.core import capacity
from ductor_project.core.keys import refuse_foreign, tenant_key
from tenants import freshness
from tenants.models import Plan, Tenant, TenantEntitlementOverride, Tier

CACHE_TTL_S = 300

# Sent (with ``tenant`` and ``committed``) when a tenant's limits or status may have changed: at
# the change, and again once it committed. What keeps state derived from them listens to it: the
# quota flag (dropped both times), the fair queue's copy of the limits (rewritten once committed:
# reading the limits before the commit would cache what a rollback undoes).
limits_changed = Signal()


@dataclass(frozen=True)
class Entitlements:
    plan: str
    max_concurrency: int
    step_rate_per_s: float
    step_burst: int
    monthly_run_quota: int
    max_workflows: int
    max_pools: int
    max_connections: int
    max_rules: int
    max_schedules: int
    max_fairness_keys: int
    max_nesting_depth: int
    max_payload_bytes: int
    event_retention_days: int
    history_retention_days: int
    api_rate_per_s: float
    api_burst: int
    weight: int
    allowed_tiers: tuple[str, ...]
    overridden: tuple[str, ...] = ()

    @property
    def default_tier(self) -> str:
        """The tier of a run started without one (an event's, a schedule's, the API's when not
        given): ``standard``, or, when the plan leaves it out, the lowest tier it allows, so that a
        default never takes priority over other tenants' work."""
        if Tier.STANDARD in self.allowed_tiers:
            return str(Tier.STANDARD.value)
        return max(self.allowed_tiers, key=list(Tier.values).index)

    def queue_tier(self, tier: str | None) -> str:
        """The tier the tenant's work asked for ``tier`` (a run's, a routing decision's) is queued in:
        that one while the plan allows it, else ``default_tier``. Work of a run started in a tier the
        plan has lost since (a downgrade) still goes on, and never ahead of other tenants' in it."""
        return tier if tier in self.allowed_tiers else self.default_tier

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["allowed_tiers"] = list(self.allowed_tiers)
        data["overridden"] = list(self.overridden)
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Entitlements | None:
        """The limits ``as_dict`` gave (the shared cache holds them so: JSON), or None for a value of
        another shape."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(**{**data, "allowed_tiers": tuple(data["allowed_tiers"]),
                          "overridden": tuple(data["overridden"])})
        except (KeyError, TypeError):
            return None


LIMIT_FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(Entitlements) if f.name not in ("plan", "overridden")
)
CEILING_FIELDS = {
    "workflows": "max_workflows",
    "pools": "max_pools",
    "connections": "max_connections",
    "rules": "max_rules",
    "schedules": "max_schedules",
    "fairness_keys": "max_fairness_keys",
}


# Largest value of each integer limit: what its Plan column can hold, or what its use can. A retention
# period is subtracted from today's date: a century is as long as a date can take, and then some. A
# sub-workflow level is a run waiting on a child run, and a run's lineage nests its tree a level per
# level (the plans allow 2 to 10): 32 is past any real use. A payload is stored in a jsonb column,
# which holds at most 256 MiB - 1 bytes.
MAX_NESTING_DEPTH = 32
MAX_PAYLOAD_BYTES = 256 * 1024 * 1024 - 1
_INT_MAX = {"monthly_run_quota": 2**63 - 1, "event_retention_days": 36_500, "history_retention_days": 36_500,
            "max_nesting_depth": MAX_NESTING_DEPTH, "max_payload_bytes": MAX_PAYLOAD_BYTES}
_INT_MAX_DEFAULT = 2**31 - 1


def limit_maximum(field: str) -> float:
    """The largest value the limit ``field`` takes (a rate: per second)."""
    if field.endswith("_per_s"):
        return capacity.MAX_RATE_PER_S
    return _INT_MAX.get(field, _INT_MAX_DEFAULT)


def coerce_limit(field: str, value: Any) -> Any:
    """Validate a value for the limit ``field`` (an override or a plan edit).

    Returns the normalized value; raises ValueError saying what is wrong.
    """
    if field not in LIMIT_FIELDS:
        raise ValueError(f"unknown limit '{field}'")
    if field == "allowed_tiers":
        if not isinstance(value, list) or not value or any(v not in Tier.values for v in value):
            raise ValueError(f"must be a non-empty list of tiers from {list(Tier.values)}")
        return [t for t in Tier.values if t in value]
    if field.endswith("_per_s"):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not capacity.MIN_RATE_PER_S <= value <= capacity.MAX_RATE_PER_S
        ):
            raise ValueError(f"must be a finite number of at least {capacity.MIN_RATE_PER_S} and at most "
                             f"{capacity.MAX_RATE_PER_S:.0f} per second")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("must be a non-negative integer")
    if field in ("weight", "max_concurrency", "step_burst", "api_burst", "event_retention_days",
                 "history_retention_days") and value < 1:
        raise ValueError("must be at least 1")
    if value > limit_maximum(field):
        raise ValueError(f"must be at most {int(limit_maximum(field))}")
    return value


def _stored(field: str, value: Any) -> Any:
    """An override's stored ``value`` as ``coerce_limit`` takes it; one stored before its limit had
    its bound (a max_nesting_depth of a million) counts as that bound, never as an error of every
    request of the tenant."""
    try:
        return coerce_limit(field, value)
    except ValueError:
        if isinstance(value, int | float) and not isinstance(value, bool) and value > limit_maximum(field):
            return coerce_limit(field, type(value)(limit_maximum(field)))
        raise


def _plan_version() -> int:
    return int(cache.get(freshness.PLANS_KEY) or 0)


def _cache_key(tenant: Tenant) -> str:
    return tenant_key("entitlements", _plan_version(), tenant=tenant)


def resolve(tenant: Tenant) -> Entitlements:
    """Compute the effective limits from PostgreSQL (no cache)."""
    # Through the tenant row, not ``tenant.plan_id``: a tenant object loaded
    # before a plan change must not put the old plan back into the cache.
    plan = Plan.objects.get(tenants=tenant.pk)
    return _applied(plan, TenantEntitlementOverride.all_tenants.filter(tenant_id=tenant.pk))


def resolve_many(tenants: Iterable[Tenant]) -> dict[Any, Entitlements]:
    """The effective limits of each of ``tenants`` that still exists, by id, computed from PostgreSQL
    (no cache) in two queries for them all: a pass over many tenants (the retentions) reads them at
    once, where ``effective_entitlements`` would cost each tenant its own round trips."""
    ids = [tenant.pk for tenant in tenants]
    plans = {row.pk: row.plan for row in Tenant.objects.filter(pk__in=ids).select_related("plan")}
    overrides: dict[Any, list[TenantEntitlementOverride]] = {}
    for override in TenantEntitlementOverride.all_tenants.filter(tenant_id__in=list(plans)):
        overrides.setdefault(override.tenant_id, []).append(override)
    return {pk: _applied(plan, overrides.get(pk, [])) for pk, plan in plans.items()}


def _applied(plan: Plan, overrides: Iterable[TenantEntitlementOverride]) -> Entitlements:
    """``plan``'s limits with ``overrides`` (a tenant's) applied field by field."""
    values = {name: getattr(plan, name) for name in LIMIT_FIELDS}
    applied = []
    for override in overrides:
        if override.field in values:
            values[override.field] = _stored(override.field, override.value)
            applied.append(override.field)
    values["allowed_tiers"] = tuple(values["allowed_tiers"])
    return Entitlements(plan=plan.slug, overridden=tuple(sorted(applied)), **values)


_copies: freshness.Copies[Entitlements] = freshness.Copies()


def effective_entitlements(tenant: Tenant) -> Entitlements:
    """The tenant's effective limits. Cached per tenant: this process's copy while the tenant's stamp
    is the same (at most one round trip, every ``freshness.LOCAL_TTL_S``), else at most two cache
    round trips more."""
    refuse_foreign(tenant_key("entitlements", tenant=tenant))  # not another tenant's in a tenant context
    return _copies.get(tenant, lambda: _shared(tenant))


def _shared(tenant: Tenant) -> Entitlements:
    """The limits from the shared cache, or resolved (and cached) when it has none, or none of this
    release's shape (``from_dict``: a previous release's, during a rolling deploy)."""
    key = _cache_key(tenant)
    cached = Entitlements.from_dict(cache.get(key))
    if cached is not None:
        return cached
    resolved = resolve(tenant)
    cache.set(key, resolved.as_dict(), CACHE_TTL_S)
    return resolved


def invalidate_tenant(tenant: Tenant) -> None:
    """Drop a tenant's cached limits now and again after the surrounding commit, sending
    ``limits_changed`` each time (``committed`` says which)."""

    def drop(committed: bool) -> None:
        cache.delete(_cache_key(tenant))
        freshness.renew(tenant)
        limits_changed.send(sender=Tenant, tenant=tenant, committed=committed)

    drop(False)
    transaction.on_commit(lambda: drop(True))


def invalidate_all_plans() -> None:
    """A plan changed: every tenant's cached limits become stale (the plans' stamp, part of every
    tenant's stamp and of every cache key of the limits)."""
    freshness.bump_plans()


@receiver([post_save, post_delete], sender=Plan)
def _plan_changed(sender: Any, **kwargs: Any) -> None:
    invalidate_all_plans()


@receiver([post_save, post_delete], sender=TenantEntitlementOverride)
def _override_changed(sender: Any, instance: TenantEntitlementOverride, **kwargs: Any) -> None:
    invalidate_tenant(Tenant.objects.get(pk=instance.tenant_id))


@receiver(post_save, sender=Tenant)
def _tenant_changed(sender: Any, instance: Tenant, created: bool, **kwargs: Any) -> None:
    if not created:
        invalidate_tenant(instance)
