"""Queue shares on the real Redis: the slots of a team's worker queue, shared by every tenant.

A task step for a queue of ``DUCTOR_TASK_QUEUE_SLOTS`` takes one of its slots
at dequeue, with its tenant's and pool's, or waits parked among the share's
waiters; a freed slot goes to the waiter with the smallest start tag, so the
queue's slots are handed out in the weighted fair order, across tenants.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import pytest

from ductor_project.core.context import no_tenant, tenant_context
from ductor_project.core.keys import shard_of
from scheduling import admission, routing_table
from scheduling import fair_queue as fq
from scheduling.models import Connection, Pool, PoolMember
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.scheduling.helpers import lapse_lease

LEASE_MS = 30_000
_ids = itertools.count()

pytestmark = pytest.mark.usefixtures("redis_client")


@pytest.fixture
def shop_slots(settings: Any) -> Callable[[int], None]:
    def set_slots(slots: int) -> None:
        settings.DUCTOR_TASK_QUEUE_SLOTS = {"shop": str(slots)}

    return set_slots


def weighted(make_tenant: Any, weight: int) -> Tenant:
    tenant = make_tenant()[0]
    tenant_services.override_set(tenant=tenant, field="weight", value=weight)
    return tenant


def enqueue_task(tenant: Tenant, *, queue: str = "shop", partition: str | None = None) -> str:
    """A task step for ``queue`` with no pool, as the engine enqueues one."""
    item_id = f"task-{next(_ids):06d}"
    with tenant_context(tenant):
        scope, scopes = admission.queue_scope(queue) or (None, {})
        fq.enqueue(item_id, tier="standard", partition=partition or item_id, payload={"kind": "test.noop"},
                   scope=scope, scopes=scopes)
    return item_id


def take(shard: int = 0) -> fq.Dequeued | None:
    with no_tenant():
        return fq.dequeue(shard=shard, lease_ms=LEASE_MS)


def tenant_of(item: fq.Dequeued, tenants: list[Tenant]) -> Tenant:
    return next(t for t in tenants if str(t.pk) == item.tenant_id)


def ack(item: fq.Dequeued, tenants: list[Tenant]) -> None:
    """Each item did the same work: fair by work is then fair by items."""
    assert fq.ack(item.item_id, delivery=item.delivery, tenant=tenant_of(item, tenants), work_ms=10.0)


def test_a_shared_queues_slots_go_to_backlogged_tenants_by_weight_and_never_exceed_its_slots(
        db, make_tenant, shop_slots):
    shop_slots(2)
    tenants = [weighted(make_tenant, w) for w in (1, 2, 4)]
    assert {shard_of(str(t.pk)) for t in tenants} == {0}
    for tenant in tenants:
        for _ in range(80):
            enqueue_task(tenant)
    flight: deque[fq.Dequeued] = deque()
    while (item := take()) is not None:
        flight.append(item)
    assert len(flight) == 2  # the queue's slots; the rest waits parked
    served: Counter[str] = Counter()
    for _ in range(140):
        ack(flight.popleft(), tenants)
        item = take()
        assert item is not None
        assert take() is None  # one freed slot, one dispatch
        flight.append(item)
        served[item.tenant_id] += 1
    shares = [served[str(t.pk)] / w for t, w in zip(tenants, (1, 2, 4), strict=True)]
    assert max(shares) - min(shares) <= 2, served  # 20 / 40 / 80, within an item or two each
    assert sum(served.values()) == 140


def test_a_tenants_other_partitions_are_served_while_its_queue_waits(db, make_tenant, shop_slots):
    shop_slots(1)
    tenant = make_tenant()[0]
    first, second = enqueue_task(tenant), enqueue_task(tenant)
    held = take()
    assert held is not None
    assert held.item_id == first
    with tenant_context(tenant):
        fq.enqueue("tick-1", tier="standard", partition="run:1", payload={"kind": "test.noop"})
    tick = take()
    assert tick is not None
    assert tick.item_id == "tick-1"  # not held back by the parked task
    assert take() is None
    ack(held, [tenant])
    nxt = take()
    assert nxt is not None
    assert nxt.item_id == second  # the freed slot woke it: no poll, no timer


def test_a_lapsed_lease_frees_the_slot_for_another_tenant(db, make_tenant, shop_slots):
    shop_slots(1)
    a, b = make_tenant()[0], make_tenant()[0]
    enqueue_task(a)
    with no_tenant():
        held = fq.dequeue(shard=0, lease_ms=LEASE_MS)
    assert held is not None
    waiting = enqueue_task(b)
    assert take() is None
    lapse_lease(held, a)  # its worker died: the lease ends, by Redis's clock
    with no_tenant():
        assert fq.reap(shard=0) == 1
    nxt = take()
    assert nxt is not None
    assert nxt.item_id == waiting


def hold_the_slot_and_serve(holder: Tenant, other: Tenant, tenants: list[Tenant]) -> fq.Dequeued:
    """``holder``'s task takes the queue's one slot; then ``other`` is served an item of its own, so
    that among the share's waiters it comes after a tenant not served yet. Returns the task's dispatch."""
    enqueue_task(holder)
    first = take()
    assert first is not None
    with tenant_context(other):
        fq.enqueue("warm-up", tier="standard", partition="run:0", payload={"kind": "test.noop"})
    warm_up = take()
    assert warm_up is not None
    ack(warm_up, tenants)
    return first


def test_a_freed_slot_goes_to_a_waiter_that_can_take_it_not_to_one_held_at_its_own_ceiling(
        db, make_tenant, shop_slots):
    shop_slots(1)
    holder, busy, other = make_tenant()[0], make_tenant()[0], make_tenant()[0]
    tenants = [holder, busy, other]
    tenant_services.override_set(tenant=busy, field="max_concurrency", value=2)
    first = hold_the_slot_and_serve(holder, other, tenants)  # busy comes before other among the waiters
    busy_task = enqueue_task(busy)
    with tenant_context(busy):
        fq.enqueue("action-1", tier="standard", partition="run:1", payload={"kind": "test.noop"})
    started = take() or take()
    assert started is not None
    assert started.item_id == "action-1"  # busy's task waits for the queue
    waiting = enqueue_task(other)
    assert take() is None  # so does other's
    with tenant_context(busy):
        fq.enqueue("action-2", tier="standard", partition="run:2", payload={"kind": "test.noop"})
    second = take()
    assert second is not None
    assert second.item_id == "action-2"  # busy is at its ceiling of 2, for as long as its actions run

    ack(first, tenants)  # the queue's slot frees

    nxt = take()
    assert nxt is not None
    assert nxt.item_id == waiting  # not kept free for busy, which cannot take it until an action of its ends
    ack(second, tenants)
    assert take() is None  # busy's task is still first for the queue's next slot
    ack(nxt, tenants)
    last = take()
    assert last is not None
    assert last.item_id == busy_task


def test_a_freed_slot_goes_to_a_waiter_that_can_take_it_not_to_one_its_step_rate_holds_back(
        db, make_tenant, shop_slots):
    shop_slots(1)
    holder, slow, other = make_tenant()[0], make_tenant()[0], make_tenant()[0]
    tenant_services.override_set(tenant=slow, field="step_rate_per_s", value=0.001)  # one start per 1,000 s
    tenant_services.override_set(tenant=slow, field="step_burst", value=1)
    first = hold_the_slot_and_serve(holder, other, [holder, slow, other])  # slow comes before other
    enqueue_task(slow)
    assert take() is None  # slow's task waits for the queue
    with tenant_context(slow):
        fq.enqueue("action-1", tier="standard", partition="run:1", payload={"kind": "test.noop"})
    started = take()
    assert started is not None
    assert started.item_id == "action-1"  # the one start slow's rate admits for 1,000 s
    waiting = enqueue_task(other)
    assert take() is None

    ack(first, [holder, slow, other])  # the queue's slot frees

    nxt = take()
    assert nxt is not None
    assert nxt.item_id == waiting


def test_celery_connections_of_two_tenants_to_one_queue_share_its_slots(db, make_tenant, shop_slots):
    shop_slots(1)
    tenants = [make_tenant()[0], make_tenant()[0]]
    for tenant in tenants:
        with tenant_context(tenant):
            connection = Connection.objects.create(name="shop", kind="celery",
                                                   config={"queue": "shop", "broker": "default"})
            pool = Pool.objects.create(name="shop", max_concurrency=5)
            PoolMember.objects.create(pool=pool, connection=connection)
            table = routing_table.routing_table()
            found = table.pools["shop"]
            for n in range(3):
                fq.enqueue(f"s-{n}", tier="standard", partition=f"s-{n}", payload={"kind": "test.noop"},
                           scope=found.id, scopes=admission.scope_confs(found, table))
    first = take()
    assert first is not None
    assert take() is None  # one slot for the queue, whatever each tenant's pool allows
    assert "at its slots" in fq_why(tenants[1 - [str(t.pk) for t in tenants].index(first.tenant_id)])
    ack(first, tenants)
    second = take()
    assert second is not None
    assert second.tenant_id != first.tenant_id  # the waiter of the other tenant, in the fair order


def fq_why(tenant: Tenant) -> str:
    """Why the tenant's shop pool waits, as the routing dry run explains it."""
    with tenant_context(tenant):
        table = routing_table.routing_table()
        view = admission.peek(table.pools["shop"], table)
    return " ".join(str(member.why) for member in view.members)


def test_queues_without_slots_are_not_shared(db, make_tenant, settings):
    settings.DUCTOR_TASK_QUEUE_SLOTS = {}
    tenant = make_tenant()[0]
    for _ in range(3):
        enqueue_task(tenant)
    assert admission.queue_scope("shop") is None
    assert all(take() is not None for _ in range(3))
