"""Hypothesis state machine: multi-scope acquire is all or nothing and never passes a limit."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from ductor_project.core.capacity import (
    LeaseConflict,
    Scope,
    acquire,
    connection_scope,
    extend,
    holder_key,
    pool_scope,
    release,
    tenant_scope,
)
from ductor_project.core.context import tenant_context

SCOPES = [
    tenant_scope(3),
    pool_scope("p1", 2),
    pool_scope("p2", 1),
    connection_scope("c1", 1),
    connection_scope("c2", 2),
]
HOLDERS = [f"h{i}" for i in range(6)]
LEASE_S = 60


def test_multi_scope_acquire_takes_all_scopes_or_none(redis_client, tenant_a):
    tenant = tenant_a[0]

    class CapacityMachine(RuleBasedStateMachine):
        """The model: which scopes each holder holds. Redis must match it after every step."""

        def __init__(self) -> None:
            super().__init__()
            redis_client.flushdb()
            self.held: dict[str, frozenset[Scope]] = {}

        def holders_of(self, scope: Scope) -> set[str]:
            return {holder for holder, scopes in self.held.items() if scope in scopes}

        @rule(holder=st.sampled_from(HOLDERS), scopes=st.sets(st.sampled_from(SCOPES), min_size=1))
        def acquire(self, holder: str, scopes: set[Scope]) -> None:
            wanted = frozenset(scopes)
            current = self.held.get(holder)
            with tenant_context(tenant):
                if current is not None and current != wanted:
                    with pytest.raises(LeaseConflict):
                        acquire(list(scopes), holder, LEASE_S)
                    return
                fits = all(len(self.holders_of(scope)) < scope.limit for scope in wanted)
                taken = acquire(list(scopes), holder, LEASE_S)
            assert taken == (current is not None or fits)
            if taken:
                self.held[holder] = wanted

        @rule(holder=st.sampled_from(HOLDERS))
        def release(self, holder: str) -> None:
            with tenant_context(tenant):
                assert release(holder) == len(self.held.pop(holder, ()))

        @rule(holder=st.sampled_from(HOLDERS))
        def extend(self, holder: str) -> None:
            with tenant_context(tenant):
                assert extend(holder, LEASE_S) == (holder in self.held)

        @invariant()
        def redis_matches_the_model_and_no_scope_passes_its_limit(self) -> None:
            with tenant_context(tenant):
                pipe = redis_client.pipeline(transaction=True)
                for scope in SCOPES:
                    pipe.zrange(scope.key(), 0, -1)
                for holder in HOLDERS:
                    pipe.hkeys(holder_key(holder))
                replies = pipe.execute()
                scope_replies, record_replies = replies[: len(SCOPES)], replies[len(SCOPES) :]
                members = {
                    scope: {m.decode() for m in reply}
                    for scope, reply in zip(SCOPES, scope_replies, strict=True)
                }
                records = {
                    holder: {f.decode() for f in reply} - {"_exp"}
                    for holder, reply in zip(HOLDERS, record_replies, strict=True)
                }
                for scope in SCOPES:
                    assert len(members[scope]) <= scope.limit
                    assert members[scope] == self.holders_of(scope)
                for holder in HOLDERS:
                    # In all of its scopes or in none, and its record names exactly those.
                    in_scopes = {scope for scope in SCOPES if holder in members[scope]}
                    assert in_scopes == set(self.held.get(holder, ()))
                    assert records[holder] == {scope.key() for scope in in_scopes}

    run_state_machine_as_test(
        CapacityMachine, settings=settings(max_examples=50, stateful_step_count=30, deadline=None)
    )


def test_a_refused_acquire_changes_nothing(redis_client, tenant_a):
    """Whatever is already held, a refused acquire leaves every key exactly as it was."""
    tenant = tenant_a[0]

    @settings(max_examples=50, deadline=None)
    @given(
        held=st.lists(st.sets(st.sampled_from(SCOPES), min_size=1), max_size=6),
        wanted=st.sets(st.sampled_from(SCOPES), min_size=1),
    )
    def check(held: list[set[Scope]], wanted: set[Scope]) -> None:
        redis_client.flushdb()
        with tenant_context(tenant):
            for i, scopes in enumerate(held):
                acquire(list(scopes), f"h{i}", LEASE_S)
            before = dump(redis_client)
            if not acquire(list(wanted), "new", LEASE_S):
                assert dump(redis_client) == before

    check()


def dump(redis: Any) -> dict[bytes, Any]:
    return {
        key: redis.zrange(key, 0, -1, withscores=True) if redis.type(key) == b"zset" else redis.hgetall(key)
        for key in redis.keys("*")
    }
