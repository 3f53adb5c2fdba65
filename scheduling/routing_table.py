"""A tenant's routing table (enabled rules, pools with members), cached per tenant.

``route()`` runs on the hot path, so a warm lookup touches neither PostgreSQL
nor, most of the time, Redis: a process keeps the table it holds while the
tenant's stamp is the same (``tenants.freshness``: one round trip every
``freshness.LOCAL_TTL_S``, shared with everything else the process keeps of the
tenant). Otherwise it reads the tenant's routing version and the table of that
version from the Django cache, and only when that misses is it built from
PostgreSQL. Every create, update or delete of a connection, pool, member or
rule sets a new random version and a new stamp (now and again on commit), so
the next ``route()`` of the process that made it sees the change at once, and
every other process within ``freshness.LOCAL_TTL_S``; a random version never
repeats, so a stale table can never be mistaken for a fresh one. The cache
keeps one table per tenant, which names its version: a table of another
version than the current one is built again and replaces it, so however often
a tenant edits, it keeps one table in Redis, not one per edit.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from django.core.cache import cache
from django.db import transaction

from ductor_project.core.context import current_tenant, tenant_context
from ductor_project.core.keys import tenant_key
from scheduling.models import Pool, PoolMember, Rule
from tenants import freshness
from tenants.models import Tenant

TABLE_TTL_S = 24 * 3600


@dataclass(frozen=True)
class MemberInfo:
    connection_id: str
    name: str
    kind: str
    weight: int
    priority: int
    max_concurrency: int | None
    rate_per_s: float | None
    burst: int | None
    # A celery connection's queue and broker name ("" for other kinds).
    queue: str = ""
    broker: str = ""


@dataclass(frozen=True)
class PoolInfo:
    id: str
    name: str
    strategy: str
    max_concurrency: int | None
    rate_per_s: float | None
    burst: int | None
    members: tuple[MemberInfo, ...]


@dataclass(frozen=True)
class RuleInfo:
    id: str
    name: str
    priority: int
    match: dict[str, Any]
    action: dict[str, Any]

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "priority": self.priority}


@dataclass(frozen=True)
class RoutingTable:
    version: str
    rules: tuple[RuleInfo, ...]
    pools: dict[str, PoolInfo] = field(default_factory=dict)
    default_pool: str | None = None

    def pool_by_id(self, pool_id: str) -> PoolInfo | None:
        """The pool with this id, or None (pools are keyed by name)."""
        return next((pool for pool in self.pools.values() if pool.id == pool_id), None)

    def member(self, connection_id: str) -> MemberInfo | None:
        """One of the tenant's pooled connections, by id (None when no pool has it)."""
        for pool in self.pools.values():
            for member in pool.members:
                if member.connection_id == connection_id:
                    return member
        return None

    def connection_name(self, connection_id: str) -> str:
        """The name of one of the tenant's pooled connections ("" when none has this id)."""
        member = self.member(connection_id)
        return member.name if member else ""

    def as_json(self) -> dict[str, Any]:
        """The table as JSON, as the shared cache holds it (``from_json`` reads it back)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> RoutingTable | None:
        """The table ``as_json`` gave, or None for a value of another shape."""
        if not isinstance(data, dict):
            return None
        try:
            pools = {name: PoolInfo(**{**pool, "members": tuple(MemberInfo(**m) for m in pool["members"])})
                     for name, pool in data["pools"].items()}
            return cls(version=data["version"], rules=tuple(RuleInfo(**rule) for rule in data["rules"]),
                       pools=pools, default_pool=data["default_pool"])
        except (AttributeError, KeyError, TypeError):
            return None


_copies: freshness.Copies[RoutingTable] = freshness.Copies()


def _version_key() -> str:
    return tenant_key("routing", "version")


def current_version() -> str:
    """The tenant's routing version; created on first use. One Redis round trip."""
    version = cache.get(_version_key())
    if version is None:
        cache.add(_version_key(), uuid.uuid4().hex, None)
        version = cache.get(_version_key())
    return str(version)


def bump_version(tenant: Tenant) -> None:
    """Invalidate the tenant's routing table everywhere: now and after the surrounding commit."""

    def bump() -> None:
        with tenant_context(tenant):
            cache.set(_version_key(), uuid.uuid4().hex, None)
        freshness.renew(tenant)

    bump()
    transaction.on_commit(bump)


def build(version: str) -> RoutingTable:
    """Read the tenant's routing table from PostgreSQL."""
    rules = tuple(
        RuleInfo(id=str(r.id), name=r.name, priority=r.priority, match=r.match, action=r.action)
        for r in Rule.objects.filter(enabled=True).order_by("priority")
    )
    members: dict[Any, list[MemberInfo]] = {}
    for m in PoolMember.objects.select_related("connection").order_by("priority", "id"):
        c = m.connection
        members.setdefault(m.pool_id, []).append(
            MemberInfo(
                connection_id=str(c.id), name=c.name, kind=c.kind, weight=m.weight, priority=m.priority,
                max_concurrency=c.max_concurrency, rate_per_s=c.rate_per_s, burst=c.burst,
                queue=str(c.config.get("queue", "")) if c.kind == "celery" else "",
                broker=str(c.config.get("broker", "default")) if c.kind == "celery" else "",
            )
        )
    pools: dict[str, PoolInfo] = {}
    default_pool = None
    for p in Pool.objects.all():
        pools[p.name] = PoolInfo(
            id=str(p.id), name=p.name, strategy=p.strategy, max_concurrency=p.max_concurrency,
            rate_per_s=p.rate_per_s, burst=p.burst, members=tuple(members.get(p.id, ())),
        )
        if p.is_default:
            default_pool = p.name
    return RoutingTable(version=version, rules=rules, pools=pools, default_pool=default_pool)


def routing_table() -> RoutingTable:
    """The routing table of the tenant in context. Warm: this process's copy (at most one round
    trip, the tenant's stamp, every ``freshness.LOCAL_TTL_S``); no PostgreSQL."""
    return _copies.get(current_tenant(), _shared)


def table_key() -> str:
    """The Django cache key of the tenant's table: one for every version, the table saying its own."""
    return tenant_key("routing", "table")


def _shared() -> RoutingTable:
    """The table of the tenant's routing version from the Django cache, or built (and cached in
    place of the table of another version, or of another shape: ``from_json``)."""
    version = current_version()
    table = RoutingTable.from_json(cache.get(table_key()))
    if table is None or table.version != version:
        table = build(version)
        cache.set(table_key(), table.as_json(), TABLE_TTL_S)
    return table


def forget_local() -> None:
    """Drop this process's copies (the next lookup reads the cache or PostgreSQL)."""
    _copies.forget()


def routing_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    """A connection, pool, member or rule was saved or deleted (connected in ``ready()``)."""
    bump_version(instance.tenant)
