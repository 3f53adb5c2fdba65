"""Metrics, health and heartbeats on the real PostgreSQL and Redis: ``/metrics`` parsed with
``prometheus_client``'s own parser, ``/healthz``, ``/readyz`` against a real coordinator loop,
and the supervisor's restart of a child whose heartbeat went stale."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from ductor_project.celery import RESULTS_QUEUE, SYSTEM_QUEUE, WORK_QUEUE
from ductor_project.core import heartbeats
from ductor_project.core.context import no_tenant, tenant_context
from ductor_project.embedded import free_port
from ductor_project.management.commands.up import HeartbeatWatch
from ductor_project.stack import Stack
from scheduling import fair_queue as fq
from scheduling.circuit import record_failure, record_success
from scheduling.coordinator.loop import Coordinator
from scheduling.dispatch import credits
from scheduling.dispatch.dispatcher import IDLE_WAIT_S, Dispatcher
from scheduling.metrics import SharedStateCollector
from tenants.models import Tenant
from tests.conftest import LogLines
from workflows import services

pytestmark = pytest.mark.django_db(transaction=True)

NOOP = {"nodes": [{"id": "work", "type": "action", "action": "noop"}]}
TIER = "standard"


def wait_for(condition: Callable[[], Any], *, what: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return found


def scrape(client: Client | None = None, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as {(sample name, sorted labels): value}."""
    response = (client or Client()).get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.content.decode())
            for sample in family.samples}


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def fresh_metrics(settings: Any, redis_client: Any) -> Any:
    settings.DUCTOR_METRICS_QUEUE_EVERY_S = 0  # every scrape reads Redis
    return settings


# --- /metrics -----------------------------------------------------------------------------------


def test_the_queue_gauges_match_the_tenants_queue_api(fresh_metrics, tenant_a, tenant_b, client_a):
    for tenant, runs in ((tenant_a[0], 5), (tenant_b[0], 2)):
        with tenant_context(tenant):
            services.workflow_put(name="w", spec=NOOP)
            for _ in range(runs):
                services.run_start(workflow="w", input={})
    with no_tenant():
        assert fq.dequeue(shard=0, lease_ms=60_000) is not None  # one in flight
    queue = client_a.get("/api/v1/queue").json()
    queue_b = {"backlog": 0, "due": 0, "in_flight": 0}
    with tenant_context(tenant_b[0]):
        stats_b = fq.stats()
        queue_b = {"backlog": stats_b.backlog, "due": stats_b.due, "in_flight": stats_b.in_flight}
    samples = scrape()
    tenant = str(tenant_a[0].pk)
    assert value(samples, "ductor_tenant_queue_waiting", tenant_id=tenant) == queue["backlog"]
    assert value(samples, "ductor_tenant_queue_due", tenant_id=tenant) == queue["due"]
    assert value(samples, "ductor_tenant_queue_in_flight", tenant_id=tenant) == queue["in_flight"]
    assert queue["backlog"] + queue["in_flight"] + queue_b["backlog"] + queue_b["in_flight"] == 7
    tier = queue["tiers"][TIER]
    assert value(samples, "ductor_queue_waiting", shard="0", tier=TIER) == tier["backlog"] + queue_b["backlog"]
    assert value(samples, "ductor_queue_in_flight", shard="0", tier=TIER) == 1
    assert value(samples, "ductor_leases_in_flight", shard="0") == 1
    assert value(samples, "ductor_queue_tenants_with_items", shard="0") == 2
    assert value(samples, "ductor_tenant_queue_waiting", tenant_id="other") == 0  # both are named
    assert value(samples, "ductor_shared_state_up") == 1


def test_per_tenant_series_stay_bounded_with_ten_thousand_tenants(fresh_metrics):
    fresh_metrics.DUCTOR_METRICS_TOP_TENANTS = 20
    conf = fq.TenantConf(weight=1, max_concurrency=None, rate_per_s=None, burst=1, tiers=(TIER,))
    tenants = [Tenant(id=uuid.uuid4(), slug=f"load-{n}") for n in range(10_000)]
    batches = [fq.TenantBatch(tenant, [fq.NewItem(f"i{j}", TIER, f"p{j}", {"kind": "test.noop"})
                                       for j in range(1 + n % 3)], conf)
               for n, tenant in enumerate(tenants)]
    with no_tenant():
        queued = fq.bulk_enqueue(batches)
    samples = scrape()
    tenant_series = {labels for name, labels in samples if name == "ductor_tenant_queue_waiting"}
    assert len(tenant_series) == 21  # the 20 largest and "other"
    largest = {dict(labels)["tenant_id"] for labels in tenant_series} - {"other"}
    assert all(len(batches[n].items) == 3 for n, tenant in enumerate(tenants) if str(tenant.pk) in largest)
    named = sum(value(samples, "ductor_tenant_queue_waiting", tenant_id=t) for t in largest)
    assert named + value(samples, "ductor_tenant_queue_waiting", tenant_id="other") == queued
    assert value(samples, "ductor_queue_waiting", shard="0", tier=TIER) == queued
    assert value(samples, "ductor_queue_tenants_with_items", shard="0") == 10_000
    # What the scrape reads of the shared state: fixed by shards, tiers, processes and N, not by tenants.
    shared = [sample for family in SharedStateCollector().collect() for sample in family.samples]
    assert len(shared) < 200
    assert all(not name.startswith("ductor_") or name.startswith(RECORDED) or (name, labels) in shared_keys(shared)
               for name, labels in samples)


RECORDED = ("ductor_dispatch_wait", "ductor_item_duration", "ductor_step_duration", "ductor_reaped",
            "ductor_reconciler", "ductor_loop_pass", "ductor_breaker_opened", "ductor_http_request")


def shared_keys(shared: list[Any]) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(sample.name, tuple(sorted(sample.labels.items()))) for sample in shared}


def test_the_metrics_can_need_a_token_or_be_off(settings, redis_client):
    elsewhere = Client(REMOTE_ADDR="10.1.2.3").get("/metrics")  # no token: this machine only
    assert (elsewhere.status_code, elsewhere.json()["error"]["code"]) == (403, "permission_denied")
    assert scrape(Client(REMOTE_ADDR="127.0.0.1"))
    # A reverse proxy on this host forwards everyone's requests from loopback: they are not this machine's.
    for header in ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP"):
        proxied = Client(REMOTE_ADDR="127.0.0.1").get("/metrics", **{header: "203.0.113.9"})
        assert (proxied.status_code, proxied.json()["error"]["code"]) == (403, "permission_denied"), header
    settings.DUCTOR_METRICS_TOKEN = "s3cret-metrics"
    assert scrape(Client(REMOTE_ADDR="10.1.2.3"), HTTP_AUTHORIZATION="Bearer s3cret-metrics")
    client = Client()
    refused = client.get("/metrics")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "not_authenticated"
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-metrics")
    settings.DUCTOR_METRICS_ENABLED = False
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-metrics").status_code == 404


def test_requests_are_timed_by_url_pattern_and_status_not_by_path(fresh_metrics, client_a):
    def not_found_counts() -> dict[str, float]:
        return {dict(labels)["route"]: v for (name, labels), v in scrape().items()
                if name == "ductor_http_request_duration_seconds_count"
                and (dict(labels)["method"], dict(labels)["status"]) == ("GET", "404")}

    before = not_found_counts()
    missing = [uuid.uuid4(), uuid.uuid4()]
    for run_id in missing:
        client_a.get(f"/api/v1/runs/{run_id}/lineage")
    after = not_found_counts()
    [(route, added)] = [(route, n - before.get(route, 0)) for route, n in after.items() if n != before.get(route, 0)]
    assert added == 2  # both requests in one series: the pattern's
    assert "lineage" in route
    assert all(str(run_id) not in route for run_id in missing)  # the pattern, never the id


def test_a_made_up_http_method_is_labelled_other_not_by_its_name(fresh_metrics, client_a):
    """Anyone who reaches the web server names the method: as a label, each name was a new series."""
    for method in ("ZZPROBE1", "ZZPROBE2"):
        client_a.generic(method, "/healthz")
    methods = {dict(labels)["method"] for (name, labels), _ in scrape().items()
               if name == "ductor_http_request_duration_seconds_count"}
    assert "other" in methods
    assert not {"ZZPROBE1", "ZZPROBE2"} & methods


def test_a_scrape_merges_what_every_process_of_the_host_recorded(fresh_metrics, tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    record = ("from ductor_project.core import metrics; metrics.REAPED.inc(3); "
              "metrics.STEP_DURATION.labels('action', 'failed').observe(0.2)")
    for _ in range(2):  # two processes, as two prefork children
        subprocess.run([sys.executable, "-c", record], check=True, env={**_env(), "PROMETHEUS_MULTIPROC_DIR":
                                                                        str(tmp_path)})
    samples = scrape()
    assert value(samples, "ductor_reaped_leases_total") == 6
    assert value(samples, "ductor_step_duration_seconds_count", node_type="action", outcome="failed") == 2
    assert value(samples, "ductor_shared_state_up") == 1


def _env() -> dict[str, str]:
    return {key: val for key, val in os.environ.items() if key != "PROMETHEUS_MULTIPROC_DIR"}


def test_an_unreadable_redis_is_a_gauge_not_a_failed_scrape(fresh_metrics, monkeypatch):
    def unreachable() -> Any:
        raise ConnectionError("redis is away")

    monkeypatch.setattr("scheduling.metrics.read_snapshot", unreachable)
    samples = scrape()
    assert value(samples, "ductor_shared_state_up") == 0


# --- health -------------------------------------------------------------------------------------


def test_healthz_answers_while_the_process_serves(db):
    response = Client().get("/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})
    assert Client().post("/healthz").status_code == 405


def loop_thread(run_forever: Callable[[threading.Event], None], stop: threading.Event) -> threading.Thread:
    """``run_forever(stop)`` in a thread of its own, started; its database connection closed when it ends
    (else it outlives the thread and holds the test database at its teardown)."""

    def run() -> None:
        try:
            run_forever(stop)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def loops(settings: Any, redis_client: Any) -> Iterator[Callable[[], None]]:
    """A real coordinator loop and dispatcher loop in threads, until the test ends; the coordinator's
    passes can be held (``hold``/``resume``), as a stuck or disconnected one would be."""
    # Above the longest gap between two beats of a healthy loop: a dispatcher beats at most every
    # BEAT_EVERY_S, after a round and its idle wait (IDLE_WAIT_S); a pass of either loop takes well under 1 s.
    settings.DUCTOR_HEARTBEAT_STALE_S = heartbeats.BEAT_EVERY_S + IDLE_WAIT_S + 1.0
    stop = threading.Event()
    gate = threading.Event()
    gate.set()
    coordinator = Coordinator(interval_s=0.05)
    real_tick = coordinator.tick

    def tick() -> dict[str, int]:
        gate.wait()
        return real_tick()

    coordinator.tick = tick  # type: ignore[method-assign]
    threads = [loop_thread(coordinator.run_forever, stop), loop_thread(Dispatcher().run_forever, stop)]
    yield gate
    stop.set()
    gate.set()
    for thread in threads:
        thread.join(10)


def ready() -> tuple[int, dict[str, Any]]:
    response = Client().get("/readyz")
    return response.status_code, response.json()


def test_readyz_is_unavailable_until_a_coordinator_and_a_dispatcher_beat(settings, redis_client):
    credits.register_worker("w@host", [WORK_QUEUE, SYSTEM_QUEUE, RESULTS_QUEUE], 2)
    status, body = ready()
    assert status == 503
    assert body["status"] == "unavailable"
    assert body["checks"]["database"]["ok"]
    assert body["checks"]["redis"]["ok"]
    assert not body["checks"]["coordinator"]["ok"]
    assert not body["checks"]["dispatcher"]["ok"]
    heartbeats.beat(heartbeats.COORDINATOR, "c1")
    assert ready()[1]["checks"]["coordinator"] | {"ms": 0, "newest_age_s": 0} == {
        "ok": True, "fresh": 1, "stale": 0, "ms": 0, "newest_age_s": 0}
    assert ready()[0] == 503  # no dispatcher yet
    heartbeats.beat(heartbeats.DISPATCHER, "d1")
    assert ready()[0] == 200


def test_readyz_is_unavailable_while_one_of_ductors_queues_has_no_live_worker(settings, redis_client):
    """A deployment whose workers of steps leave the results queue to results workers, with none
    running: the outcomes of task nodes would wait there for good."""
    heartbeats.beat(heartbeats.COORDINATOR, "c1")
    heartbeats.beat(heartbeats.DISPATCHER, "d1")
    credits.register_worker("steps@host", [WORK_QUEUE, SYSTEM_QUEUE], 4)
    status, body = ready()
    assert status == 503
    assert body["checks"]["workers"] | {"ms": 0} == {
        "ok": False, "slots": {WORK_QUEUE: 4, SYSTEM_QUEUE: 4, RESULTS_QUEUE: 0},
        "error": f"no live worker consumes {RESULTS_QUEUE}", "ms": 0}
    credits.register_worker("results-1@host", [RESULTS_QUEUE], 1)
    status, body = ready()
    assert status == 200
    assert body["checks"]["workers"]["slots"] == {WORK_QUEUE: 4, SYSTEM_QUEUE: 4, RESULTS_QUEUE: 1}
    credits.unregister_worker("steps@host", [WORK_QUEUE, SYSTEM_QUEUE], 4)  # a warm shutdown
    assert ready()[1]["checks"]["workers"]["error"] == f"no live worker consumes {WORK_QUEUE}, {SYSTEM_QUEUE}"


def test_readyz_with_redis_out_of_reach_checks_nothing_more_of_it_and_says_why_once(settings, logged: LogLines):
    """Every check after Redis's reads Redis: with it out of reach each would wait its own timeout
    (a paused server: ``socket_timeout`` each). They are reported as not checked. The answer is a
    readiness probe doing its job: one warning naming what failed, not Django's error line."""
    settings.DUCTOR_QUEUE_REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    status, body = ready()
    assert status == 503
    assert body["checks"]["database"]["ok"]
    assert not body["checks"]["redis"]["ok"]
    for name in ("coordinator", "dispatcher", "shards", "workers"):
        assert body["checks"][name] | {"ms": 0} == {"ok": False, "error": "not checked: Redis is out of reach",
                                                    "ms": 0}, name
    lines = [line for line in logged.json() if "readyz" in line.get("event", "") or line.get("event") == "not_ready"]
    assert [(line["event"], line["level"], line["failed"]) for line in lines] == [
        ("not_ready", "warning", ["redis", "coordinator", "dispatcher", "shards", "workers"])]


def test_readyz_turns_unhealthy_when_the_coordinators_heartbeat_stops_and_healthy_when_it_resumes(loops):
    credits.register_worker("w@host", [WORK_QUEUE, SYSTEM_QUEUE, RESULTS_QUEUE], 2)
    wait_for(lambda: ready()[0] == 200, what="both loops beating")
    loops.clear()  # the coordinator's next pass hangs: it beats no more, though its thread lives
    _status, body = wait_for(lambda: (found := ready())[0] == 503 and found, what="the stale coordinator")
    assert not body["checks"]["coordinator"]["ok"]
    assert body["checks"]["dispatcher"]["ok"]
    assert "no coordinator beat in the last 2.5 s" in body["checks"]["coordinator"]["error"]
    loops.set()
    wait_for(lambda: ready()[0] == 200, what="the coordinator beating again")


def test_a_coordinator_whose_passes_fail_stops_beating(settings, redis_client, monkeypatch):
    failed: list[int] = []

    def broken(**kwargs: Any) -> int:
        failed.append(1)
        raise RuntimeError("the database went away")

    monkeypatch.setattr("scheduling.coordinator.loop.reconcile_all", broken)
    coordinator = Coordinator(interval_s=0.01, reconcile_every_s=0)  # every pass reconciles, and fails
    stop = threading.Event()
    thread = loop_thread(coordinator.run_forever, stop)
    try:
        wait_for(lambda: len(failed) >= 3, what="three failed passes")
        assert heartbeats.ages(heartbeats.COORDINATOR) == {}
    finally:
        stop.set()
        thread.join(10)


def test_a_stopping_loop_withdraws_its_heartbeat(redis_client):
    stop = threading.Event()
    thread = loop_thread(Dispatcher().run_forever, stop)
    wait_for(lambda: heartbeats.ages(heartbeats.DISPATCHER), what="the dispatcher's first beat")
    stop.set()
    thread.join(10)
    assert heartbeats.ages(heartbeats.DISPATCHER) == {}


# --- the supervisor restarts a stale loop ------------------------------------------------------


def test_up_restarts_a_living_child_whose_heartbeat_went_stale(settings, redis_client, tmp_path: Path):
    settings.DUCTOR_HEARTBEAT_STALE_S = 0.5
    said: list[str] = []
    stack = Stack(tmp_path, say=said.append)
    try:
        stuck = stack.start("coordinator", [sys.executable, "-c", "import time; time.sleep(120)"])
        beating = stack.start("dispatcher-1", [sys.executable, "-c", "import time; time.sleep(120)"])
        watch = HeartbeatWatch(stack, [(stuck, heartbeats.COORDINATOR), (beating, heartbeats.DISPATCHER)])
        first_pid = stuck.proc.pid
        wait_for(lambda: time.monotonic() - max(stuck.started_at, beating.started_at) > 0.5,
                 what="both children older than the stale bound")
        heartbeats.beat(heartbeats.DISPATCHER, stack.process_name("dispatcher-1"))  # it beat just now
        watch.check()  # the coordinator never beat since its start, more than the bound ago
        assert (stuck.restarts, beating.restarts) == (1, 0)
        assert stuck.alive()
        assert stuck.proc.pid != first_pid
        [restart] = said
        assert restart.startswith("coordinator has not beaten for ")
        assert restart.endswith(f" s; restarting it (restart #1, log: {stuck.log_path})")
        watch.check()
        assert stuck.restarts == 1  # judged from its restart again: not restarted at once
    finally:
        stack.stop_all(grace_s=2)


def test_up_restarts_the_stale_loops_it_finds_together_within_one_grace_period(settings, redis_client,
                                                                               tmp_path: Path, monkeypatch):
    """Two stuck loops that ignore their SIGTERM (as a stopped or wedged process does): both are told to
    stop before either is waited for, so the supervisor is held one grace period, not one each."""
    from ductor_project.management.commands import up

    settings.DUCTOR_HEARTBEAT_STALE_S = 0.5
    monkeypatch.setattr(up, "STALE_GRACE_S", 1.0)
    said: list[str] = []
    stack = Stack(tmp_path, say=said.append)
    deaf = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                  "print('deaf', flush=True); time.sleep(120)"]
    try:
        loops = [stack.start(name, deaf, ready_text="deaf") for name in ("dispatcher-1", "dispatcher-2")]
        stack.wait_ready(*loops)
        watch = HeartbeatWatch(stack, [(loop, heartbeats.DISPATCHER) for loop in loops])
        wait_for(lambda: time.monotonic() - max(loop.started_at for loop in loops) > 0.5,
                 what="both loops older than the stale bound")
        watch.check()
        assert [loop.restarts for loop in loops] == [1, 1]
        assert all(loop.alive() for loop in loops)
        assert [line.split(" ")[0] for line in said] == ["dispatcher-1", "dispatcher-2", "dispatcher-1", "dispatcher-2"]
        assert all("restarting it" in line for line in said[:2])  # both told before either is waited for
        assert all(line.endswith("did not stop in time; killing it") for line in said[2:])
    finally:
        stack.stop_all(grace_s=2)


def test_up_judges_no_child_by_a_redis_outage_in_which_none_could_beat(settings, redis_client, tmp_path: Path,
                                                                         monkeypatch):
    settings.DUCTOR_HEARTBEAT_STALE_S = 0.5
    stack = Stack(tmp_path, say=lambda line: None)
    try:
        loop = stack.start("coordinator", [sys.executable, "-c", "import time; time.sleep(120)"])
        watch = HeartbeatWatch(stack, [(loop, heartbeats.COORDINATOR)])
        heartbeats.beat(heartbeats.COORDINATOR, stack.process_name("coordinator"))
        watch.check()
        real_ages = heartbeats.ages

        def unreadable(kind: str) -> dict[str, float]:
            raise ConnectionError("Redis is away")

        monkeypatch.setattr(heartbeats, "ages", unreadable)
        watch.check()  # not judged while Redis is away
        heartbeats.forget(heartbeats.COORDINATOR, stack.process_name("coordinator"))  # its beat lost with Redis
        wait_for(lambda: time.monotonic() - loop.started_at > 1.0, what="an outage longer than the stale bound")
        monkeypatch.setattr(heartbeats, "ages", real_ages)
        watch.check()  # back: judged from now, not from its last beat before the outage
        assert loop.restarts == 0
        wait_for(lambda: (watch.check(), loop.restarts)[1] == 1, what="a restart once it stays silent")
    finally:
        stack.stop_all(grace_s=2)


def test_the_breaker_gauges_count_breakers_that_opened_and_forget_those_closed_again(fresh_metrics, tenant_a,
                                                                                     tenant_b):
    fresh_metrics.DUCTOR_BREAKER_FAILURES = 1
    for tenant in (tenant_a[0], tenant_b[0]):
        with tenant_context(tenant):
            record_failure("conn-1")  # the same connection id in two tenants: two breakers
    assert value(scrape(), "ductor_breakers", state="open") == 2
    with tenant_context(tenant_a[0]):
        record_success("conn-1")
    samples = scrape()
    assert (value(samples, "ductor_breakers", state="open"), value(samples, "ductor_breakers", state="half_open")) == (
        1, 0)
    assert value(samples, "ductor_breaker_opened_total") >= 2
