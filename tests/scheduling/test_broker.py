"""The fair broker end to end: real PostgreSQL, real Redis and real Celery worker processes.

Workers import ``tests.scheduling.broker_handlers`` (``--include``), whose
handlers record each event in Redis (with Redis TIME and the worker pid).
Dispatchers run in threads of the test process. Each worker start costs
seconds on a small machine, so a test that needs a worker checks every rule
that the same worker can show.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.test import APIClient

from ductor_project.celery import SYSTEM_QUEUE, WORK_QUEUE, app
from ductor_project.core import capacity
from ductor_project.core.context import no_tenant
from ductor_project.core.keys import redis_key, shard_of
from ductor_project.stack import Child
from scheduling import fair_queue as fq
from scheduling.coordinator.reaper import reap_all
from scheduling.coordinator.wakeups import schedule_wakeup
from scheduling.dispatch import credits as broker
from scheduling.dispatch.dispatcher import RESERVE_MIN, Dispatcher
from scheduling.dispatch.handlers import _publishers, register_publisher
from scheduling.dispatch.worker import execute_item
from scheduling.fair_queue import SYSTEM_TIER
from tenants import services
from tenants.models import Tenant
from tenants.tasking import TENANT_HEADER
from tests.conftest import api_client, broker_redis, error_code, handed_off
from tests.scheduling.broker_handlers import WAKE_KIND, records, redis_ms
from tests.waiting import wait_for

# Also on a Redis Cluster (the cluster run), with this module's tenants on shard 0, which its direct
# dispatcher calls serve.
pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("tenants_on_shard")]

HANDLERS = ("--include", "tests.scheduling.broker_handlers")
# How often the test's reaper looks for items whose lease ended (the coordinator: every second).
REAP_EVERY_S = 0.2
BUFFER = settings.DUCTOR_DISPATCH_BUFFER


@contextlib.contextmanager
def dispatching(count: int = 1) -> Iterator[list[Dispatcher]]:
    """``count`` dispatchers, each in a thread of this process, and the reaper (as the
    coordinator runs it), until the block ends."""
    dispatchers = [Dispatcher() for _ in range(count)]
    stop = threading.Event()

    def run(dispatcher: Dispatcher) -> None:
        try:
            dispatcher.run_forever(stop)
        finally:
            connection.close()

    def reap() -> None:
        while not stop.wait(REAP_EVERY_S):
            reap_all()

    threads = [threading.Thread(target=run, args=(d,), daemon=True) for d in dispatchers]
    threads.append(threading.Thread(target=reap, daemon=True))
    for thread in threads:
        thread.start()
    try:
        yield dispatchers
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        assert not any(thread.is_alive() for thread in threads)


def enqueue(tenant: Tenant, count: int, *, kind: str, partitions: int = 1, prefix: str = "i",
            **body: Any) -> list[str]:
    ids = [f"{prefix}{n}" for n in range(count)]
    for n, item_id in enumerate(ids):
        fq.enqueue(item_id, tier="standard", partition=f"p{n % partitions}", payload={"kind": kind, **body},
                   tenant=tenant)
    return ids


def assert_drained(*tenants: Tenant) -> None:
    """Nothing waiting, nothing in flight, no capacity slot held, no dispatch credit held."""
    for tenant in tenants:
        stats = fq.stats(tenant)
        assert (stats.backlog, stats.in_flight) == (0, 0), tenant.slug
        assert capacity.tenant_in_flight(tenant=tenant) == 0, tenant.slug
    # A killed worker's running mark is not removed by the dead process: it ages out with its
    # lease, so the credit comes back within a lease, never stays lost.
    wait_for(lambda: broker.busy(WORK_QUEUE) == 0, what="every credit back")
    assert broker.busy(SYSTEM_QUEUE) == 0


def events(redis: Any, event: str, item: str | None = None) -> list[dict[str, Any]]:
    return [r for r in records(redis) if r["event"] == event and (item is None or r.get("item") == item)]


def served_by(worker: Child, row: dict[str, Any]) -> bool:
    """The record was written by a process of ``worker`` (its process group)."""
    try:
        return os.getpgid(row["pid"]) == worker.proc.pid
    except ProcessLookupError:
        return False


# --- credits --------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("buffer", [0, 2])  # the default with handoff, and one without
def test_without_workers_dispatchers_together_publish_no_more_than_the_buffer(
    make_tenant, redis_client, settings, buffer
):
    settings.DUCTOR_DISPATCH_BUFFER = buffer
    tenant, _ = make_tenant("credits")
    enqueue(tenant, 20, kind="test.noop", partitions=20)
    dispatchers = [Dispatcher() for _ in range(8)]

    def run_once(dispatcher: Dispatcher) -> None:
        try:
            dispatcher.run_once()
        finally:
            connection.close()

    threads = [threading.Thread(target=run_once, args=(d,)) for d in dispatchers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sum(d.dispatched for d in dispatchers) == buffer
    assert broker.outstanding(WORK_QUEUE) == buffer
    assert fq.stats(tenant).in_flight == buffer

    # A registered worker of 3 slots makes room for exactly 3 more, whoever dispatches.
    broker.register_worker("fake@host", [WORK_QUEUE], 3)
    for dispatcher in dispatchers:
        dispatcher.run_once()
    assert sum(d.dispatched for d in dispatchers) == buffer + 3
    assert broker.busy(WORK_QUEUE) == broker.worker_slots(WORK_QUEUE) + buffer == 3 + buffer
    assert broker.credits(WORK_QUEUE) == 0
    assert fq.stats(tenant).backlog == 20 - buffer - 3


@pytest.mark.django_db
def test_a_dispatcher_out_of_work_credits_sleeps_holding_none_so_two_never_split_the_credits_for_good(
    make_tenant, redis_client
):
    """Kept across its sleep, the system credits a dispatcher did not use would be out of reach
    of the other dispatcher, which then held the work credits it took the same way: each waited
    for what the other held, neither went idle, and no credit ever came back."""
    tenant, _ = make_tenant("split")
    broker.register_worker("fake@host", [WORK_QUEUE, SYSTEM_QUEUE], 2)
    first, second = Dispatcher(), Dispatcher()
    enqueue(tenant, 2, kind="test.noop", partitions=2)
    assert first.run_once() == 2  # both work credits used; the system ones unused
    assert broker.busy(SYSTEM_QUEUE) == 2
    first._idle()  # out of work credits: it waits for one to free ...
    assert broker.busy(SYSTEM_QUEUE) == 0  # ... holding nothing it did not use
    second.run_once()
    assert broker.credits(SYSTEM_QUEUE) == 0  # the other dispatcher could take them
    second._idle()
    assert broker.busy(SYSTEM_QUEUE) == 0
    assert broker.busy(WORK_QUEUE) == 2  # the two messages published and not yet run


@pytest.mark.django_db
def test_a_dispatcher_out_of_work_credits_still_hands_task_nodes_to_their_publisher_and_leaves_the_rest(
    make_tenant, redis_client
):
    """Task nodes' items need no Ductor worker: with every work slot taken, a round still hands
    them to their publisher, and the items that need a slot stay queued for one."""
    steps, _ = make_tenant("slotless-steps")
    tasks, _ = make_tenant("slotless-tasks")
    broker.register_worker("fake@host", [WORK_QUEUE, SYSTEM_QUEUE], 1)
    published: list[fq.Dequeued] = []
    register_publisher("test.published", published.extend)
    try:
        dispatcher = Dispatcher(shards=list(range(settings.DUCTOR_QUEUE_SHARDS)))
        enqueue(steps, 3, kind="test.noop", partitions=3, prefix="s")
        assert dispatcher.run_once() == 1  # the one work slot
        dispatcher.give_back()
        assert broker.credits(WORK_QUEUE) == 0
        enqueue(tasks, 2, kind="test.published", partitions=2, prefix="t")

        assert dispatcher.run_once() == 2
        assert sorted(item.item_id for item in published) == ["t0", "t1"]
        assert all(item.tenant_id == str(tasks.pk) for item in published)
        assert fq.stats(steps).backlog == 2  # still queued: no slot for them
        assert broker.busy(WORK_QUEUE) == 1  # the task nodes took no credit
        dispatcher.give_back()
    finally:
        _publishers.pop("test.published")


@pytest.mark.django_db
def test_a_dispatcher_that_took_every_due_item_sleeps_at_once_on_all_its_shards_without_an_empty_round(
    make_tenant, redis_client, monkeypatch
):
    """A round that came back short of its credits took all that was due, so the dispatcher goes to
    sleep at once (what is enqueued after its dequeue leaves a signal that ends the sleep), instead
    of a round more that finds nothing: a credit reservation and a dequeue fewer per item of a
    light load. It sleeps on the signals of every shard it serves."""
    tenant, _ = make_tenant("light")
    broker.register_worker("fake@host", [WORK_QUEUE, SYSTEM_QUEUE], 4)
    enqueue(tenant, 2, kind="test.noop", partitions=2)
    dispatcher = Dispatcher(shards=list(range(settings.DUCTOR_QUEUE_SHARDS)))  # a plan the beats cannot move
    dequeues: list[int] = []
    sleeps: list[list[int]] = []
    stop = threading.Event()
    real_dequeue = fq.dequeue_batches

    def dequeue_batches(**call: Any) -> list[list[fq.Dequeued]]:
        dequeues.append(call["shard"])
        return real_dequeue(**call)

    def wait_for_work(*, shards: list[int], timeout_s: float) -> bool:
        sleeps.append(list(shards))
        stop.set()  # its first sleep ends the test's run
        return False

    monkeypatch.setattr(fq, "dequeue_batches", dequeue_batches)
    monkeypatch.setattr(fq, "wait_for_work", wait_for_work)
    dispatcher.run_forever(stop)
    assert dispatcher.dispatched == 2
    assert sorted(dequeues) == sorted(dispatcher.shards)  # one round: each shard dequeued once
    assert sleeps == [dispatcher.shards]
    assert broker.busy(WORK_QUEUE) == 2  # the two messages published; the unused credits given back
    assert broker.busy(SYSTEM_QUEUE) == 0


@pytest.mark.django_db
def test_a_dispatcher_whose_round_failed_holds_no_credit_through_its_back_off(make_tenant, redis_client, monkeypatch):
    """Held round after round by a dispatcher whose every round fails (a shard it cannot serve, a
    setting it trips on), the credits left the other dispatchers none, and no work ran anywhere."""
    tenant, _ = make_tenant("failing-round")
    broker.register_worker("fake@host", [WORK_QUEUE, SYSTEM_QUEUE], 10)
    enqueue(tenant, 3, kind="test.noop", partitions=3, prefix="waiting")
    dispatcher = Dispatcher(shards=list(range(settings.DUCTOR_QUEUE_SHARDS)))
    dispatcher._ask = dict.fromkeys((WORK_QUEUE, SYSTEM_QUEUE), 4 * RESERVE_MIN)  # a busy one's ask

    def dequeue_batches(**call: Any) -> list[list[fq.Dequeued]]:
        raise RuntimeError("this round fails")

    class BackOff(threading.Event):
        """The back-off after the failed round: what the broker counts busy then; it ends the run."""

        seen: list[tuple[int, int]] = []

        def wait(self, timeout: float | None = None) -> bool:
            self.seen.append((broker.busy(WORK_QUEUE), broker.busy(SYSTEM_QUEUE)))
            self.set()
            return True

    monkeypatch.setattr(fq, "dequeue_batches", dequeue_batches)
    stop = BackOff()
    dispatcher.run_forever(stop)
    assert stop.seen == [(0, 0)]
    assert dispatcher._ask == dict.fromkeys((WORK_QUEUE, SYSTEM_QUEUE), RESERVE_MIN)
    assert fq.stats(tenant).backlog == 3  # nothing was taken


@pytest.mark.django_db
def test_a_dispatcher_asks_for_the_credits_its_load_needs_not_one_per_idle_slot_of_the_fleet(
    make_tenant, redis_client, monkeypatch
):
    """Each credit is a Redis entry made and, unused, removed again: a round of one due item costs a
    few whatever the fleet, and a backlog doubles the ask each round that used all it got, without
    waiting for a freed credit it does not need."""
    tenant, _ = make_tenant("asks")
    broker.register_worker("fake@host", [WORK_QUEUE, SYSTEM_QUEUE], 500)
    dispatcher = Dispatcher(shards=list(range(settings.DUCTOR_QUEUE_SHARDS)))
    enqueue(tenant, 1, kind="test.noop", prefix="one")
    assert dispatcher.run_once() == 1
    assert broker.busy(WORK_QUEUE) <= RESERVE_MIN  # the published one and the unused ones held
    assert broker.busy(SYSTEM_QUEUE) <= RESERVE_MIN
    dispatcher.give_back()
    assert broker.busy(WORK_QUEUE) == 1
    assert fq.ack("one0", tenant=tenant)  # its partition free for the backlog

    enqueue(tenant, 3 * RESERVE_MIN, kind="test.noop", partitions=3 * RESERVE_MIN, prefix="backlog")
    reserved: list[int] = []
    real_reserve = broker.reserve_credits

    def reserve_credits(wanted: dict[str, int], **call: Any) -> dict[str, list[str]]:
        reserved.append(wanted[WORK_QUEUE])
        return real_reserve(wanted, **call)

    def starved(*, timeout_s: float) -> bool:
        raise AssertionError("a dispatcher with credits to take waited for a freed one")

    stop = threading.Event()
    monkeypatch.setattr(broker, "reserve_credits", reserve_credits)
    monkeypatch.setattr(broker, "wait_for_credit", starved)
    monkeypatch.setattr(fq, "wait_for_work", lambda **call: stop.set())
    dispatcher.run_forever(stop)
    assert dispatcher.dispatched == 1 + 3 * RESERVE_MIN
    # The first round used one of its 8: it asks for 8 again; those used up, 16, then 32 (all
    # 24 out), and a round more that finds nothing due.
    assert reserved == [RESERVE_MIN, 2 * RESERVE_MIN, 4 * RESERVE_MIN]
    assert fq.stats(tenant).backlog == 0


@pytest.mark.django_db
def test_a_round_takes_a_producer_only_for_a_queue_it_dequeued_items_for(make_tenant, redis_client, monkeypatch):
    """A dispatcher is woken by every ack and often finds nothing due: such a round takes no
    producer from the pool, nor does the queue of a round that dequeued nothing for it."""
    tenant, _ = make_tenant("producers")
    broker.register_worker("fake@host", [WORK_QUEUE, SYSTEM_QUEUE], 10)
    dispatcher = Dispatcher(shards=list(range(settings.DUCTOR_QUEUE_SHARDS)))
    taken: list[Any] = []
    real = app.producer_or_acquire

    def producer_or_acquire(producer: Any = None) -> Any:
        if producer is None:  # one taken from the pool (a publish passes on the one it was given)
            taken.append(producer)
        return real(producer)

    monkeypatch.setattr(app, "producer_or_acquire", producer_or_acquire)
    assert dispatcher.run_once() == 0
    assert taken == []
    enqueue(tenant, 1, kind="test.noop", prefix="p")
    assert dispatcher.run_once() == 1
    assert len(taken) == 1  # the work queue's: the system queue had nothing
    dispatcher.give_back()


@pytest.mark.django_db
def test_a_dispatcher_that_serves_no_shard_leaves_the_wake_signals_to_the_dispatchers_that_do(
    make_tenant, redis_client
):
    """With more dispatchers than shards, one may serve none for a while; it slept on shard 0's
    signal, and a signal it took left shard 0's own dispatcher asleep with work due."""
    tenant, _ = make_tenant("idle")
    broker.register_worker("fake@host", [WORK_QUEUE, SYSTEM_QUEUE], 2)
    enqueue(tenant, 1, kind="test.noop")  # signals the tenant's shard (0)
    spare = Dispatcher(shards=[])
    assert spare.run_once() == 0
    spare._idle()
    assert fq.wait_for_work(shards=[0], timeout_s=0) is True  # the signal is still there for shard 0's


@pytest.mark.django_db
def test_a_reserved_credit_lives_seconds_until_its_message_is_sent_then_as_long_as_a_message_may_wait(
    redis_client
):
    broker.register_worker("fake@host", [WORK_QUEUE], 2)
    first, second = broker.reserve_credits({WORK_QUEUE: 2})[WORK_QUEUE]
    outstanding = broker._key("outstanding", WORK_QUEUE)

    def lives_s(credit: str) -> float:
        return float(redis_client.zscore(outstanding, credit)) - broker._now()

    # A dispatcher killed now, between reserve and publish, loses them for seconds only.
    assert 0 < lives_s(first) <= broker.RESERVED_TTL_S
    broker.mark_sent(WORK_QUEUE, [first])
    assert broker.credit_lifetime_s() - 5 < lives_s(first) <= broker.credit_lifetime_s()
    assert lives_s(second) <= broker.RESERVED_TTL_S
    broker.mark_running(WORK_QUEUE, [second], 3.0)  # a fast worker started it before the mark
    broker.mark_sent(WORK_QUEUE, [second])
    assert redis_client.zscore(outstanding, second) is None  # it stays running, counted once
    assert broker.busy(WORK_QUEUE) == 2


# --- end to end -------------------------------------------------------------------------------


@pytest.mark.worker
def test_items_of_two_tenants_run_on_a_real_worker_each_in_its_own_tenant_context_within_the_credits(
    make_tenant, celery_worker, redis_client, monkeypatch
):
    monkeypatch.setenv("DUCTOR_HANDOFF_MS", "1000")  # the worker's: room for several 100 ms items
    a, _ = make_tenant("broker-a")
    b, _ = make_tenant("broker-b")
    suspended, _ = make_tenant("broker-suspended")
    concurrency = 2
    worker = celery_worker(*HANDLERS, concurrency=concurrency)
    owner = {}
    for tenant in (a, b):
        for item_id in enqueue(tenant, 8, kind="test.sleep", partitions=4, prefix=f"{tenant.slug}-", ms=100):
            owner[item_id] = str(tenant.pk)
    services.tenant_set_status(tenant=suspended, status=Tenant.Status.SUSPENDED)
    enqueue(suspended, 2, kind="test.ran", partitions=2, prefix="held-")

    samples: list[tuple[int, int, int]] = []
    celery_queue = broker_redis()
    with dispatching(count=2):
        def all_finished() -> bool:
            samples.append(
                (broker.busy(WORK_QUEUE), broker.outstanding(WORK_QUEUE), celery_queue.llen(WORK_QUEUE))
            )
            return len(events(redis_client, "end")) == len(owner)

        wait_for(all_finished, timeout=60, every=0.02, what="every item to finish")
        wait_for(lambda: broker.busy(WORK_QUEUE) == 0, timeout=10, what="the credits to come back")
        # A suspended tenant's items were never dispatched: parked, due, holding nothing.
        held = fq.stats(suspended)
        assert (held.backlog, held.due, held.in_flight) == (2, 2, 0)
        assert capacity.tenant_in_flight(tenant=suspended) == 0
        assert not [r for r in events(redis_client, "start") if r["item"].startswith("held-")]
        # Reactivated, it is woken at once (not polled): its items run.
        services.tenant_set_status(tenant=suspended, status=Tenant.Status.ACTIVE)
        wait_for(lambda: len(events(redis_client, "start")) == len(owner) + 2, timeout=10,
                 what="the reactivated tenant's items to run")
        wait_for(lambda: broker.busy(WORK_QUEUE) == 0, timeout=10, what="the credits to come back again")

    starts = [r for r in events(redis_client, "start") if r["item"] in owner]
    assert sorted(r["item"] for r in starts) == sorted(owner)  # each item ran once
    for row in starts:
        # The handler ran inside the item's tenant: the message's (or, handed off, its own), the
        # context's and the owner's.
        assert row["tenant"] == row["context_tenant"] == owner[row["item"]]
    assert handed_off(worker.output())  # some were taken by a process that finished one
    for tenant in (a, b):
        # Written under the tenant in context (no tenant named), read here under the owner.
        assert int(redis_client.get(redis_key("test", "ran", tenant=tenant))) == 8
    # Never more running at once than the worker's slots ...
    running = peak = 0
    for row in (r for r in records(redis_client) if r.get("item") in owner):
        running += 1 if row["event"] == "start" else -1
        peak = max(peak, running)
    assert peak <= concurrency
    # ... and, across two dispatchers, never more published-but-unfinished than slots + buffer,
    # so never more than that waiting unstarted in Celery.
    assert len(samples) > 20
    assert max(busy for busy, _, _ in samples) <= concurrency + BUFFER
    assert max(unstarted for _, unstarted, _ in samples) <= concurrency + BUFFER
    assert max(queued for _, _, queued in samples) <= concurrency + BUFFER
    assert_drained(a, b, suspended)
    # Each of the suspended tenant's items ran once, after its reactivation.
    assert sorted(r["item"] for r in events(redis_client, "start") if r["item"].startswith("held-")) == [
        "held-0", "held-1"]


@pytest.mark.worker
@pytest.mark.cluster(also=False)  # what a worker makes of a message, whatever Redis: the cluster run is short
def test_a_worker_drops_a_stale_delivery_and_refuses_a_message_without_tenant_without_running_the_handler(
    make_tenant, celery_worker, redis_client
):
    a, _ = make_tenant("stale-a")
    b, _ = make_tenant("stale-b")
    worker = celery_worker(*HANDLERS, concurrency=1)
    enqueue(a, 1, kind="test.ran", prefix="item-")
    item = fq.dequeue(lease_ms=30_000)
    assert item is not None
    assert item.item_id == "item-0"
    kwargs = {"item_id": item.item_id, "kind": "test.ran", "body": {"kind": "test.ran"},
              "tier": item.tier, "partition": item.partition}

    execute_item.apply_async(kwargs={**kwargs, "tenant_id": str(a.pk), "delivery": item.delivery + 1})
    # Sent around the tenant-stamping base class: no tenant at all, and two tenants that disagree.
    app.send_task("ductor.execute_item", kwargs={**kwargs, "delivery": item.delivery}, queue=WORK_QUEUE)
    app.send_task("ductor.execute_item", kwargs={**kwargs, "delivery": item.delivery, "tenant_id": str(b.pk)},
                  headers={TENANT_HEADER: str(a.pk)}, queue=WORK_QUEUE)

    wait_for(lambda: worker.output().count("task_refused_without_tenant") == 2
             and "stale_delivery_dropped" in worker.output(), what="the worker to handle all three messages")
    assert events(redis_client, "start") == []
    stats = fq.stats(a)
    assert (stats.in_flight, stats.backlog) == (1, 0)  # untouched: still the live delivery's

    # The live delivery runs, once, and finishes the item.
    execute_item.apply_async(kwargs={**kwargs, "tenant_id": str(a.pk), "delivery": item.delivery})
    wait_for(lambda: events(redis_client, "start"), what="the live delivery to run")
    wait_for(lambda: fq.stats(a).in_flight == 0, what="the ack")
    assert [r["delivery"] for r in events(redis_client, "start")] == [item.delivery]
    assert_drained(a)


# --- recovery ----------------------------------------------------------------------------------


@pytest.mark.worker
@pytest.mark.cluster(also=False)  # a worker's death, whatever Redis: too long for the cluster run
def test_a_sigkilled_workers_item_is_redelivered_after_its_lease_and_its_slot_and_partition_come_back(
    make_tenant, celery_worker, redis_client, monkeypatch, settings
):
    lease_ms = 3000
    monkeypatch.setenv("DUCTOR_LEASE_MS", str(lease_ms))  # the workers' (service_env copies os.environ)
    settings.DUCTOR_LEASE_MS = lease_ms  # the dispatcher's
    tenant, _ = make_tenant("crash")
    services.override_set(tenant=tenant, field="max_concurrency", value=1)
    workers = [celery_worker(*HANDLERS, concurrency=1) for _ in range(2)]
    # x sleeps on its first delivery only; y shares its partition; z needs its capacity slot.
    sleep_once = {"kind": "test.sleep", "ms": 60_000, "once": True}
    fq.enqueue("x", tier="standard", partition="p", payload=sleep_once, tenant=tenant)
    fq.enqueue("y", tier="standard", partition="p", payload={"kind": "test.ran"}, tenant=tenant)
    fq.enqueue("z", tier="standard", partition="q", payload={"kind": "test.ran"}, tenant=tenant)

    with dispatching():
        first = wait_for(lambda: events(redis_client, "start", "x"), what="x to start")[0]
        time.sleep(1.0)
        assert [r["item"] for r in events(redis_client, "start")] == ["x"]  # y, z held back while x runs
        victim = next(w for w in workers if served_by(w, first))
        os.killpg(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait(10)
        lease_end_ms = redis_client.zscore(fq.global_key("inflight"), f"{tenant.pk}|x")
        assert lease_end_ms is not None  # still leased to the dead worker

        second = wait_for(lambda: events(redis_client, "start", "x")[1:], timeout=30,
                          what="x to be delivered again")[0]
        wait_for(lambda: len(events(redis_client, "start")) == 4, timeout=30, what="y and z to run")
        # Acked once: nothing runs again, even a lease later.
        time.sleep(lease_ms / 1000 + 1)

    starts = {r["item"]: r for r in events(redis_client, "start")}  # each item's last start
    assert sorted(r["item"] for r in events(redis_client, "start")) == ["x", "x", "y", "z"]
    assert second["at_ms"] >= lease_end_ms  # delivered again, but not before the lease ended
    assert second["delivery"] > first["delivery"]
    assert not served_by(victim, second)
    x_end = events(redis_client, "end", "x")
    assert [r["delivery"] for r in x_end] == [second["delivery"]]  # finished (and acked) once
    # The one capacity slot came back when the dead worker's lease ended (z may then go before
    # x is reaped: order across partitions is not promised); the partition lock only when
    # x's second delivery was acked.
    assert starts["z"]["at_ms"] >= lease_end_ms
    assert starts["y"]["at_ms"] >= x_end[0]["at_ms"]
    assert_drained(tenant)


# --- wake-ups ----------------------------------------------------------------------------------


@pytest.mark.worker
def test_a_wakeup_fires_after_its_delay_in_its_tenants_context_on_a_system_only_worker(
    make_tenant, celery_worker, redis_client, settings
):
    # With no work-queue slot anywhere, only a buffer lets the follow-up work be published.
    settings.DUCTOR_DISPATCH_BUFFER = 2
    a, _ = make_tenant("wake-a")
    b, _ = make_tenant("wake-b")
    worker = celery_worker(*HANDLERS, "-Q", SYSTEM_QUEUE, concurrency=1)
    delay_s = 1.0
    scheduled_ms = redis_ms()
    schedule_wakeup(a, "r1", kind=WAKE_KIND, delay_s=delay_s)
    schedule_wakeup(a, "r1", kind=WAKE_KIND, delay_s=delay_s)  # coalesced: one wake-up per ref
    schedule_wakeup(b, "r1", kind=WAKE_KIND, delay_s=delay_s)

    with dispatching():
        wakes = wait_for(lambda: len(events(redis_client, "wake")) == 2 and events(redis_client, "wake"),
                         timeout=30, what="both wake-ups")
        # The real work each wake-up enqueued under its tenant goes to the work queue, which this
        # worker does not serve: it waits there, published.
        wait_for(lambda: fq.stats(a).in_flight == fq.stats(b).in_flight == 1, what="the follow-up dispatch")
        time.sleep(0.5)

    assert sorted(w["context_tenant"] for w in wakes) == sorted([str(a.pk), str(b.pk)])
    assert all(w["at_ms"] >= scheduled_ms + delay_s * 1000 for w in wakes)
    assert all(served_by(worker, w) for w in wakes)
    assert events(redis_client, "wake") == wakes  # no third one
    assert events(redis_client, "start") == []
    assert broker_redis().llen(WORK_QUEUE) == 2
    assert broker.busy(SYSTEM_QUEUE) == 0


def test_one_tenants_wakeups_do_not_hold_up_anothers(make_tenant, redis_client):
    """Every tenant's wake-ups are the system tenant's items: without a key each, one tenant's
    thousand sleeps ending at once (or a cancel of a thousand runs) would go out, in due order,
    before another tenant's sleep that ends a moment later. Each owning tenant is a fairness key
    of the system tenant, so the owners share the system tier's dispatches in turn."""
    many, _ = make_tenant("wake-many")
    one, _ = make_tenant("wake-one")
    for n in range(20):
        schedule_wakeup(many, f"r{n}", kind=WAKE_KIND)
    schedule_wakeup(one, "r0", kind=WAKE_KIND)
    owners = []
    system = Tenant.system()
    with no_tenant():
        for _ in range(21):  # each acked before the next, as a worker of one slot would
            item = fq.dequeue(shard=shard_of(str(system.pk)), lease_ms=30_000, tiers=[SYSTEM_TIER])
            assert item is not None
            owners.append(item.payload["tenant_id"])
            assert fq.ack(item.item_id, delivery=item.delivery, work_ms=5, tenant=system)
    assert owners.count(str(one.pk)) == 1
    assert owners.index(str(one.pk)) <= 1  # within one round of the two owners, not after the twenty


# --- the queue API -------------------------------------------------------------------------------


@pytest.fixture
def superuser_api(db: None) -> APIClient:
    client = APIClient()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client


def test_get_queue_shows_only_the_callers_numbers(tenant_a, tenant_b, client_a, client_b, redis_client):
    enqueue(tenant_a[0], 3, kind="test.noop", partitions=3)
    in_flight = fq.dequeue(lease_ms=30_000)
    assert in_flight is not None
    assert in_flight.tenant_id == str(tenant_a[0].pk)
    enqueue(tenant_b[0], 5, kind="test.noop", partitions=5)
    fq.enqueue("later", tier="batch", partition="x", payload={"kind": "test.noop"}, delay_ms=60_000,
               tenant=tenant_b[0])

    body_a = client_a.get("/api/v1/queue").json()
    body_b = client_b.get("/api/v1/queue").json()

    assert (body_a["backlog"], body_a["due"], body_a["in_flight"]) == (2, 2, 1)
    assert body_a["tiers"]["standard"]["in_flight"] == 1
    assert body_a["tiers"]["batch"]["backlog"] == 0
    assert (body_b["backlog"], body_b["due"], body_b["in_flight"]) == (6, 5, 0)
    assert body_b["tiers"]["batch"] == {"backlog": 1, "due": 0, "in_flight": 0, "oldest_waiting_ms": 0}
    for body, other in ((body_a, tenant_b[0]), (body_b, tenant_a[0])):
        assert str(other.pk) not in str(body)
        assert other.slug not in str(body)


def test_the_platform_queue_view_answers_platform_admins_and_is_404_for_a_tenant_key(
    tenant_a, client_a, superuser_api, redis_client
):
    enqueue(tenant_a[0], 2, kind="test.noop", partitions=2)
    assert fq.dequeue(lease_ms=30_000) is not None
    broker.register_worker("w1@host", [WORK_QUEUE, SYSTEM_QUEUE], 4)

    refused = client_a.get("/api/v1/platform/queue")
    assert refused.status_code == 404
    assert error_code(refused) == "not_found"

    _, platform_key = services.platform_key_create(name="ops")
    for client in (superuser_api, api_client(platform_key)):
        response = client.get("/api/v1/platform/queue")
        assert response.status_code == 200
        shards = response.json()
        assert [s["shard"] for s in shards] == list(range(settings.DUCTOR_QUEUE_SHARDS))
        shard = shards[0]  # the tenant's
        assert shard["in_flight"] == 1
        assert shard["tiers"]["standard"]["ready_tenants"] == 1
        assert shard["worker_slots"] == {WORK_QUEUE: 4, SYSTEM_QUEUE: 4}
        assert shard["busy"] == {WORK_QUEUE: 0, SYSTEM_QUEUE: 0}


@pytest.mark.django_db(transaction=True)
def test_two_workers_of_one_celery_name_on_one_host_each_count_their_slots(redis_client):
    """Two ``celery worker`` processes with one name on one host (a process manager's second worker
    keeps the default ``celery@<host>``) announced the same member: their slots counted once."""
    from tests.conftest import service_env, service_stack
    from tests.waiting import wait_for

    stack = service_stack()
    try:
        twins = [stack.worker(f"twin-{n}", concurrency=1, hostname="twin@localhost", env=service_env(),
                              extra=["--pool", "prefork", "--without-heartbeat"]) for n in range(2)]
        stack.wait_ready(*twins, timeout_s=60)
        wait_for(lambda: broker.worker_slots(WORK_QUEUE) == 2, what="the slots of both workers")
        stack.stop(twins[0])
        assert broker.worker_slots(WORK_QUEUE) == 1
    finally:
        stack.stop_all(grace_s=20)
