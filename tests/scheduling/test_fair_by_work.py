"""Fair by work, against the real Redis: a dispatch charges the tenant its estimate of the item's
work, and the ack corrects the tenant's tag by what the worker measured; an item whose worker
died is charged its lease, one item never more than ``DUCTOR_FAIR_MAX_COST_MS``; ``items`` mode
counts items. And an order key puts a tenant's older work first, never before it is due."""

from __future__ import annotations

from collections import Counter

import pytest

from ductor_project.core.context import no_tenant, tenant_context
from ductor_project.core.keys import redis_key
from scheduling import fair_queue as fq
from tenants import services
from tenants.models import Tenant
from tests.conftest import api_client
from tests.scheduling.helpers import redis_now_ms, sleep_until

LEASE_MS = 30_000

pytestmark = pytest.mark.usefixtures("redis_client")


def fill(tenant: Tenant, count: int, *, prefix: str = "") -> None:
    items = [fq.NewItem(f"{prefix}{n}", "standard", f"{prefix}p{n}", {"kind": "work"}) for n in range(count)]
    fq.enqueue_many(items, tenant=tenant)


def take(lease_ms: int = LEASE_MS) -> fq.Dequeued | None:
    with no_tenant():
        return fq.dequeue(lease_ms=lease_ms)


def serve(tenants: dict[str, Tenant], work_ms: dict[str, float], count: int) -> list[str]:
    """Dequeue and ack ``count`` items, each having done its tenant's ``work_ms``; their tenants."""
    served = []
    for _ in range(count):
        item = take()
        assert item is not None
        served.append(item.tenant_id)
        assert fq.ack(item.item_id, delivery=item.delivery, tenant=tenants[item.tenant_id],
                      work_ms=work_ms[item.tenant_id])
    return served


@pytest.mark.parametrize("mode", ["time", "items"])
def test_backlogged_tenants_share_worker_time_by_weight_however_long_their_items_take(db, weighted, settings, mode):
    settings.DUCTOR_FAIR_COST = mode
    tenants = {str(t.pk): t for t in (weighted(f"work{w}", w) for w in (1, 2, 4))}
    weight = dict(zip(tenants, (1, 2, 4), strict=True))
    work_ms = dict(zip(tenants, (100.0, 10.0, 30.0), strict=True))
    for tenant in tenants.values():
        fill(tenant, 1500)

    served = Counter(serve(tenants, work_ms, 1500))

    time_share = {tid: served[tid] * work_ms[tid] for tid in tenants}
    total_time, total_items = sum(time_share.values()), sum(served.values())
    for tid in tenants:
        fair = weight[tid] / 7
        if mode == "time":
            assert time_share[tid] / total_time == pytest.approx(fair, abs=0.01), served
        else:
            assert served[tid] / total_items == pytest.approx(fair, abs=0.01), served


def test_a_dispatch_charges_the_tenants_estimate_of_the_kind_before_any_ack(db, weighted):
    a, b = weighted("est-a", 1), weighted("est-b", 1)
    tenants = {str(a.pk): a, str(b.pk): b}
    fill(a, 60, prefix="a")
    fill(b, 300, prefix="b")
    serve(tenants, {str(a.pk): 100.0, str(b.pk): 10.0}, 60)  # the estimates learn 100 and 10 ms

    in_flight = Counter()
    for _ in range(44):  # none acked: only the estimates charge
        item = take()
        assert item is not None
        in_flight[item.tenant_id] += 1

    assert in_flight[str(a.pk)] in (3, 4, 5)  # one of A's per ten of B's, not one per one
    assert in_flight[str(b.pk)] == 44 - in_flight[str(a.pk)]


@pytest.mark.parametrize("mode", ["time", "items"])
def test_an_item_whose_worker_died_is_charged_its_lease(db, weighted, redis_client, settings, mode):
    settings.DUCTOR_FAIR_COST = mode
    a, b = weighted("died-a", 1), weighted("died-b", 1)
    tenants = {str(a.pk): a, str(b.pk): b}
    work = {str(a.pk): 10.0, str(b.pk): 10.0}
    fill(a, 100, prefix="a")
    fill(b, 100, prefix="b")
    serve(tenants, work, 10)
    item = take()
    while item is not None and item.tenant_id != str(a.pk):
        fq.ack(item.item_id, delivery=item.delivery, tenant=b, work_ms=10.0)
        item = take()
    assert item is not None
    fq.extend_lease(item.item_id, lease_ms=400, delivery=item.delivery, tenant=a)  # its worker dies now
    sleep_until(redis_client, redis_now_ms(redis_client) + 450)
    with no_tenant():
        assert fq.reap() == 1

    served = Counter(serve(tenants, work, 40))

    if mode == "time":  # A was charged about 400 ms: B runs about 40 of its 10 ms items first
        assert served[str(a.pk)] <= 3, served
    else:  # one item is one item
        assert abs(served[str(a.pk)] - served[str(b.pk)]) <= 2, served


def test_one_item_is_charged_at_most_the_max_cost(db, weighted, settings):
    settings.DUCTOR_FAIR_MAX_COST_MS = 100
    a, b = weighted("max-a", 1), weighted("max-b", 1)
    tenants = {str(a.pk): a, str(b.pk): b}
    fill(a, 20, prefix="a")
    fill(b, 100, prefix="b")
    serve(tenants, {str(a.pk): 10.0, str(b.pk): 10.0}, 4)
    item = take()
    while item is not None and item.tenant_id != str(a.pk):
        fq.ack(item.item_id, delivery=item.delivery, tenant=b, work_ms=10.0)
        item = take()
    assert item is not None
    assert fq.ack(item.item_id, delivery=item.delivery, tenant=a, work_ms=3_600_000.0)  # an hour, it says

    served = serve(tenants, {str(a.pk): 10.0, str(b.pk): 10.0}, 30)

    first_a = served.index(str(a.pk))
    assert 5 <= first_a <= 12, served  # charged 100 ms: about ten of B's 10 ms items, not 360,000


def test_a_bad_work_figure_is_refused(db, weighted):
    a = weighted("bad-work", 1)
    fill(a, 1)
    item = take()
    assert item is not None
    for bad in (-1.0, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="work_ms"):
            fq.ack(item.item_id, delivery=item.delivery, tenant=a, work_ms=bad)  # type: ignore[arg-type]
    assert fq.ack(item.item_id, delivery=item.delivery, tenant=a, work_ms=0.0)


def test_an_order_key_puts_a_tenants_older_work_first_and_never_before_it_is_due(db, weighted, redis_client):
    a = weighted("order", 1)
    now = int(redis_now_ms(redis_client))
    with tenant_context(a):
        fq.enqueue("new-1", tier="standard", partition="n1", order_ms=now - 1_000)
        fq.enqueue("new-2", tier="standard", partition="n2", order_ms=now - 900)
        fq.enqueue("old", tier="standard", partition="o", order_ms=now - 60_000)
        fq.enqueue("later", tier="standard", partition="l", delay_ms=1_000, order_ms=now - 120_000)
        due_by = redis_now_ms(redis_client) + 1_000  # "later" fell due at or before this
        fq.enqueue("plain", tier="standard", partition="p")

    order = []
    while (item := take()) is not None:
        order.append(item.item_id)
        assert item.waited_ms < 5_000  # waited since it was due, not since its order key

    assert order == ["old", "new-1", "new-2", "plain"]  # "later" is not due yet, however old its key
    sleep_until(redis_client, due_by + 1)
    item = take()
    assert item is not None
    assert item.item_id == "later"


def test_the_queue_view_shows_the_tenants_share_of_worker_time_beside_its_fair_share(db, weighted, make_tenant):
    a, raw = make_tenant("view-a")
    services.override_set(tenant=a, field="weight", value=1)
    b = weighted("view-b", 3)
    tenants = {str(a.pk): a, str(b.pk): b}
    fill(a, 50, prefix="a")
    fill(b, 50, prefix="b")
    serve(tenants, {str(a.pk): 30.0, str(b.pk): 30.0}, 40)  # both backlogged throughout: 1 : 3

    body = api_client(raw).get("/api/v1/queue").json()

    assert body["work"]["tenant_id"] == str(a.pk)
    assert body["work"]["weight"] == 1
    assert body["work"]["work_ms"] == pytest.approx(300.0, abs=30.0)
    # Exact shares of the work; the fair share may move by the last few items if a bucket boundary
    # fell among them (a bucket where only B worked is B's alone to deserve).
    assert body["work"]["share"] == pytest.approx(0.25, abs=0.001)
    assert body["work"]["fair_share"] == pytest.approx(0.25, abs=0.03)
    with no_tenant():
        shares = {s.tenant_id: s for s in fq.work_shares()}
    assert shares[str(b.pk)].share == pytest.approx(0.75, abs=0.001)
    assert shares[str(b.pk)].fair_share == pytest.approx(0.75, abs=0.03)
    assert list(shares) == [str(b.pk), str(a.pk)]  # most work first


def test_an_item_acked_without_its_work_is_charged_at_most_four_times_its_kinds_estimate(db, weighted, redis_client):
    """A task node on a team worker without ductor_sdk's hook reports no work: its time in flight
    is charged, which counts its wait in the team's broker (the team's workers were down), but at
    most four times what the tenant's items of its kind take. An outage is not the tenant's."""
    a, b = weighted("unreported-a", 1), weighted("unreported-b", 1)
    tenants = {str(a.pk): a, str(b.pk): b}
    fill(a, 100, prefix="a")
    fill(b, 100, prefix="b")
    serve(tenants, {str(a.pk): 10.0, str(b.pk): 10.0}, 20)  # both tenants' estimate: 10 ms
    item = take()
    while item is not None and item.tenant_id != str(a.pk):
        fq.ack(item.item_id, delivery=item.delivery, tenant=b, work_ms=10.0)
        item = take()
    assert item is not None
    sleep_until(redis_client, redis_now_ms(redis_client) + 500)  # half a second out, none of it reported
    assert fq.ack(item.item_id, delivery=item.delivery, tenant=a)

    served = serve(tenants, {str(a.pk): 10.0, str(b.pk): 10.0}, 20)

    # Charged 40 ms, not 500: A is next after about four of B's 10 ms items, not fifty.
    assert served.index(str(a.pk)) <= 6, served
    estimate = float(redis_client.hget(redis_key("fq", "est", tenant=a), "work"))
    assert estimate <= 10 + 0.2 * 30 + 1e-6  # it learnt the charge, not the wait
