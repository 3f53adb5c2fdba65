"""Both Redis roles through a Sentinel and over TLS, on real servers: Ductor's queue client, the
Django cache, and Celery (a Ductor item from the fair queue through the broker to a real worker,
and its ack back).

The Sentinel (``redis-server --sentinel``, the embedded binary) watches an embedded Redis of this
module's own (the primary), so whatever lands there came through the Sentinel's answer. The
embedded server has no TLS built in: a proxy that terminates TLS with a certificate of a test
authority sits in front of the primary, and of each node of a Redis Cluster whose nodes announce
the proxies' ports (``rediss+cluster://``). Every client verifies the certificate; one without the
authority is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from django.core.cache import cache
from redis.sentinel import SentinelConnectionPool

from ductor_project import embedded, redis_cluster
from ductor_project.core import redis_urls
from ductor_project.core.context import no_tenant
from ductor_project.core.keys import global_key, redis_key
from ductor_project.core.redis import get_redis, is_cluster
from scheduling import fair_queue as fq
from tenants.models import Tenant
from tests.conftest import service_env, service_stack
from tests.redis_servers import SERVICE, Certificates, TlsProxy, certificates, sentinel
from tests.scheduling.test_broker import HANDLERS, enqueue
from tests.waiting import wait_for

ROLE_SETTINGS = ("DUCTOR_QUEUE_REDIS_URL", "CACHE_REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND")


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    """An embedded Redis of this module's own; a client of it (flushed by each test that uses it)."""
    directory = tmp_path_factory.mktemp("primary")
    state = embedded.ensure_running(directory, postgres=False, redis=True)
    try:
        yield redis.Redis(port=state.redis_port)
    finally:
        embedded.stop(directory)


@pytest.fixture
def direct(primary: redis.Redis) -> redis.Redis:
    primary.flushdb()
    return primary


@pytest.fixture(scope="module")
def sentinel_url(primary: redis.Redis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with sentinel(tmp_path_factory.mktemp("sentinel"), primary.connection_pool.connection_kwargs["port"]) as port:
        yield f"redis+sentinel://127.0.0.1:{port}/{SERVICE}/0"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return certificates(tmp_path_factory.mktemp("tls"))


def verified(certs: Certificates) -> str:
    return f"ssl_cert_reqs=required&ssl_ca_certs={quote(str(certs.ca), safe='')}"


@pytest.fixture(scope="module")
def tls_url(primary: redis.Redis, certs: Certificates) -> Iterator[str]:
    proxy = TlsProxy(primary.connection_pool.connection_kwargs["port"], certs)
    try:
        yield f"rediss://127.0.0.1:{proxy.port}/0?{verified(certs)}"
    finally:
        proxy.stop()


def enqueue_and_dequeue(tenant: Tenant, direct: redis.Redis) -> None:
    """An item of ``tenant`` through the queue client: it lands on ``direct``'s server, is
    dispatched, and its ack deletes it there."""
    fq.enqueue("x", tier="standard", partition="p", payload={}, tenant=tenant)
    items = redis_key("fq", "items", tenant=tenant)
    assert direct.hexists(items, "x")
    with no_tenant():
        item = fq.dequeue(lease_ms=30_000)
    assert item is not None
    assert (item.tenant_id, item.item_id) == (str(tenant.pk), "x")
    assert fq.ack("x", delivery=item.delivery, tenant=tenant) is True
    assert not direct.hexists(items, "x")


def cache_round_trip(url: str, direct: redis.Redis, settings: Any) -> None:
    """The Django cache as the settings make it of ``url``: a value set is got back, and was
    stored on ``direct``'s server."""
    config = redis_urls.django_cache_config(url, setting="CACHE_REDIS_URL")
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": config.location,
                                   "OPTIONS": config.options}}
    cache.set(global_key("roles"), {"via": url}, timeout=60)
    assert cache.get(global_key("roles")) == {"via": url}
    assert [key for key in direct.keys("*") if key.endswith(b"g:roles")]


def ductor_round_trip(url: str, direct: redis.Redis, tenant: Tenant, settings: Any) -> None:
    """A real worker and dispatcher with every Redis role on ``url`` (``REDIS_URL``): three items
    enqueued there go through Celery to the worker, run in their tenant, and are acked."""
    env = {name: value for name, value in service_env().items() if name not in ROLE_SETTINGS}
    env["REDIS_URL"] = url
    stack = service_stack()
    try:
        worker = stack.worker("worker", concurrency=1, hostname=f"roles-{os.getpid()}@localhost", env=env,
                              extra=["--pool", "prefork", "--without-heartbeat", *HANDLERS])
        dispatcher = stack.dispatcher(env=env)
        stack.wait_ready(worker, dispatcher, timeout_s=60)
        settings.DUCTOR_QUEUE_REDIS_URL = url
        enqueue(tenant, 3, kind="test.ran", partitions=3)
        ran = redis_key("test", "ran", tenant=tenant)
        wait_for(lambda: direct.get(ran) == b"3", timeout=30, what="the three items to run on the worker")
        wait_for(lambda: (s := fq.stats(tenant)).backlog == s.in_flight == 0, what="their acks")
    finally:
        stack.stop_all(grace_s=20)


def test_a_queue_redis_that_cannot_be_reached_answers_503_and_is_tried_again_on_the_next_request(
    tenant_a, client_a, settings
):
    nowhere = redis_cluster.free_ports(2)
    settings.DUCTOR_QUEUE_REDIS_URL = f"redis+cluster://127.0.0.1:{nowhere[0]},127.0.0.1:{nowhere[1]}"
    for _ in range(2):
        response = client_a.get("/api/v1/queue")
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "service_unavailable"
        assert response["Retry-After"] == "5"


# -- Sentinel ------------------------------------------------------------------------------------


def test_through_a_sentinel_the_queue_client_enqueues_and_dequeues_on_the_primary_it_names(
    sentinel_url, direct, make_tenant, tenants_on_shard, settings
):
    settings.DUCTOR_QUEUE_REDIS_URL = sentinel_url
    assert isinstance(get_redis().connection_pool, SentinelConnectionPool)
    enqueue_and_dequeue(make_tenant("via-sentinel")[0], direct)


def test_through_a_sentinel_the_cache_sets_and_gets_on_the_primary(sentinel_url, direct, settings):
    cache_round_trip(sentinel_url, direct, settings)


@pytest.mark.worker
def test_through_a_sentinel_an_item_goes_through_celery_to_a_real_worker_and_is_acked(
    sentinel_url, direct, make_tenant, tenants_on_shard, transactional_db, settings
):
    ductor_round_trip(sentinel_url, direct, make_tenant("sentinel-trip")[0], settings)


# -- TLS -----------------------------------------------------------------------------------------


def test_over_tls_the_queue_client_verifies_the_server_and_enqueues_and_dequeues(
    tls_url, direct, make_tenant, tenants_on_shard, settings
):
    settings.DUCTOR_QUEUE_REDIS_URL = tls_url
    enqueue_and_dequeue(make_tenant("via-tls")[0], direct)


def test_over_tls_a_client_without_the_authority_is_refused(tls_url):
    without_ca = tls_url.split("?")[0]
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        redis_urls.parse(without_ca, setting="DUCTOR_QUEUE_REDIS_URL").client().ping()
    assert redis_urls.parse(tls_url, setting="DUCTOR_QUEUE_REDIS_URL").client().ping() is True


def test_over_tls_the_cache_sets_and_gets(tls_url, direct, settings):
    cache_round_trip(tls_url, direct, settings)


@pytest.mark.worker
def test_over_tls_an_item_goes_through_celery_to_a_real_worker_and_is_acked(
    tls_url, direct, make_tenant, tenants_on_shard, transactional_db, settings
):
    ductor_round_trip(tls_url, direct, make_tenant("tls-trip")[0], settings)


@pytest.fixture
def tls_cluster(tmp_path: Path, certs: Certificates) -> Iterator[redis_cluster.ClusterState]:
    """A three-master cluster whose nodes announce the ports of TLS proxies in front of them."""
    nodes = redis_cluster.free_ports(3)
    proxies = [TlsProxy(node, certs) for node in nodes]  # they connect to a node once a client comes
    try:
        state = redis_cluster.start(tmp_path / "cluster", ports=nodes, announced=[p.port for p in proxies])
        yield state
    finally:
        redis_cluster.stop(tmp_path / "cluster")
        for proxy in proxies:
            proxy.stop()


def test_over_tls_a_cluster_client_reaches_every_node_through_its_proxy(
    tls_cluster, certs, make_tenant, tenants_on_shard: Callable[[int], None], settings
):
    url = tls_cluster.url(tls=True, options=verified(certs))
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):  # without the authority
        redis_urls.parse(tls_cluster.url(tls=True), setting="DUCTOR_QUEUE_REDIS_URL").client()
    settings.DUCTOR_QUEUE_REDIS_URL = url
    settings.DUCTOR_QUEUE_SHARDS = 6
    client = get_redis()
    assert is_cluster(client)
    assert sorted(node.port for node in client.get_primaries()) == sorted(tls_cluster.announced)
    for shard in range(settings.DUCTOR_QUEUE_SHARDS):  # every shard, so every node
        tenants_on_shard(shard)
        tenant = make_tenant(f"tls-s{shard}")[0]
        fq.enqueue("x", tier="standard", partition="p", payload={}, tenant=tenant)
        with no_tenant():
            item = fq.dequeue(shard=shard, lease_ms=30_000)
        assert item is not None
        assert item.tenant_id == str(tenant.pk)
        assert fq.ack("x", delivery=item.delivery, tenant=tenant) is True
