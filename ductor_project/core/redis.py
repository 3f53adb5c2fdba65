"""The one raw Redis client of the process: Ductor's own Redis state.

The fair queue, the capacity counters, the limiters, the breakers, the dispatch credits, the
heartbeats, the epoch keys and the quota flag live on ``DUCTOR_QUEUE_REDIS_URL`` (default
``REDIS_URL``): one server, a Redis Cluster or a Sentinel setup (``redis_urls``). When that is
the Django cache's own plain Redis, the client shares django-redis's connection pool; otherwise
the process has a client of its own, made on first use. Raw clients ignore Django's cache key
function, so every key passed to them must come from ``ductor_project.core.keys``.

On a cluster every call keeps to one hash slot (the keys' ``{s<n>}`` tags). Two things need
more than the cluster client: commands that name no key but must run where a key lives
(``TIME`` beside the scripts' own clock, ``INFO`` of the server that holds a shard), and
pipelines of scripts, which redis-py's cluster pipeline refuses. ``on_node`` and ``per_node``
send those to the server that holds the keys, on its own connection; a failed node or a
redirection there makes the cluster client read the cluster's layout again.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.conf import settings
from django_redis import get_redis_connection
from redis import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ductor_project.core import redis_urls

T = TypeVar("T")

# A node's answer that the cluster's layout changed under the client (a failover, a slot that moved).
REDIRECTED = (MovedError, AskError, TryAgainError, ClusterDownError)
_NODE_FAILED = (RedisConnectionError, RedisTimeoutError, *REDIRECTED)

_clients: dict[str, Any] = {}
_lock = threading.Lock()


def get_redis() -> Any:
    """The process-wide client of ``DUCTOR_QUEUE_REDIS_URL``: a ``redis.Redis`` (also for a
    Sentinel setup: its primary's) or a ``redis.RedisCluster``. Thread-safe, pooled; made once
    per URL."""
    url = settings.DUCTOR_QUEUE_REDIS_URL
    client = _clients.get(url)
    if client is None:
        with _lock:
            client = _clients.get(url)
            if client is None:
                client = _clients[url] = _connect(url)
    return client


def _connect(url: str) -> Any:
    cache: dict[str, Any] = settings.CACHES["default"]
    if url == cache["LOCATION"] and cache["OPTIONS"].get("CLIENT_CLASS") == redis_urls.DEFAULT_CACHE_CLIENT:
        return get_redis_connection("default")
    return redis_urls.parse(url, setting="DUCTOR_QUEUE_REDIS_URL").client()


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def per_node(keys: Sequence[str], work: Callable[[Any, list[int]], T]) -> list[T]:
    """``work(server, positions)`` once per server that holds some of ``keys``, with that server's
    client and the positions of its keys in ``keys``, in the order of each server's first key;
    their results in that order. One call with ``get_redis()`` and every position unless it is a
    cluster. A node that failed or redirected makes the cluster client read the layout again
    before the error propagates."""
    client = get_redis()
    if not is_cluster(client):
        return [work(client, list(range(len(keys))))]
    groups: dict[str, tuple[Any, list[int]]] = {}
    for position, key in enumerate(keys):
        node = client.get_node_from_key(key)
        groups.setdefault(node.name, (node, []))[1].append(position)
    results = []
    for node, positions in groups.values():
        try:
            results.append(work(client.get_redis_connection(node), positions))
        except _NODE_FAILED:
            relearn_layout(client)
            raise
    return results


def on_node(key: str, work: Callable[[Any], T]) -> T:
    """``work(server)`` with the client of the server that holds ``key`` (see ``per_node``)."""
    return per_node([key], lambda server, _: work(server))[0]


def relearn_layout(client: Any) -> None:
    """Have a cluster client read which node serves which slot again (a no-op for one server);
    a cluster that cannot be reached now is read on the next command instead."""
    if is_cluster(client):
        with contextlib.suppress(RedisError):
            client.nodes_manager.initialize()


def ping() -> bool:
    """Every server of the client answers ``PING`` (each primary of a cluster). Raises if one does not."""
    client = get_redis()
    if is_cluster(client):
        # Each through its own connection, tried once: the cluster client tries a node that does not
        # answer again and again (its retries, with backoffs), minutes where a health check gives up
        # after one timeout.
        return all(client.get_redis_connection(node).ping() for node in client.get_primaries())
    return bool(client.ping())
