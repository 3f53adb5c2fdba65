"""Per-connection circuit breakers, kept in Redis under the tenant's keys.

A breaker opens after ``DUCTOR_BREAKER_FAILURES`` consecutive failures and
stays open for ``DUCTOR_BREAKER_COOLDOWN_S``; then it is half-open: calls are
let through, the next success closes it and the next failure opens it again.
Times come from Redis ``TIME``.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from django.conf import settings

from ductor_project.core import metrics, scripts, tenant_moves
from ductor_project.core.context import named_or_current
from ductor_project.core.keys import fence_key, global_redis_key, redis_key, shard_of
from ductor_project.core.redis import get_redis, on_node
from scheduling import LUA_DIR

if TYPE_CHECKING:
    from tenants.models import Tenant

KEY_TTL_S = 7 * 24 * 3600
# The platform's index of opened breakers (tenant|connection -> open until, ms); an entry whose
# breaker never closed again is dropped a day after its cooldown.
OPEN_INDEX = global_redis_key("breakers", "opened")
INDEX_KEEP_MS = 24 * 3600 * 1000
_RECORD = LUA_DIR / "breaker_record.lua"


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


STATES = (BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN)


def breaker_key(connection_id: object, *, tenant: Tenant | None = None) -> str:
    return redis_key("breaker", connection_id, tenant=tenant)


def _record(connection_id: object, ok: bool, tenant: Tenant | None) -> BreakerState:
    tenant_id = str(named_or_current(tenant, what="breakers").pk)
    args = [1 if ok else 0, settings.DUCTOR_BREAKER_FAILURES, int(settings.DUCTOR_BREAKER_COOLDOWN_S * 1000), KEY_TTL_S]
    state = tenant_moves.follow(tenant_id, lambda: scripts.run(
        _RECORD,
        [breaker_key(connection_id, tenant=tenant), fence_key(tenant_id, shard_of(tenant_id))],
        args,
        libraries=(tenant_moves.FENCE_LIBRARY,),
    ))
    if int(state) > 0:
        metrics.BREAKER_OPENED.inc()
        _index(connection_id, tenant, open_until_ms=int(state))
        return BreakerState.OPEN
    if int(state) < 0:
        _index(connection_id, tenant, open_until_ms=None)
    return BreakerState.CLOSED


def _index(connection_id: object, tenant: Tenant | None, *, open_until_ms: int | None) -> None:
    """Keep the platform's index of breakers that opened (``open_breakers``): written only when a
    breaker opens or closes again, never on the path of a call through a closed one."""
    member = _member(named_or_current(tenant, what='breakers').pk, connection_id)
    redis = get_redis()
    if open_until_ms is None:
        redis.zrem(OPEN_INDEX, member)
        return
    with redis.pipeline(transaction=False) as pipe:
        pipe.zadd(OPEN_INDEX, {member: open_until_ms})
        pipe.zremrangebyscore(OPEN_INDEX, "-inf", open_until_ms - INDEX_KEEP_MS)
        pipe.execute()


def _member(tenant_id: object, connection_id: object) -> str:
    """A breaker's entry in ``OPEN_INDEX``: its tenant's id, then its connection's."""
    return f"{tenant_id}|{connection_id}"


def forget_tenant(tenant_id: str) -> None:
    """Take the breakers of the tenant ``tenant_id`` out of ``OPEN_INDEX`` (a deleted tenant's: its
    own breaker keys go with its other keys)."""
    redis = get_redis()
    prefix = _member(tenant_id, "")
    members = [m for m in redis.zrange(OPEN_INDEX, 0, -1)
               if (m.decode() if isinstance(m, bytes) else str(m)).startswith(prefix)]
    if members:
        redis.zrem(OPEN_INDEX, *members)


def open_breakers() -> tuple[int, int]:
    """How many breakers are open now, and how many are half-open (cooldown over, no success
    since), across tenants: for the platform's metrics. One round trip."""

    def read(server: Any) -> list[Any]:  # the index's own server: its clock stamped the breakers
        with server.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.zrange(OPEN_INDEX, 0, -1, withscores=True)
            return list(pipe.execute())

    (seconds, micros), entries = on_node(OPEN_INDEX, read)
    now_ms = seconds * 1000 + micros // 1000
    opened = sum(1 for _, until in entries if until > now_ms)
    # A breaker whose cooldown ended more than INDEX_KEEP_MS ago is no longer counted (its entry is
    # dropped by the next opening): one that saw no call in a day is not worth an alarm.
    half_open = sum(1 for _, until in entries if now_ms - INDEX_KEEP_MS < until <= now_ms)
    return opened, half_open


def record_success(connection_id: object, *, tenant: Tenant | None = None) -> BreakerState:
    """A call through the connection succeeded: close its breaker. One round trip."""
    return _record(connection_id, True, tenant)


def record_failure(connection_id: object, *, tenant: Tenant | None = None) -> BreakerState:
    """A call failed: count it, opening the breaker at the threshold. One round trip."""
    return _record(connection_id, False, tenant)
