"""Erasing a deleted tenant's Redis state: its fair queue, counters, limiters, breakers and cache.

A tenant's queue state may sit in more than one shard (a move killed half-way leaves keys in two),
so every served shard is cleaned: the fence step of a move (``reshard_out.lua``, atomic in the
shard's slot) takes the tenant out of the shard's cross-tenant indexes (ready, timers, parked,
finish tags, in flight, queue-share waits and slots, backlog), then every key under its prefix goes,
the fence with them. Its fields of the shard map (a pin, a move), its entries in the breakers' index
and its Django cache entries (of every cache version) go too. The per-minute work buckets, which name
it, expire on their own.

Run only for a tenant being deleted, once its rows are gone: nothing of it is dispatched any more
(the queue holds it as suspended) and nothing is left to enqueue its work again. Idempotent.
"""

from __future__ import annotations

from typing import Any, cast

from django.core.cache import cache

from ductor_project.core.context import TenantLike, id_text, tenant_context
from ductor_project.core.keys import (
    MOVE,
    PIN,
    fence_key,
    queue_shards,
    read_shard_map,
    shard_map_key,
)
from ductor_project.core.redis import get_redis
from scheduling import circuit, fair_queue
from scheduling.coordinator.wakeups import withdraw_tenant_wakeups
from scheduling.resharding import delete_tenant_keys


def erase_tenant_state(tenant: TenantLike) -> int:
    """Remove every Redis key and index entry of ``tenant``, in every served shard; how many keys.
    Idempotent: a second call finds nothing."""
    tenant_id = id_text(tenant)
    erased = withdraw_tenant_wakeups(tenant_id)
    erased += sum(_erase_in_shard(tenant_id, shard) for shard in queue_shards())
    _forget_in_shard_map(tenant_id)
    circuit.forget_tenant(tenant_id)
    with tenant_context(tenant):
        # django-redis's; the cache's key function makes the pattern t:<tenant>:*, in each version the
        # cache has had (an earlier one's entries, some kept for ever, name the tenant too).
        erased += sum(int(cast(Any, cache).delete_pattern("*", version=version) or 0)
                      for version in range(1, cast(Any, cache).version + 1))
    return erased


def _erase_in_shard(tenant_id: str, shard: int) -> int:
    fence = fence_key(tenant_id, shard)
    redis = get_redis()
    if redis.get(fence) is None:
        fair_queue.shard_script("reshard_out", shard, [fence], [tenant_id])
    erased = delete_tenant_keys(tenant_id, shard)
    return erased + int(redis.delete(fence))


def _forget_in_shard_map(tenant_id: str) -> None:
    current = read_shard_map()
    fields = [name + tenant_id for name, known in ((PIN, current.pins), (MOVE, current.moves)) if tenant_id in known]
    if fields:
        get_redis().hdel(shard_map_key(), *fields)
        read_shard_map()
