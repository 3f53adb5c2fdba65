"""What the shared cache holds across a deploy: a tenant's limits and routing table, pickled by
whichever release's process read them last (docs/operations.md, Upgrading).

During a rolling deploy the previous release's processes keep writing them, with the fields
their classes had. A copy that lacks a field today's class declares (one a release added, which
an unpickled dataclass does not get) is read as a miss and built again, never handed to code
that reads that field and would raise until the entry expired (five minutes for the limits, a
day for a routing table).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from django.core.cache import cache

from ductor_project.core.context import tenant_context
from scheduling import routing_table, services
from tenants import entitlements, freshness
from tenants.models import Tenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_client")]


def pickled_before(value: Any, *fields: str) -> Any:
    """``value`` as a release whose class had not ``fields`` yet pickled it, read back today."""
    older = object.__new__(type(value))
    older.__dict__.update({k: v for k, v in vars(value).items() if k not in fields})
    return older


@pytest.fixture
def tenant(tenant_a: tuple[Tenant, str]) -> Tenant:
    return tenant_a[0]


def test_limits_a_previous_release_cached_without_a_field_are_resolved_again(tenant: Tenant) -> None:
    resolved = entitlements.resolve(tenant)
    cache.set(entitlements._cache_key(tenant), pickled_before(resolved, "max_fairness_keys"))
    freshness.forget()
    entitlements._copies.forget()
    assert entitlements.effective_entitlements(tenant).max_fairness_keys == resolved.max_fairness_keys


def test_a_routing_table_a_previous_release_cached_without_a_field_is_built_again(tenant: Tenant) -> None:
    with tenant_context(tenant):
        services.pool_create(name="p", strategy="round_robin")
        table = routing_table._shared()
        older = dataclasses.replace(table, pools={name: pickled_before(pool, "burst")
                                                  for name, pool in table.pools.items()})
        cache.set(routing_table.table_key(), older)
        routing_table.forget_local()
        freshness.forget()
        assert routing_table.routing_table().pools["p"].burst is None
