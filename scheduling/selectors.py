"""Reads of the routing data. Every lookup is scoped to the tenant in context.

``get_<x>_for_tenant`` returns a row of the tenant in context or raises
``NotFound``, also for another tenant's id and for a malformed one, so an id
of another tenant cannot be told apart from one that never existed. Each
raises ``TenantScopeError`` with no tenant in context.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet

from ductor_project.core.ids import canonical_uuid
from scheduling.models import Connection, FairnessKey, Pool, PoolMember, Rule
from tenants.selectors import first_or_404, parse_uuid


def connection_list() -> QuerySet[Connection]:
    """The tenant's connections, by name."""
    return Connection.objects.order_by("name")


def get_connection_for_tenant(connection_id: Any) -> Connection:
    """A connection of the tenant in context, or ``NotFound``."""
    return first_or_404(Connection.objects.filter(pk=parse_uuid(connection_id)))


def connection_by_reference(reference: str) -> Connection | None:
    """The tenant's connection with this id, else with this name; None when there is none."""
    pk = canonical_uuid(reference)
    found = Connection.objects.filter(pk=pk).first() if pk is not None else None
    return found or Connection.objects.filter(name=reference).first()


def _with_members(pools: QuerySet[Pool]) -> QuerySet[Pool]:
    members = PoolMember.objects.select_related("connection").order_by("priority", "id")
    return pools.prefetch_related(Prefetch("members", queryset=members))


def pool_list() -> QuerySet[Pool]:
    """The tenant's pools, by name, with their members (and each member's connection) prefetched."""
    return _with_members(Pool.objects.order_by("name"))


def get_pool_for_tenant(pool_id: Any) -> Pool:
    """A pool of the tenant in context (members prefetched), or ``NotFound``."""
    return first_or_404(_with_members(Pool.objects.filter(pk=parse_uuid(pool_id))))


def rule_list() -> QuerySet[Rule]:
    """The tenant's rules in evaluation order (priority, lowest first), disabled ones included."""
    return Rule.objects.order_by("priority")


def get_rule_for_tenant(rule_id: Any) -> Rule:
    """A rule of the tenant in context, or ``NotFound``."""
    return first_or_404(Rule.objects.filter(pk=parse_uuid(rule_id)))


def rules_using_pool(pool_name: str) -> QuerySet[Rule]:
    """The tenant's rules whose action routes to the pool named ``pool_name``."""
    return Rule.objects.filter(action__pool=pool_name).order_by("priority")


def fairness_key_list() -> QuerySet[FairnessKey]:
    """The tenant's weighted fairness keys, by key."""
    return FairnessKey.objects.order_by("key")


def get_fairness_key_for_tenant(fairness_key_id: Any) -> FairnessKey:
    """A weighted fairness key of the tenant in context, or ``NotFound``."""
    return first_or_404(FairnessKey.objects.filter(pk=parse_uuid(fairness_key_id)))
