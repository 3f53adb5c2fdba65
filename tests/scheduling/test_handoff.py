"""Handoff: a worker process that finishes an item takes the next one itself, fairly.

``fair_queue.handoff`` against the real Redis; ``execute_item`` run in this
process (``Task.apply``: the worker's code path without a broker); and a real
worker whose process dies in the middle of a chain.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from ductor_project.celery import WORK_QUEUE
from ductor_project.core import capacity, scripts
from ductor_project.core.context import TenantScopeError, tenant_context
from ductor_project.core.keys import shard_of
from scheduling import fair_queue as fq
from scheduling.dispatch import credits as broker
from scheduling.dispatch.finisher import finisher
from scheduling.dispatch.handlers import _publishers, register_publisher
from scheduling.dispatch.worker import execute_item
from tenants import services
from tenants.models import Tenant
from tests.conftest import handed_off
from tests.scheduling.broker_handlers import records
from tests.scheduling.helpers import redis_now_ms, sleep_until
from tests.scheduling.test_broker import HANDLERS, assert_drained, dispatching, enqueue, events, wait_for

# Also on a Redis Cluster (the cluster run), with this module's tenants on shard 0, which its direct
# dispatcher calls serve.
pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("tenants_on_shard")]

LEASE_MS = 30_000
TIERS = broker.CUSTOMER_TIERS


def run_message(item: fq.Dequeued, **overrides: Any) -> str:
    """``execute_item`` for ``item`` as a worker runs a message, here; then the pending acks
    and credits are sent (the renewal thread's job on a worker)."""
    kwargs = {"tenant_id": item.tenant_id, "item_id": item.item_id, "delivery": item.delivery,
              "kind": item.payload["kind"], "body": item.payload, "tier": item.tier, "partition": item.partition,
              "lease_until_ms": item.lease_until_ms, **overrides}
    outcome = execute_item.apply(kwargs=kwargs).get()
    finisher.flush()
    return str(outcome)


# --- fair_queue.handoff ----------------------------------------------------------------------


@pytest.mark.django_db
def test_handoff_acks_first_so_the_next_item_of_the_same_partition_goes_out_in_the_same_call(
    make_tenant, redis_client
):
    tenant, _ = make_tenant("handoff-partition")
    services.override_set(tenant=tenant, field="max_concurrency", value=1)
    enqueue(tenant, 2, kind="test.noop", prefix="x")  # one partition: x1 waits behind x0
    first = fq.dequeue(lease_ms=LEASE_MS)
    assert first is not None
    assert first.item_id == "x0"
    assert fq.dequeue(lease_ms=LEASE_MS) is None  # partition locked, and the one slot taken

    acked, nxt = fq.handoff((tenant, first.item_id, first.delivery), shard=0, lease_ms=LEASE_MS, tiers=TIERS)

    assert acked is True
    assert nxt is not None
    assert nxt.item_id == "x1"
    assert nxt.tenant_id == str(tenant.pk)
    assert capacity.tenant_in_flight(tenant=tenant) == 1
    stats = fq.stats(tenant)
    assert (stats.backlog, stats.in_flight) == (0, 1)


@pytest.mark.django_db
def test_handoff_reports_a_lost_ack_and_an_empty_queue_and_only_serves_the_tiers_asked(make_tenant, redis_client):
    tenant, _ = make_tenant("handoff-empty")
    enqueue(tenant, 1, kind="test.noop", prefix="y")
    item = fq.dequeue(lease_ms=LEASE_MS)
    assert item is not None
    with tenant_context(Tenant.system()):
        fq.enqueue("wake", tier=fq.SYSTEM_TIER, partition="w", payload={"kind": "test.noop"})

    # Another delivery's token: nothing acked; then nothing of the customer tiers is left.
    acked, nxt = fq.handoff((tenant, item.item_id, item.delivery + 1), shard=0, lease_ms=LEASE_MS, tiers=TIERS)
    assert (acked, nxt) == (False, None)
    assert fq.stats(tenant).in_flight == 1
    acked, nxt = fq.handoff((tenant, item.item_id, item.delivery), shard=0, lease_ms=LEASE_MS, tiers=TIERS)
    assert (acked, nxt) == (True, None)
    # Without an item to ack, it only dequeues; the system tier only when asked for (on its shard).
    system_shard = shard_of(str(Tenant.system().pk))
    acked, nxt = fq.handoff(None, shard=system_shard, lease_ms=LEASE_MS, tiers=[fq.SYSTEM_TIER])
    assert acked is None
    assert nxt is not None
    assert nxt.item_id == "wake"


@pytest.mark.django_db
def test_handoff_crosses_tenants_so_it_refuses_to_run_in_a_customer_tenants_context(make_tenant, redis_client):
    tenant, _ = make_tenant("handoff-scope")
    with tenant_context(tenant), pytest.raises(TenantScopeError):
        fq.handoff(None, shard=0, lease_ms=LEASE_MS, tiers=TIERS)


def wake_token(redis: Any) -> bool:
    """Whether shard 0's dispatchers have a wake-up signal waiting (taken from them: a test's own look)."""
    return redis.lpop(fq.global_key("wake")) is not None


@pytest.mark.django_db
def test_a_handoff_of_a_kind_takes_the_next_item_only_if_the_fair_order_gives_one_of_that_kind(
    make_tenant, redis_client
):
    tenant, _ = make_tenant("handoff-kind")
    enqueue(tenant, 1, kind="task", prefix="t")
    with tenant_context(tenant):  # behind t0 in the same partition
        fq.enqueue("s0", tier="standard", partition="p0", payload={"kind": "step"}, delay_ms=20)
    first = fq.dequeue(lease_ms=LEASE_MS)
    assert first is not None
    assert first.item_id == "t0"
    sleep_until(redis_client, redis_now_ms(redis_client) + 25)  # s0 is due
    acked, nxt = fq.handoff((tenant, first.item_id, first.delivery), shard=0, lease_ms=LEASE_MS, tiers=TIERS,
                            kind="task")
    # The next in the fair order is a step: nothing is taken, nothing of it changed.
    assert (acked, nxt) == (True, None)
    stats = fq.stats(tenant)
    assert (stats.backlog, stats.in_flight) == (1, 0)
    assert capacity.tenant_in_flight(tenant=tenant) == 0
    enqueue(tenant, 1, kind="task", prefix="u")
    other = fq.dequeue(lease_ms=LEASE_MS)
    assert other is not None
    assert other.item_id == "s0"  # the dispatcher's dequeue takes it, in its turn
    _, nxt = fq.handoff((tenant, other.item_id, other.delivery), shard=0, lease_ms=LEASE_MS, tiers=TIERS,
                        kind="task")
    assert nxt is not None
    assert nxt.item_id == "u0"


@pytest.mark.django_db
def test_a_handoff_wakes_no_dispatcher_for_the_item_it_takes_and_wakes_them_for_what_it_leaves(
    make_tenant, redis_client
):
    tenant, first = one_in_flight(make_tenant, "handoff-quiet")
    wake_token(redis_client)
    with fq.holding_enqueues():
        soon(tenant, "next")
        _, nxt = fq.handoff((tenant, first.item_id, first.delivery), shard=0, lease_ms=LEASE_MS, tiers=TIERS)
    assert nxt is not None
    assert nxt.item_id == "next"
    assert not wake_token(redis_client)  # the enqueue made the tenant ready; the handoff took its item

    with fq.holding_enqueues():
        soon(tenant, "a")
        soon(tenant, "b")
        _, taken = fq.handoff((tenant, nxt.item_id, nxt.delivery), shard=0, lease_ms=LEASE_MS, tiers=TIERS)
    assert taken is not None
    assert wake_token(redis_client)  # one more is ready: a dispatcher is woken for it
    # Outside a handoff, an enqueue that makes a tenant ready wakes them at once.
    other, _ = make_tenant("handoff-loud")
    soon(other, "c")
    assert wake_token(redis_client)


# --- enqueues held for the handoff ------------------------------------------------------------


def soon(tenant: Tenant, item_id: str) -> None:
    with tenant_context(tenant):
        fq.enqueue_soon([fq.NewItem(item_id, "standard", f"p-{item_id}", {"kind": "test.noop"})])


def one_in_flight(make_tenant: Any, slug: str) -> tuple[Tenant, fq.Dequeued]:
    """A new tenant with one item, dequeued."""
    tenant, _ = make_tenant(slug)
    enqueue(tenant, 1, kind="test.noop", prefix=slug)
    first = fq.dequeue(lease_ms=LEASE_MS)
    assert first is not None
    return tenant, first


def batches_sent(monkeypatch: Any) -> list[int]:
    """From now on, the number of script calls of each batch sent (one round trip each)."""
    real, sent = scripts.Batch._send, []

    def send(calls: list[Any]) -> list[Any]:
        sent.append(len(calls))
        return real(calls)

    monkeypatch.setattr(scripts.Batch, "_send", staticmethod(send))
    return sent


@pytest.mark.django_db
def test_an_enqueue_held_in_a_worker_s_block_travels_with_its_handoff_and_is_dequeued_by_it(
        make_tenant, redis_client, monkeypatch):
    tenant, first = one_in_flight(make_tenant, "handoff-held")
    with fq.holding_enqueues():
        soon(tenant, "next")
        assert fq.stats(tenant).backlog == 0  # held: not sent
        sent = batches_sent(monkeypatch)
        acked, nxt = fq.handoff((tenant, first.item_id, first.delivery), shard=0, lease_ms=LEASE_MS, tiers=TIERS)
        monkeypatch.undo()
    assert acked is True
    assert nxt is not None
    assert nxt.item_id == "next"
    # One round trip: the enqueue (the tenant's items key), the ack (its too), the dequeue (the shard's).
    assert sent == [3]
    stats = fq.stats(tenant)
    assert (stats.backlog, stats.in_flight) == (0, 1)


@pytest.mark.django_db
def test_an_ack_in_a_worker_s_block_carries_the_held_enqueues_in_its_round_trip(
        make_tenant, redis_client, monkeypatch):
    tenant, first = one_in_flight(make_tenant, "handoff-held-ack")
    with fq.holding_enqueues():
        soon(tenant, "next")
        sent = batches_sent(monkeypatch)
        assert fq.ack(first.item_id, delivery=first.delivery, tenant=tenant) is True
        assert fq.ack(first.item_id, delivery=first.delivery, tenant=tenant) is False  # nothing held: alone
        monkeypatch.undo()
    assert sent == [2, 1]  # the held enqueue and the ack, in one round trip; the second ack alone
    stats = fq.stats(tenant)
    assert (stats.backlog, stats.in_flight) == (1, 0)
    with tenant_context(tenant):
        assert fq.remove("next")


@pytest.mark.django_db
def test_a_remove_in_a_worker_s_block_withdraws_an_item_whose_enqueue_it_holds(make_tenant, redis_client):
    tenant, _ = make_tenant("handoff-held-remove")
    with fq.holding_enqueues():
        soon(tenant, "started-and-ended")
        with tenant_context(tenant):
            assert fq.remove("started-and-ended")  # the held enqueue goes first, in the same round trip
    assert fq.stats(tenant).backlog == 0  # not enqueued after its removal, when the block ends


@pytest.mark.django_db
def test_what_is_still_held_when_the_block_ends_is_sent_then_and_outside_a_block_at_once(
        make_tenant, redis_client):
    tenant, _ = make_tenant("handoff-held-end")
    soon(tenant, "now")
    assert fq.stats(tenant).backlog == 1
    with fq.holding_enqueues():
        soon(tenant, "later")
        assert fq.stats(tenant).backlog == 1
    assert fq.stats(tenant).backlog == 2


@pytest.fixture
def first_batch_fails(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[int]]:
    """Call it, and the next Redis batch is lost on the way (``ConnectionError``) while the later ones
    go through; it returns the size of each batch sent from then on, in order."""
    real, calls = scripts.Batch.execute, []

    def fails_once(batch: Any) -> list[Any]:
        calls.append(len(batch))
        if len(calls) == 1:
            batch._calls, batch._again = [], []
            raise ConnectionError("lost")
        return real(batch)

    def arm() -> list[int]:
        monkeypatch.setattr(scripts.Batch, "execute", fails_once)
        return calls

    return arm


@pytest.mark.django_db
def test_held_enqueues_whose_handoff_failed_are_sent_at_the_block_s_end(make_tenant, redis_client, first_batch_fails):
    tenant, _ = make_tenant("handoff-held-fail")
    calls = first_batch_fails()
    with fq.holding_enqueues():
        soon(tenant, "kept")
        with pytest.raises(ConnectionError):
            fq.handoff(None, shard=0, lease_ms=LEASE_MS, tiers=TIERS)
        assert fq.stats(tenant).backlog == 0
    assert calls[0] == 2  # the held enqueue and the dequeue, in one batch
    assert fq.stats(tenant).backlog == 1
    with tenant_context(tenant):
        assert fq.remove("kept")


@pytest.mark.django_db
def test_acks_and_credits_the_finisher_could_not_send_are_sent_once_redis_answers_again(
    make_tenant, redis_client, first_batch_fails
):
    """Dropped while Redis was away, a finished item stayed leased (its partition's next item
    waited for the reaper) and its credit counted until it aged out: the workers stood idle
    after Redis came back, with work due."""
    tenant, item = one_in_flight(make_tenant, "finisher-away")
    broker.register_worker("fake@host", [WORK_QUEUE], 1)
    credit = broker.reserve_credits({WORK_QUEUE: 1})[WORK_QUEUE]
    broker.mark_sent(WORK_QUEUE, credit)
    calls = first_batch_fails()
    finisher.later(WORK_QUEUE, credit[0], fq.Finished(tenant, item.item_id, item.delivery))
    finisher.flush()  # this one or the renewal thread's, woken by ``later``, fails
    finisher.flush()  # Redis answers again

    assert calls[0] == 2  # the ack and the credit, in one round trip
    assert (fq.stats(tenant).in_flight, broker.busy(WORK_QUEUE)) == (0, 0)


@pytest.mark.django_db
def test_held_enqueues_of_two_tenants_each_go_to_their_own_queue_and_none_without_a_tenant(
        make_tenant, redis_client):
    a, _ = make_tenant("handoff-held-a")
    b, _ = make_tenant("handoff-held-b")
    with fq.holding_enqueues():
        soon(a, "of-a")
        soon(b, "of-b")
        with pytest.raises(TenantScopeError):
            fq.enqueue_soon([fq.NewItem("nobody", "standard", "p", {"kind": "test.noop"})])
    assert (fq.stats(a).backlog, fq.stats(b).backlog) == (1, 1)
    with tenant_context(a):
        assert not fq.remove("of-b")  # b's item is not in a's queue
        assert fq.remove("of-a")
    with tenant_context(b):
        assert fq.remove("of-b")


@pytest.mark.django_db
def test_an_enqueue_held_is_validated_when_it_is_made(make_tenant, redis_client):
    tenant, _ = make_tenant("handoff-held-bad")
    with fq.holding_enqueues(), tenant_context(tenant), pytest.raises(fq.TierNotAllowed):
        fq.enqueue_soon([fq.NewItem("x", "no-such-tier", "p", {"kind": "test.noop"})])


# --- execute_item chains ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_message_runs_the_next_items_of_every_tenant_in_the_fair_order_each_in_its_own_context(
    make_tenant, redis_client, settings
):
    settings.DUCTOR_HANDOFF_MS = 60_000  # however slow this machine: the chain ends when nothing is due
    settings.DUCTOR_FAIR_COST = "items"  # the order by weight in items; fair by work has its own tests
    a, _ = make_tenant("chain-a")
    b, _ = make_tenant("chain-b")
    for tenant, weight in ((a, 1), (b, 2)):
        services.override_set(tenant=tenant, field="weight", value=weight)
    owner = {}
    for tenant in (a, b):
        for item_id in enqueue(tenant, 6, kind="test.ran", partitions=6, prefix=f"{tenant.slug}-"):
            owner[item_id] = str(tenant.pk)
    first = fq.dequeue(lease_ms=LEASE_MS)
    assert first is not None

    assert run_message(first) == "ok"

    starts = events(redis_client, "start")
    assert sorted(r["item"] for r in starts) == sorted(owner)  # all twelve, each once, from one message
    for row in starts:
        assert row["tenant"] == row["context_tenant"] == owner[row["item"]]
    # Tenant-first by weight while both are backlogged: b twice as often as a.
    first_six = [owner[r["item"]] for r in starts[:6]]
    assert first_six.count(str(b.pk)) == 4
    assert_drained(a, b)


@pytest.mark.django_db
def test_a_handed_off_item_of_a_kind_with_a_publisher_goes_to_it_and_stays_leased(
    make_tenant, redis_client, settings
):
    settings.DUCTOR_HANDOFF_MS = 60_000
    tenant, _ = make_tenant("chain-pub")
    published: list[fq.Dequeued] = []
    register_publisher("test.published", published.extend)
    try:
        enqueue(tenant, 1, kind="test.ran", prefix="ran")
        for n in range(2):  # due a little later: the message's first item is the one that runs here
            fq.enqueue(f"pub{n}", tier="standard", partition=f"q{n}", payload={"kind": "test.published"},
                       delay_ms=50, tenant=tenant)
        due_ms = redis_now_ms(redis_client) + 50  # no earlier than theirs
        first = fq.dequeue(lease_ms=LEASE_MS)
        assert first is not None
        assert first.item_id == "ran0"
        sleep_until(redis_client, due_ms + 1)  # they are due when the message runs

        assert run_message(first) == "ok"
    finally:
        _publishers.pop("test.published")
    # Not dropped as an item without a handler: handed to its publisher, in flight until its outcome.
    assert sorted(item.item_id for item in published) == ["pub0", "pub1"]
    assert fq.stats(tenant).in_flight == 2
    for item in published:
        assert fq.ack(item.item_id, delivery=item.delivery, tenant=tenant)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("handoff_ms", "kind"), [(0, "test.ran"), (50, "test.sleep")])
def test_a_message_takes_no_next_item_with_handoff_off_or_once_its_time_is_up(
    make_tenant, redis_client, settings, handoff_ms, kind
):
    settings.DUCTOR_HANDOFF_MS = handoff_ms
    tenant, _ = make_tenant("chain-off")
    enqueue(tenant, 3, kind=kind, partitions=3, prefix="z", ms=60)  # a sleep outlasts the 50 ms
    first = fq.dequeue(lease_ms=LEASE_MS)
    assert first is not None

    assert run_message(first) == "ok"

    assert [r["item"] for r in events(redis_client, "start")] == [first.item_id]
    stats = fq.stats(tenant)
    assert (stats.backlog, stats.in_flight) == (2, 0)


@pytest.mark.django_db(transaction=True)
def test_a_redelivered_message_of_an_item_acked_before_a_handoff_does_not_run_again(make_tenant, redis_client):
    tenant, _ = make_tenant("chain-redelivered")
    enqueue(tenant, 1, kind="test.ran", prefix="r")
    item = fq.dequeue(lease_ms=LEASE_MS)
    assert item is not None
    assert run_message(item) == "ok"

    # Celery delivering the same message again (its process died later in the chain): however
    # fresh its lease looks, the worker asks Redis, and the item is no longer in flight.
    kwargs = {"tenant_id": item.tenant_id, "item_id": item.item_id, "delivery": item.delivery,
              "kind": "test.ran", "body": item.payload, "tier": item.tier, "partition": item.partition,
              "lease_until_ms": item.lease_until_ms}
    execute_item.push_request(id="again", called_directly=False, kwargs=kwargs,
                              delivery_info={"redelivered": True})  # as a worker's tracer does
    try:
        outcome = execute_item(**kwargs)
    finally:
        execute_item.pop_request()

    assert outcome == "stale"
    assert len(events(redis_client, "start")) == 1


@pytest.mark.django_db(transaction=True)
def test_a_message_a_later_release_published_with_an_argument_more_runs_its_item(make_tenant, redis_client):
    """A dispatcher of the next release may publish while this release's workers still run (a rolling
    deploy, or a rollback with messages left in the broker): an argument it adds is passed over; the
    item was failed and came back only after its lease."""
    tenant, _ = make_tenant("chain-later-release")
    enqueue(tenant, 1, kind="test.ran", prefix="l")
    item = fq.dequeue(lease_ms=LEASE_MS)
    assert item is not None

    assert run_message(item, added_by_a_later_release={"any": 1}) == "ok"

    assert [r["item"] for r in events(redis_client, "start")] == [item.item_id]
    assert fq.stats(tenant).in_flight == 0


# --- a real worker -----------------------------------------------------------------------------


@pytest.mark.worker
@pytest.mark.cluster(also=False)  # a worker's death, whatever Redis: too long for the cluster run
def test_a_worker_process_killed_mid_chain_runs_neither_its_acked_items_again_nor_loses_the_current_one(
    make_tenant, celery_worker, redis_client, monkeypatch, settings
):
    # Long enough that a's message, back within a few seconds, looks fresh: only the redelivery
    # flag makes the worker ask Redis.
    lease_ms = 10_000
    monkeypatch.setenv("DUCTOR_LEASE_MS", str(lease_ms))
    monkeypatch.setenv("DUCTOR_HANDOFF_MS", "5000")  # a's 200 ms leave time to hand b off
    settings.DUCTOR_LEASE_MS = lease_ms
    settings.DUCTOR_DISPATCH_BUFFER = 0  # the dispatcher publishes one message: the rest is handed off
    tenant, _ = make_tenant("chain-crash")
    worker = celery_worker(*HANDLERS, concurrency=1)
    enqueue(tenant, 1, kind="test.sleep", prefix="a", ms=200)
    fq.enqueue("b", tier="standard", partition="pb", payload={"kind": "test.sleep", "ms": 60_000, "once": True},
               tenant=tenant)

    with dispatching():
        b_start = wait_for(lambda: events(redis_client, "start", "b"), what="b to start")[0]
        time.sleep(0.3)  # b is asleep (its "once" mark set)
        os.kill(b_start["pid"], signal.SIGKILL)  # the pool process, in b: a is finished and acked
        b_again = wait_for(lambda: events(redis_client, "start", "b")[1:], timeout=30,
                           what="b to be delivered again")[0]
        wait_for(lambda: events(redis_client, "end", "b"), what="b to finish")
        wait_for(lambda: "stale_delivery_dropped" in worker.output(), timeout=10,
                 what="a's message, delivered again by Celery, to be dropped")
        time.sleep(0.5)

    a_starts = events(redis_client, "start", "a0")
    assert len(a_starts) == 1  # ran once, although its message came back
    assert a_starts[0]["pid"] == b_start["pid"]  # and b was handed off in the same process
    assert handed_off(worker.output())
    assert b_again["delivery"] > b_start["delivery"]
    assert b_again["at_ms"] >= b_start["at_ms"] + lease_ms * 0.9  # not before b's lease ended
    assert [r["item"] for r in records(redis_client) if r["event"] == "end"] == ["a0", "b"]
    assert_drained(tenant)
