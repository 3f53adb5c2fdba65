"""Admission at dequeue on the real Redis: a routed item takes its tenant's, pool's and connection's
slots and rates in the dequeue's atomic step, or waits parked, and is never handed out only to
come back. Connections are chosen there, by the pool's strategy; a dry run consumes nothing."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from ductor_project.core import capacity
from ductor_project.core.context import no_tenant, tenant_context
from ductor_project.core.keys import shard_of
from scheduling import admission, routing_table
from scheduling import fair_queue as fq
from scheduling.circuit import OPEN_INDEX, BreakerState, record_failure, record_success
from scheduling.models import Connection, Pool, PoolMember
from scheduling.routing import explain
from scheduling.rules import Step
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.scheduling.helpers import lapse_lease, redis_now_ms, sleep_until

STEP = Step(workflow="billing.invoice", action="http.request")
LEASE_MS = 30_000
_ids = itertools.count()


@pytest.fixture
def tenant(redis_client: Any, tenant_a: Any) -> Iterator[Tenant]:
    with tenant_context(tenant_a[0]) as tenant:
        yield tenant


def conn(name: str, **fields: Any) -> Connection:
    return Connection.objects.create(name=name, kind="http", config={"base_url": f"https://{name}.example.com"},
                                     **fields)


def pool(name: str, members: list[Connection] | list[tuple[Connection, int, int]], *,
         strategy: str = Pool.Strategy.ROUND_ROBIN, **fields: Any) -> Pool:
    """A pool; members are connections (priority in list order) or (connection, weight, priority)."""
    created = Pool.objects.create(name=name, strategy=strategy, **fields)
    for index, member in enumerate(members):
        connection, weight, priority = member if isinstance(member, tuple) else (member, 1, index)
        PoolMember.objects.create(pool=created, connection=connection, weight=weight, priority=priority)
    return created


def enqueue(pool_name: str | None = "main", *, partition: str | None = None, tier: str = "standard") -> str:
    """One routed item of the tenant in context, in its own partition unless told, as the engine
    enqueues a step: its pool as its scope, with the pool's current confs."""
    item_id = f"item-{next(_ids):06d}"  # ids in enqueue order: equal due times go in id order
    table = routing_table.routing_table()
    found = table.pools[pool_name] if pool_name else None
    fq.enqueue(item_id, tier=tier, partition=partition or item_id, payload={"kind": "test.noop"},
               scope=found.id if found else None, scopes=admission.scope_confs(found, table) if found else None)
    return item_id


def take(tenant: Tenant) -> fq.Dequeued | None:
    """The next dispatch of the tenant's shard, as a dispatcher takes it (outside any tenant)."""
    with no_tenant():
        return fq.dequeue(shard=shard_of(str(tenant.pk)), lease_ms=LEASE_MS)


def take_all(tenant: Tenant) -> list[fq.Dequeued]:
    taken = []
    while (item := take(tenant)) is not None:
        taken.append(item)
    return taken


def ack(item: fq.Dequeued, tenant: Tenant) -> None:
    assert fq.ack(item.item_id, delivery=item.delivery, tenant=tenant)


def open_until(redis: Any, tenant: Tenant, connection: Connection) -> float:
    """When ``connection``'s open breaker half-opens (ms, Redis TIME), as the platform's index has it."""
    until = redis.zscore(OPEN_INDEX, f"{tenant.pk}|{connection.id}")
    assert until is not None
    return float(until)


def names(items: list[fq.Dequeued]) -> list[str]:
    by_id = {str(c.pk): c.name for c in Connection.objects.all()}
    return [by_id.get(item.connection_id, "") for item in items]


# --- strategies, once per dispatched attempt ---------------------------------------------------


def test_round_robin_alternates_once_per_dispatched_attempt_and_explain_uses_no_turn(tenant):
    pool("main", [conn("r1"), conn("r2")])
    picks, explained = [], []
    for _ in range(6):
        for _ in range(3):  # dry runs between the attempts move nothing
            explained.append(explain(Step(workflow="w", action="a", pool="main")).trace()["connection"]["name"])
        enqueue()
        item = take(tenant)
        assert item is not None
        picks.append(names([item])[0])
        assert explained[-1] == picks[-1]  # what explain said is what the next dispatch chose
        ack(item, tenant)
    assert picks == ["r2", "r1", "r2", "r1", "r2", "r1"]
    assert Counter(picks) == {"r1": 3, "r2": 3}


def test_weighted_dispatches_exactly_by_weight_interleaved_and_never_a_zero_weight_member(tenant):
    members = [(conn("w1"), 1, 0), (conn("w3"), 3, 1), (conn("w6"), 6, 2), (conn("never"), 0, 3)]
    pool("main", members, strategy=Pool.Strategy.WEIGHTED)
    picks = []
    for _ in range(100):
        enqueue()
        item = take(tenant)
        assert item is not None
        picks.append(names([item])[0])
        ack(item, tenant)
    assert Counter(picks) == {"w1": 10, "w3": 30, "w6": 60}
    for start in range(0, 100, 10):  # smooth: every run of ten holds each weight's share
        assert Counter(picks[start:start + 10]) == {"w1": 1, "w3": 3, "w6": 6}


def test_least_inflight_picks_the_connection_with_the_fewest_items_in_flight(tenant):
    pool("main", [conn("a"), conn("b"), conn("c")], strategy=Pool.Strategy.LEAST_INFLIGHT)
    for _ in range(6):
        enqueue()
    held = take_all(tenant)  # nothing acked: each goes where the fewest are in flight
    assert Counter(names(held)) == {"a": 2, "b": 2, "c": 2}
    ack(next(i for i in held if names([i]) == ["b"]), tenant)
    enqueue()
    (next_one,) = take_all(tenant)
    assert names([next_one]) == ["b"]
    assert next_one.admitted == "least in-flight (1)"


def test_failover_moves_to_the_backup_while_the_primarys_breaker_is_open_and_back_after(
    tenant, settings, redis_client
):
    settings.DUCTOR_BREAKER_FAILURES = 3
    settings.DUCTOR_BREAKER_COOLDOWN_S = 0.3
    primary, backup = conn("primary"), conn("backup")
    pool("main", [(backup, 1, 2), (primary, 1, 1)], strategy=Pool.Strategy.FAILOVER)

    def next_pick() -> str:
        enqueue()
        item = take(tenant)
        assert item is not None
        ack(item, tenant)
        return names([item])[0]

    assert next_pick() == "primary"
    record_failure(primary.id)
    record_failure(primary.id)
    assert next_pick() == "primary"  # below the threshold
    assert record_failure(primary.id) == BreakerState.OPEN
    assert next_pick() == "backup"
    sleep_until(redis_client, open_until(redis_client, tenant, primary))
    assert next_pick() == "primary"  # cooldown over: half-open, a trial call
    assert record_failure(primary.id) == BreakerState.OPEN  # the trial failed: open again
    assert next_pick() == "backup"
    sleep_until(redis_client, redis_now_ms(redis_client) + 350)
    assert next_pick() == "primary"
    assert record_success(primary.id) == BreakerState.CLOSED
    assert next_pick() == "primary"


# --- parked, never bounced -----------------------------------------------------------------------


def test_a_full_pool_parks_its_heads_and_each_freed_slot_dispatches_exactly_one_once(tenant):
    pool("main", [conn("c")], max_concurrency=1)
    queued = [enqueue() for _ in range(50)]
    delivered: list[fq.Dequeued] = []
    while (item := take(tenant)) is not None:
        delivered.append(item)
        assert take(tenant) is None  # the others wait parked: none is handed out to come back
        ack(item, tenant)
    assert [item.item_id for item in delivered] == queued  # in due order, each once
    assert {item.attempt for item in delivered} == {1}  # no item was delivered twice
    stats = fq.stats()
    assert (stats.backlog, stats.in_flight) == (0, 0)


def test_a_parked_head_holds_nothing_and_the_tenants_other_partitions_are_served(tenant):
    limited = pool("main", [conn("c", max_concurrency=1)])
    pool("other", [conn("d")])
    first, parked = enqueue(), enqueue()
    assert [i.item_id for i in take_all(tenant)] == [first]
    free = [enqueue("other"), enqueue(None)]  # another pool, and no pool at all
    assert sorted(i.item_id for i in take_all(tenant)) == sorted(free)
    assert capacity.in_flight(capacity.pool_scope(limited.id, 0)) == 1  # the parked head holds no slot
    assert capacity.tenant_in_flight() == 3  # of its pool, nor of its tenant
    stats = fq.stats()
    assert (stats.backlog, stats.due, stats.in_flight) == (1, 1, 3)
    assert parked not in {i.item_id for i in take_all(tenant)}


def test_a_connection_shared_by_two_pools_wakes_the_heads_parked_on_either(tenant):
    shared = conn("shared", max_concurrency=1)
    pool("main", [shared])
    pool("other", [shared])
    holder = enqueue("main")
    [in_flight] = take_all(tenant)
    assert in_flight.item_id == holder
    waiting = enqueue("other")
    assert take_all(tenant) == []
    ack(in_flight, tenant)  # an item of "main" frees the connection "other" waits for
    assert [i.item_id for i in take_all(tenant)] == [waiting]


def test_a_reaped_lease_wakes_a_parked_head(tenant):
    pool("main", [conn("c")], max_concurrency=1)
    enqueue()
    with no_tenant():
        dead = fq.dequeue(shard=shard_of(str(tenant.pk)), lease_ms=LEASE_MS)
    assert dead is not None
    waiting = enqueue()
    assert take_all(tenant) == []
    lapse_lease(dead, tenant)  # its worker died
    with no_tenant():
        assert fq.reap(shard=shard_of(str(tenant.pk))) == 1
    picked = take_all(tenant)  # the slot came back with the lease: the two heads go in due order
    assert [i.item_id for i in picked] == [dead.item_id]
    ack(picked[0], tenant)
    assert [i.item_id for i in take_all(tenant)] == [waiting]


def test_a_raised_pool_limit_wakes_the_parked_heads_at_once(tenant, django_capture_on_commit_callbacks):
    main = pool("main", [conn("c")], max_concurrency=1)
    for _ in range(4):
        enqueue()
    assert len(take_all(tenant)) == 1
    with django_capture_on_commit_callbacks(execute=True):
        main.max_concurrency = 3
        main.save()  # the routing change reconfigures the queue's copy after the commit
    assert len(take_all(tenant)) == 2


def test_a_deleted_pools_parked_heads_are_dispatched_without_it(tenant, django_capture_on_commit_callbacks):
    main = pool("main", [conn("c", max_concurrency=1)])
    first, second = enqueue(), enqueue()
    assert [i.item_id for i in take_all(tenant)] == [first]
    with django_capture_on_commit_callbacks(execute=True):
        main.delete()
    [item] = take_all(tenant)
    assert (item.item_id, item.connection_id) == (second, "")


# --- rates and breakers: looked at again when they allow ------------------------------------------


def test_a_rate_limited_connection_waits_until_its_rate_allows_and_charges_no_other_rate(make_tenant, redis_client):
    slow, _ = make_tenant("slow", plan="free")
    with tenant_context(slow):
        pool("main", [conn("c", rate_per_s=5, burst=1)])
        first, second = enqueue(), enqueue()
        assert [i.item_id for i in take_all(slow)] == [first]
        before = capacity.rate_peek(capacity.STEP_RATE_LIMITER, 5, 10)
        assert take_all(slow) == []  # within the connection's 200 ms
        assert capacity.rate_peek(capacity.STEP_RATE_LIMITER, 5, 10).remaining == before.remaining
        sleep_until(redis_client, redis_now_ms(redis_client) + 220)
        assert [i.item_id for i in take_all(slow)] == [second]


def test_an_open_breaker_parks_its_only_connection_until_it_half_opens(tenant, settings, redis_client):
    settings.DUCTOR_BREAKER_FAILURES = 1
    settings.DUCTOR_BREAKER_COOLDOWN_S = 0.3
    only = conn("only")
    pool("main", [only])
    record_failure(only.id)
    waiting = enqueue()
    assert take_all(tenant) == []
    with no_tenant():
        assert fq.next_due_ms(shard_of(str(tenant.pk))) > 0  # a timer, not a poll
    sleep_until(redis_client, open_until(redis_client, tenant, only))
    [item] = take_all(tenant)
    assert (item.item_id, item.admitted) == (waiting, "round robin: turn 1")


# --- suspension ---------------------------------------------------------------------------------


def test_a_suspended_tenant_is_never_dispatched_and_is_served_again_at_its_reactivation(
    make_tenant, redis_client, django_capture_on_commit_callbacks
):
    held, _ = make_tenant("held")
    with tenant_context(held):
        items = [enqueue(None) for _ in range(3)]
    with django_capture_on_commit_callbacks(execute=True):  # the queue hears of it once committed
        tenant_services.tenant_set_status(tenant=held, status=Tenant.Status.SUSPENDED)
    assert take_all(held) == []  # not dispatched to be put back: not dispatched at all
    with tenant_context(held):
        assert fq.stats().due == 3
        enqueue(None)  # new work of a suspended tenant waits too
    assert take_all(held) == []
    with django_capture_on_commit_callbacks(execute=True):
        tenant_services.tenant_set_status(tenant=held, status=Tenant.Status.ACTIVE)
    assert len({i.item_id for i in take_all(held)} & set(items)) == 3


def test_an_enqueue_by_a_process_that_read_the_tenant_before_its_suspension_does_not_undo_it(
    make_tenant, redis_client, django_capture_on_commit_callbacks
):
    held, _ = make_tenant("held-stale")
    stale = Tenant.objects.get(pk=held.pk)  # what a worker's cache read before the suspension
    with django_capture_on_commit_callbacks(execute=True):
        tenant_services.tenant_set_status(tenant=held, status=Tenant.Status.SUSPENDED)
    with tenant_context(stale):
        assert stale.is_active
        enqueue(None)  # writes the tenant's conf as that process read it
    assert take_all(held) == []  # still suspended: the newer row's status wins
    with django_capture_on_commit_callbacks(execute=True):
        tenant_services.tenant_set_status(tenant=held, status=Tenant.Status.ACTIVE)
    stale_suspended = Tenant.objects.get(pk=held.pk)
    stale_suspended.status = Tenant.Status.SUSPENDED  # an older read the other way round
    stale_suspended.updated_at -= timedelta(seconds=1)
    with tenant_context(stale_suspended):
        enqueue(None)
    assert len(take_all(held)) == 2


# --- a dry run, and isolation -----------------------------------------------------------------------


def test_explain_shows_every_candidate_and_the_choice_and_takes_nothing(tenant, settings):
    settings.DUCTOR_BREAKER_FAILURES = 1
    broken, ok, full = conn("broken"), conn("ok", rate_per_s=1, burst=1), conn("full", max_concurrency=1)
    main = pool("main", [broken, ok, full], max_concurrency=5)
    record_failure(broken.id)
    enqueue()
    [holder] = take_all(tenant)
    assert names([holder]) == ["full"]  # round robin turn 1 of the two eligible ones: the second
    for _ in range(3):
        trace = explain(Step(workflow="w", action="a", pool="main")).trace()
        states = [(c["name"], c["breaker"], c["eligible"], c["in_flight"], c["limit"]) for c in trace["candidates"]]
        assert states == [("broken", "open", False, 0, None), ("ok", "closed", True, 0, None),
                          ("full", "closed", False, 1, 1)]
        assert trace["connection"]["name"] == "ok"
        assert trace["admission"]["admitted"] is True
        assert trace["admission"]["pool_in_flight"] == 1
    assert capacity.in_flight(capacity.pool_scope(main.id, 5)) == 1  # no slot taken by asking
    assert capacity.rate_peek(f"connection:{ok.id}", 1, 1).allowed  # no rate token spent
    enqueue()
    [next_item] = take_all(tenant)
    assert names([next_item]) == ["ok"]
    assert next_item.admitted == "round robin: turn 2"  # and no turn used


def test_explain_of_a_pool_refused_at_routing_still_shows_its_candidates_state(tenant):
    pool("main", [(conn("a"), 0, 0), (conn("b"), 0, 1)], strategy=Pool.Strategy.WEIGHTED)
    trace = explain(Step(workflow="w", action="a", pool="main")).trace()
    assert trace["allowed"] is False
    assert "every connection has weight 0" in trace["reason"]
    assert [(c["name"], c["breaker"], c["eligible"], c["weight"]) for c in trace["candidates"]] == [
        ("a", "closed", True, 0), ("b", "closed", True, 0)]
    assert trace["admission"]["admitted"] is False
    assert trace["connection"] is None


def test_idor_one_tenants_full_pool_never_holds_back_another_tenants_pool_of_the_same_name(
    tenant_a, tenant_b, redis_client
):
    a, b = tenant_a[0], tenant_b[0]
    for t in (a, b):
        with tenant_context(t):
            pool("main", [conn("same", max_concurrency=1)])
            enqueue()
            enqueue()
    taken = take_all(a)  # both tenants are on the shard
    assert Counter(item.tenant_id for item in taken) == {str(a.pk): 1, str(b.pk): 1}
    for t in (a, b):  # each holds its own connection's one slot, and has one head parked
        with tenant_context(t):
            assert capacity.in_flight(capacity.connection_scope(Connection.objects.get().pk, 1)) == 1
            assert fq.stats().due == 1
    ack(next(item for item in taken if item.tenant_id == str(a.pk)), a)  # A's slot frees A's head only
    [woken] = take_all(a)
    assert woken.tenant_id == str(a.pk)
