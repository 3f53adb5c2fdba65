"""Following a tenant whose queue state moves to another shard (``manage.py queue_reshard``).

While a tenant's keys are copied out of shard ``a``, a fence in ``a``'s slot (``keys.fence_key``)
says ``MOVING``; once they are in shard ``b`` it says ``MOVED b``. Every tenant-side script of
the fair queue, the capacity counters and the breakers reads the fence first (``fence_lib.lua``:
one ``GET`` inside a script that runs anyway) and answers a fenced call with an error reply
instead of acting, so nothing is written to ``a`` once the copy started. ``follow`` runs such a
call again: at once in ``b`` after ``MOVED b`` (the process's copy of the shard map learns it),
after a short wait while ``MOVING``. On the normal path it costs nothing but a ``try``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import structlog
from redis.exceptions import ResponseError

from ductor_project.core import keys

T = TypeVar("T")

# The Lua of the fence check, for every script that acts on one tenant's keys.
FENCE_LIBRARY = Path(__file__).resolve().parent / "lua" / "fence_lib.lua"
# The error replies of a fenced script (fence_lib.lua); not "MOVED": redis-py reads that as a
# cluster redirection.
MOVING_REPLY = "TENANT_MOVING"
MOVED_REPLY = "TENANT_MOVED"
# How long a call waits for a move to finish before it gives up (a move of a tenant with 10,000
# waiting items takes well under a second; docs/scaling.md), and its waits between tries.
MOVE_WAIT_S = 15.0
_FIRST_WAIT_S = 0.005
_LONGEST_WAIT_S = 0.1
# Redirections one call follows at most (a tenant moved again meanwhile).
_MAX_HOPS = 4
# The tenants (with the shard) this process found sent to a shard not served: logged once each.
_TOLD_UNSERVED: set[tuple[str, int]] = set()

log = structlog.get_logger(__name__)


class TenantMoving(RuntimeError):
    """A tenant's queue state was still moving after ``MOVE_WAIT_S``: the call changed nothing."""


@dataclass(frozen=True)
class Redirect:
    """A fenced script's answer: the tenant is moving (``shard`` None), or moved to ``shard``."""

    shard: int | None


def redirect_of(reply: object) -> Redirect | None:
    """The redirect a script's reply (or the error it raised) says, or None."""
    if not isinstance(reply, ResponseError):
        return None
    text = str(reply)
    if text.startswith(MOVING_REPLY):
        return Redirect(None)
    if text.startswith(MOVED_REPLY):
        return Redirect(int(text.split()[1]))
    return None


def follow(tenant_id: str, call: Callable[[], T]) -> T:
    """``call()``, run again while a fence of the tenant answers it; ``call`` builds its keys on each
    try (through ``keys.redis_key``), so a try after ``MOVED b`` goes to ``b``. A fenced try changed
    nothing, so running it again is exact. Raises ``TenantMoving`` after ``MOVE_WAIT_S`` of moving
    (or too many redirections), and whatever ``call`` raises otherwise."""
    deadline = time.monotonic() + MOVE_WAIT_S
    wait_s, hops = _FIRST_WAIT_S, 0
    while True:
        try:
            return call()
        except ResponseError as exc:
            redirect = redirect_of(exc)
            if redirect is None:
                raise
            if redirect.shard is not None:
                hops += 1
                _tell_unserved(tenant_id, redirect.shard)
                keys.shard_moved(tenant_id, redirect.shard)
            elif time.monotonic() < deadline:
                time.sleep(wait_s)
                wait_s = min(wait_s * 2, _LONGEST_WAIT_S)
                keys.read_shard_map()
            if hops > _MAX_HOPS or time.monotonic() >= deadline:
                raise TenantMoving(f"tenant {tenant_id}'s queue state is still moving between shards") from exc


def _tell_unserved(tenant_id: str, shard: int) -> None:
    """A fence sent the tenant to a shard no longer served (the shard map was lost since its move,
    and a smaller count is in force): its items go there and wait, for no dispatcher walks it.
    Logged once per tenant and shard by each process; ``queue_reshard`` with the count of that
    move serves the shard again (docs/scaling.md). The map is read again first, should the
    process's copy be older than the move (a reshard that just grew the count)."""
    if shard in keys.queue_shards() or (tenant_id, shard) in _TOLD_UNSERVED:
        return
    served = keys.read_shard_map().shards()
    if shard < served:
        return
    _TOLD_UNSERVED.add((tenant_id, shard))
    log.error("tenant_moved_to_unserved_shard", tenant_id=tenant_id, shard=shard, served=served)
