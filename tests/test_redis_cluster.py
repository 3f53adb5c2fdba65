"""Ductor's queue state on a real Redis Cluster: three masters, the shards spread over them.

These run in ``make test``'s cluster run only (``DUCTOR_TEST_QUEUE_CLUSTER``, with
``DUCTOR_QUEUE_SHARDS=6``): the test process's queue client is a ``RedisCluster``, the broker and
the cache a plain Redis. Every server counts the errors it answered (``INFO errorstats``) and the
calls of each command that failed (``INFO commandstats``): after the product's operations on
tenants of every shard, none may be a ``CROSSSLOT`` (a script or a command whose keys span
slots), and no call may have failed but two kinds, which are no fault: ``NOSCRIPT`` (a node that
had not loaded a script yet: the client loads it there and calls again), and redis-py's
``CLIENT SETINFO`` on each new connection, which Redis 6.2 does not know.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from redis.connection import Connection
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from structlog.testing import capture_logs

from ductor_project import redis_cluster
from ductor_project.core import capacity, heartbeats, scripts
from ductor_project.core.context import no_tenant, tenant_context
from ductor_project.core.keys import shard_of
from ductor_project.core.redis import get_redis, is_cluster, ping
from scheduling import circuit
from scheduling import fair_queue as fq
from scheduling import metrics as queue_metrics
from scheduling import services as scheduling_services
from scheduling.coordinator.epoch import RedisWatch, epoch_key
from scheduling.coordinator.loop import Coordinator
from scheduling.dispatch import credits
from tenants import services as tenant_services
from tenants.models import Tenant
from tenants.usage import QuotaExceeded, quota_consume
from tests.conftest import api_client, queue_cluster_directory
from tests.processes import running_processes
from tests.waiting import wait_for
from workflows import services
from workflows.models import WorkflowRun
from workflows.why import why_waiting

pytestmark = pytest.mark.cluster(only=True)

CUSTOMER_TIERS = [tier for tier in fq.TIERS if tier != fq.SYSTEM_TIER]
LEASE_MS = 30_000
LATER_MS = 600_000  # an item not due during the test
# A pool P of one connection C, with one slot each (as the fair queue's admission reads them).
SCOPES = {
    "pool:P": json.dumps({"limit": -1, "rate": 0, "burst": 1, "strategy": "round_robin", "members": [["C", 1, 0]]}),
    "connection:C": json.dumps({"limit": 1, "rate": 0, "burst": 1, "pools": ["P"]}),
}


def reset_errors(client: Any) -> None:
    client.config_resetstat(target_nodes=client.PRIMARIES)


def _summed(client: Any, section: str, prefix: str, count: Callable[[dict[str, Any]], int]) -> dict[str, int]:
    found: dict[str, int] = {}
    for stats in client.info(section, target_nodes=client.PRIMARIES).values():
        for name, value in stats.items():
            if n := count(value):
                found[name.removeprefix(prefix)] = found.get(name.removeprefix(prefix), 0) + n
    return found


def assert_no_cross_slot_nor_failed_call(client: Any) -> None:
    """Since ``reset_errors``, on every primary: no CROSSSLOT, and no failed call but the two
    harmless kinds (the module's docstring)."""
    errors = _summed(client, "errorstats", "errorstat_", lambda value: int(value["count"]))
    failed = _summed(client, "commandstats", "cmdstat_",
                     lambda value: int(value.get("failed_calls", 0)) + int(value.get("rejected_calls", 0)))
    assert "CROSSSLOT" not in errors, errors
    assert set(failed) <= {"client", "evalsha"}, failed
    assert set(errors) <= {"ERR", "NOSCRIPT"}, errors
    assert (errors.get("ERR", 0), errors.get("NOSCRIPT", 0)) == (failed.get("client", 0), failed.get("evalsha", 0))


@pytest.fixture
def superuser_api(db: None) -> Any:
    client = api_client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.fixture
def spread(
    make_tenant: Callable[..., tuple[Tenant, str]], tenants_on_shard: Callable[[int], None]
) -> Callable[[int], list[Tenant]]:
    """``per_shard`` new tenants on each shard, shard by shard."""

    def make(per_shard: int) -> list[Tenant]:
        tenants = []
        for shard in range(settings.DUCTOR_QUEUE_SHARDS):
            tenants_on_shard(shard)
            tenants += [make_tenant(f"s{shard}-t{n}")[0] for n in range(per_shard)]
        return tenants

    return make


@pytest.fixture
def cluster(redis_client: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The flushed cluster, with its error counts reset and no script loaded anywhere, so that the
    test loads every script it runs on every primary."""
    redis_client.script_flush()
    monkeypatch.setattr(scripts.Batch, "_loaded", set())
    reset_errors(redis_client)
    return redis_client


def test_the_queue_client_is_a_cluster_whose_three_masters_each_serve_some_shards(cluster):
    assert is_cluster(cluster)
    masters = {node.name for node in cluster.get_primaries()}
    assert len(masters) == 3
    assert settings.DUCTOR_QUEUE_SHARDS >= 6
    serving = {cluster.get_node_from_key(epoch_key(shard)).name for shard in range(settings.DUCTOR_QUEUE_SHARDS)}
    assert serving == masters


def test_the_check_sees_a_script_whose_keys_span_two_slots(cluster):
    """The check of the other tests is not blind: a node refuses such a call as CROSSSLOT (the
    cluster client would not even send it), and the check fails on it."""
    node = cluster.get_node_from_key("{s0}:a")
    assert cluster.get_node_from_key("{s1}:a") == node  # two shards, two slots, one node
    with pytest.raises(ResponseError, match="hash to the same slot"):  # CROSSSLOT
        cluster.get_redis_connection(node).eval("return 1", 2, "{s0}:a", "{s1}:a")
    with pytest.raises(AssertionError, match="CROSSSLOT"):
        assert_no_cross_slot_nor_failed_call(cluster)


def test_the_fair_queue_on_tenants_of_every_shard_causes_no_cross_slot_error(cluster, spread):
    tenants = spread(per_shard=3)
    by_id = {str(t.pk): t for t in tenants}
    assert {shard_of(t) for t in by_id} == set(range(settings.DUCTOR_QUEUE_SHARDS))
    direct, bulk = tenants[::2], tenants[1::2]
    for tenant in direct:  # the tenant's own calls: an item of pool P, a fairness key, one not due yet
        items = [fq.NewItem(f"e{i}", "standard", f"p{i}", {"kind": "k"}, scope="P" if i == 0 else None,
                            key="k1" if i == 1 else "") for i in range(3)]
        fq.enqueue_many([*items, fq.NewItem("later", "batch", "pl", {}, delay_ms=LATER_MS)], scopes=SCOPES,
                        tenant=tenant)
        assert fq.configure(scopes=SCOPES, replace_scopes=True, tenant=tenant) == 0
    # Many tenants' items in one bulk load: calls of every shard, sent together, one pipeline per node.
    with no_tenant():
        queued = fq.bulk_enqueue([fq.TenantBatch(t, [fq.NewItem(f"b{i}", "interactive", f"b{i}", {})
                                                     for i in range(2)]) for t in bulk])
    assert queued == 2 * len(bulk)
    with no_tenant():
        backlog = sum(fq.depth(shard).tiers["standard"].backlog for shard in range(settings.DUCTOR_QUEUE_SHARDS))
    assert backlog == 3 * len(direct)

    # Every shard's dispatch, then reads of the items in flight across tenants.
    got: list[fq.Dequeued] = []
    with no_tenant():
        for shard in range(settings.DUCTOR_QUEUE_SHARDS):
            system, work = fq.dequeue_batches(shard=shard, lease_ms=LEASE_MS,
                                              batches=[([fq.SYSTEM_TIER], 5), (CUSTOMER_TIERS, 100)])
            assert system == []
            got += work
        assert len(got) == 3 * len(direct) + 2 * len(bulk)
        assert {item.connection_id for item in got if item.item_id == "e0"} == {"C"}
        assert fq.pending([(by_id[item.tenant_id], item.item_id) for item in got]) == [True] * len(got)
    for tenant in direct[:2]:
        with tenant_context(tenant):
            holds = fq.holds_of(["e0", "later"])
            assert [hold.state if hold else None for hold in holds] == ["inflight", "waiting"]
            assert fq.admission_peek("P", SCOPES["pool:P"], {"connection:C": SCOPES["connection:C"]}).admitted is False
            assert fq.stats().in_flight == 3

    # Batches whose calls go to every node (lease renewals); then a third of the items nacked, a third
    # handed off, a third acked.
    batch = scripts.Batch()
    for item in got:
        fq.queue_extend_lease(batch, item.item_id, lease_ms=LEASE_MS, delivery=item.delivery,
                              tenant=by_id[item.tenant_id])
    assert batch.execute() == [1] * len(got)
    for item in got[::3]:
        assert fq.nack(item.item_id, delivery=item.delivery, tenant=by_id[item.tenant_id]) is True
    acked = 0
    with no_tenant():
        for item in got[1::3]:
            # The ack (the item's shard) and the next dequeue (the next shard, often on another node).
            other = (shard_of(item.tenant_id) + 1) % settings.DUCTOR_QUEUE_SHARDS
            done, nxt = fq.handoff((by_id[item.tenant_id], item.item_id, item.delivery, 3.0), shard=other,
                                   lease_ms=LEASE_MS, tiers=CUSTOMER_TIERS)
            assert done is True
            acked += 1
            if nxt is not None:
                assert fq.ack(nxt.item_id, delivery=nxt.delivery, tenant=by_id[nxt.tenant_id]) is True
                acked += 1
        # The rest through one batch of acks of every shard; what the nacks put back, dequeued again.
        batch = scripts.Batch()
        rest = got[2::3]
        for shard in range(settings.DUCTOR_QUEUE_SHARDS):
            rest += fq.dequeue_many(shard=shard, lease_ms=LEASE_MS, limit=100)
        for item in rest:
            fq.queue_ack(batch, item.item_id, delivery=item.delivery, tenant=by_id[item.tenant_id], work_ms=5.0)
        assert batch.execute() == [1] * len(rest)
        assert acked + len(rest) == len(got)

        assert sum(fq.reap(shard=shard) for shard in range(settings.DUCTOR_QUEUE_SHARDS)) == 0
        due = [fq.next_due_ms(shard) for shard in range(settings.DUCTOR_QUEUE_SHARDS)]
        assert all(ms is None or ms > LATER_MS / 2 for ms in due)  # only the "later" items are left
        # Each shard's wake list holds one token at most: taken once, it is gone.
        assert any([fq.wait_for_work(shards=[shard], timeout_s=0) for shard in range(settings.DUCTOR_QUEUE_SHARDS)])
        assert not any(fq.wait_for_work(shards=[shard], timeout_s=0) for shard in range(settings.DUCTOR_QUEUE_SHARDS))
        stats = [fq.global_stats(shard) for shard in range(settings.DUCTOR_QUEUE_SHARDS)]
        assert sum(s.in_flight for s in stats) == 0
        assert sum(len(fq.work_shares(shard)) for shard in range(settings.DUCTOR_QUEUE_SHARDS)) == len(tenants)
        snapshot = queue_metrics.read_snapshot()  # every read the metrics make
        assert sum(d.tiers["batch"].backlog for d in snapshot.depths) == len(direct)
    for tenant in direct:
        with tenant_context(tenant):
            assert fq.work_share().work_ms > 0
            assert fq.remove("later") is True
            assert fq.stats().backlog == 0

    assert_no_cross_slot_nor_failed_call(cluster)


def test_capacity_breakers_credits_heartbeats_epochs_and_the_quota_flag_cause_no_cross_slot_error(
    cluster, spread, superuser_api: Any
):
    tenants = spread(per_shard=1)
    for tenant in tenants:
        with tenant_context(tenant):
            scopes = [capacity.tenant_scope(2), capacity.pool_scope("p", 1), capacity.connection_scope("c", 1)]
            assert capacity.acquire(scopes, "h", lease_s=30) is True
            assert capacity.extend("h", lease_s=30) is True
            assert capacity.tenant_in_flight() == 1
            assert capacity.rate_check("steps", rate_per_s=10, burst=2).allowed
            assert capacity.release("h") == 3
            assert circuit.record_failure("c", tenant=tenant) is circuit.BreakerState.CLOSED
    with no_tenant():
        for _ in range(settings.DUCTOR_BREAKER_FAILURES):
            circuit.record_failure("c", tenant=tenants[0])
        assert circuit.open_breakers() == (1, 0)
        assert circuit.record_success("c", tenant=tenants[0]) is circuit.BreakerState.CLOSED
        assert circuit.open_breakers() == (0, 0)

    credits.register_worker("w@host", list(credits.QUEUES), 3)
    assert credits.worker_slots(credits.WORK_QUEUE) == 3
    taken = credits.reserve_credits({queue: 2 for queue in credits.QUEUES})
    credits.mark_sent(credits.WORK_QUEUE, taken[credits.WORK_QUEUE])
    credits.mark_running(credits.WORK_QUEUE, taken[credits.WORK_QUEUE][:1], 30)
    assert credits.busy(credits.WORK_QUEUE) == 2
    assert credits.outstanding(credits.WORK_QUEUE) == 1
    credits.free_credits(credits.WORK_QUEUE, taken[credits.WORK_QUEUE])
    credits.free_credits(credits.SYSTEM_QUEUE, taken[credits.SYSTEM_QUEUE], signal=False)
    assert credits.wait_for_credit(timeout_s=0.01) is True  # the freed work credit signalled
    assert credits.credits(credits.WORK_QUEUE) == 3 + settings.DUCTOR_DISPATCH_BUFFER
    credits.unregister_worker("w@host", list(credits.QUEUES), 3)

    heartbeats.beat(heartbeats.DISPATCHER, "d-1")
    assert set(heartbeats.ages(heartbeats.DISPATCHER)) == {"d-1"}
    heartbeats.forget(heartbeats.DISPATCHER, "d-1")
    watch = RedisWatch()
    assert watch.lost() is True  # a flushed cluster: every shard's epoch key is missing
    watch.repaired()
    assert watch.lost() is False

    tenant_services.override_set(tenant=tenants[1], field="monthly_run_quota", value=0)
    with tenant_context(tenants[1]):
        for _ in range(2):  # the second refusal reads the flag the first one set
            with pytest.raises(QuotaExceeded):
                quota_consume()
    assert Coordinator().tick() == {"reaped": 0, "repaired": 0, "removed": 0}

    # The API's rate limit and the queue views, the readiness check, the metrics.
    for tenant in tenants[:2]:
        with tenant_context(tenant):
            _, raw = tenant_services.api_key_create(name="k", scopes=["read"])
        assert api_client(raw).get("/api/v1/queue").status_code == 200
    shards = superuser_api.get("/api/v1/platform/queue").json()
    assert [shard["shard"] for shard in shards] == list(range(settings.DUCTOR_QUEUE_SHARDS))
    ready = superuser_api.get("/readyz").json()
    assert ready["checks"]["redis"]["ok"] is True
    assert superuser_api.get("/metrics").status_code == 200

    assert_no_cross_slot_nor_failed_call(cluster)


def test_a_master_restarted_empty_is_a_loss_of_its_shards_and_the_clients_carry_on(cluster, spread):
    """A master back without its data (a restart without persistence; a promoted replica is
    another server too): the epoch watch names its shards and says restarted, and the queue client
    finds the node again."""
    watch = RedisWatch()
    assert watch.lost() is True  # a flushed cluster
    watch.repaired()
    assert watch.lost() is False
    tenants = spread(per_shard=1)
    for tenant in tenants:
        fq.enqueue("before", tier="standard", partition="p", payload={}, tenant=tenant)
    node = cluster.get_node_from_key(epoch_key(2))
    its_shards = [s for s in range(settings.DUCTOR_QUEUE_SHARDS) if cluster.get_node_from_key(epoch_key(s)) == node]

    redis_cluster.restart_node(queue_cluster_directory(), node.port)

    with capture_logs() as logs:
        assert watch.lost() is True
    (lost,) = [line for line in logs if line["event"] == "redis_data_lost"]
    assert (lost["shards_without_epoch"], lost["restarted"]) == (its_shards, True)
    for tenant in tenants:  # the restarted master's tenants lost their item; the others kept theirs
        assert fq.stats(tenant).backlog == (0 if shard_of(str(tenant.pk)) in its_shards else 1)
        fq.enqueue("after", tier="standard", partition="q", payload={}, tenant=tenant)
    with no_tenant():
        served = [fq.dequeue_many(shard=s, lease_ms=LEASE_MS, limit=10) for s in range(settings.DUCTOR_QUEUE_SHARDS)]
    assert sum(len(items) for items in served) == 2 * len(tenants) - len(its_shards)
    watch.repaired()
    assert watch.lost() is False


def test_the_readiness_ping_tries_a_master_that_does_not_answer_once(queue_cluster, monkeypatch):
    """A paused master (or one behind a partition): the cluster client tried it again and again
    (its own retries, 10 by default, with backoffs), so ``/readyz`` answered after minutes where
    its check is to give up after one ``socket_timeout``."""
    monkeypatch.setattr(settings, "DUCTOR_QUEUE_REDIS_URL", queue_cluster.url(options="socket_timeout=0.5"))
    client = get_redis()
    assert ping()  # every primary's connection is open
    paused = client.get_node_from_key(epoch_key(0))
    sent: list[Any] = []  # every command sent to the paused master: the ping, a retry's handshake
    send = Connection.send_packed_command

    def counted(connection: Connection, command: Any, check_health: bool = True) -> None:
        if connection.port == paused.port:
            sent.append(command)
        send(connection, command, check_health)

    monkeypatch.setattr(Connection, "send_packed_command", counted)
    pid = queue_cluster.pids[queue_cluster.ports.index(paused.port)]
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(RedisTimeoutError):
            ping()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert len(sent) == 1


# -- end to end ----------------------------------------------------------------------------------


def flaky_diamond() -> dict[str, Any]:
    """a, then b through the pool and c failing once before its retry (a timer of the system
    tenant's shard), then a short sleep (another timer), then d."""
    return {
        "nodes": [
            {"id": "a", "type": "action", "action": "echo", "input": {"v": "$input.v"}},
            {"id": "b", "type": "action", "action": "echo", "input": {"b": "$nodes.a.output.v"},
             "pool": "api", "depends_on": ["a"]},
            {"id": "c", "type": "action", "action": "fail", "depends_on": ["a"],
             "input": {"succeed_on_attempt": 2, "message": "once"},
             "retry": {"max_attempts": 3, "backoff_s": 0.2, "jitter": False}},
            {"id": "nap", "type": "sleep", "duration_s": 0.2, "depends_on": ["b", "c"]},
            {"id": "d", "type": "action", "action": "echo", "depends_on": ["nap"],
             "input": {"b": "$nodes.b.output.b", "c": "$nodes.c.output.attempt"}},
        ],
        "output": "$nodes.d.output",
    }


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_workflows_of_tenants_on_every_shard_run_to_their_end_through_a_real_worker_dispatcher_and_coordinator(
    spread, superuser_api: Any
):
    with running_processes() as processes:
        client = get_redis()
        reset_errors(client)
        tenants = spread(per_shard=1)
        runs: list[tuple[Tenant, WorkflowRun]] = []
        for n, tenant in enumerate(tenants):
            with tenant_context(tenant):
                scheduling_services.connection_create(name="api-1", kind="http", max_concurrency=1,
                                                      config={"base_url": "https://api.example.com"})
                scheduling_services.pool_create(name="api", max_concurrency=1,
                                                members=[scheduling_services.MemberSpec("api-1")])
                services.workflow_put(name="flaky", spec=flaky_diamond())
                run, _ = services.run_start(workflow="flaky", input={"v": n})
            runs.append((tenant, run))
        tenant, run = runs[0]
        with tenant_context(tenant):
            assert isinstance(why_waiting(run), list)  # reads its items' holds where they live

        def finished() -> bool:
            for tenant, run in runs:
                with tenant_context(tenant):
                    run.refresh_from_db()
                if not run.is_terminal:
                    return False
            return True

        wait_for(finished, timeout=90, what="every run to end")
        for n, (tenant, run) in enumerate(runs):
            assert run.status == WorkflowRun.Status.SUCCEEDED, (tenant.slug, run.error)
            assert run.output == {"b": n, "c": 2}
        for tenant in tenants:
            wait_for(lambda t=tenant: (s := fq.stats(t)).backlog == 0 and s.in_flight == 0, timeout=20,
                     what=f"{tenant.slug}'s queue to drain")
            with tenant_context(tenant):
                assert capacity.tenant_in_flight() == 0
        assert superuser_api.get("/metrics").status_code == 200
        assert processes.dispatcher.alive()
    assert_no_cross_slot_nor_failed_call(client)
