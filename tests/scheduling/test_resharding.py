"""Moving a tenant's queue state to another shard while the system runs (``scheduling.resharding``,
``manage.py queue_reshard``), against the real Redis (and, in the cluster run, a real Redis Cluster:
the shards moved between are then on different masters where the layout allows)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connections
from structlog.testing import capture_logs

from ductor_project.core import capacity, tenant_moves
from ductor_project.core.keys import (
    fence_key,
    forget_shard_map,
    hashed_shard,
    queue_shards,
    read_shard_map,
    shard_map_key,
    shard_moved,
    shard_of,
    tenant_shard_prefix,
)
from ductor_project.core.redis import get_redis, is_cluster
from scheduling import fair_queue as fq
from scheduling import resharding
from tenants import services
from tenants.models import Tenant
from tests.scheduling.helpers import lapse_lease, redis_keys

# Also on a Redis Cluster (the cluster run), with this module's tenants on shard 0 by their hash.
pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("tenants_on_shard")]

LEASE_MS = 60_000
TIERS = ("interactive", "standard", "batch")


@pytest.fixture(autouse=True)
def two_shards_at_least(settings: Any, redis_client: Any) -> Iterator[None]:
    """At least two shards in force (the single Redis run has one by default), and no shard map
    left for the next test."""
    settings.DUCTOR_QUEUE_SHARDS = max(2, settings.DUCTOR_QUEUE_SHARDS)
    yield
    get_redis().delete(shard_map_key())
    forget_shard_map()


def other_shard(source: int) -> int:
    """A shard other than ``source``: on another master of a cluster when there is one."""
    client = get_redis()
    candidates = [shard for shard in range(settings.DUCTOR_QUEUE_SHARDS) if shard != source]
    if is_cluster(client):
        node = client.get_node_from_key(fence_key("x", source)).name
        elsewhere = [s for s in candidates if client.get_node_from_key(fence_key("x", s)).name != node]
        candidates = elsewhere or candidates
    return candidates[0]


def keys_under(tenant: Tenant, shard: int) -> list[str]:
    prefix = tenant_shard_prefix(str(tenant.pk), shard)
    return sorted(k.decode() if isinstance(k, bytes) else k for k in redis_keys(get_redis(), prefix + "*"))


@pytest.fixture
def tenant_with(make_tenant: Callable[..., tuple[Tenant, str]]) -> Callable[..., Tenant]:
    def make(slug: str, **limits: Any) -> Tenant:
        tenant, _ = make_tenant(slug)
        for name, value in limits.items():
            services.override_set(tenant=tenant, field=name, value=value)
        return Tenant.objects.get(pk=tenant.pk)

    return make


def backlog(tenant: Tenant, per_tier: int = 4, partitions: int = 3) -> set[str]:
    """Items over every customer tier and several partitions, some under a fairness key."""
    items = [
        fq.NewItem(f"{tier}-{p}-{i}", tier, f"p{p}", {"i": i}, key="k1" if p == 0 else "")
        for tier in TIERS for p in range(partitions) for i in range(per_tier)
    ]
    fq.enqueue_many(items, key_weights={"k1": 2}, tenant=tenant)
    return {item.item_id for item in items}


def drain(shard: int, tenants: dict[str, Tenant]) -> list[fq.Dequeued]:
    """Dequeue and ack everything eligible on ``shard``."""
    served = []
    while (item := fq.dequeue(shard=shard, lease_ms=LEASE_MS)) is not None:
        served.append(item)
        assert fq.ack(item.item_id, delivery=item.delivery, tenant=tenants[item.tenant_id], work_ms=1.0)
    return served


def test_a_moved_tenant_keeps_its_backlog_leases_limiter_and_ceiling_with_nothing_lost_or_twice(tenant_with):
    tenant = tenant_with("mover", max_concurrency=2)
    tenants = {str(tenant.pk): tenant}
    source = shard_of(str(tenant.pk))
    target = other_shard(source)
    waiting = backlog(tenant)
    held = fq.dequeue(shard=source, lease_ms=LEASE_MS)
    lapsing = fq.dequeue(shard=source, lease_ms=LEASE_MS)  # its worker dies after the move
    assert held is not None
    assert lapsing is not None
    assert fq.dequeue(shard=source, lease_ms=LEASE_MS) is None  # at its ceiling of 2
    spent = capacity.rate_check("api-test", 0.001, 5, cost=3, tenant=tenant)
    assert spent.allowed
    assert spent.remaining == 2

    report = resharding.move_tenant(str(tenant.pk), target)

    assert report is not None
    assert (report.source, report.target) == (source, target)
    assert report.items == len(waiting)
    assert shard_of(str(tenant.pk)) == target
    # Nothing of it is left in the old shard but the fence, which sends late callers on.
    assert keys_under(tenant, source) == [fence_key(str(tenant.pk), source)]
    assert get_redis().get(fence_key(str(tenant.pk), source)) == b"MOVED %d" % target
    assert fq.dequeue(shard=source, lease_ms=LEASE_MS) is None
    # Its ceiling and its limiter hold in the new shard.
    assert fq.dequeue(shard=target, lease_ms=LEASE_MS) is None
    assert capacity.rate_peek("api-test", 0.001, 5, tenant=tenant).remaining == 2
    # Its items in flight are acked there; a stale token still changes nothing.
    assert not fq.ack(held.item_id, delivery=held.delivery + 1, tenant=tenant)
    assert fq.ack(held.item_id, delivery=held.delivery, tenant=tenant)
    # A lease that lapsed is reaped there, and its item delivered again.
    lapse_lease(lapsing, tenant)
    assert fq.reap(shard=target) == 1
    served = drain(target, tenants)
    assert Counter(item.item_id for item in served) == Counter(waiting - {held.item_id})
    assert {i.attempt for i in served if i.item_id == lapsing.item_id} == {2}
    assert fq.stats(tenant).backlog == fq.stats(tenant).in_flight == 0


def test_a_process_with_an_older_map_is_sent_on_by_the_fence(tenant_with):
    tenant = tenant_with("late")
    source = shard_of(str(tenant.pk))
    target = other_shard(source)
    fq.enqueue("before", tier="standard", partition="p", tenant=tenant)
    resharding.move_tenant(str(tenant.pk), target)

    shard_moved(str(tenant.pk), source)  # as a process that read the map before the move knows it
    assert fq.enqueue("after", tier="standard", partition="q", tenant=tenant) == fq.EnqueueResult.QUEUED

    assert shard_of(str(tenant.pk)) == target
    assert {i.item_id for i in drain(target, {str(tenant.pk): tenant})} == {"before", "after"}


def test_moves_while_a_producer_enqueues_and_a_consumer_acks_lose_nothing_and_repeat_nothing(
    transactional_db, tenant_with
):
    tenant = tenant_with("busy")
    tid = str(tenant.pk)
    home = shard_of(tid)
    away = other_shard(home)
    enqueued: list[str] = []
    acked: list[str] = []
    produced, stop = threading.Event(), threading.Event()
    failures: list[BaseException] = []
    total = 600

    def produce() -> None:
        try:
            for n in range(total):
                item_id = f"i{n}"
                fq.enqueue(item_id, tier="standard", partition=f"p{n % 7}", tenant=tenant)
                enqueued.append(item_id)
        except BaseException as exc:
            failures.append(exc)
        finally:
            produced.set()
            connections.close_all()

    def consume() -> None:
        try:
            while not (produced.is_set() and len(acked) >= len(enqueued)) and not stop.is_set():
                for shard in (home, away):
                    for item in fq.dequeue_many(shard=shard, lease_ms=LEASE_MS, limit=20):
                        assert item.tenant_id == tid
                        if fq.ack(item.item_id, delivery=item.delivery, tenant=tenant, work_ms=1.0):
                            acked.append(item.item_id)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=produce, daemon=True), threading.Thread(target=consume, daemon=True)]
    for thread in threads:
        thread.start()
    moves = 0
    while not produced.is_set() or moves < 4:
        resharding.move_tenant(tid, away if moves % 2 == 0 else home)
        moves += 1
    for thread in threads:
        thread.join(timeout=60)
    stop.set()

    assert not failures, failures
    assert moves >= 4
    assert Counter(acked) == Counter(enqueued) == Counter(f"i{n}" for n in range(total))


@pytest.mark.parametrize("steps_done", range(1, len(resharding.STEPS)))
def test_a_move_killed_between_steps_is_finished_by_running_it_again(tenant_with, monkeypatch, steps_done):
    tenant = tenant_with("killed")
    tid = str(tenant.pk)
    source = shard_of(tid)
    target = other_shard(source)
    waiting = backlog(tenant, per_tier=2)
    move = resharding.begin_move(tid, target)
    assert move is not None
    for _ in range(steps_done):  # the command dies after these steps
        move = resharding.copy_keys(move)[0] if move.step == "copy" else resharding._STEPS[move.step](move)
    if move.step in ("copy", "index", "map"):  # fenced, not yet published: its callers wait, then give up
        monkeypatch.setattr(tenant_moves, "MOVE_WAIT_S", 0.05)
        with pytest.raises(tenant_moves.TenantMoving):
            fq.stats(tenant)
        monkeypatch.undo()

    assert read_shard_map().moves[tid] == move.record()
    resharding.move_tenant(tid, target)  # the command, run again

    assert read_shard_map().moves == {}
    assert shard_of(tid) == target
    assert keys_under(tenant, source) == [fence_key(tid, source)]
    assert Counter(i.item_id for i in drain(target, {tid: tenant})) == Counter(waiting)


def test_a_move_of_one_tenant_leaves_another_untouched_and_never_fences_it(tenant_with, monkeypatch):
    mover, bystander = tenant_with("a-moves"), tenant_with("b-stays")
    source = shard_of(str(mover.pk))
    assert shard_of(str(bystander.pk)) == source  # the same shard, the same slot
    backlog(mover, per_tier=1)
    backlog(bystander, per_tier=1)
    capacity.rate_check("api-test", 0.001, 5, cost=2, tenant=bystander)
    before = {key: get_redis().dump(key) for key in keys_under(bystander, source)}
    move = resharding.fence_out(resharding.begin_move(str(mover.pk), other_shard(source)))

    # While the mover is fenced, the bystander's operations run at once: no redirect reaches them.
    monkeypatch.setattr(tenant_moves, "MOVE_WAIT_S", 0.0)
    assert fq.stats(bystander).backlog == len(TIERS) * 3
    assert capacity.rate_peek("api-test", 0.001, 5, tenant=bystander).remaining == 3
    monkeypatch.undo()
    resharding.resume(move)

    assert {key: get_redis().dump(key) for key in keys_under(bystander, source)} == before
    served = drain(source, {str(bystander.pk): bystander})
    assert len(served) == len(TIERS) * 3
    assert {i.tenant_id for i in served} == {str(bystander.pk)}


@pytest.fixture
def ids_by_hash(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[str], bool]], None]:
    """New tenants' ids drawn until ``wanted(id)`` holds."""
    import uuid

    def place(wanted: Callable[[str], bool]) -> None:
        def draw() -> uuid.UUID:
            while not wanted(str(candidate := uuid.uuid4())):
                pass
            return candidate

        monkeypatch.setattr(Tenant._meta.get_field("id"), "_get_default", draw)

    return place


def test_the_command_lists_moves_on_a_dry_run_then_moves_and_shrinks_back(tenant_with, ids_by_hash):
    count = settings.DUCTOR_QUEUE_SHARDS
    ids_by_hash(lambda tid: hashed_shard(tid, count) == 0 and hashed_shard(tid, count + 1) == count)
    mover = tenant_with("cmd-mover")
    ids_by_hash(lambda tid: hashed_shard(tid, count) == 0 and hashed_shard(tid, count + 1) == 0)
    stayer = tenant_with("cmd-stayer")
    tenants = {str(t.pk): t for t in (mover, stayer)}
    waiting = {tid: {f"{tid}:{i}" for i in backlog(t, per_tier=2)} for tid, t in tenants.items()}
    out = StringIO()

    call_command("queue_reshard", "--shards", str(count + 1), "--dry-run", stdout=out)

    assert f"{mover.pk}: shard 0 -> {count}" in out.getvalue()
    assert str(stayer.pk) not in out.getvalue()
    assert read_shard_map().count is None
    assert shard_of(str(mover.pk)) == 0

    out = StringIO()
    call_command("queue_reshard", "--shards", str(count + 1), stdout=out)

    assert f"moved {mover.pk}: shard 0 -> {count}" in out.getvalue()
    assert "pause per tenant" in out.getvalue()
    assert f"DUCTOR_QUEUE_SHARDS={count + 1}" in out.getvalue()
    assert list(queue_shards()) == list(range(count + 1))
    assert (shard_of(str(mover.pk)), shard_of(str(stayer.pk))) == (count, 0)
    assert keys_under(mover, 0) == [fence_key(str(mover.pk), 0)]

    call_command("queue_reshard", "--shards", str(count), stdout=StringIO())  # and back

    assert list(queue_shards()) == list(range(count))
    assert shard_of(str(mover.pk)) == shard_of(str(stayer.pk)) == 0
    assert keys_under(mover, count) == [fence_key(str(mover.pk), count)]
    served = drain(0, tenants)
    assert Counter(f"{i.tenant_id}:{i.item_id}" for i in served) == Counter(set().union(*waiting.values()))


def test_the_command_run_again_after_the_map_was_lost_finds_a_moved_tenant_where_its_fence_sends_it(
    tenant_with, ids_by_hash
):
    """The map alone lost (a Redis Cluster whose master of shard 0 came back empty), the moved tenant's
    fence and keys stayed: the setting's count in force again sent its calls to a shard no longer
    served, and the command run again to put the count back failed on that fence (TENANT_MOVED)."""
    count = settings.DUCTOR_QUEUE_SHARDS
    ids_by_hash(lambda tid: hashed_shard(tid, count) == 0 and hashed_shard(tid, count + 1) == count)
    mover = tenant_with("map-lost")
    waiting = backlog(mover, per_tier=2)
    call_command("queue_reshard", "--shards", str(count + 1), stdout=StringIO())
    get_redis().delete(shard_map_key())
    forget_shard_map()
    assert list(queue_shards()) == list(range(count))

    call_command("queue_reshard", "--shards", str(count + 1), stdout=StringIO())

    assert list(queue_shards()) == list(range(count + 1))
    assert shard_of(str(mover.pk)) == count
    assert read_shard_map().moves == {}
    assert get_redis().get(fence_key(str(mover.pk), count)) is None
    assert {item.item_id for item in drain(count, {str(mover.pk): mover})} == waiting


def test_a_fence_that_sends_a_tenant_to_a_shard_no_longer_served_is_logged(tenant_with, ids_by_hash):
    """With the map lost, the moved tenant's items went to a shard no dispatcher walked, and nothing
    said so."""
    count = settings.DUCTOR_QUEUE_SHARDS
    ids_by_hash(lambda tid: hashed_shard(tid, count) == 0 and hashed_shard(tid, count + 1) == count)
    mover = tenant_with("fenced-away")
    call_command("queue_reshard", "--shards", str(count + 1), stdout=StringIO())
    get_redis().delete(shard_map_key())
    forget_shard_map()

    with capture_logs() as logs:
        fq.enqueue("first", tier="standard", partition="p", tenant=mover)
        fq.enqueue("second", tier="standard", partition="p", tenant=mover)

    assert [(line["event"], line["tenant_id"], line["shard"], line["served"])
            for line in logs if line["log_level"] == "error"] == [
        ("tenant_moved_to_unserved_shard", str(mover.pk), count, count)]


def test_the_command_refuses_a_bad_count_and_an_unknown_tenant(tenant_with):
    tenant_with("known")
    with pytest.raises(CommandError, match="between 1 and"):
        call_command("queue_reshard", "--shards", "0", stdout=StringIO())
    with pytest.raises(CommandError, match="unknown tenant"):
        call_command("queue_reshard", "--shards", "3", "--tenant", "no-such-tenant", stdout=StringIO())
    assert read_shard_map().count is None


def test_only_the_named_tenant_moves_and_the_others_stay_pinned_until_the_next_run(tenant_with, ids_by_hash):
    count = settings.DUCTOR_QUEUE_SHARDS
    ids_by_hash(lambda tid: hashed_shard(tid, count) == 0 and hashed_shard(tid, count + 1) == count)
    first, second = tenant_with("first"), tenant_with("second")
    out = StringIO()

    call_command("queue_reshard", "--shards", str(count + 1), "--tenant", str(first.pk), stdout=out)

    assert (shard_of(str(first.pk)), shard_of(str(second.pk))) == (count, 0)
    assert "run the command again" in out.getvalue()
    call_command("queue_reshard", "--shards", str(count + 1), stdout=StringIO())
    assert shard_of(str(second.pk)) == count
    assert read_shard_map().pins == {}
