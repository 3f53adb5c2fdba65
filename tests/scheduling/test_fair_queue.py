"""The tiered fair queue against the real Redis: fairness, due times, partitions, tiers,
capacity-aware dispatch, leases and tenant isolation."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from ductor_project.core import capacity
from ductor_project.core.context import TenantScopeError, tenant_context
from ductor_project.core.keys import redis_key, shard_of, shard_tag
from scheduling import fair_queue as fq
from tenants import services
from tenants.models import Tenant, system_context
from tests.scheduling.helpers import redis_keys, redis_now_ms, sleep_until

# Also on a Redis Cluster (the cluster run), with this module's tenants on shard 0, which its direct
# dispatcher calls serve.
pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("tenants_on_shard")]

LEASE_MS = 30_000
WORK_MS = 10.0


class Queue:
    """The dispatcher's view in the tests: dequeue, and ack as the item's tenant, each item having
    done ``WORK_MS`` of work unless ``work`` says otherwise (by tenant id): fair by work, equal
    work is fair by items."""

    def __init__(self) -> None:
        self.tenants: dict[str, Tenant] = {}
        self.work: dict[str, float] = {}

    def add(self, tenant: Tenant) -> Tenant:
        self.tenants[str(tenant.pk)] = tenant
        return tenant

    def ack(self, item: fq.Dequeued) -> None:
        assert fq.ack(item.item_id, delivery=item.delivery, tenant=self.tenants[item.tenant_id],
                      work_ms=self.work.get(item.tenant_id, WORK_MS))

    def serve(self, count: int, *, ack: bool = True, lease_ms: int = LEASE_MS, shard: int = 0) -> list[fq.Dequeued]:
        """Dequeue up to ``count`` items of ``shard`` (stopping at the first None), acking each at once."""
        served = []
        for _ in range(count):
            item = fq.dequeue(shard=shard, lease_ms=lease_ms)
            if item is None:
                break
            served.append(item)
            if ack:
                self.ack(item)
        return served


def take(lease_ms: int = LEASE_MS) -> fq.Dequeued:
    """Dequeue an item that must be there."""
    item = fq.dequeue(lease_ms=lease_ms)
    assert item is not None, "nothing was eligible"
    return item


@pytest.fixture
def queue(redis_client: Any) -> Queue:
    return Queue()


@pytest.fixture
def tenant_with(
    make_tenant: Callable[..., tuple[Tenant, str]], queue: Queue
) -> Callable[..., Tenant]:
    """A tenant on ``plan`` (enterprise by default) with per-tenant overrides of its limits."""

    def make(slug: str, plan: str = "enterprise", **limits: Any) -> Tenant:
        tenant, _ = make_tenant(slug, plan=plan)
        for name, value in limits.items():
            services.override_set(tenant=tenant, field=name, value=value)
        return queue.add(tenant)

    return make


def fill(tenant: Tenant, partitions: int, per_partition: int, *, prefix: str = "") -> None:
    items = [
        fq.NewItem(f"{prefix}{p}-{i}", "standard", f"{prefix}p{p}", {"p": p, "i": i})
        for i in range(per_partition)
        for p in range(partitions)
    ]
    fq.enqueue_many(items, tenant=tenant)


def shares(served: list[fq.Dequeued]) -> Counter[str]:
    return Counter(item.tenant_id for item in served)


def test_backlogged_tenants_share_dispatches_in_proportion_to_their_weights(tenant_with, queue):
    tenants = {w: tenant_with(f"w{w}", weight=w) for w in (1, 2, 4)}
    for w, tenant in tenants.items():
        fill(tenant, partitions=4, per_partition=150, prefix=f"w{w}-")

    served = queue.serve(700)

    assert len(served) == 700
    counts = shares(served)
    for w, tenant in tenants.items():
        share = counts[str(tenant.pk)] / len(served)
        assert share == pytest.approx(w / 7, abs=0.01), counts


def test_dequeue_many_hands_out_what_as_many_dequeues_would_and_stops_at_its_limit(
    tenant_with, queue, redis_client
):
    tenants = [tenant_with(f"many{w}", weight=w) for w in (1, 3)]

    def refill() -> None:
        redis_client.flushdb()
        for n, tenant in enumerate(tenants):
            fill(tenant, partitions=30, per_partition=1, prefix=f"m{n}-")

    refill()
    one_by_one = [(item.tenant_id, item.item_id) for item in queue.serve(20, ack=False)]
    refill()
    before = redis_now_ms(redis_client)

    batch = fq.dequeue_many(lease_ms=LEASE_MS, limit=20)

    assert len(batch) == 20
    assert [(item.tenant_id, item.item_id) for item in batch] == one_by_one
    assert len({(item.tenant_id, item.delivery) for item in batch}) == 20
    # Whole ms of Redis TIME, taken inside the call.
    assert all(before - 1 + LEASE_MS <= item.lease_until_ms <= redis_now_ms(redis_client) + LEASE_MS for item in batch)
    rest = fq.dequeue_many(lease_ms=LEASE_MS, limit=100)
    assert len(rest) == 40
    assert not {item.item_id for item in rest} & {item.item_id for item in batch}
    assert fq.dequeue_many(lease_ms=LEASE_MS, limit=100) == []
    with pytest.raises(ValueError, match="limit"):
        fq.dequeue_many(lease_ms=LEASE_MS, limit=0)


def test_partition_count_attack_5000_partitions_buy_no_more_than_3(tenant_with, queue):
    attacker, modest = tenant_with("attacker"), tenant_with("modest")
    fill(attacker, partitions=5_000, per_partition=10)
    fill(modest, partitions=3, per_partition=10)
    assert fq.stats(tenant=attacker).backlog == 50_000

    served = queue.serve(200)

    # While both are backlogged (until the modest tenant's 30th item), each gets half.
    last_modest = max(i for i, item in enumerate(served) if item.tenant_id == str(modest.pk))
    while_both = shares(served[: last_modest + 1])
    assert while_both[str(modest.pk)] == 30
    assert while_both[str(modest.pk)] / (last_modest + 1) == pytest.approx(0.5, abs=0.02)
    # The attacker's items came from many partitions: partitions buy it nothing.
    assert len({item.partition for item in served if item.tenant_id == str(attacker.pk)}) > 100


def test_nothing_is_dispatched_before_it_is_due(tenant_with, queue, redis_client):
    tenant = tenant_with("late")
    before = redis_now_ms(redis_client)
    with tenant_context(tenant):
        fq.enqueue("later", tier="standard", partition="p", delay_ms=200)

    while True:
        item = fq.dequeue(lease_ms=LEASE_MS)
        after = redis_now_ms(redis_client)
        if item is not None:
            break
        assert after < before + 10_000, "never dispatched once due"  # liveness only: never a speed
        time.sleep(0.01)
    assert after >= before + 200
    assert item.item_id == "later"
    assert item.waited_ms >= 0


def test_a_future_item_waits_on_a_timer_and_next_due_says_when(tenant_with, redis_client):
    tenant = tenant_with("timer")
    assert fq.next_due_ms() is None
    with tenant_context(tenant):
        fq.enqueue("a", tier="standard", partition="p", delay_ms=500)
    assert 400 <= (fq.next_due_ms() or 0) <= 500
    assert fq.dequeue(lease_ms=LEASE_MS) is None
    assert redis_client.zscore(fq.global_key("timers"), f"standard|{tenant.pk}") is not None
    with tenant_context(tenant):
        fq.enqueue("b", tier="standard", partition="q")
    assert fq.next_due_ms() == 0
    assert fq.wait_for_work(timeout_s=0.05) is True
    assert fq.wait_for_work(timeout_s=0) is False  # one token, taken
    # Less than a ms still times out (Redis would read 0 ms as "block forever").
    started = time.monotonic()
    assert fq.wait_for_work(timeout_s=0.0004) is False
    assert time.monotonic() - started < 5


@pytest.mark.django_db(transaction=True)  # the enqueueing thread reads the tenant's rows
def test_a_dispatcher_of_several_shards_is_woken_by_new_work_on_any_of_them(
    tenant_with, tenants_on_shard, settings, redis_client
):
    """One Redis waits on every shard's signal at once; a Redis Cluster (the cluster run), whose
    commands keep to one slot, takes the other shards' signals between short waits on the first."""
    settings.DUCTOR_QUEUE_SHARDS = max(settings.DUCTOR_QUEUE_SHARDS, 3)
    last = settings.DUCTOR_QUEUE_SHARDS - 1
    for shard in range(last + 1):
        fq.wait_for_work(shards=[shard], timeout_s=0)  # no signal left from before
    tenants_on_shard(last)
    tenant = tenant_with("far")
    assert shard_of(str(tenant.pk)) == last

    def enqueue_soon() -> None:
        # Most often after the wait below began, so that the test sees a blocked waiter woken (a
        # signal already there is taken at once; the loop below holds either way, never a timing).
        time.sleep(0.1)
        try:
            with tenant_context(tenant):
                fq.enqueue("a", tier="standard", partition="p")
        finally:
            connection.close()

    waker = threading.Thread(target=enqueue_soon)
    waker.start()
    try:
        # Woken by the enqueue's signal, however slow the enqueue: each wait that ends without
        # one is followed by another until the enqueue is done (a wait on shard 0 alone never ends
        # with one).
        woken = False
        while not woken:
            enqueued = not waker.is_alive()  # before this wait began: its signal is there to take
            woken = fq.wait_for_work(shards=[0, last], timeout_s=fq.MAX_WAIT_S)
            if enqueued:
                break
        assert woken
    finally:
        waker.join()
    assert fq.wait_for_work(shards=[0, last], timeout_s=0) is False  # one signal, taken


def test_one_item_in_flight_per_partition_and_partition_items_go_out_in_due_order(
    tenant_with, queue, redis_client
):
    tenant = tenant_with("ordered")
    with tenant_context(tenant):
        fq.enqueue("late", tier="standard", partition="p", delay_ms=150)
        fq.enqueue("early", tier="standard", partition="p")
        fq.enqueue("middle", tier="standard", partition="p", delay_ms=50)
        fq.enqueue("other", tier="standard", partition="q")
    start = redis_now_ms(redis_client)

    first, second = take(), take()
    assert [first.item_id, second.item_id] == ["early", "other"]
    sleep_until(redis_client, start + 200)
    assert fq.dequeue(lease_ms=LEASE_MS) is None  # p's next items are due, but "early" is in flight

    queue.ack(first)
    order = [item.item_id for item in queue.serve(10)]
    assert order == ["middle", "late"]


def test_a_partition_is_locked_across_tiers(tenant_with, queue):
    tenant = tenant_with("mixed")
    with tenant_context(tenant):
        fq.enqueue("s", tier="standard", partition="run-1")
        fq.enqueue("b", tier="batch", partition="run-1")
    first = take()
    assert first.item_id == "s"
    assert fq.dequeue(lease_ms=LEASE_MS) is None
    queue.ack(first)
    assert [item.item_id for item in queue.serve(5)] == ["b"]


def test_tiers_are_strict_priorities_with_the_system_tier_first(tenant_with, queue, tenants_on_shard):
    system_shard = shard_of(str(Tenant.system().pk))
    tenants_on_shard(system_shard)  # tiers are ordered within a shard
    tenant = tenant_with("tiered")
    with tenant_context(tenant):
        for tier in ("batch", "standard", "interactive"):
            fq.enqueue(f"{tier}-1", tier=tier, partition=tier)
            fq.enqueue(f"{tier}-2", tier=tier, partition=tier, delay_ms=0)
    with system_context() as system:
        queue.add(system)
        fq.enqueue("wakeup", tier=fq.SYSTEM_TIER, partition="coordinator")

    order = [item.item_id for item in queue.serve(20, shard=system_shard)]

    assert order == [
        "wakeup", "interactive-1", "interactive-2", "standard-1", "standard-2", "batch-1", "batch-2"
    ]


def test_tiers_outside_the_plan_and_the_system_tier_are_refused_to_customers(tenant_with):
    free = tenant_with("free-tier", plan="free")
    with tenant_context(free):
        with pytest.raises(fq.TierNotAllowed):
            fq.enqueue("x", tier="interactive", partition="p")
        with pytest.raises(fq.TierNotAllowed):
            fq.enqueue("x", tier=fq.SYSTEM_TIER, partition="p")
        assert fq.stats().backlog == 0
    with system_context(), pytest.raises(fq.TierNotAllowed):
        fq.enqueue("x", tier="standard", partition="p")


def test_a_tenant_at_its_ceiling_is_skipped_and_resumes_after_a_release(tenant_with, queue, redis_client):
    capped, other = tenant_with("capped", max_concurrency=2), tenant_with("other")
    fill(capped, partitions=5, per_partition=1)
    fill(other, partitions=5, per_partition=1)

    held = queue.serve(20, ack=False)

    by_tenant = shares(held)
    assert by_tenant[str(capped.pk)] == 2
    assert by_tenant[str(other.pk)] == 5
    assert capacity.tenant_in_flight(tenant=capped) == 2
    assert redis_client.sismember(fq.global_key("blocked:standard"), str(capped.pk))
    assert fq.dequeue(lease_ms=LEASE_MS) is None  # other is drained, capped is parked

    queue.ack(next(item for item in held if item.tenant_id == str(capped.pk)))
    resumed = take()
    assert resumed.tenant_id == str(capped.pk)
    assert fq.dequeue(lease_ms=LEASE_MS) is None  # at the ceiling again
    assert capacity.tenant_in_flight(tenant=capped) == 2


def test_a_raised_ceiling_unparks_the_tenant_at_its_next_enqueue(tenant_with, queue):
    capped = tenant_with("raised", max_concurrency=1)
    fill(capped, partitions=3, per_partition=1)
    assert len(queue.serve(3, ack=False)) == 1

    services.override_set(tenant=capped, field="max_concurrency", value=3)
    with tenant_context(capped):
        fq.enqueue("extra", tier="standard", partition="extra")

    assert len(queue.serve(5, ack=False)) == 2  # 3 in flight: the new ceiling
    assert capacity.tenant_in_flight(tenant=capped) == 3


def test_a_raised_step_rate_admits_the_tenant_at_once(tenant_with, queue, django_capture_on_commit_callbacks):
    """The steps a slow rate let through are not a debt the raised rate still makes the tenant pay:
    with the rate an operator raised to let it go on, it is dispatched at once, not when the old
    rate would have admitted it. (At once, one step: the new burst's others follow at the new rate,
    10 ms apart, so how many more a dequeue right after finds depends on the clock.)"""
    throttled = tenant_with("throttled", step_rate_per_s=0.001, step_burst=1)
    fill(throttled, partitions=3, per_partition=1)
    assert len(queue.serve(3, ack=False)) == 1  # its burst, then parked for 1,000 s

    with django_capture_on_commit_callbacks(execute=True):
        services.override_set(tenant=throttled, field="step_rate_per_s", value=100.0)
        services.override_set(tenant=throttled, field="step_burst", value=10)

    assert queue.serve(3, ack=False)  # held for 1,000 s without the change


def test_a_parked_tenant_comes_back_when_a_lease_lapses_without_a_release(tenant_with, queue, redis_client):
    capped = tenant_with("lapsed", max_concurrency=1)
    fill(capped, partitions=2, per_partition=1)
    first = take(150)
    assert fq.dequeue(lease_ms=LEASE_MS) is None  # parked at the ceiling

    sleep_until(redis_client, redis_now_ms(redis_client) + 160)
    second = take()  # the slot lapsed with the lease: the parked tenant's timer fired
    assert second.item_id != first.item_id


def test_a_rate_limited_tenant_is_skipped_and_resumes_when_its_rate_allows(tenant_with, queue, redis_client):
    slow = tenant_with("slow", step_rate_per_s=5.0, step_burst=2)
    fast = tenant_with("fast")
    fill(slow, partitions=4, per_partition=1)
    fill(fast, partitions=10, per_partition=1)

    start = redis_now_ms(redis_client)
    burst = queue.serve(50)
    after_burst = redis_now_ms(redis_client)

    assert shares(burst)[str(slow.pk)] == 2  # the burst, then parked on a timer
    assert shares(burst)[str(fast.pk)] == 10
    when = redis_client.zscore(fq.global_key("timers"), f"standard|{slow.pk}")
    assert when is not None
    assert when > after_burst
    # Not before the limiter admits: its TAT (µs) less its tolerance, one interval of 200 ms a
    # burst of 2 (the scripts' clock floors to the ms; the timer must round the moment up).
    tat_us = float(redis_client.get(capacity.rate_key(capacity.STEP_RATE_LIMITER, tenant=slow)))
    assert when * 1000 >= tat_us + 200_000 - 2 * 200_000 - 1
    sleep_until(redis_client, when)
    resumed = take()
    assert resumed.tenant_id == str(slow.pk)
    # One step every 200 ms after the burst of 2.
    assert redis_now_ms(redis_client) >= start + 200
    queue.ack(resumed)
    assert fq.dequeue(lease_ms=LEASE_MS) is None


def test_an_expired_lease_is_delivered_again_after_reap_and_an_ack_stops_that(tenant_with, redis_client):
    tenant = tenant_with("leases")
    with tenant_context(tenant):
        fq.enqueue("job", tier="standard", partition="p", payload={"n": 1})
    first = take(100)
    assert first.attempt == 1
    assert fq.reap() == 0  # the lease lives
    assert fq.dequeue(lease_ms=LEASE_MS) is None

    sleep_until(redis_client, redis_now_ms(redis_client) + 110)
    assert fq.dequeue(lease_ms=LEASE_MS) is None  # expired but not reaped: not delivered again
    assert fq.reap() == 1
    again = take(100)
    assert (again.item_id, again.attempt, again.payload) == ("job", 2, {"n": 1})
    assert again.delivery != first.delivery

    with tenant_context(tenant):
        assert fq.ack("job", delivery=first.delivery) is False  # the first worker is too late
        assert fq.extend_lease("job", lease_ms=LEASE_MS, delivery=first.delivery) is False
        assert fq.ack("job", delivery=again.delivery) is True
        assert fq.ack("job") is False
    sleep_until(redis_client, redis_now_ms(redis_client) + 110)
    assert fq.reap() == 0
    assert fq.dequeue(lease_ms=LEASE_MS) is None
    assert capacity.tenant_in_flight(tenant=tenant) == 0


def test_extend_lease_keeps_the_item_and_its_slot(tenant_with, redis_client):
    tenant = tenant_with("extended")
    with tenant_context(tenant):
        fq.enqueue("job", tier="standard", partition="p")
    item = take(100)
    with tenant_context(tenant):
        assert fq.extend_lease("job", lease_ms=LEASE_MS, delivery=item.delivery) is True
        assert fq.extend_lease("job", lease_ms=LEASE_MS, delivery=item.delivery + 1) is False
    sleep_until(redis_client, redis_now_ms(redis_client) + 150)
    assert fq.reap() == 0
    assert capacity.tenant_in_flight(tenant=tenant) == 1
    with tenant_context(tenant):
        assert fq.ack("job") is True
    assert capacity.tenant_in_flight(tenant=tenant) == 0


def test_a_lapsed_lease_cannot_be_extended(tenant_with, redis_client):
    tenant = tenant_with("lapsed-lease")
    with tenant_context(tenant):
        fq.enqueue("job", tier="standard", partition="p")
    assert fq.dequeue(lease_ms=50) is not None
    sleep_until(redis_client, redis_now_ms(redis_client) + 60)
    with tenant_context(tenant):
        assert fq.extend_lease("job", lease_ms=LEASE_MS) is False
    assert fq.reap() == 1


def test_a_newly_active_tenant_is_served_within_about_one_round(tenant_with, queue):
    active = [tenant_with(f"active-{i}") for i in range(10)]
    for tenant in active:
        fill(tenant, partitions=2, per_partition=30)
    queue.serve(150)

    newcomer = tenant_with("newcomer")
    with tenant_context(newcomer):
        fq.enqueue("first", tier="standard", partition="p")
    served = queue.serve(30)

    position = next(i for i, item in enumerate(served) if item.tenant_id == str(newcomer.pk))
    assert position <= len(active)


def test_nack_puts_the_item_back_after_its_delay_and_frees_its_slot(tenant_with, queue, redis_client):
    tenant = tenant_with("nacked")
    with tenant_context(tenant):
        fq.enqueue("job", tier="standard", partition="p")
    item = take()
    with tenant_context(tenant):
        assert fq.nack("job", delay_ms=150, delivery=item.delivery) is True
        assert fq.nack("job") is False
    assert capacity.tenant_in_flight(tenant=tenant) == 0
    nacked_at = redis_now_ms(redis_client)
    assert fq.dequeue(lease_ms=LEASE_MS) is None
    sleep_until(redis_client, nacked_at + 150)
    again = take()
    assert again.attempt == 2


def test_a_nack_with_a_longest_delay_doubles_it_per_failure_in_a_row_and_an_ack_starts_over(tenant_with, queue,
                                                                                            redis_client):
    tenant = tenant_with("backoff")
    with tenant_context(tenant):
        fq.enqueue("job", tier="standard", partition="p")

    def nack_waits() -> tuple[float, float]:
        """How long the nack put the item off: at least and at most (Redis's clock around it, in
        whole ms as the scripts read it)."""
        item = take()
        before = int(redis_now_ms(redis_client))
        with tenant_context(tenant):
            assert fq.nack("job", delay_ms=200, max_delay_ms=500, delivery=item.delivery)
            due = json.loads(redis_client.hget(redis_key("fq", "items"), "job"))["due"]
        after = redis_now_ms(redis_client)
        sleep_until(redis_client, due)
        return due - after, due - before

    for expected in (200, 400, 500, 500):
        low, high = nack_waits()
        assert low <= expected <= high
    item = take()
    with tenant_context(tenant):
        assert fq.enqueue("job", tier="standard", partition="p") == "rerun"
    queue.ack(item)  # it succeeded: it waits again, its count of failures cleared
    low, high = nack_waits()
    assert low <= 200 <= high
    with pytest.raises(ValueError, match="max_delay_ms"), tenant_context(tenant):
        fq.nack("job", delay_ms=200, max_delay_ms=100)


def test_enqueue_is_idempotent_and_coalesces_wakeups(tenant_with, queue):
    tenant = tenant_with("coalesce")
    with tenant_context(tenant):
        assert fq.enqueue("tick", tier="standard", partition="run", payload=1, delay_ms=60_000) == "queued"
        assert fq.enqueue("tick", tier="standard", partition="run", payload=2, delay_ms=60_000) == "exists"
        assert fq.enqueue("tick", tier="standard", partition="run", payload=3) == "advanced"
        assert fq.stats().backlog == 1
    item = take()
    assert item.payload == 1  # the waiting item kept its payload
    with tenant_context(tenant):
        assert fq.enqueue("tick", tier="standard", partition="run", payload=4) == "rerun"
        assert fq.enqueue("tick", tier="standard", partition="run", payload=5) == "rerun"
    assert fq.dequeue(lease_ms=LEASE_MS) is None  # the partition is locked
    queue.ack(item)
    rerun = take()
    assert (rerun.item_id, rerun.payload, rerun.attempt) == ("tick", 5, 2)
    queue.ack(rerun)
    assert fq.dequeue(lease_ms=LEASE_MS) is None
    assert fq.stats(tenant=tenant).backlog == 0


def test_a_nack_with_a_pending_rerun_is_due_when_the_rerun_is(tenant_with, queue):
    tenant = tenant_with("nack-rerun")
    with tenant_context(tenant):
        fq.enqueue("tick", tier="standard", partition="run")
    item = take()
    with tenant_context(tenant):
        assert fq.enqueue("tick", tier="standard", partition="run", payload="wake") == "rerun"
        assert fq.nack("tick", delay_ms=60_000, delivery=item.delivery) is True
        assert fq.stats().due == 1  # the wake-up is not postponed by the nack's delay
    again = take()
    assert (again.payload, again.attempt) == ("wake", 2)
    queue.ack(again)
    assert fq.next_due_ms() is None


def test_remove_withdraws_a_waiting_item_or_a_pending_rerun(tenant_with):
    tenant = tenant_with("removal")
    with tenant_context(tenant):
        fq.enqueue("a", tier="standard", partition="p")
        fq.enqueue("b", tier="standard", partition="q", delay_ms=60_000)
        assert fq.remove("b") is True
        assert fq.remove("b") is False
    item = take()
    assert item.item_id == "a"
    with tenant_context(tenant):
        assert fq.remove("a") is False  # in flight, nothing pending
        fq.enqueue("a", tier="standard", partition="p")
        assert fq.remove("a") is True  # the re-run is cancelled
        assert fq.ack("a") is True
    assert fq.dequeue(lease_ms=LEASE_MS) is None
    assert fq.next_due_ms() is None  # nothing left anywhere, not even a timer


def test_idor_fair_queue_items_of_another_tenant_are_out_of_reach(tenant_with):
    a, b = tenant_with("owner-a"), tenant_with("other-b")
    with tenant_context(a):
        fq.enqueue("secret", tier="standard", partition="p")
        fq.enqueue("waiting", tier="standard", partition="q", delay_ms=60_000)
    item = take()
    assert item.item_id == "secret"

    with tenant_context(b):
        assert fq.ack("secret") is False
        assert fq.nack("secret") is False
        assert fq.extend_lease("secret", lease_ms=LEASE_MS) is False
        assert fq.remove("waiting") is False
        assert (fq.stats().backlog, fq.stats().in_flight) == (0, 0)
        for call in (
            lambda: fq.ack("secret", tenant=a),
            lambda: fq.remove("waiting", tenant=a),
            lambda: fq.extend_lease("secret", lease_ms=LEASE_MS, tenant=a),
            lambda: fq.stats(tenant=a),
            lambda: fq.enqueue("x", tier="standard", partition="p", tenant=a),
            lambda: fq.dequeue(lease_ms=LEASE_MS),
            lambda: fq.reap(),
            lambda: fq.global_stats(),
        ):
            with pytest.raises(TenantScopeError):
                call()
        # The same id in another tenant is another item.
        assert fq.enqueue("secret", tier="standard", partition="p") == "queued"
    a_stats = fq.stats(tenant=a)
    assert (a_stats.backlog, a_stats.in_flight) == (1, 1)


def test_tenant_side_operations_need_a_tenant():
    with pytest.raises(TenantScopeError):
        fq.enqueue("x", tier="standard", partition="p")
    with pytest.raises(TenantScopeError):
        fq.ack("x")


def test_scripts_use_the_keys_of_tenants_keys_and_capacity_in_one_slot(tenant_with, redis_client):
    tenant = tenant_with("layout", step_rate_per_s=1.0, step_burst=10)
    with tenant_context(tenant):
        fq.enqueue("job", tier="standard", partition="p")
    take()
    with tenant_context(tenant):
        assert redis_client.hexists(redis_key("fq", "items"), "job")
        assert redis_client.hget(redis_key("fq", "locks"), "p") == b"job"
        assert redis_client.zscore(capacity.tenant_scope(1).key(), "fq:job") is not None
        assert redis_client.exists(capacity.holder_key("fq:job")) == 1
        assert capacity.rate_peek(capacity.STEP_RATE_LIMITER, 1.0, 10).remaining == 9
    assert redis_client.zscore(fq.global_key("inflight"), f"{tenant.pk}|job") is not None
    tag = shard_tag(shard_of(str(tenant.pk)))
    queue_keys = [k.decode() for k in redis_keys(redis_client, "{*")]
    assert queue_keys
    assert all(k.startswith(tag + ":") for k in queue_keys)


def test_stats_report_backlog_due_in_flight_and_the_oldest_wait(tenant_with, redis_client):
    tenant = tenant_with("observed")
    with tenant_context(tenant):
        fq.enqueue("a", tier="standard", partition="p")
        fq.enqueue("b", tier="standard", partition="q")
        fq.enqueue("c", tier="batch", partition="r", delay_ms=60_000)
    sleep_until(redis_client, redis_now_ms(redis_client) + 30)
    assert fq.dequeue(lease_ms=LEASE_MS) is not None

    report = fq.stats(tenant=tenant)
    assert report.tiers["standard"].backlog == 1
    assert report.tiers["standard"].due == 1
    assert report.tiers["standard"].in_flight == 1
    assert report.tiers["standard"].oldest_waiting_ms >= 30
    assert (report.tiers["batch"].backlog, report.tiers["batch"].due) == (1, 0)
    assert (report.backlog, report.due, report.in_flight) == (2, 1, 1)

    overall = fq.global_stats()
    assert overall.in_flight == 1
    assert overall.tiers["standard"].ready_tenants == 1
    assert overall.timers == 1  # the batch tier's future item
    assert overall.tiers["standard"].virtual_time >= 0


def test_dequeue_validates_its_arguments(redis_client):
    with pytest.raises(ValueError, match="lease_ms"):
        fq.dequeue(lease_ms=0)
    with pytest.raises(ValueError, match="tiers"):
        fq.dequeue(lease_ms=LEASE_MS, tiers=["gold"])
    with pytest.raises(ValueError, match="shard"):
        fq.dequeue(shard=99, lease_ms=LEASE_MS)
    assert fq.dequeue(lease_ms=LEASE_MS, tiers=[fq.SYSTEM_TIER]) is None


def test_with_no_credit_left_a_dequeue_takes_items_of_the_free_kinds_and_passes_over_the_others_in_place(
        tenant_with, queue, redis_client):
    """Task nodes use no work credit: a dispatcher with none left still takes them, beside at most
    its credits' worth of other items; a tenant whose next item needs a credit keeps its start tag."""
    steps_a, tasks, steps_c = (queue.add(tenant_with(name)) for name in ("free-a", "free-b", "free-c"))
    for tenant, kind in ((steps_a, "step"), (tasks, "task"), (steps_c, "step")):
        fq.enqueue_many([fq.NewItem(f"{kind}-{n}", "standard", f"p{n}", {"kind": kind}) for n in range(3)],
                        tenant=tenant)
    ready = fq.global_key("ready:standard", shard=0)
    tags = dict(redis_client.zrange(ready, 0, -1, withscores=True))
    assert len(tags) == 3

    [none_credited] = fq.dequeue_batches(shard=0, lease_ms=LEASE_MS, batches=[(None, 0, 10)], free_kinds=["task"])

    assert [(item.tenant_id, item.item_id) for item in none_credited] == [(str(tasks.pk), f"task-{n}")
                                                                         for n in range(3)]
    after = dict(redis_client.zrange(ready, 0, -1, withscores=True))
    passed_over = {member: tag for member, tag in tags.items() if member.decode() != str(tasks.pk)}
    assert after == passed_over  # both still ready, each at its own start tag

    [one_credit] = fq.dequeue_batches(shard=0, lease_ms=LEASE_MS, batches=[(None, 1, 10)], free_kinds=["task"])
    assert len(one_credit) == 1
    assert one_credit[0].payload["kind"] == "step"
    first = min(passed_over, key=lambda member: (passed_over[member], member))
    assert one_credit[0].tenant_id == first.decode()  # the fair order's first, as if never passed over
    with pytest.raises(ValueError, match="at least one item"):
        fq.dequeue_batches(shard=0, lease_ms=LEASE_MS, batches=[(None, 0, 0)], free_kinds=["task"])
    with pytest.raises(ValueError, match="limit"):
        fq.dequeue_batches(shard=0, lease_ms=LEASE_MS, batches=[(None, 0, 10)])  # no free kind: a credit each
