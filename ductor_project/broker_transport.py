"""Celery's Redis transport (kombu's), with one Redis client per channel for its commands.

kombu's Redis channel builds a new ``redis.Redis`` for each publish and, with late acks,
for each message a worker receives and each ack (``Channel.conn_or_acquire``); with
redis-py 8 one costs about 0.1 ms of CPU (it copies its response callbacks), about 0.3 ms
per Celery message in all. This channel keeps one, on the channel's own connection pool
(a client is safe to share: each command takes a connection from the pool; a new pool
gets a new client). ``for_url`` names it for a ``redis://`` or ``rediss://`` broker;
a Sentinel or an AMQP broker keeps kombu's own transport.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis


class Channel(redis.Channel):
    _command_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        kept = self._command_client
        if kept is None or kept.connection_pool is not self.pool:
            kept = self._command_client = self._create_client()  # type: ignore[attr-defined]
        yield kept


class Transport(redis.Transport):
    Channel = Channel
