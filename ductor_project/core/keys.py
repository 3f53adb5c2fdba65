"""The one place that builds cache and Redis keys.

Every key of tenant data starts with ``t:<tenant_id>:``; Redis keys also carry
the hash tag of the tenant's fair-queue shard (``{s<n>}``), so that the Lua
scripts of one tenant touch a single Redis Cluster slot. Building a tenant key
with no tenant in context raises ``TenantScopeError``.

Global keys (cross-tenant indexes of the fair queue, the platform's own cache
entries) are built by ``global_key``/``global_redis_key``: the name says out
loud that they cross tenants.

**Which shard.** A tenant's shard is the jump consistent hash of its id over the shard
count in force, unless the shard map pins it elsewhere. The map is one Redis hash
(``shard_map_key``, in shard 0's slot) written only by ``manage.py queue_reshard``:
``count`` (the shard count in force, once a reshard wrote it; until then
``DUCTOR_QUEUE_SHARDS``), ``serve`` (the shards to serve while dropped ones drain),
``pin:<tenant>`` (a tenant's shard where it differs from the hash) and ``move:<tenant>``
(a move in progress). Each process keeps a copy, read again at most every
``SHARD_MAP_EVERY_S`` and at once when a script answers that a tenant moved
(``ductor_project.core.tenant_moves``): no round trip on the path of a call.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import structlog
from django.conf import settings
from redis.exceptions import RedisError

from ductor_project.core.context import TenantLike, TenantScopeError, current_tenant, id_text, peek_tenant
from ductor_project.core.redis import get_redis

log = structlog.get_logger(__name__)

GLOBAL_PREFIX = "g:"
_SEP = ":"


def _tenant_id(tenant: TenantLike | None) -> str:
    return id_text(tenant or current_tenant())


def _join(parts: tuple[Any, ...]) -> str:
    if not parts:
        raise ValueError("a key needs at least one part")
    return _SEP.join(str(part) for part in parts)


def shard_of(tenant_id: str, shards: int | None = None) -> int:
    """The fair-queue shard that holds a tenant's keys: its pin in the shard map, else the jump
    hash of its id over the count in force. With ``shards``, only the hash over that count (what
    a reshard to ``shards`` aims at). No round trip but the map's lazy refresh."""
    if shards is not None:
        return hashed_shard(tenant_id, shards)
    return shard_map().shard_of(tenant_id)


@lru_cache(maxsize=65_536)  # on every tenant-side key's path; a pure function of its arguments
def hashed_shard(tenant_id: str, shards: int) -> int:
    """The jump consistent hash of a tenant id over ``shards``: stable, independent of the process."""
    return _jump_hash(zlib.crc32(tenant_id.encode()), shards)


def _jump_hash(key: int, buckets: int) -> int:
    """Jump consistent hash (Lamping and Veach): few keys move when shards are added."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def shard_tag(shard: int) -> str:
    return "{s" + str(shard) + "}"


def tenant_key(*parts: Any, tenant: TenantLike | None = None) -> str:
    """A cache key of a tenant: ``t:<tenant_id>:<parts>``. Raises without a tenant."""
    return f"t:{_tenant_id(tenant)}:{_join(parts)}"


def tenant_redis_prefix(shard: int) -> str:
    """The start of the Redis key of every tenant of ``shard``: ``{s<shard>}:t:``.

    A tenant's key is this prefix, the tenant id, ``:`` and the parts. Lua scripts
    that read tenant ids from a shard's global indexes (the fair queue's dequeue and
    reaper) build those tenants' keys from it, so the format stays in this module.
    """
    return f"{shard_tag(shard)}:t:"


def redis_key(*parts: Any, tenant: TenantLike | None = None, shard: int | None = None) -> str:
    """A raw Redis key of a tenant: ``{s<shard>}:t:<tenant_id>:<parts>``, in the tenant's shard
    (or in ``shard``: a move copies between shards). Raises without a tenant."""
    tenant_id = _tenant_id(tenant)
    return f"{tenant_shard_prefix(tenant_id, shard_of(tenant_id) if shard is None else shard)}{_join(parts)}"


def tenant_shard_prefix(tenant_id: str, shard: int) -> str:
    """The start of every Redis key of the tenant in ``shard``: ``{s<shard>}:t:<tenant_id>:``.
    A move finds the tenant's keys by it and renames them from one shard's to another's."""
    return f"{tenant_redis_prefix(shard)}{tenant_id}{_SEP}"


def fence_key(tenant_id: str, shard: int) -> str:
    """The tenant's fence in ``shard``: set while its keys move out of that shard ("MOVING"), and
    after ("MOVED <shard>"). Every tenant-side script of the shard reads it first."""
    return f"{tenant_shard_prefix(tenant_id, shard)}moved"


def global_key(*parts: Any) -> str:
    """A cache key that belongs to no tenant. Only for platform-wide data."""
    return GLOBAL_PREFIX + _join(parts)


def global_redis_key(*parts: Any, shard: int = 0) -> str:
    """A raw Redis key that belongs to no tenant, in a shard (cross-tenant indexes)."""
    return f"{shard_tag(shard)}:{GLOBAL_PREFIX}{_join(parts)}"


def shard_map_key() -> str:
    """The shard map's Redis hash (module docstring), in shard 0's slot: it crosses tenants."""
    return global_redis_key("shards")


# How old a process's copy of the shard map may get before a call reads it again.
SHARD_MAP_EVERY_S = 2.0
PIN = "pin:"
MOVE = "move:"


@dataclass(frozen=True)
class ShardMap:
    """What the shard map says (module docstring). ``count`` None: no reshard ever wrote one,
    ``DUCTOR_QUEUE_SHARDS`` is in force."""

    count: int | None = None
    serve: int = 0
    pins: Mapping[str, int] = field(default_factory=dict)
    moves: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Mapping[Any, Any]) -> ShardMap:
        """From the hash's fields as Redis returns them."""
        fields = {_text(name): _text(value) for name, value in raw.items()}
        return cls(
            count=int(fields["count"]) if "count" in fields else None,
            serve=int(fields.get("serve", 0)),
            pins={name[len(PIN):]: int(value) for name, value in fields.items() if name.startswith(PIN)},
            moves={name[len(MOVE):]: value for name, value in fields.items() if name.startswith(MOVE)},
        )

    def in_force(self) -> int:
        """The shard count the unpinned tenants are hashed over."""
        return self.count if self.count is not None else int(settings.DUCTOR_QUEUE_SHARDS)

    def shard_of(self, tenant_id: str) -> int:
        pinned = self.pins.get(tenant_id)
        return pinned if pinned is not None else hashed_shard(tenant_id, self.in_force())

    def shards(self) -> int:
        """How many shards are served: the count in force, and any shard still holding a pinned
        tenant or draining (``serve``)."""
        return max(self.in_force(), self.serve, *(shard + 1 for shard in self.pins.values()))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _ShardMapCopy:
    """The process's copy of the shard map, per Redis URL; read again when older than
    ``SHARD_MAP_EVERY_S``. A read that fails (Redis away) keeps the last copy: the call that
    needed it fails on its own Redis call anyway, or succeeds through the fences."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._copies: dict[str, tuple[float, ShardMap]] = {}
        self._warned: set[int] = set()

    def get(self) -> ShardMap:
        url = settings.DUCTOR_QUEUE_REDIS_URL
        found = self._copies.get(url)
        if found is not None and time.monotonic() - found[0] < SHARD_MAP_EVERY_S:
            return found[1]
        return self.read(url, unless_fresh=True)

    def read(self, url: str | None = None, *, unless_fresh: bool = False) -> ShardMap:
        """Read the map now (one round trip); ``unless_fresh``: unless another thread just did."""
        url = url or settings.DUCTOR_QUEUE_REDIS_URL
        with self._lock:
            found = self._copies.get(url)
            if unless_fresh and found is not None and time.monotonic() - found[0] < SHARD_MAP_EVERY_S:
                return found[1]
            try:
                current = ShardMap.parse(get_redis().hgetall(shard_map_key()))
            except RedisError:
                log.warning("shard_map_unread", exc_info=True)
                current = self._copies.get(url, (0.0, ShardMap()))[1]
            self._copies[url] = (time.monotonic(), current)
        self._warn_if_unlike_settings(current)
        return current

    def hint(self, tenant_id: str, shard: int) -> None:
        """A fence said the tenant moved to ``shard``: believe it until the next read."""
        url = settings.DUCTOR_QUEUE_REDIS_URL
        if url not in self._copies:
            self.read(url)
        with self._lock:
            at, current = self._copies[url]
            pins = {**current.pins, tenant_id: shard}
            self._copies[url] = (at, ShardMap(current.count, current.serve, pins, current.moves))

    def forget(self) -> None:
        with self._lock:
            self._copies.clear()

    def _warn_if_unlike_settings(self, current: ShardMap) -> None:
        if current.count is not None and current.count != settings.DUCTOR_QUEUE_SHARDS \
                and current.count not in self._warned:
            self._warned.add(current.count)
            log.warning("shard_count_differs_from_settings", in_force=current.count,
                        setting=settings.DUCTOR_QUEUE_SHARDS)


_shard_maps = _ShardMapCopy()


def shard_map() -> ShardMap:
    """The shard map as this process knows it (read again when older than ``SHARD_MAP_EVERY_S``)."""
    return _shard_maps.get()


def read_shard_map() -> ShardMap:
    """The shard map read now: after a redirect, and by the reshard itself. One round trip."""
    return _shard_maps.read()


def shard_moved(tenant_id: str, shard: int) -> None:
    """A fence said the tenant is in ``shard`` now: the process's copy says so until its next read."""
    _shard_maps.hint(tenant_id, shard)


def forget_shard_map() -> None:
    """Drop the process's copy (a test that flushed Redis): the next call reads the map."""
    _shard_maps.forget()


def queue_shards() -> range:
    """The fair-queue shards served now: ``0 .. n-1`` for the count in force, more while a reshard
    drains shards or a tenant is pinned beyond it. Dispatchers, the reaper, the epoch, the metrics
    and the platform view walk these."""
    return range(shard_map().shards())


def refuse_foreign(key: str) -> None:
    """A prebuilt tenant key used inside another tenant's context is refused (also for
    process-local caches keyed by ``tenant_key``)."""
    tenant = peek_tenant()
    if tenant is not None and not key.startswith(f"t:{id_text(tenant)}:"):
        raise TenantScopeError("cache key of another tenant used inside a tenant context")


def cache_key_function(key: str, key_prefix: str, version: int) -> str:
    """Django's KEY_FUNCTION: scope ``cache.get("x")`` to the tenant in context.

    Keys already built by this module pass through (a tenant key of another
    tenant than the one in context raises); anything else is scoped to the
    current tenant, and raises ``TenantScopeError`` outside a tenant.
    """
    if key.startswith("t:"):
        refuse_foreign(key)
    elif not key.startswith(GLOBAL_PREFIX):
        key = tenant_key(key)
    prefix = f"{key_prefix}:" if key_prefix else ""
    return f"{prefix}{version}:{key}"
