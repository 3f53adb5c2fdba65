"""Per-connection circuit breakers, kept in Redis under the tenant's keys.

A breaker opens after ``DUCTOR_BREAKER_FAILURES`` consecutive failures and
stays open for ``DUCTOR_BREAKER_COOLDOWN_S``; then it is half-open: calls are
let through, the next success closes it and the next failure opens it again.
Times come from Redis ``TIME``.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from django.conf import settings

from ductor_project.core import scripts
from ductor_project.core.keys import redis_key
from scheduling import LUA_DIR

if TYPE_CHECKING:
    from tenants.models import Tenant

KEY_TTL_S = 7 * 24 * 3600


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


STATES = (BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN)


def breaker_key(connection_id: object, *, tenant: Tenant | None = None) -> str:
    return redis_key("breaker", connection_id, tenant=tenant)


def _record(connection_id: object, ok: bool, tenant: Tenant | None) -> BreakerState:
    state = scripts.run(
        LUA_DIR / "breaker_record.lua",
        [breaker_key(connection_id, tenant=tenant)],
        [
            1 if ok else 0,
            settings.DUCTOR_BREAKER_FAILURES,
            int(settings.DUCTOR_BREAKER_COOLDOWN_S * 1000),
            KEY_TTL_S,
        ],
    )
    return BreakerState.OPEN if int(state) == 1 else BreakerState.CLOSED


def record_success(connection_id: object, *, tenant: Tenant | None = None) -> BreakerState:
    """A call through the connection succeeded: close its breaker. One round trip."""
    return _record(connection_id, True, tenant)


def record_failure(connection_id: object, *, tenant: Tenant | None = None) -> BreakerState:
    """A call failed: count it, opening the breaker at the threshold. One round trip."""
    return _record(connection_id, False, tenant)
