"""Two levels, against the real Redis: inside a tenant, its backlogged fairness keys share its
dispatches by their weights (equal by default) before its partitions do; the tenant is still one
flow among tenants, however many keys it has; a flooding key does not hold up the others; and a
key that has nothing left holds no state."""

from __future__ import annotations

from collections import Counter

import pytest

from ductor_project.core.context import no_tenant, tenant_context
from ductor_project.core.keys import redis_key
from scheduling import fair_queue as fq
from tenants.models import Tenant
from tests.scheduling.helpers import redis_now_ms, sleep_until

pytestmark = pytest.mark.usefixtures("redis_client")

LEASE_MS = 30_000
WORK_MS = 10.0


def fill(tenant: Tenant, key: str, count: int, *, per_partition: int = 1, delay_ms: int = 0,
         key_weights: dict[str, int] | None = None) -> list[str]:
    ids = [f"{key or 'none'}-{n}" for n in range(count)]
    items = [fq.NewItem(item_id, "standard", f"{key or 'none'}-p{n // per_partition}", delay_ms=delay_ms, key=key)
             for n, item_id in enumerate(ids)]
    fq.enqueue_many(items, key_weights=key_weights, tenant=tenant)
    return ids


def take() -> fq.Dequeued | None:
    with no_tenant():
        return fq.dequeue(lease_ms=LEASE_MS)


def serve(tenants: dict[str, Tenant], count: int) -> list[fq.Dequeued]:
    """Dequeue and ack up to ``count`` items, each having done ``WORK_MS``."""
    served = []
    for _ in range(count):
        item = take()
        if item is None:
            break
        served.append(item)
        assert fq.ack(item.item_id, delivery=item.delivery, work_ms=WORK_MS, tenant=tenants[item.tenant_id])
    return served


def key_of(item: fq.Dequeued) -> str:
    return item.item_id.rsplit("-", 1)[0]


def test_a_tenants_backlogged_keys_share_its_dispatches_equally_whatever_their_backlogs(db, weighted):
    a = weighted("keys-equal", 1)
    fill(a, "flood", 1000, per_partition=10)
    for k in range(1, 5):
        fill(a, f"k{k}", 40)

    served = Counter(key_of(item) for item in serve({str(a.pk): a}, 100))

    assert served == Counter({"flood": 20, "k1": 20, "k2": 20, "k3": 20, "k4": 20})


def test_key_weights_split_the_tenants_share_and_a_key_put_back_to_1_is_equal_again(db, weighted):
    a = weighted("keys-weighted", 1)
    fill(a, "gold", 200, key_weights={"gold": 3})
    fill(a, "tin", 200)

    first = Counter(key_of(item) for item in serve({str(a.pk): a}, 80))
    fill(a, "gold", 1, key_weights={"gold": 1})
    then = Counter(key_of(item) for item in serve({str(a.pk): a}, 80))

    assert first == Counter({"gold": 60, "tin": 20})
    assert abs(then["gold"] - then["tin"]) <= 2


def test_a_tenant_with_many_keys_is_one_flow_among_tenants(db, weighted):
    many, plain = weighted("keys-many", 1), weighted("keys-plain", 1)
    for k in range(50):
        fill(many, f"c{k}", 4)
    fill(plain, "", 200)

    served = Counter(item.tenant_id for item in serve({str(many.pk): many, str(plain.pk): plain}, 100))

    assert abs(served[str(many.pk)] - served[str(plain.pk)]) <= 2, served


def test_a_key_that_arrives_behind_a_flood_is_served_within_a_round_of_the_active_keys(db, weighted):
    a = weighted("keys-late", 1)
    fill(a, "flood", 500, per_partition=5)
    for k in range(3):
        fill(a, f"k{k}", 100)
    serve({str(a.pk): a}, 40)

    fill(a, "late", 1)
    waited = next(n for n, item in enumerate(serve({str(a.pk): a}, 20)) if key_of(item) == "late")

    assert waited <= 5  # the four active keys at most, not the flood's backlog


def test_a_key_whose_items_are_not_due_waits_and_the_others_are_served_meanwhile(db, weighted, redis_client):
    a = weighted("keys-due", 1)
    fill(a, "later", 5, delay_ms=1_000)
    due_by = redis_now_ms(redis_client) + 1_000  # "later" fell due at or before this
    fill(a, "now", 5)

    early = serve({str(a.pk): a}, 10)

    assert [key_of(item) for item in early] == ["now"] * 5
    sleep_until(redis_client, due_by + 1)
    assert [key_of(item) for item in serve({str(a.pk): a}, 10)] == ["later"] * 5


def test_the_same_key_in_two_tenants_is_two_keys(db, weighted):
    a, b = weighted("keys-a", 1), weighted("keys-b", 1)
    fill(a, "shared", 300, per_partition=3)
    fill(a, "mine", 300)
    fill(b, "shared", 300)

    served = serve({str(a.pk): a, str(b.pk): b}, 120)

    by_tenant = Counter(item.tenant_id for item in served)
    assert abs(by_tenant[str(a.pk)] - by_tenant[str(b.pk)]) <= 2  # b's "shared" is not a's
    of_a = Counter(key_of(item) for item in served if item.tenant_id == str(a.pk))
    assert abs(of_a["shared"] - of_a["mine"]) <= 2


def test_a_partition_keeps_its_first_key(db, weighted):
    a = weighted("keys-part", 1)
    fq.enqueue_many([fq.NewItem("x1", "standard", "p", key="first"), fq.NewItem("x2", "standard", "p", key="second"),
                     fq.NewItem("y", "standard", "q", key="second")], tenant=a)
    fill(a, "other", 3)

    served = [item.item_id for item in serve({str(a.pk): a}, 10)]

    # keys "first" (x1, then x2), "second" (y) and "other" take turns: x2 is of "first".
    assert served.index("x2") > served.index("y")
    assert sorted(served) == sorted(["x1", "x2", "y", "other-0", "other-1", "other-2"])


def test_keys_that_have_nothing_left_hold_no_state(db, weighted, redis_client):
    a = weighted("keys-gone", 1)
    for k in range(20):
        fill(a, f"c{k}", 3, per_partition=3)
    removed = fill(a, "withdrawn", 4)
    with tenant_context(a):
        for item_id in removed:
            assert fq.remove(item_id)

    assert len(serve({str(a.pk): a}, 100)) == 60
    with tenant_context(a):
        namespace = redis_key("fq", "", tenant=a)
    left = {key.decode().removeprefix(namespace) for key in redis_client.scan_iter(match=f"{namespace}*")}

    assert not {key for key in left if key.startswith(("parts:", "kready:", "ktimers:", "kfin:", "kv:", "pkey"))}, left


def test_a_bad_key_or_key_weight_is_refused_and_nothing_is_written(db, weighted):
    a = weighted("keys-bad", 1)
    for bad in ({"key": "x" * 300}, {"key": 7}):
        with pytest.raises(ValueError, match="key"):
            fq.enqueue_many([fq.NewItem("ok", "standard", "p"), fq.NewItem("bad", "standard", "p", **bad)],
                            tenant=a)
    with pytest.raises(ValueError, match="weight"):
        fq.enqueue_many([fq.NewItem("ok", "standard", "p", key="k")], key_weights={"k": 0}, tenant=a)
    with tenant_context(a):
        assert fq.stats().backlog == 0

