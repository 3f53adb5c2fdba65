"""Tenant-aware cache and Redis keys: one module builds them all, and it fails closed."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.core.cache import cache

from ductor_project.core.context import TenantScopeError, tenant_context
from ductor_project.core.keys import global_key, global_redis_key, redis_key, shard_of, shard_tag, tenant_key
from tenants.models import Tenant


@pytest.fixture
def a(tenant_a: tuple[Tenant, str]) -> Tenant:
    return tenant_a[0]


@pytest.fixture
def b(tenant_b: tuple[Tenant, str]) -> Tenant:
    return tenant_b[0]


def test_tenant_key_raises_without_a_tenant(db: None) -> None:
    with pytest.raises(TenantScopeError):
        tenant_key("rules")


def test_redis_key_raises_without_a_tenant(db: None) -> None:
    with pytest.raises(TenantScopeError):
        redis_key("cap", "pool-1")


def test_tenant_key_names_the_tenant_in_context_and_differs_per_tenant(a: Tenant, b: Tenant) -> None:
    with tenant_context(a):
        key_a = tenant_key("rules", 3)
    with tenant_context(b):
        key_b = tenant_key("rules", 3)
    assert key_a == f"t:{a.pk}:rules:3"
    assert key_b == f"t:{b.pk}:rules:3"
    assert key_a != key_b
    assert tenant_key("rules", 3, tenant=a) == key_a


def test_a_key_needs_at_least_one_part(a: Tenant) -> None:
    with tenant_context(a), pytest.raises(ValueError, match="at least one part"):
        tenant_key()


def test_redis_key_carries_the_hash_tag_of_the_tenant_shard(a: Tenant, b: Tenant) -> None:
    for tenant in (a, b):
        with tenant_context(tenant):
            keys = [redis_key("cap", "pool-1"), redis_key("gcra", "api"), redis_key("fq", "parts")]
        tag = shard_tag(shard_of(str(tenant.pk)))
        for key in keys:
            assert re.fullmatch(r"\{s\d+\}:t:[0-9a-f-]{36}:.+", key), key
            assert key.startswith(f"{tag}:t:{tenant.pk}:")
    with tenant_context(a):
        assert redis_key("cap") != redis_key("cap", tenant=b)


def test_shard_of_is_stable_in_range_and_moves_few_tenants_when_shards_grow() -> None:
    ids = [str(uuid.UUID(int=i * 7919 + 1)) for i in range(400)]
    before = {tenant_id: shard_of(tenant_id, 8) for tenant_id in ids}
    assert before == {tenant_id: shard_of(tenant_id, 8) for tenant_id in ids}
    assert set(before.values()) == set(range(8))
    after = {tenant_id: shard_of(tenant_id, 9) for tenant_id in ids}
    moved = [tenant_id for tenant_id in ids if after[tenant_id] != before[tenant_id]]
    # Jump consistent hashing: a tenant only ever moves to the new shard.
    assert all(after[tenant_id] == 8 for tenant_id in moved)
    assert 0 < len(moved) < len(ids) // 4
    assert all(shard_of(tenant_id, 1) == 0 for tenant_id in ids)


def test_global_keys_name_no_tenant_and_work_without_one(db: None) -> None:
    assert global_key("plans", "free") == "g:plans:free"
    assert global_redis_key("fq", "tenants", shard=3) == "{s3}:g:fq:tenants"


def test_django_cache_entries_are_separate_per_tenant(a: Tenant, b: Tenant, redis_client: Any) -> None:
    with tenant_context(a):
        cache.set("x", 1)
    with tenant_context(b):
        assert cache.get("x") is None
        cache.set("x", 2)
    with tenant_context(a):
        assert cache.get("x") == 1
    with tenant_context(b):
        assert cache.get("x") == 2
    stored = {key.decode() for key in redis_client.keys("*")}
    assert any(key.endswith(f"t:{a.pk}:x") for key in stored), stored
    assert any(key.endswith(f"t:{b.pk}:x") for key in stored), stored


def test_django_cache_bulk_operations_are_separate_per_tenant(a: Tenant, b: Tenant, redis_client: Any) -> None:
    with tenant_context(a):
        cache.set_many({"k1": "a1", "k2": "a2"})
        cache.set("n", 10)
        cache.incr("n")
    with tenant_context(b):
        assert cache.get_many(["k1", "k2"]) == {}
        cache.set("k1", "b1")
        cache.delete_many(["k1", "k2"])
        assert cache.get("n") is None
    with tenant_context(a):
        assert cache.get_many(["k1", "k2"]) == {"k1": "a1", "k2": "a2"}
        assert cache.get("n") == 11


def test_django_cache_keys_listing_only_sees_the_tenant_in_context(a: Tenant, b: Tenant, redis_client: Any) -> None:
    with tenant_context(a):
        cache.set("mine", 1)
    with tenant_context(b):
        cache.set("theirs", 2)
        listed = cache.keys("*")
    assert listed
    assert all(str(b.pk) in key for key in listed)
    assert not any(str(a.pk) in key for key in listed)


@pytest.mark.parametrize(
    "operation",
    [
        lambda: cache.get("x"),
        lambda: cache.set("x", 1),
        lambda: cache.add("x", 1),
        lambda: cache.delete("x"),
        lambda: cache.get_many(["x"]),
        lambda: cache.has_key("x"),
        lambda: cache.incr("x"),
    ],
    ids=["get", "set", "add", "delete", "get_many", "has_key", "incr"],
)
def test_django_cache_outside_any_tenant_raises(db: None, redis_client: Any, operation: Any) -> None:
    with pytest.raises(TenantScopeError):
        operation()
    assert redis_client.dbsize() == 0


def test_global_cache_key_works_outside_a_tenant_and_is_shared(a: Tenant, b: Tenant, redis_client: Any) -> None:
    cache.set(global_key("flag"), "on")
    assert cache.get(global_key("flag")) == "on"
    with tenant_context(a):
        assert cache.get(global_key("flag")) == "on"
        assert cache.get("flag") is None
    with tenant_context(b):
        assert cache.get(global_key("flag")) == "on"


def test_prebuilt_key_of_another_tenant_inside_a_tenant_context_raises(a: Tenant, b: Tenant, redis_client: Any) -> None:
    key_b = tenant_key("secret", tenant=b)
    with tenant_context(b):
        cache.set(key_b, "b-data")
    with tenant_context(a):
        with pytest.raises(TenantScopeError):
            cache.get(key_b)
        with pytest.raises(TenantScopeError):
            cache.set(key_b, "overwritten")
        with pytest.raises(TenantScopeError):
            cache.delete(key_b)
    with tenant_context(b):
        assert cache.get(key_b) == "b-data"
        assert cache.get("secret") == "b-data"


def test_prebuilt_tenant_key_outside_a_context_reaches_that_tenant_only(
    a: Tenant, b: Tenant, redis_client: Any
) -> None:
    cache.set(tenant_key("warm", tenant=a), "a-data")
    with tenant_context(a):
        assert cache.get("warm") == "a-data"
    with tenant_context(b):
        assert cache.get("warm") is None
