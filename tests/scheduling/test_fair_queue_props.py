"""The fair queue against a model, under random operation sequences on the real Redis:
no item is lost or duplicated, whatever mix of enqueue, dequeue, ack, nack, remove, lease
expiry and reaping happens, and whatever work the acks report (fair by work charges it);
and an item that needs a pool's connection is dispatched exactly when one of them is free
(parked until then, never lost in its wait); with items under fairness keys and order keys."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ductor_project.core import capacity
from ductor_project.core.redis import get_redis
from scheduling import fair_queue as fq
from tenants.models import Tenant
from tests.scheduling.helpers import redis_now_ms, sleep_until

# Also on a Redis Cluster (the cluster run), with this module's tenants on shard 0, which its direct
# dispatcher calls serve.
pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("tenants_on_shard")]

# "Far" items never fall due during an example; short leases expire within one.
FAR_MS = 600_000
SHORT_LEASE_MS = 25
LONG_LEASE_MS = 600_000
CUSTOMER_TIERS = ("interactive", "standard", "batch")
RANK = {tier: i for i, tier in enumerate(fq.TIERS)}

ids = st.sampled_from(["i0", "i1", "i2"])
partitions = st.sampled_from(["p0", "p1"])
# Each tenant's pools: P has connection C, Q has C and D; each connection has one slot. An item of a
# pool sits alone in its partition, so it is always its partition's head.
POOL_MEMBERS = {"P": ("C",), "Q": ("C", "D")}
SCOPES = {
    **{f"pool:{pool}": json.dumps({"limit": -1, "rate": 0, "burst": 1, "strategy": "round_robin",
                                   "members": [[c, 1, i] for i, c in enumerate(members)]})
       for pool, members in POOL_MEMBERS.items()},
    **{f"connection:{c}": json.dumps({"limit": 1, "rate": 0, "burst": 1,
                                      "pools": sorted(p for p, ms in POOL_MEMBERS.items() if c in ms)})
       for c in ("C", "D")},
}
scopes = st.sampled_from([None, "P", "P", "Q"])
tiers = st.sampled_from(CUSTOMER_TIERS)
tenant_index = st.sampled_from([0, 1])
fairness_keys = st.sampled_from(["", "", "k1", "k2"])
# The work an ack reports: none (its time in flight), nothing, typical, or past the most one item is charged.
works = st.one_of(st.none(), st.just(0.0), st.floats(0.1, 500.0), st.just(10_000_000.0))


@dataclass
class Item:
    """The model of one item: what the queue must hold for it."""

    tier: str
    partition: str
    far: bool
    in_flight: bool = False
    delivery: int = 0
    short_lease: bool = False
    rerun: bool = False
    rerun_far: bool = False
    scope: str | None = None  # the pool whose connection it needs
    connection: str = ""  # the one it holds while in flight


Key = tuple[int, str]


def machine(tenants: list[Tenant]) -> type[RuleBasedStateMachine]:
    by_id = {str(t.pk): i for i, t in enumerate(tenants)}

    class FairQueueMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.redis = get_redis()
            self.redis.flushdb()
            self.items: dict[Key, Item] = {}
            # Obligations: each enqueue that the queue must honour with exactly one successful
            # ack (a new item or a re-run); coalesced and withdrawn ones are taken off.
            self.owed: Counter[Key] = Counter()
            self.stale: list[tuple[Key, int]] = []
            self.short_expiry = 0.0

        def in_flight(self, short: bool | None = None) -> list[Key]:
            return sorted(
                k for k, m in self.items.items() if m.in_flight and (short is None or m.short_lease == short)
            )

        def held(self) -> set[tuple[int, str]]:
            """(tenant, connection) pairs taken by items in flight."""
            return {(k[0], m.connection) for k, m in self.items.items() if m.in_flight and m.connection}

        def free_members(self, t: int, pool: str) -> list[str]:
            return [c for c in POOL_MEMBERS[pool] if (t, c) not in self.held()]

        def eligible(self) -> list[Key]:
            locked = {(k[0], m.partition) for k, m in self.items.items() if m.in_flight}
            return [
                k for k, m in self.items.items()
                if not m.in_flight and not m.far and (k[0], m.partition) not in locked
                and (m.scope is None or self.free_members(k[0], m.scope))
            ]

        def back_to_waiting(self, key: Key, far: bool) -> None:
            """A delivery that did not finish goes back; a pending re-run merges into it."""
            m = self.items[key]
            m.in_flight, m.connection = False, ""
            if m.rerun:
                far = far and m.rerun_far
                m.rerun = False
                self.owed[key] -= 1
            m.far = far

        @rule(t=tenant_index, item_id=ids, tier=tiers, part=partitions, far=st.booleans(), scope=scopes,
              key=fairness_keys, order=st.one_of(st.none(), st.just(0.0)))
        def enqueue(self, t: int, item_id: str, tier: str, part: str, far: bool, scope: str | None, key: str,
                    order: float | None) -> None:
            """Keys and order keys change the order of what is eligible, never what is."""
            part = f"x-{item_id}" if scope else part
            result = fq.enqueue(
                item_id, tier=tier, partition=part, payload={"t": t}, delay_ms=FAR_MS if far else 0,
                scope=scope, scopes=SCOPES if scope else None, key=key, order_ms=order, tenant=tenants[t],
            )
            key = (t, item_id)
            m = self.items.get(key)
            if m is None:
                assert result == fq.EnqueueResult.QUEUED
                self.items[key] = Item(tier, part, far, scope=scope)
                self.owed[key] += 1
            elif not m.in_flight:
                if m.far and not far:
                    assert result == fq.EnqueueResult.ADVANCED
                    m.far = False
                else:
                    assert result == fq.EnqueueResult.EXISTS
            else:
                assert result == fq.EnqueueResult.RERUN
                if m.rerun:
                    m.rerun_far = m.rerun_far and far
                else:
                    m.rerun, m.rerun_far = True, far
                    self.owed[key] += 1

        @rule(short=st.booleans())
        def dequeue(self, short: bool) -> None:
            eligible = self.eligible()
            self.dispatched(fq.dequeue(lease_ms=SHORT_LEASE_MS if short else LONG_LEASE_MS), eligible, short)

        def dispatched(self, got: fq.Dequeued | None, eligible: list[Key], short: bool) -> None:
            if got is None:
                assert eligible == []
                return
            key = (by_id[got.tenant_id], got.item_id)
            assert key in eligible, "dispatched an item that was not eligible"
            m = self.items[key]
            assert (got.tier, got.partition) == (m.tier, m.partition)
            assert all(RANK[self.items[k].tier] >= RANK[got.tier] for k in eligible), "tier priority"
            if m.scope is None:
                assert got.connection_id == ""
            else:
                assert got.connection_id in self.free_members(key[0], m.scope), "a connection without a slot"
            m.in_flight, m.delivery, m.short_lease, m.connection = True, got.delivery, short, got.connection_id
            if short:
                self.short_expiry = max(self.short_expiry, redis_now_ms(self.redis) + SHORT_LEASE_MS)

        @precondition(lambda self: self.in_flight())
        @rule(data=st.data(), work=works)
        def ack(self, data: st.DataObject, work: float | None) -> None:
            """Its worker measured ``work`` (None: its time in flight is charged)."""
            key = data.draw(st.sampled_from(self.in_flight()))
            assert fq.ack(key[1], delivery=self.items[key].delivery, work_ms=work, tenant=tenants[key[0]]) is True
            self.acked(key)

        @precondition(lambda self: self.in_flight())
        @rule(data=st.data(), short=st.booleans())
        def handoff(self, data: st.DataObject, short: bool) -> None:
            """A worker acks its item and takes the next one, in one call."""
            key = data.draw(st.sampled_from(self.in_flight()))
            finished = (tenants[key[0]], key[1], self.items[key].delivery, data.draw(works))
            acked, got = fq.handoff(finished, shard=0, lease_ms=SHORT_LEASE_MS if short else LONG_LEASE_MS,
                                    tiers=fq.TIERS)
            assert acked is True
            self.acked(key)
            self.dispatched(got, self.eligible(), short)

        def acked(self, key: Key) -> None:
            m = self.items[key]
            self.owed[key] -= 1
            self.stale.append((key, m.delivery))
            m.connection = ""
            if m.rerun:
                m.in_flight, m.far, m.rerun = False, m.rerun_far, False
            else:
                del self.items[key]

        @precondition(lambda self: self.in_flight())
        @rule(data=st.data(), far=st.booleans(), work=works)
        def nack(self, data: st.DataObject, far: bool, work: float | None) -> None:
            key = data.draw(st.sampled_from(self.in_flight()))
            m = self.items[key]
            assert fq.nack(key[1], delay_ms=FAR_MS if far else 0, delivery=m.delivery, work_ms=work,
                           tenant=tenants[key[0]])
            self.stale.append((key, m.delivery))
            self.back_to_waiting(key, far)

        @precondition(lambda self: self.stale)
        @rule(data=st.data())
        def a_stale_delivery_changes_nothing(self, data: st.DataObject) -> None:
            (t, item_id), delivery = data.draw(st.sampled_from(self.stale))
            assert fq.ack(item_id, delivery=delivery, tenant=tenants[t]) is False
            assert fq.nack(item_id, delivery=delivery, tenant=tenants[t]) is False
            extended = fq.extend_lease(item_id, lease_ms=LONG_LEASE_MS, delivery=delivery, tenant=tenants[t])
            assert extended is False

        @rule(t=tenant_index, item_id=ids)
        def ack_of_an_item_not_in_flight_changes_nothing(self, t: int, item_id: str) -> None:
            m = self.items.get((t, item_id))
            if m is None or not m.in_flight:
                assert fq.ack(item_id, tenant=tenants[t]) is False

        @precondition(lambda self: self.in_flight(short=False))
        @rule(data=st.data())
        def extend_lease(self, data: st.DataObject) -> None:
            key = data.draw(st.sampled_from(self.in_flight(short=False)))
            m = self.items[key]
            tenant = tenants[key[0]]
            assert fq.extend_lease(key[1], lease_ms=LONG_LEASE_MS, delivery=m.delivery, tenant=tenant)

        @rule(t=tenant_index, key=fairness_keys, weight=st.integers(1, 5), replace=st.booleans())
        def key_weight_changes(self, t: int, key: str, weight: int, replace: bool) -> None:
            """A key's weight (through the API, or the repair's rewrite of them all) changes the order of
            what is eligible, never what is."""
            if key:
                fq.set_key_weights({key: weight}, replace=replace, tenant=tenants[t])

        @rule(t=tenant_index, item_id=ids)
        def remove(self, t: int, item_id: str) -> None:
            key = (t, item_id)
            m = self.items.get(key)
            removed = fq.remove(item_id, tenant=tenants[t])
            if m is None:
                assert removed is False
            elif not m.in_flight:
                assert removed is True
                del self.items[key]
                self.owed[key] -= 1
            elif m.rerun:
                assert removed is True
                m.rerun = False
                self.owed[key] -= 1
            else:
                assert removed is False

        @precondition(lambda self: self.in_flight(short=True))
        @rule()
        def short_leases_expire_and_are_reaped(self) -> None:
            sleep_until(self.redis, self.short_expiry + 1)
            expired = self.in_flight(short=True)
            assert fq.reap(limit=1_000) == len(expired)
            for key in expired:
                self.stale.append((key, self.items[key].delivery))
                self.back_to_waiting(key, far=False)

        @invariant()
        def the_queue_holds_what_the_model_holds(self) -> None:
            for t, tenant in enumerate(tenants):
                mine = [m for k, m in self.items.items() if k[0] == t]
                report = fq.stats(tenant=tenant)
                assert report.backlog == sum(1 for m in mine if not m.in_flight)
                assert report.due == sum(1 for m in mine if not m.in_flight and not m.far)
                assert report.in_flight == sum(1 for m in mine if m.in_flight)
                for c in ("C", "D"):  # a connection's one slot is held exactly while its item runs
                    held = capacity.in_flight(capacity.connection_scope(c, 1), tenant=tenant)
                    holders = [m for k, m in self.items.items() if k[0] == t and m.in_flight and m.connection == c]
                    if not holders:
                        assert held == 0
                    elif holders[0].short_lease:  # its lease (and the slot's) may have run out by now
                        assert held in (0, 1)
                    else:
                        assert held == 1
            assert fq.global_stats().in_flight == len(self.in_flight())

        def teardown(self) -> None:
            """Drain: every obligation is acked exactly once, then nothing is left anywhere."""
            for key in self.in_flight():
                assert fq.ack(key[1], tenant=tenants[key[0]]) is True
                self.owed[key] -= 1
                m = self.items[key]
                if m.rerun:
                    m.in_flight, m.far, m.rerun = False, m.rerun_far, False
                else:
                    del self.items[key]
            while (got := fq.dequeue(lease_ms=LONG_LEASE_MS)) is not None:
                key = (by_id[got.tenant_id], got.item_id)
                assert not self.items[key].far
                assert fq.ack(got.item_id, delivery=got.delivery, tenant=tenants[key[0]]) is True
                self.owed[key] -= 1
                del self.items[key]
            for key, m in list(self.items.items()):
                assert m.far
                assert not m.in_flight
                assert fq.remove(key[1], tenant=tenants[key[0]]) is True
                self.owed[key] -= 1
                del self.items[key]
            assert all(n == 0 for n in self.owed.values()), self.owed
            for tenant in tenants:
                assert fq.stats(tenant=tenant).backlog == 0
                assert capacity.tenant_in_flight(tenant=tenant) == 0
            assert fq.global_stats().in_flight == 0
            assert fq.next_due_ms() is None  # no ready tenant, timer or lease is left behind

    return FairQueueMachine


def test_no_item_is_lost_or_duplicated_under_random_operations(
    redis_client: Any, make_tenant: Callable[..., tuple[Tenant, str]]
) -> None:
    tenants = [make_tenant("prop-a")[0], make_tenant("prop-b")[0]]
    run_state_machine_as_test(
        machine(tenants),
        settings=settings(
            max_examples=30,
            stateful_step_count=50,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
