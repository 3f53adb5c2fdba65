"""The one place that builds cache and Redis keys.

Every key of tenant data starts with ``t:<tenant_id>:``; Redis keys also carry
the hash tag of the tenant's fair-queue shard (``{s<n>}``), so that the Lua
scripts of one tenant touch a single Redis Cluster slot. Building a tenant key
with no tenant in context raises ``TenantScopeError``.

Global keys (cross-tenant indexes of the fair queue, the platform's own cache
entries) are built by ``global_key``/``global_redis_key``: the name says out
loud that they cross tenants.
"""

from __future__ import annotations

import zlib
from typing import Any

from django.conf import settings

from ductor_project.core.context import TenantLike, TenantScopeError, current_tenant, peek_tenant

GLOBAL_PREFIX = "g:"
_SEP = ":"


def _tenant_id(tenant: TenantLike | None) -> str:
    return str((tenant or current_tenant()).pk)


def _join(parts: tuple[Any, ...]) -> str:
    if not parts:
        raise ValueError("a key needs at least one part")
    return _SEP.join(str(part) for part in parts)


def shard_of(tenant_id: str, shards: int | None = None) -> int:
    """The fair-queue shard a tenant maps to: a stable hash, independent of the process."""
    count = shards if shards is not None else settings.DUCTOR_QUEUE_SHARDS
    return _jump_hash(zlib.crc32(tenant_id.encode()), count)


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


def redis_key(*parts: Any, tenant: TenantLike | None = None) -> str:
    """A raw Redis key of a tenant: ``{s<shard>}:t:<tenant_id>:<parts>``. Raises without a tenant."""
    tenant_id = _tenant_id(tenant)
    return f"{tenant_redis_prefix(shard_of(tenant_id))}{tenant_id}:{_join(parts)}"


def global_key(*parts: Any) -> str:
    """A cache key that belongs to no tenant. Only for platform-wide data."""
    return GLOBAL_PREFIX + _join(parts)


def global_redis_key(*parts: Any, shard: int = 0) -> str:
    """A raw Redis key that belongs to no tenant, in a shard (cross-tenant indexes)."""
    return f"{shard_tag(shard)}:{GLOBAL_PREFIX}{_join(parts)}"


def refuse_foreign(key: str) -> None:
    """A prebuilt tenant key used inside another tenant's context is refused (also for
    process-local caches keyed by ``tenant_key``)."""
    tenant = peek_tenant()
    if tenant is not None and not key.startswith(f"t:{tenant.pk}:"):
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
