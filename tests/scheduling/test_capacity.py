"""Leased concurrency slots against the real Redis: acquire, extend, release, isolation."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ductor_project.core import capacity
from ductor_project.core.capacity import (
    LeaseConflict,
    Scope,
    acquire,
    connection_scope,
    extend,
    holder_key,
    in_flight,
    pool_scope,
    release,
    tenant_in_flight,
    tenant_scope,
)
from ductor_project.core.context import TenantScopeError, tenant_context
from ductor_project.core.keys import shard_of, shard_tag
from tests.scheduling.helpers import redis_keys, sleep_until

pytestmark = pytest.mark.cluster  # also on a Redis Cluster (the cluster run)


@pytest.fixture
def tenant(redis_client: Any, tenant_a: Any) -> Any:
    with tenant_context(tenant_a[0]) as tenant:
        yield tenant


def members(redis: Any, scope: Scope) -> set[str]:
    return {m.decode() for m in redis.zrange(scope.key(), 0, -1)}


def test_acquire_takes_a_slot_in_every_scope_or_in_none(tenant, redis_client):
    scopes = [tenant_scope(5), pool_scope("p", 5), connection_scope("c", 1)]
    assert acquire(scopes, "h1", lease_s=30) is True
    assert all(members(redis_client, s) == {"h1"} for s in scopes)

    assert acquire(scopes, "h2", lease_s=30) is False  # the connection is full
    assert all(members(redis_client, s) == {"h1"} for s in scopes)
    assert redis_client.exists(holder_key("h2")) == 0

    assert acquire(scopes[:2], "h2", lease_s=30) is True
    assert in_flight(scopes[0]) == 2
    assert in_flight(scopes[2]) == 1
    assert tenant_in_flight() == 2


def test_a_full_scope_refuses_until_a_slot_is_released(tenant):
    scope = tenant_scope(2)
    assert [acquire([scope], f"h{i}", lease_s=30) for i in range(3)] == [True, True, False]
    assert release("h0") == 1
    assert acquire([scope], "h2", lease_s=30) is True
    assert in_flight(scope) == 2


def test_a_zero_limit_refuses_everything(tenant):
    assert acquire([tenant_scope(0)], "h", lease_s=30) is False
    assert tenant_in_flight() == 0


def test_reacquire_by_the_same_holder_refreshes_without_taking_a_second_slot(tenant, redis_client):
    scopes = [tenant_scope(1), pool_scope("p", 1)]
    assert acquire(scopes, "h", lease_s=5) is True
    first = redis_client.zscore(scopes[0].key(), "h")
    assert acquire(scopes, "h", lease_s=30) is True  # the scopes are full, but h holds them
    assert in_flight(scopes[0]) == 1
    assert in_flight(scopes[1]) == 1
    assert redis_client.zscore(scopes[0].key(), "h") > first
    assert redis_client.zscore(scopes[1].key(), "h") == redis_client.zscore(scopes[0].key(), "h")
    assert release("h") == 2


def test_reacquire_on_other_scopes_while_the_lease_lives_raises_and_changes_nothing(tenant, redis_client):
    assert acquire([tenant_scope(3), pool_scope("p", 3)], "h", lease_s=30) is True
    with pytest.raises(LeaseConflict):
        acquire([tenant_scope(3)], "h", lease_s=30)
    with pytest.raises(LeaseConflict):
        acquire([tenant_scope(3), pool_scope("p", 3), connection_scope("c", 3)], "h", lease_s=30)
    assert redis_client.exists(connection_scope("c", 3).key()) == 0
    assert release("h") == 2


def test_double_release_gives_back_exactly_once(tenant):
    scopes = [tenant_scope(3), pool_scope("p", 3)]
    assert acquire(scopes, "h1", lease_s=30) is True
    assert acquire(scopes, "h2", lease_s=30) is True
    assert release("h1") == 2
    assert release("h1") == 0
    assert in_flight(scopes[0]) == 1  # h2 keeps its slots
    assert in_flight(scopes[1]) == 1
    assert release("unknown") == 0


def test_extend_renews_a_live_lease_in_all_its_scopes(tenant, redis_client):
    scopes = [tenant_scope(1), connection_scope("c", 1)]
    assert acquire(scopes, "h", lease_s=1) is True
    before = redis_client.zscore(scopes[0].key(), "h")
    assert extend("h", lease_s=60) is True
    after = [redis_client.zscore(s.key(), "h") for s in scopes]
    assert after[0] == after[1] > before + 50_000
    assert float(redis_client.hget(holder_key("h"), "_exp")) == after[0]


def test_extend_after_release_returns_false_and_takes_no_slot(tenant):
    scope = tenant_scope(1)
    assert acquire([scope], "h", lease_s=30) is True
    assert release("h") == 1
    assert extend("h", lease_s=30) is False
    assert in_flight(scope) == 0


def test_extend_and_release_after_expiry_take_and_give_back_nothing(tenant, redis_client):
    scope = tenant_scope(1)
    assert acquire([scope], "h", lease_s=0.05) is True
    sleep_until(redis_client, redis_client.zscore(scope.key(), "h"))

    assert extend("h", lease_s=30) is False
    assert in_flight(scope) == 0
    assert redis_client.zscore(scope.key(), "h") is None
    assert release("h") == 0
    assert acquire([scope], "other", lease_s=30) is True


def test_keep_alive_holds_a_slot_past_its_lease_while_the_block_runs_and_not_after(tenant):
    scope = pool_scope("p", 1)
    assert acquire([scope], "long", lease_s=0.3) is True
    with capacity.keep_alive("long", lease_s=0.3):
        time.sleep(1.0)  # more than three leases
        assert in_flight(scope) == 1
        assert acquire([scope], "next", lease_s=30) is False
    time.sleep(0.5)  # one lease (and a renewal racing the block's end) later
    assert in_flight(scope) == 0
    assert acquire([scope], "next", lease_s=30) is True


def test_an_expired_lease_frees_its_slot_for_the_next_holder(tenant, redis_client):
    scope = tenant_scope(1)
    assert acquire([scope], "crashed", lease_s=0.05) is True
    assert acquire([scope], "next", lease_s=30) is False
    sleep_until(redis_client, redis_client.zscore(scope.key(), "crashed"))
    assert acquire([scope], "next", lease_s=30) is True
    assert members(redis_client, scope) == {"next"}  # pruned by the acquire
    assert release("crashed") == 0


def test_in_flight_counts_only_live_leases_before_any_prune(tenant, redis_client):
    scope = tenant_scope(10)
    assert acquire([scope], "short", lease_s=0.05) is True
    assert acquire([scope], "long", lease_s=30) is True
    sleep_until(redis_client, redis_client.zscore(scope.key(), "short"))
    assert redis_client.zcard(scope.key()) == 2  # not full, so nothing pruned it yet
    assert in_flight(scope) == 1


def test_after_its_lease_ended_a_holder_may_acquire_other_scopes(tenant, redis_client):
    assert acquire([tenant_scope(2), pool_scope("p", 2)], "h", lease_s=0.05) is True
    sleep_until(redis_client, redis_client.zscore(tenant_scope(2).key(), "h"))
    assert acquire([tenant_scope(2), connection_scope("c", 1)], "h", lease_s=30) is True
    assert {f.decode() for f in redis_client.hkeys(holder_key("h"))} == {
        "_exp", tenant_scope(2).key(), connection_scope("c", 1).key()
    }
    assert in_flight(pool_scope("p", 2)) == 0
    assert release("h") == 2


def test_a_lowered_limit_keeps_current_leases_and_admits_no_one_until_below_it(tenant):
    assert [acquire([pool_scope("p", 3)], f"h{i}", lease_s=30) for i in range(3)] == [True] * 3
    assert acquire([pool_scope("p", 2)], "new", lease_s=30) is False
    assert acquire([pool_scope("p", 2)], "h0", lease_s=30) is True  # a holder renews its own slot
    assert release("h1") == 1
    assert acquire([pool_scope("p", 2)], "new", lease_s=30) is False
    assert release("h2") == 1
    assert acquire([pool_scope("p", 2)], "new", lease_s=30) is True
    assert in_flight(pool_scope("p", 2)) == 2


def test_every_key_carries_the_tenants_hash_tag_and_expires(tenant, redis_client):
    assert acquire([tenant_scope(2), pool_scope(7, 2), connection_scope(9, 2)], "h", lease_s=30)
    capacity.rate_check("steps", rate_per_s=10, burst=5)
    keys = sorted(k.decode() for k in redis_keys(redis_client))
    prefix = f"{shard_tag(shard_of(str(tenant.pk)))}:t:{tenant.pk}:"
    assert keys == sorted(
        prefix + suffix
        for suffix in ["cap:tenant:steps", "cap:pool:7", "cap:connection:9", "cap:holder:h", "rate:steps"]
    )
    assert all(redis_client.pttl(k) > 0 for k in keys)


def test_every_operation_raises_without_a_tenant_and_writes_nothing(redis_client):
    scope = tenant_scope(1)
    with pytest.raises(TenantScopeError):
        acquire([scope], "h", lease_s=30)
    with pytest.raises(TenantScopeError):
        extend("h", lease_s=30)
    with pytest.raises(TenantScopeError):
        release("h")
    with pytest.raises(TenantScopeError):
        in_flight(scope)
    with pytest.raises(TenantScopeError):
        tenant_in_flight()
    with pytest.raises(TenantScopeError):
        capacity.rate_check("api", rate_per_s=1, burst=1)
    with pytest.raises(TenantScopeError):
        capacity.rate_peek("api", rate_per_s=1, burst=1)
    assert redis_keys(redis_client) == []


@pytest.mark.parametrize(
    ("kind", "scope_id", "limit"),
    [("queue", "x", 1), ("pool", "", 1), ("pool", "p", -1), ("pool", "p", 1.5), ("pool", "p", True)],
)
def test_invalid_scopes_are_refused(kind, scope_id, limit):
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        Scope(kind, scope_id, limit)


def test_invalid_acquires_are_refused_before_touching_redis(tenant, redis_client):
    with pytest.raises(ValueError, match="at least one scope"):
        acquire([], "h", lease_s=30)
    with pytest.raises(ValueError, match="twice"):
        acquire([pool_scope("p", 1), pool_scope("p", 2)], "h", lease_s=30)
    with pytest.raises(ValueError, match="lease"):
        acquire([tenant_scope(1)], "h", lease_s=0)
    with pytest.raises(ValueError, match="holder"):
        acquire([tenant_scope(1)], "", lease_s=1)
    assert redis_keys(redis_client) == []


def snapshot(redis: Any, pattern: str) -> dict[str, Any]:
    """Every key matching ``pattern`` with its content."""
    readers = {
        b"zset": lambda k: redis.zrange(k, 0, -1, withscores=True),
        b"hash": redis.hgetall,
        b"string": redis.get,
    }
    return {k.decode(): readers[redis.type(k)](k) for k in redis_keys(redis, pattern)}


def test_tenant_a_exhausting_concurrency_and_rate_leaves_tenant_b_unaffected(
    redis_client, tenant_a, tenant_b
):
    a, b = tenant_a[0], tenant_b[0]
    scopes = [tenant_scope(2), pool_scope("shared-name", 2)]
    with tenant_context(a):
        assert [acquire(scopes, f"h{i}", lease_s=30) for i in range(3)] == [True, True, False]
        assert [capacity.rate_check("steps", 1, 3).allowed for _ in range(4)] == [True] * 3 + [False]
    a_keys = snapshot(redis_client, f"*:t:{a.pk}:*")
    assert len(a_keys) == 5

    with tenant_context(b):
        # The same scope names and holder ids are other counters in tenant B.
        assert [acquire(scopes, f"h{i}", lease_s=30) for i in range(3)] == [True, True, False]
        assert [capacity.rate_check("steps", 1, 3).allowed for _ in range(4)] == [True] * 3 + [False]
        assert extend("h0", lease_s=60) is True
        assert release("h0") == 2
        assert release("h1") == 2
        assert release("h1") == 0
        assert tenant_in_flight() == 0

    assert snapshot(redis_client, f"*:t:{a.pk}:*") == a_keys
    with tenant_context(a):
        assert tenant_in_flight() == 2
        assert in_flight(scopes[1]) == 2
        assert capacity.rate_peek("steps", 1, 3).allowed is False
    assert all(f":t:{b.pk}:" in k.decode() for k in redis_keys(redis_client) if k.decode() not in a_keys)


def test_an_explicit_tenant_is_used_outside_any_context_and_refused_inside_another(
    redis_client, tenant_a, tenant_b
):
    a, b = tenant_a[0], tenant_b[0]
    assert acquire([tenant_scope(1)], "h", lease_s=30, tenant=b) is True
    assert tenant_in_flight(tenant=b) == 1
    with tenant_context(a):
        assert tenant_in_flight() == 0
        assert release("h") == 0
        for attempt in (
            lambda: acquire([tenant_scope(1)], "x", lease_s=30, tenant=b),
            lambda: extend("h", lease_s=30, tenant=b),
            lambda: release("h", tenant=b),
            lambda: tenant_in_flight(tenant=b),
            lambda: capacity.rate_check("api", 1, 1, tenant=b),
        ):
            with pytest.raises(TenantScopeError):
                attempt()
    with tenant_context(b):
        assert release("h", tenant=b) == 1
