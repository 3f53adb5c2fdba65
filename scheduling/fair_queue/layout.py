"""How Python calls the fair queue's scripts: the shard's key layout, the script runner, the checks.

Every script's ARGV starts with ``script_header(shard)``: the tenant key prefix of the shard and
the tenant-relative suffixes of every key the scripts build (derived here from the real key
builders of ``ductor_project.core.keys``, ``capacity`` and ``scheduling.circuit``, so that the
formats live in one place), then how items are charged. ``tenant_call`` runs a tenant-side script
in the tenant's shard and follows the tenant should it move (``tenant_moves``); ``run_script``
runs any of them, alone or on a ``scripts.Batch``. The argument checks raise ``ValueError`` with
the argument named, before anything is sent.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings

from ductor_project.core import capacity, scripts, tenant_moves
from ductor_project.core.context import TenantScopeError, id_text, named_or_current, no_tenant, peek_tenant
from ductor_project.core.keys import fence_key, global_redis_key, queue_shards, redis_key, shard_of, tenant_redis_prefix
from scheduling import LUA_DIR
from scheduling.circuit import breaker_key
from tenants.models import Tenant, Tier

SYSTEM_TIER = "system"
# Highest priority first.
TIERS: tuple[str, ...] = (SYSTEM_TIER, *Tier.values)
MAX_PAYLOAD_BYTES = 64 * 1024
# The names of the admission scopes a tenant's items may need: a pool, a connection.
SCOPE_FIELDS = ("pool:", "connection:")
MAX_NAME_LENGTH = 256
# Work bounds of one dequeue: due timers promoted, and tenants looked at. When a call
# reaches one, it says so and the Python side calls again (each call made progress).
PROMOTE_PER_CALL = 64
TENANTS_PER_CALL = 64
MAX_DEQUEUE_CALLS = 100
# Items per script call of an enqueue (keeps each call short; more items = more calls).
ITEMS_PER_CALL = 500
# Longest single wait in wait_for_work: well below the Redis client's socket timeout.
MAX_WAIT_S = 2.0
# A dispatcher of several shards on a Redis Cluster waits on one shard's signal this long at most
# (``wait_for_work``): a signal of its other shards waits no longer than that.
CLUSTER_WAKE_SLICE_S = 0.05
# Shortest blocking wait: Redis counts a blocking timeout in whole ms.
MIN_WAIT_S = 0.002
_LIBRARIES = (capacity.LUA_LIBRARY, tenant_moves.FENCE_LIBRARY, LUA_DIR / "fq_lib.lua")
# The scripts that admit items (dequeue) or explain it (peek) also load the admission library.
_ADMISSION = (*_LIBRARIES, LUA_DIR / "admit_lib.lua")


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def tenant_of(tenant: Tenant | None) -> Tenant:
    """The tenant whose items an operation touches (``named_or_current``)."""
    return named_or_current(tenant, what="fair-queue items")


def dispatcher_side() -> None:
    """The cross-tenant operations run outside tenant contexts (or as the system tenant)."""
    tenant = peek_tenant()
    if tenant is not None and not tenant.is_system:
        raise TenantScopeError("the fair queue's dispatcher side crosses tenants: not in a tenant context")


def check_shard(shard: int) -> int:
    served = queue_shards()
    if isinstance(shard, bool) or not isinstance(shard, int) or shard not in served:
        raise ValueError(f"shard must be in [0, {len(served)}), not {shard!r}")
    return shard


def at_least(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} is an int >= {low}, not {value!r}")
    return value


@cache
def _suffixes() -> dict[str, str]:
    """The tenant-relative key suffixes and prefixes the scripts append to ``<prefix><tenant id>``.

    Derived from the real key builders with a probe tenant (no row: only its id is read),
    so the formats stay in ``ductor_project.core.keys``, ``ductor_project.core.capacity`` and
    ``scheduling.circuit``: the scripts build ``<tenant head><cap>pool:<id>``,
    ``<tenant head><rates>connection:<id>``, ``<tenant head><breaker><id>`` and
    ``<tenant head><rr><pool id>`` exactly as these do.
    """
    probe = Tenant(id=uuid.UUID(int=0))
    tenant_id = str(probe.pk)
    head = tenant_redis_prefix(shard_of(tenant_id)) + tenant_id
    mark = "\x00"
    with no_tenant():
        keys = {
            "namespace": redis_key("fq", "", tenant=probe),
            "scope": capacity.tenant_scope(0).key(probe),
            "holder": capacity.holder_key(mark, tenant=probe),
            "rate": capacity.rate_key(capacity.STEP_RATE_LIMITER, tenant=probe),
            "cap": capacity.pool_scope(mark, 0).key(probe).removesuffix(f"pool:{mark}"),
            "rates": capacity.rate_key(f"pool:{mark}", tenant=probe).removesuffix(f"pool:{mark}"),
            "breaker": breaker_key(mark, tenant=probe),
            "rr": redis_key("rr", mark, tenant=probe),
            "fence": fence_key(tenant_id, shard_of(tenant_id)),
        }
        connection = capacity.connection_scope(mark, 0).key(probe)
    suffixes = {name: key[len(head) :] for name, key in keys.items()}
    for name in ("holder", "breaker", "rr"):
        suffixes[name] = suffixes[name].removesuffix(mark)
    consistent = (
        all(key.startswith(head) for key in keys.values())
        and connection == head + suffixes["cap"] + f"connection:{mark}"
        and all(keys[name].endswith(mark) for name in ("holder", "breaker", "rr"))
    )
    if not consistent:
        raise RuntimeError("tenant keys do not have the layout the fair-queue scripts expect")
    return suffixes


@cache
def _key_header(shard: int) -> tuple[str, ...]:
    s = _suffixes()
    return (
        tenant_redis_prefix(shard), s["namespace"], s["scope"], s["holder"], s["rate"],
        global_redis_key("fq", "", shard=shard), ",".join(TIERS), s["cap"], s["rates"], s["breaker"], s["rr"],
        s["fence"],
    )


def script_header(shard: int) -> tuple[str, ...]:
    """The ARGV every fair-queue script starts with (``fq_init`` and ``FQ_HEADER`` in fq_lib.lua):
    the shard's key layout, then how items are charged (``DUCTOR_FAIR_COST``, the most one item
    is charged, what an unmeasured kind is estimated at), then whether the call is one of a
    handoff's round trip on this shard (``quiet_wakes``)."""
    return (*_key_header(shard), settings.DUCTOR_FAIR_COST, str(settings.DUCTOR_FAIR_MAX_COST_MS),
            str(settings.DUCTOR_FAIR_FIRST_COST_MS), "1" if _quiet_shard.get() == shard else "0")


# The shard whose script calls are being put on a handoff's round trip now (``quiet_wakes``).
_quiet_shard: ContextVar[int | None] = ContextVar("ductor_fq_quiet_shard", default=None)


@contextmanager
def quiet_wakes(shard: int) -> Iterator[None]:
    """The calls on ``shard`` made in this block belong to one round trip that ends with a
    dequeue: the tenants their enqueues and acks make ready do not wake the dispatchers, and that
    dequeue (the last call) wakes them for what it leaves ready. A worker's handoff takes the next
    item itself; a dispatcher woken for each of its steps would find nothing (fq_lib.lua's
    ``fq_wake``). Should the round trip break before its dequeue, the dispatchers look again
    within their idle wait."""
    token = _quiet_shard.set(shard)
    try:
        yield
    finally:
        _quiet_shard.reset(token)


def global_key(name: str, *, shard: int = 0) -> str:
    """A cross-tenant index key of the shard (``ready:<tier>``, ``timers``, ``inflight`` …)."""
    return global_redis_key("fq", name, shard=shard)


@cache
def _script_path(name: str) -> Path:
    """One ``Path`` per script, made once: a path hashes its parts again whenever it is made anew,
    and every call of a script looks its registration up by its paths."""
    return LUA_DIR / f"{name}.lua"


def run_script(name: str, keys: list[str], args: Sequence[Any], batch: scripts.Batch | None = None,
         again: Callable[[], Any] | None = None) -> Any:
    libraries = _ADMISSION if name in ("fq_dequeue", "fq_admit_peek", "fq_why") else _LIBRARIES
    return scripts.run(_script_path(name), keys, list(args), libraries=libraries, batch=batch, again=again)


def shard_script(name: str, shard: int, keys: list[str], args: Sequence[Any]) -> Any:
    """Run ``scheduling/lua/<name>.lua`` of another scheduling module that works on the fair queue's
    own layout (the reshard's): loaded with ``fq_lib.lua``, given the shard's header. One round trip."""
    return run_script(name, keys, [*script_header(shard), *args])


def tenant_call(name: str, tenant: Tenant, *args: Any, batch: scripts.Batch | None = None) -> Any:
    """One tenant-side script of the tenant, in its shard; followed there should it move meanwhile
    (``tenant_moves``; queued on ``batch``, a fenced call is made again when the batch runs)."""
    tenant_id = id_text(tenant)

    def attempt(on: scripts.Batch | None = None, again: Callable[[], Any] | None = None) -> Any:
        # The keys and header of the tenant's shard as this process knows it at each try.
        keys, header = [redis_key("fq", "items", tenant=tenant)], script_header(shard_of(tenant_id))
        return run_script(name, keys, [*header, tenant_id, *args], on, again)

    def followed() -> Any:
        return tenant_moves.follow(tenant_id, attempt)

    if batch is not None:
        return attempt(batch, followed)
    return followed()


def delivery_arg(delivery: int | None) -> str:
    if delivery is None:
        return ""
    return str(at_least("delivery", delivery, 1))


def name_arg(kind: str, value: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"{kind} is a non-empty str of at most {MAX_NAME_LENGTH} characters, not {value!r}")
    return value


def ms_arg(name: str, value: float) -> str:
    """A finite number of ms >= 0, as a script argument (µs kept as the fraction)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ValueError(f"{name} is a finite number >= 0 or None, not {value!r}")
    return repr(float(value))


def work_arg(work_ms: float | None) -> str:
    return "" if work_ms is None else ms_arg("work_ms", work_ms)

