"""What the shared cache holds across a deploy: a tenant's limits and routing table, as JSON, in the
shape of whichever release's process read them last (docs/operations.md, Upgrading).

During a rolling deploy the previous release's processes keep writing them, with the fields their
classes had. A copy that lacks a field today's class declares (one a release added), or has one it
does not know, is read as a miss and built again, never handed to code that reads that field and
would raise until the entry expired (five minutes for the limits, a day for a routing table).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache

from ductor_project.core.context import tenant_context
from scheduling import routing_table, services
from tenants import entitlements, freshness
from tenants.models import Tenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_client")]


@pytest.fixture
def tenant(tenant_a: tuple[Tenant, str]) -> Tenant:
    return tenant_a[0]


def _without(data: dict[str, Any], field: str) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key != field}


@pytest.mark.parametrize("shape", ["a field less", "a field more"])
def test_limits_another_release_cached_in_its_shape_are_resolved_again(tenant: Tenant, shape: str) -> None:
    resolved = entitlements.resolve(tenant)
    data = resolved.as_dict()
    cached = _without(data, "max_fairness_keys") if shape == "a field less" else {**data, "max_widgets": 3}
    cache.set(entitlements._cache_key(tenant), cached)
    freshness.forget()
    entitlements._copies.forget()
    assert entitlements.effective_entitlements(tenant).max_fairness_keys == resolved.max_fairness_keys
    assert entitlements.Entitlements.from_dict(cache.get(entitlements._cache_key(tenant))) == resolved


def test_a_routing_table_another_release_cached_in_its_shape_is_built_again(tenant: Tenant) -> None:
    with tenant_context(tenant):
        services.pool_create(name="p", strategy="round_robin")
        table = routing_table._shared()
        data = table.as_json()
        older = {**data, "pools": {name: {**pool, "shards": 4} for name, pool in data["pools"].items()}}
        cache.set(routing_table.table_key(), older)
        routing_table.forget_local()
        freshness.forget()
        assert routing_table.routing_table().pools["p"].strategy == "round_robin"
        assert routing_table.RoutingTable.from_json(cache.get(routing_table.table_key())) == table
