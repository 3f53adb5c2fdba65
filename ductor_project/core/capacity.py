"""Capacity counters: leased concurrency slots and GCRA rate limits, atomic in Redis.

Every operation is one Lua script (``ductor_project/core/lua/capacity_*.lua``), sent as
one ``EVALSHA``: one Redis round trip, atomic, timed by Redis ``TIME`` and never
by the client's clock.

- **Concurrency slots are leases.** A scope (the tenant, a pool, a connection)
  is a sorted set of holder → lease expiry (ms). Its free slots are
  ``limit - ZCOUNT(now, +inf)``; an acquire that finds a scope full prunes its
  expired entries first. A crashed holder's slot comes back by itself when its
  lease ends. Each holder has a lease record (its expiry and the scope keys it
  holds), so ``extend`` and ``release`` need only the holder id.
- **Rates use GCRA.** One key per limiter holds its theoretical arrival time.
  The burst tolerance is ``emission_interval * burst``: from idle exactly
  ``burst`` calls pass at once, then one every ``1 / rate`` seconds.

Every key is built by ``ductor_project.core.keys.redis_key`` for the tenant in context, or
for the tenant passed explicitly (code outside any tenant context, such as a
dispatcher, names it; inside a context no other tenant may be named). So all
keys of a tenant share its ``{s<n>}`` hash tag, one Redis Cluster slot, and
nothing done in one tenant's context can touch another tenant's counters. Keys
reach the scripts through ``KEYS[]``; the only keys a script reads from data
are the scope keys in a holder's own record, which carry the same hash tag.
Every script gets the tenant's fence last (``tenant_moves``): a call that finds
the tenant moving to another shard is run again there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any, Literal, get_args

from ductor_project.core import scripts, tenant_moves
from ductor_project.core.context import TenantLike, named_or_current
from ductor_project.core.keys import fence_key, redis_key, shard_of
from ductor_project.core.renewals import renewals

LUA_DIR = Path(__file__).resolve().parent / "lua"
# The slowest rate any limiter takes (per second): one start in 1,000 s. A slower one is no rate but a
# lock (1e-320 per second would admit nothing, ever), so every rate a tenant or the platform sets is at least this.
MIN_RATE_PER_S = 0.001
# The fastest rate a limiter is set to (per second): a faster one is no limit a limiter can keep (its
# emission interval, in milliseconds, would round to nothing); a tenant's rates and a pool's or a
# connection's alike are at most this.
MAX_RATE_PER_S = 1_000_000.0
# The Lua functions of the counters, for scripts of other modules (see ``lua_library``).
LUA_LIBRARY = LUA_DIR / "capacity_lib.lua"

ScopeKind = Literal["tenant", "pool", "connection"]
SCOPE_KINDS: frozenset[str] = frozenset(get_args(ScopeKind))
# The id of the tenant-level scope: the tenant's steps in flight.
TENANT_SCOPE_ID = "steps"
# The limiter of the tenant's step start rate (the API rate limiter is "api").
STEP_RATE_LIMITER = "steps"


class LeaseConflict(ValueError):
    """A holder that has a live lease asked for a different set of scopes."""


def _tenant(tenant: TenantLike | None) -> Any:
    """The tenant whose counters an operation touches (``named_or_current``)."""
    return named_or_current(tenant, what="capacity counters")


@dataclass(frozen=True)
class Scope:
    """One concurrency counter of a tenant and its limit (slots held at once).

    The scope does not name its tenant: its key is built for the tenant in
    context when an operation runs, so a scope can never reach another tenant.
    """

    kind: ScopeKind
    id: str
    limit: int

    def __post_init__(self) -> None:
        if self.kind not in SCOPE_KINDS:
            raise ValueError(f"unknown scope kind {self.kind!r}; expected one of {sorted(SCOPE_KINDS)}")
        if not self.id:
            raise ValueError("a scope needs an id")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0:
            raise ValueError(f"a scope limit is an int >= 0, not {self.limit!r}")

    def key(self, tenant: TenantLike | None = None) -> str:
        """The scope's Redis key. Raises ``TenantScopeError`` without a tenant."""
        return redis_key("cap", self.kind, self.id, tenant=_tenant(tenant))


def tenant_scope(limit: int) -> Scope:
    """The tenant-level scope: all steps in flight of the tenant."""
    return Scope("tenant", TENANT_SCOPE_ID, limit)


def pool_scope(pool_id: object, limit: int) -> Scope:
    """The scope of one of the tenant's pools."""
    return Scope("pool", str(pool_id), limit)


def connection_scope(connection_id: object, limit: int) -> Scope:
    """The scope of one of the tenant's connections."""
    return Scope("connection", str(connection_id), limit)


def holder_key(holder_id: str, *, tenant: TenantLike | None = None) -> str:
    """The key of a holder's lease record. Raises ``TenantScopeError`` without a tenant."""
    if not holder_id:
        raise ValueError("a holder needs an id")
    return redis_key("cap", "holder", holder_id, tenant=_tenant(tenant))


@dataclass(frozen=True)
class RateDecision:
    """The answer of a GCRA limiter.

    ``retry_after_s`` is 0 when allowed, otherwise the wait until the same call
    would pass. ``remaining`` is how many calls of cost 1 would still pass right
    now, and ``reset_after_s`` how long until the full burst is available again.
    """

    allowed: bool
    retry_after_s: float
    remaining: int
    reset_after_s: float


def lua_library() -> str:
    """The Lua functions of the capacity counters (``cap_acquire``, ``cap_gcra``, …).

    A script of another module that must check or take capacity in its own
    atomic step (the fair queue's dequeue) is loaded with the ``capacity_lib``
    library (``ductor_project.core.scripts``) and passes the keys from ``Scope.key``,
    ``holder_key`` and ``rate_key``.
    """
    return str(scripts.source(LUA_LIBRARY))


@cache
def _script_path(name: str) -> Path:
    """``capacity_<name>.lua``'s path, made once (a new ``Path`` hashes its parts again)."""
    return LUA_DIR / f"capacity_{name}.lua"


def _run(name: str, tenant: Any, keys: Callable[[], list[str]], args: list[Any]) -> Any:
    """One EVALSHA of ``capacity_<name>.lua`` with ``keys()`` and the tenant's fence, followed to
    the tenant's new shard should it have moved (``keys`` is built again for each try)."""
    # A batch of one (``scripts.run``): its round trip costs the client about half of redis-py's
    # script call, whose argument encoding and command parsing it skips.
    path, tenant_id = _script_path(name), str(tenant.pk)

    def call() -> Any:
        return scripts.run(path, [*keys(), fence_key(tenant_id, shard_of(tenant_id))], args,
                           libraries=(tenant_moves.FENCE_LIBRARY, LUA_LIBRARY))

    return tenant_moves.follow(tenant_id, call)


def _lease_ms(lease_s: float) -> int:
    lease_ms = math.ceil(lease_s * 1000)
    if not lease_s > 0 or lease_ms < 1:
        raise ValueError(f"a lease lasts more than 0 s, not {lease_s!r}")
    return lease_ms


def acquire(
    scopes: Sequence[Scope], holder_id: str, lease_s: float, *, tenant: TenantLike | None = None
) -> bool:
    """Take one slot in every scope, or in none; the slots are leased for ``lease_s``.

    One Redis round trip, atomic. Returns False (changing nothing) when a scope
    is full. Idempotent: a holder that already holds these scopes keeps its
    slots and has its lease renewed. Raises ``LeaseConflict`` if the holder has
    a live lease on another set of scopes, ``ValueError`` if a scope appears
    twice, and ``TenantScopeError`` without a tenant.
    """
    if not scopes:
        raise ValueError("acquire needs at least one scope")
    tenant = _tenant(tenant)
    if len({scope.key(tenant) for scope in scopes}) != len(scopes):
        raise ValueError("a scope appears twice in one acquire")
    result = _run(
        "acquire", tenant,
        lambda: [holder_key(holder_id, tenant=tenant), *(scope.key(tenant) for scope in scopes)],
        [holder_id, _lease_ms(lease_s), *(scope.limit for scope in scopes)],
    )
    if result == -1:
        raise LeaseConflict(f"holder {holder_id!r} has a live lease on other scopes")
    return bool(result == 1)


def extend(holder_id: str, lease_s: float, *, tenant: TenantLike | None = None) -> bool:
    """Renew a holder's lease in all its scopes: it now ends ``lease_s`` from now.

    One Redis round trip, atomic. Returns False when the lease had already
    ended or been released; a lost slot is never taken back (acquire again for
    that). Raises ``TenantScopeError`` without a tenant.
    """
    tenant = _tenant(tenant)
    lease_ms = _lease_ms(lease_s)
    return bool(_run("extend", tenant, lambda: [holder_key(holder_id, tenant=tenant)], [holder_id, lease_ms]) == 1)


@contextmanager
def keep_alive(holder_id: str, lease_s: float, *, tenant: TenantLike | None = None) -> Iterator[None]:
    """Keep a holder's slots while the block runs: its lease is renewed for ``lease_s`` every
    third of ``lease_s``, by the process's renewal thread (no round trip on the caller's path).

    Renewing stops when the block ends (release the holder after it) or when a renewal
    finds no live lease (none was taken, or it ended). Raises ``TenantScopeError``
    without a tenant.
    """
    key = renewals.hold(partial(extend, holder_id, lease_s, tenant=_tenant(tenant)), every_s=lease_s / 3)
    try:
        yield
    finally:
        renewals.release(key)


def release(holder_id: str, *, tenant: TenantLike | None = None) -> int:
    """Give back a holder's slots; returns how many live slots that freed.

    One Redis round trip, atomic, idempotent: releasing again (or releasing a
    lease that already ended) frees nothing and returns 0. Raises
    ``TenantScopeError`` without a tenant.
    """
    tenant = _tenant(tenant)
    return int(_run("release", tenant, lambda: [holder_key(holder_id, tenant=tenant)], [holder_id]))


def in_flight(scope: Scope, *, tenant: TenantLike | None = None) -> int:
    """Live leases in ``scope`` (its limit is not used). One round trip, read only.

    Raises ``TenantScopeError`` without a tenant.
    """
    tenant = _tenant(tenant)
    return int(_run("in_flight", tenant, lambda: [scope.key(tenant)], []))


def tenant_in_flight(*, tenant: TenantLike | None = None) -> int:
    """The tenant's steps in flight (live leases of its tenant scope), for usage reports.

    One round trip, read only. Raises ``TenantScopeError`` without a tenant.
    """
    return in_flight(tenant_scope(0), tenant=tenant)


def rate_key(limiter: str, *, tenant: TenantLike | None = None) -> str:
    """The Redis key of a tenant's GCRA limiter. Raises ``TenantScopeError`` without a tenant."""
    if not limiter:
        raise ValueError("a limiter needs a name")
    return redis_key("rate", limiter, tenant=_tenant(tenant))


def _gcra(
    limiter: str, rate_per_s: float, burst: int, cost: int, consume: bool, tenant: TenantLike | None
) -> RateDecision:
    if not rate_per_s > 0 or math.isinf(rate_per_s):
        raise ValueError(f"a rate is a finite number > 0 per second, not {rate_per_s!r}")
    if burst < 1 or cost < 1 or cost > burst:
        raise ValueError(f"need 1 <= cost <= burst, got cost={cost!r} burst={burst!r}")
    interval_us = 1_000_000 / rate_per_s
    tenant = _tenant(tenant)
    allowed, retry_us, remaining, reset_us = _run(
        "gcra", tenant, lambda: [rate_key(limiter, tenant=tenant)], [repr(interval_us), burst, cost, int(consume)]
    )
    return RateDecision(
        allowed=allowed == 1,
        retry_after_s=retry_us / 1_000_000,
        remaining=int(remaining),
        reset_after_s=reset_us / 1_000_000,
    )


def rate_check(
    limiter: str, rate_per_s: float, burst: int, cost: int = 1, *, tenant: TenantLike | None = None
) -> RateDecision:
    """Charge ``cost`` calls to the tenant's GCRA limiter named ``limiter`` if they fit.

    From idle exactly ``burst`` calls (of cost 1) pass at once, then one every
    ``1 / rate_per_s`` seconds. A refused call changes nothing and says how long
    to wait. One Redis round trip, atomic; the key expires once the limiter is
    idle. Raises ``ValueError`` unless ``rate_per_s > 0`` and
    ``1 <= cost <= burst``, and ``TenantScopeError`` without a tenant.
    """
    return _gcra(limiter, rate_per_s, burst, cost, True, tenant)


def rate_peek(
    limiter: str, rate_per_s: float, burst: int, cost: int = 1, *, tenant: TenantLike | None = None
) -> RateDecision:
    """Like ``rate_check`` but writes nothing: would the call pass now, and when if not.

    One Redis round trip, read only. Raises like ``rate_check``.
    """
    return _gcra(limiter, rate_per_s, burst, cost, False, tenant)
