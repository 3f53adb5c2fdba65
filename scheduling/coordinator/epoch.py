"""Noticing that Redis lost its data: the epoch keys, and the server's run id.

Every shard holds an epoch key that the coordinator writes when it finds it
missing. A missing key means that shard's data is gone: a ``FLUSHALL``, a
restart without persistence, a failover to an empty replica, or the very
first start. A changed server run id means a restart, which may have lost the
writes of its last moments even with persistence. Either way the coordinator
repairs everything at once (``reconcile_all(full=True)``), instead of waiting
for the runs to look stale.
"""

from __future__ import annotations

import uuid
from typing import Any

import structlog
from django.conf import settings

from ductor_project.core.keys import global_redis_key
from ductor_project.core.redis import get_redis

log = structlog.get_logger(__name__)


def epoch_key(shard: int) -> str:
    return global_redis_key("epoch", shard=shard)


class RedisWatch:
    """Says, on each ``lost()``, whether Redis lost data since the last look. One round trip."""

    def __init__(self) -> None:
        self._server: str | None = None

    def lost(self) -> bool:
        epoch = uuid.uuid4().hex
        with get_redis().pipeline(transaction=False) as pipe:
            for shard in range(settings.DUCTOR_QUEUE_SHARDS):
                pipe.set(epoch_key(shard), epoch, nx=True)
            pipe.info("server")
            *created, info = pipe.execute()
        server = _run_id(info)
        restarted = self._server is not None and server is not None and server != self._server
        self._server = server or self._server
        emptied = [shard for shard, new in enumerate(created) if new]
        if emptied or restarted:
            log.warning("redis_data_lost", shards_without_epoch=emptied, restarted=restarted)
        return bool(emptied) or restarted


def _run_id(info: Any) -> str | None:
    """The server's run id from ``INFO server`` (None where the client merges several servers')."""
    run_id = info.get("run_id") if isinstance(info, dict) else None
    return str(run_id) if run_id else None
