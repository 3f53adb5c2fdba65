"""Celery's Redis transport (kombu's), with one Redis client per channel for its commands.

kombu's Redis channel builds a new ``redis.Redis`` for each publish and, with late acks,
for each message a worker receives and each ack (``Channel.conn_or_acquire``); with
redis-py 8 one costs about 0.1 ms of CPU (it copies its response callbacks), about 0.3 ms
per Celery message in all. This channel keeps one, on the channel's own connection pool
(a client is safe to share: each command takes a connection from the pool; a new pool
gets a new client). ``for_url`` names it for a ``redis://`` or ``rediss://`` broker;
a Sentinel or an AMQP broker keeps kombu's own transport.

Its acks are not emulated (``ack_emulation``): kombu's emulation keeps every message a worker
holds in an ``unacked`` hash, two round trips more per message (about 0.6 ms of the worker's
CPU), to redeliver it after an hour's visibility timeout should its worker vanish. Ductor does
not need it: the fair queue's lease brings back an item whose worker died, and a step's timeout
a task node's outcome. A worker still requeues a message it holds when its pool process dies
(``reject_on_worker_lost``) and when it shuts down (kombu keeps them in memory), flagged as
redelivered as the emulation flags them: a redelivered message makes the worker check the
item's lease. ``CELERY_BROKER_TRANSPORT_OPTIONS='{"ack_emulation": true}'`` turns it back on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis


class Channel(redis.Channel):
    ack_emulation = False
    _command_client: Any = None

    def _restore(self, message: Any, leftmost: bool = False) -> None:
        """Put a message this worker held back on its queue, flagged as redelivered where a worker
        reads the flag (kombu's restore without emulation flags it where none does)."""
        if self.ack_emulation:
            super()._restore(message, leftmost)  # type: ignore[call-arg]  # the stubs miss kombu's Redis override
            return
        info = message.delivery_info
        with self.conn_or_acquire() as client, client.pipeline() as pipe:
            self._do_restore_message(  # type: ignore[attr-defined]  # kombu's, as its emulated restore calls it
                message.serializable(), info["exchange"], info["routing_key"], pipe, leftmost)
            pipe.execute()

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
