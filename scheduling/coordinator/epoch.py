"""Noticing that Redis lost its data: the epoch keys, and the server's run id.

Every shard holds an epoch key that the coordinator writes when it finds it
missing. A missing key means that shard's data is gone: a ``FLUSHALL``, a
restart without persistence, a failover to an empty replica, or the very
first start. A changed server run id means a restart, which may have lost the
writes of its last moments even with persistence. Either way the coordinator
repairs everything at once (``reconcile_all(full=True)``), instead of waiting
for the runs to look stale.

The run id is read per shard, from the server that holds the shard's epoch key:
on a Redis Cluster each primary answers for its own shards, so a failover that
promoted a replica (a new run id, maybe without the last writes) is noticed for
the shards that primary serves; behind Sentinel, the new primary is a new server.
"""

from __future__ import annotations

import uuid
from typing import Any

import structlog

from ductor_project.core.keys import global_redis_key, queue_shards
from ductor_project.core.redis import per_node

log = structlog.get_logger(__name__)


def epoch_key(shard: int) -> str:
    return global_redis_key("epoch", shard=shard)


class RedisWatch:
    """Says, on each ``lost()``, whether Redis lost data since the last repair. One round trip per
    Redis server (each primary of a cluster).

    A loss is owed until ``repaired()`` is called: a pass that found it and then failed (a node
    still away, PostgreSQL away during the repair) does not make the next pass forget it.

    Every epoch missing at this process's first look is a first start as much as a loss: it is
    told (``redis_data_lost``, a warning) only if the repair then finds something lost, and is
    otherwise ``redis_epoch_set`` (info), so a fresh install does not start with a false alarm.
    """

    def __init__(self) -> None:
        self._servers: dict[int, str] = {}  # shard -> the run id of the server that held it last time
        self._owed = False
        self._untold: dict[str, Any] | None = None  # a first look's empty Redis, told after its repair

    def repaired(self, count: int = 0) -> None:
        """Everything was repaired since the last ``lost()`` that said so; ``count``: what that fixed."""
        if self._untold is not None:
            if count:
                log.warning("redis_data_lost", **self._untold, repaired=count)
            else:
                log.info("redis_epoch_set", shards=self._untold["shards_without_epoch"])
            self._untold = None
        self._owed = False

    def lost(self) -> bool:
        epoch = uuid.uuid4().hex
        created: dict[int, bool] = {}
        restarted = False

        def look(server: Any, shards: list[int]) -> None:
            nonlocal restarted
            with server.pipeline(transaction=False) as pipe:
                for shard in shards:
                    pipe.set(epoch_key(shard), epoch, nx=True)
                pipe.info("server")
                *new, info = pipe.execute()
            created.update(zip(shards, (bool(n) for n in new), strict=True))
            run_id = _run_id(info)
            for shard in shards:
                before = self._servers.get(shard)
                restarted |= before is not None and run_id is not None and run_id != before
                if run_id is not None:
                    self._servers[shard] = run_id

        first_look = not self._servers
        shards = queue_shards()
        try:  # one key per shard, in order: a key's position is its shard
            per_node([epoch_key(shard) for shard in shards], look)
        finally:  # what the servers that answered said is kept, whether the others did or not
            emptied = sorted(shard for shard, new in created.items() if new)
            if emptied or restarted:
                noticed = {"shards_without_epoch": emptied, "restarted": restarted}
                if first_look and not restarted and len(emptied) == len(shards):
                    self._untold = noticed
                else:
                    log.warning("redis_data_lost", **noticed)
                self._owed = True
        return self._owed


def _run_id(info: Any) -> str | None:
    """The server's run id from ``INFO server`` (None if it gives none)."""
    run_id = info.get("run_id") if isinstance(info, dict) else None
    return str(run_id) if run_id else None
