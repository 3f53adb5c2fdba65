"""The Redis URLs Ductor reads, parsed in one place: one server, a Redis Cluster, or a Sentinel setup.

The forms (``docs/configuration.md``, "Redis URLs"):

- ``redis://[[user]:password@]host[:port][/db][?options]``, ``rediss://…`` (TLS) and
  ``unix://[[user]:password@]/path/to.sock[?db=n&options]``: one server, as redis-py, kombu and
  django-redis read them. ``options`` are redis-py's URL options (``ssl_ca_certs``,
  ``ssl_cert_reqs``, ``socket_timeout`` …).
- ``redis+cluster://[[user]:password@]host:port[,host:port…][?options]`` and
  ``rediss+cluster://…``: a Redis Cluster, named by some of its nodes (redis-py's ``RedisCluster``
  learns the others from them). A cluster has one database, 0.
- ``redis+sentinel://[[user]:password@]host:port[,host:port…]/service[/db][?options]``: the
  primary that these Sentinels name ``service`` (redis-py's ``Sentinel.master_for``). The
  credentials and ``options`` are the primary's; ``sentinel_username`` and ``sentinel_password``
  among the options are the Sentinels' own. The same hosts, service and database make kombu's
  form (``sentinel://host:port/db;sentinel://…`` with the transport option ``master_name``) and
  django-redis's (``redis://service/db`` with its Sentinel client), which ``kombu_config`` and
  ``django_cache_config`` build.

Nothing here connects anywhere but ``RedisUrl.client()``. A URL that is not one of these, or
carries a bad option, is refused with a ``RedisUrlError`` that names the setting it came from.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from django.core.exceptions import ImproperlyConfigured
from redis import Redis, RedisCluster
from redis.cluster import ClusterNode
from redis.connection import parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.sentinel import Sentinel


class RedisUrlError(ImproperlyConfigured):
    """A Redis URL of the settings that Ductor cannot use; the message names the setting."""


class Form(enum.StrEnum):
    SERVER = "server"
    CLUSTER = "cluster"
    SENTINEL = "sentinel"


# scheme -> (form, TLS)
SCHEMES = {
    "redis": (Form.SERVER, False),
    "rediss": (Form.SERVER, True),
    "unix": (Form.SERVER, False),
    "redis+cluster": (Form.CLUSTER, False),
    "rediss+cluster": (Form.CLUSTER, True),
    "redis+sentinel": (Form.SENTINEL, False),
}
DEFAULT_PORTS = {Form.SERVER: 6379, Form.CLUSTER: 6379, Form.SENTINEL: 26379}
# Options of the Sentinels' own connections (the other options are the primary's).
SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")
DEFAULT_CACHE_CLIENT = "django_redis.client.DefaultClient"
# How long a call waits on a server that stopped answering (paused, behind a network partition)
# before it fails as unreachable (``redis.TimeoutError``: the API's ``503``), where redis-py would
# wait forever and hold the request's thread: longer than any blocking wait Ductor makes
# (``fair_queue.layout.MAX_WAIT_S``, 2 s). A URL's own ``socket_timeout`` and
# ``socket_connect_timeout``, and ``CACHE_OPTIONS``, win.
SOCKET_TIMEOUTS: dict[str, Any] = {"socket_timeout": 10.0, "socket_connect_timeout": 5.0}
SENTINEL_CACHE_CLIENT = "django_redis.client.SentinelClient"
SENTINEL_CACHE_FACTORY = "django_redis.pool.SentinelConnectionFactory"
_DATABASE = re.compile(r"/?(\d*)")


@dataclass(frozen=True)
class RedisUrl:
    """A parsed Redis URL. ``hosts`` are a cluster's startup nodes or the Sentinels (empty for one
    server, whose ``url`` redis-py reads as it is); ``options`` are the URL's query options."""

    url: str
    form: Form
    tls: bool
    hosts: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str = ""
    password: str = ""
    options: tuple[tuple[str, str], ...] = ()

    def client(self) -> Any:
        """A new redis-py client: ``Redis``, ``RedisCluster``, or the ``Redis`` of the primary that
        the Sentinels name (it finds the new primary after a failover). Connects lazily, except
        that a cluster client reads the cluster's layout from its nodes at once: a
        ``redis.ConnectionError`` when none of them answers."""
        if self.form is Form.SERVER:
            return Redis.from_url(self.url, **SOCKET_TIMEOUTS)  # the URL's options win
        if self.form is Form.CLUSTER:
            (host, port), *others = self.hosts
            try:
                return RedisCluster(url=self._node_url(host, port),
                                    startup_nodes=[ClusterNode(h, p) for h, p in others], **SOCKET_TIMEOUTS)
            except RedisClusterException as exc:  # as a lost server is: unavailable, not a bug
                raise RedisConnectionError(f"no node of the Redis Cluster answered: {exc}") from exc
        kwargs = self._connection_kwargs()
        return Sentinel(list(self.hosts), sentinel_kwargs=self._sentinel_kwargs(kwargs), **kwargs).master_for(
            self.service)

    def _node_url(self, host: str, port: int, options: tuple[tuple[str, str], ...] | None = None) -> str:
        """A one-server URL of this one's scheme family, credentials and ``options``."""
        scheme = "rediss" if self.tls else "redis"
        query = urlencode(self.options if options is None else options)
        return f"{scheme}://{self._userinfo()}{_address(host, port)}" + (f"?{query}" if query else "")

    def _userinfo(self) -> str:
        if not (self.username or self.password):
            return ""
        return f"{quote(self.username, safe='')}:{quote(self.password, safe='')}@"

    def _primary_options(self) -> tuple[tuple[str, str], ...]:
        return tuple((name, value) for name, value in self.options if name not in SENTINEL_OPTIONS)

    def _connection_kwargs(self, *, timeouts: bool = True) -> dict[str, Any]:
        """redis-py's keyword arguments for the primary's connections, from the URL's options (and
        ``SOCKET_TIMEOUTS`` where they name none, for Ductor's own clients: ``timeouts``)."""
        kwargs = {**(SOCKET_TIMEOUTS if timeouts else {}),
                  **parse_url(self._node_url("localhost", 0, self._primary_options()))}
        for name in ("host", "port", "connection_class"):
            kwargs.pop(name, None)
        kwargs["db"] = self.db
        return kwargs

    def _sentinel_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The Sentinels' own connections: the primary's socket options, and their own credentials."""
        own = {name: value for name, value in kwargs.items() if name.startswith("socket_")}
        named = dict(self.options)
        for option, name in zip(SENTINEL_OPTIONS, ("username", "password"), strict=True):
            if option in named:
                own[name] = named[option]
        return own


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def setting_name(name: str) -> str:
    """How a message names the setting ``name`` a Redis URL came from: itself when the environment
    sets it, else REDIS_URL, as its default."""
    return name if os.environ.get(name) else f"REDIS_URL (the default of {name})"


def shown(url: str) -> str:
    """``url`` with its password masked, for messages."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def parse(url: str, *, setting: str) -> RedisUrl:
    """``url`` parsed and checked (options too, as redis-py reads them); a ``RedisUrlError`` naming
    ``setting`` for anything else. Connects to nothing."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in SCHEMES:
        raise RedisUrlError(
            f"{setting} must be a Redis URL ({', '.join(f'{s}://' for s in SCHEMES)}), not {shown(url)!r}")
    form, tls = SCHEMES[scheme]
    try:
        parsed = _parse(url, form, tls)
    except ValueError as exc:
        raise RedisUrlError(f"{setting}: {exc} (in {shown(url)!r})") from None
    return parsed


def _parse(url: str, form: Form, tls: bool) -> RedisUrl:
    parts = urlsplit(url)
    if form is Form.SERVER:
        if parts.scheme != "unix" and not _DATABASE.fullmatch(parts.path):
            raise ValueError(f"the path of a one-server URL is a database number, not {parts.path!r}")
        parse_url(url)  # redis-py's own check of the options
        return RedisUrl(url=url, form=form, tls=tls)
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    hosts = tuple(_host(text, DEFAULT_PORTS[form]) for text in hostlist.split(","))
    options = tuple(parse_qsl(parts.query, keep_blank_values=True))
    service, db = "", 0
    if form is Form.CLUSTER:
        if parts.path not in ("", "/", "/0"):
            raise ValueError(f"a Redis Cluster has one database, 0: drop the path {parts.path!r}")
    else:
        service, _, database = parts.path.strip("/").partition("/")
        if not service or not (database == "" or database.isdigit()):
            raise ValueError("a Sentinel URL names the service, and may name the database: "
                             f"'/<service>[/<db>]', not {parts.path!r}")
        db = int(database or 0)
    parsed = RedisUrl(url=url, form=form, tls=tls, hosts=hosts, service=service, db=db,
                      username=unquote(username), password=unquote(password), options=options)
    parse_url(parsed._node_url(*hosts[0], parsed._primary_options()))  # redis-py's own check of the options
    return parsed


def _host(text: str, default_port: int) -> tuple[str, int]:
    if not text:
        raise ValueError("an empty host in the host list")
    located = urlsplit(f"//{text}")
    if not located.hostname or located.username or located.path:
        raise ValueError(f"{text!r} is not host:port")
    return located.hostname, located.port or default_port  # .port raises ValueError for a bad one


@dataclass(frozen=True)
class CacheConfig:
    """django-redis's ``LOCATION`` and the ``OPTIONS`` that go with it."""

    location: str
    options: dict[str, Any]


def django_cache_config(url: str, *, setting: str) -> CacheConfig:
    """How django-redis reaches ``url``: one server as it is (``DefaultClient``); a Sentinel URL as
    its ``SentinelClient`` and ``SentinelConnectionFactory`` with the Sentinels. A Redis Cluster is
    refused: the Django cache needs one server or a Sentinel setup."""
    parsed = parse(url, setting=setting)
    if parsed.form is Form.SERVER:
        return CacheConfig(url, {"CLIENT_CLASS": DEFAULT_CACHE_CLIENT, **_cache_timeouts()})
    if parsed.form is Form.CLUSTER:
        raise RedisUrlError(f"{setting} names a Redis Cluster ({shown(url)!r}): the Django cache runs on one Redis "
                            "server or a Sentinel setup; put the cluster in DUCTOR_QUEUE_REDIS_URL only")
    query = urlencode(parsed._primary_options())
    location = f"redis://{parsed._userinfo()}{parsed.service}/{parsed.db}" + (f"?{query}" if query else "")
    options: dict[str, Any] = {"CLIENT_CLASS": SENTINEL_CACHE_CLIENT, "CONNECTION_FACTORY": SENTINEL_CACHE_FACTORY,
                               "SENTINELS": list(parsed.hosts), **_cache_timeouts()}
    sentinel_kwargs = parsed._sentinel_kwargs(parsed._connection_kwargs())
    if sentinel_kwargs:
        options["SENTINEL_KWARGS"] = sentinel_kwargs
    return CacheConfig(location, options)


def _cache_timeouts() -> dict[str, Any]:
    """``SOCKET_TIMEOUTS`` in django-redis's terms (the URL's own options win over them)."""
    return {name.upper(): value for name, value in SOCKET_TIMEOUTS.items()}


def kombu_transport(url: str) -> str | None:
    """The transport Celery's broker at ``url`` (as ``kombu_config`` gives it) takes: Ductor's Redis
    transport for one Redis server (``ductor_project/broker_transport.py``), else None, kombu's
    own for the URL's scheme (a Sentinel list, AMQP)."""
    return "ductor_project.broker_transport:Transport" if url.partition("://")[0].lower() in ("redis", "rediss") \
        else None


def kombu_config(url: str, *, setting: str) -> tuple[str, dict[str, Any]]:
    """The URL and transport options that Celery's broker (kombu) and its Redis result backend take
    for ``url``: a Sentinel URL becomes their ``sentinel://host:port/db;sentinel://…`` list with
    ``master_name`` (and the Sentinels' credentials as ``sentinel_kwargs``); any other URL (one Redis
    server, ``sentinel://…``, ``amqp://…``) is theirs, as it is. A Redis Cluster is refused (kombu
    has no Cluster transport), and so are a Sentinel URL's options for the primary, which they
    read from their transport options instead. A one-server URL is parsed too, so that one Celery
    cannot read (a port that is not a number, a path that is not a database) refuses to start."""
    scheme = url.partition("://")[0].lower()
    if scheme not in SCHEMES:
        return url, {}
    parsed = parse(url, setting=setting)
    if parsed.form is Form.SERVER:
        return url, {}
    if parsed.form is Form.CLUSTER:
        # The result backend takes Redis alone; only the broker may be RabbitMQ.
        instead = ("one Redis server or a Sentinel setup" if "CELERY_RESULT_BACKEND" in setting
                   else "one Redis server, a Sentinel setup or RabbitMQ (amqp://)")
        raise RedisUrlError(f"{setting} names a Redis Cluster ({shown(url)!r}): Celery's transport (kombu) has no "
                            f"Redis Cluster support; use {instead}")
    if parsed._primary_options():
        names = ", ".join(sorted({name for name, _ in parsed._primary_options()}))
        raise RedisUrlError(f"{setting}: Celery takes no options in a Sentinel URL ({names}); give them as its "
                            "transport options (CELERY_BROKER_TRANSPORT_OPTIONS, "
                            "CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS)")
    urls = [f"sentinel://{parsed._userinfo()}{_address(host, port)}/{parsed.db}" for host, port in parsed.hosts]
    options: dict[str, Any] = {"master_name": parsed.service}
    sentinel_kwargs = parsed._sentinel_kwargs(parsed._connection_kwargs(timeouts=False))  # kombu's own
    if sentinel_kwargs:
        options["sentinel_kwargs"] = sentinel_kwargs
    return ";".join(urls), options
