"""Script batches against the real Redis: one round trip, order kept, scripts the server lost reloaded."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import DataError, NoScriptError, ResponseError

from ductor_project.core import scripts
from ductor_project.core.context import tenant_context
from ductor_project.core.keys import global_redis_key
from scheduling import fair_queue as fq

# Also on a Redis Cluster (the cluster run), with this module's tenants on shard 0, which its direct
# dispatcher calls serve.
pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("tenants_on_shard")]


def test_a_batch_runs_its_calls_in_order_and_reloads_scripts_the_server_forgot(make_tenant, redis_client: Any):
    tenant, _ = make_tenant("batch")
    with tenant_context(tenant):
        fq.enqueue_many([fq.NewItem(f"b{i}", "standard", f"p{i}", {}) for i in range(3)])
    items = fq.dequeue_many(lease_ms=30_000, limit=3)
    assert len(items) == 3
    redis_client.script_flush()  # a restarted or failed-over Redis knows no script

    batch = scripts.Batch()
    for item in items:
        fq.queue_ack(batch, item.item_id, delivery=item.delivery, tenant=tenant)
    fq.queue_ack(batch, items[0].item_id, delivery=items[0].delivery, tenant=tenant)  # twice: a no-op
    replies = batch.execute()

    assert replies == [1, 1, 1, 0]
    assert len(batch) == 0
    stats = fq.stats(tenant)
    assert (stats.backlog, stats.in_flight) == (0, 0)


def test_dequeue_batches_serve_each_batch_in_order_with_its_own_limit(make_tenant, redis_client: Any):
    tenant, _ = make_tenant("batches")
    with tenant_context(tenant):
        fq.enqueue_many([fq.NewItem(f"s{i}", "standard", f"s{i}", {}) for i in range(5)]
                        + [fq.NewItem(f"i{i}", "interactive", f"i{i}", {}) for i in range(5)])

    interactive, standard = fq.dequeue_batches(lease_ms=30_000, batches=[(["interactive"], 2), (["standard"], 4)])

    assert [item.item_id for item in interactive] == ["i0", "i1"]
    assert [item.tier for item in standard] == ["standard"] * 4
    # What is left of each tier is still there, in its tier.
    rest = fq.dequeue_many(lease_ms=30_000, limit=10)
    assert sorted(item.item_id for item in rest) == ["i2", "i3", "i4", "s4"]


def test_a_batch_keeps_its_order_even_when_the_server_has_not_seen_its_first_script(
    make_tenant, redis_client: Any, monkeypatch
):
    tenant, _ = make_tenant("batch-order")
    with tenant_context(tenant):
        fq.enqueue_many([fq.NewItem(f"o{i}", "standard", "one", {}) for i in range(2)])  # one partition
    first = fq.dequeue(lease_ms=30_000)
    assert first is not None
    redis_client.script_flush()
    monkeypatch.setattr(scripts.Batch, "_loaded", set())  # a new process: nothing loaded yet

    # The ack must run before the dequeue, or the partition is still locked for it.
    acked, nxt = fq.handoff((tenant, first.item_id, first.delivery), shard=0, lease_ms=30_000, tiers=["standard"])

    assert acked is True
    assert nxt is not None
    assert nxt.item_id == "o1"


def _server(redis_client: Any, key: str) -> Any:
    """The plain client of the server that holds ``key`` (the cluster run's node, or the one server)."""
    from ductor_project.core.redis import on_node

    return on_node(key, lambda server: server)


def test_a_round_trip_answers_each_command_in_place_an_error_among_them(redis_client: Any):
    key = global_redis_key("test", "round-trip")
    server = _server(redis_client, key)
    good = server.script_load("return ARGV[1] .. ':' .. #ARGV")
    bad = server.script_load("return redis.error_reply('ERR refused')")

    replies = scripts._round_trip(server, [("EVALSHA", good, 1, key, "a", 2, 1.5, b"\xff"),
                                           ("EVALSHA", bad, 1, key),
                                           ("EVALSHA", "0" * 40, 1, key),
                                           ("EVALSHA", good, 1, key, "after")])

    assert replies[0] == b"a:4"
    assert isinstance(replies[1], ResponseError)
    assert "refused" in str(replies[1])
    assert isinstance(replies[2], NoScriptError)
    assert replies[3] == b"after:1"  # the errors were read in full: the next replies are intact
    assert server.ping()  # and the connection went back to the pool usable


def test_a_round_trip_refuses_what_redis_cannot_send_before_sending_anything(redis_client: Any):
    key = global_redis_key("test", "round-trip-refused")
    server = _server(redis_client, key)
    counted = server.script_load("return redis.call('INCR', KEYS[1])")

    for value in (None, True):
        with pytest.raises(DataError):
            scripts._round_trip(server, [("EVALSHA", counted, 1, key), ("EVALSHA", counted, 1, key, value)])

    assert server.get(key) is None  # neither batch sent its first command
