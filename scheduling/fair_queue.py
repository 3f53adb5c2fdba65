"""The tiered fair queue: tenant-first, weighted, capacity-aware dispatch in Redis.

Every operation is one Lua script (``scheduling/lua/fq_*.lua``, sharing
``fq_lib.lua`` and the capacity counters' ``capacity_lib.lua``; the dequeue and
its dry run also ``admit_lib.lua``), sent as one ``EVALSHA``: one Redis round
trip, atomic, timed by Redis ``TIME``.

**Items.** An item has an id (unique per tenant), a tenant, a tier, a partition,
a due time, a cost (default 1), a JSON payload, and optionally a scope: the id
of the tenant's pool whose slot and rate, and one of whose connections, it
needs at dequeue (``scheduling.admission``).

**Order.** Tiers are strict priority classes: ``system`` (the system tenant's,
never a customer's), then ``interactive``, ``standard`` and ``batch``. Inside a
tier, tenants are served by start-time fair queueing (SFQ): a tenant that
becomes backlogged starts at ``S = max(V, F_last)``; dequeue serves the
smallest ``S``; the tenant's finish tag is ``F = S + cost / weight`` and
``V = S``; a tenant still backlogged re-enters with ``S = F``. Inside the
tenant, its fairness keys are served the same way, one level down (the second
level); inside a key, the partition whose head is due first goes out.

**Cost.** With ``DUCTOR_FAIR_COST=time`` (the default) the cost is work: a
dispatch charges the tenant's moving average for the item's kind, and the ack
corrects the tenant's (and its key's) tag by the work the worker measured; with
``items`` it is the item's ``cost``. docs/fair-queue.md has the bounds.

**Guarantees** (docs/fair-queue.md has the bounds):

- Backlogged tenants of a tier get dispatches in proportion to their weights,
  whatever their number of partitions or size of backlog: over any interval in
  which tenants ``i`` and ``j`` both stay backlogged, the costs ``W`` served to
  them satisfy ``|W_i / w_i - W_j / w_j| <= cost_max / w_i + cost_max / w_j``.
- A tenant that becomes backlogged starts at ``max(V, F_last)`` and every ready
  tenant is at ``V`` or later: it is served after at most one item of each
  tenant already active (about one round), usually next.
- Nothing is dispatched before it is due. A tenant whose earliest head is not
  due yet waits on a timer, promoted by the next dequeue once due: no polling
  of items, and bounded promotion work per call.
- At most one item of a partition (of a tenant, across tiers) is in flight, and
  a partition's items of one tier go out in due order (ties in id order).
- Admission at dequeue, in the same atomic step: a suspended tenant is parked
  (``blocked``, no timer) until its reactivation; a tenant at its concurrency
  ceiling is parked until one of its items leaves flight; a tenant held back by
  its GCRA step rate waits on a timer until the rate admits it; an item whose
  pool is full, or none of whose pool's connections is eligible, is parked on
  the pool (``w:<pool>``: a freed slot wakes it) or looked at again when a rate
  or a breaker allows, while the tenant's other partitions are served. A
  dispatch takes the tenant's step slot, and its pool's and connection's, all
  or none (holder ``fq:<item>``, leased like the item), charges the rates, and
  says which connection it chose and why: it is never handed out only to come
  back.
- Leases: an item in flight is delivered again only after its lease ended and
  the reaper returned it. Each delivery has a token, unique per tenant:
  ``ack``/``nack``/``extend_lease`` with a stale token change nothing.
- Idempotent: ``ack`` of an item that is not in flight changes nothing;
  ``enqueue`` of an id that is waiting keeps the item (coalescing); ``enqueue``
  of an id in flight makes it run once more after its ack (no lost wake-up).

**Redis layout.** Tenant keys come from ``ductor_project.core.keys.redis_key`` and hold one
tenant's data: ``fq:conf`` (its limits and status), ``fq:scopes`` (its pools'
and connections' limits), ``fq:items``, ``fq:parts:<tier>``,
``fq:p:<tier>:<partition>``, ``fq:wait:<tier>``, ``fq:w:<pool>`` (partitions
parked on a pool), ``fq:locks``, ``fq:flight``, ``fq:seq``.
The only cross-tenant keys are the shard's indexes, from
``ductor_project.core.keys.global_redis_key("fq", ..., shard=n)``: ``ready:<tier>``
(tenant → start tag), ``timers`` (``"<tier>|<tenant>"`` → when to look again),
``blocked:<tier>`` (tenants at their ceiling, or suspended), ``finish:<tier>`` (tenant → last finish tag),
``vtime:<tier>``, ``inflight`` (``"<tenant>|<item>"`` → lease end) and
``wake``. ``fq_lib.lua`` documents each. All keys of a shard carry its
``{s<n>}`` hash tag, so each script touches one Redis Cluster slot; the
dispatcher-side scripts read tenant ids from the indexes and build those
tenants' keys from prefixes that Python derives from ``ductor_project.core.keys``.
A tenant's fence (``keys.fence_key``) sits beside its keys: every tenant-side script
reads it first, so that a tenant moving to another shard (``scheduling.resharding``)
is followed there (``ductor_project.core.tenant_moves``).

**Changes from the suggested design** (DESIGN.md §5), and why:

- A partition is one serialization domain of the tenant across tiers (its lock
  is the tenant's ``fq:locks`` entry): the promise "at most one item of a
  partition in flight" must not depend on callers keeping a partition in one
  tier. Item sets stay per tier, so strict tier priority is kept.
- A tenant parked at its ceiling also gets a timer at its earliest lease end: a
  slot can free without passing through the fair queue (another holder of the
  step scope, a lease that lapsed before the reaper ran), and a blocked set
  alone would then park the tenant forever.
- Enqueueing an id that is already waiting keeps the item but takes the earlier
  of the two due times, so coalescing never postpones a wake-up.
- Delivery tokens (not only the item id) name a delivery: with leases that can
  end and items that are delivered again, a late worker must not ack the next
  delivery.
- The system tenant is not capacity-limited here (its plan's limits are for
  customers); its work is engine-internal and has its own tier.
- A dispatch charges one step to the step-rate limiter whatever the item's
  cost: the rate counts steps started, the cost is a fair-share notion.

**Tenancy.** The tenant-side operations (enqueue, ack, nack, extend_lease,
remove, stats) act on the tenant in context, or the tenant passed explicitly,
which must be the one in context when there is one: another tenant's items are
out of reach (an id of another tenant is simply not found). The dispatcher side
(dequeue, reap, next_due_ms, wait_for_work, global_stats, bulk_enqueue) crosses
tenants by nature and refuses to run inside a customer tenant's context.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache, partial
from typing import Any, NamedTuple, TypeVar

import structlog
from django.conf import settings

from ductor_project.core import capacity, scripts, tenant_moves
from ductor_project.core.context import TenantScopeError, named_or_current, no_tenant, peek_tenant
from ductor_project.core.keys import (
    fence_key,
    global_redis_key,
    queue_shards,
    redis_key,
    shard_of,
    tenant_redis_prefix,
)
from ductor_project.core.redis import get_redis, is_cluster, per_node
from scheduling import LUA_DIR
from scheduling.circuit import breaker_key
from tenants.entitlements import effective_entitlements
from tenants.models import Tenant, Tier

log = structlog.get_logger(__name__)

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
_MAX_CALLS = 100
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


class TierNotAllowed(ValueError):
    """The tenant may not use this tier (its plan's ``allowed_tiers``; ``system`` is the system tenant's)."""


class EnqueueResult(StrEnum):
    QUEUED = "queued"  # a new item
    EXISTS = "exists"  # already waiting, unchanged
    ADVANCED = "advanced"  # already waiting, now due earlier
    RERUN = "rerun"  # in flight: it runs again after its ack


_ENQUEUE_CODES = {
    1: EnqueueResult.QUEUED,
    2: EnqueueResult.EXISTS,
    3: EnqueueResult.ADVANCED,
    4: EnqueueResult.RERUN,
}


@dataclass(frozen=True)
class NewItem:
    """An item to enqueue. ``payload`` is any JSON-serializable value (keep it small: references).

    ``scope`` is the id of the tenant's pool whose slots and rate (and one of whose
    connections) the item needs at dequeue, besides its tenant's; None for none.
    ``kind`` names what its work is estimated by (the tenant's moving average of that
    kind's measured work; default: the payload's ``"kind"``). ``order_ms`` (Unix ms) is its
    order key among the tenant's items due now, when earlier than its due time: the
    engine gives a run's items the run's start, so a tenant's older runs go first.
    ``key`` is its fairness key inside the tenant ("" for none): the tenant's backlogged keys
    share its dispatches by their weights (equal by default) before its partitions do. A
    partition keeps the key of the item it was created with.
    """

    item_id: str
    tier: str
    partition: str
    payload: Any = None
    delay_ms: int = 0
    cost: int = 1
    scope: str | None = None
    kind: str | None = None
    order_ms: float | None = None
    key: str = ""


@dataclass(frozen=True)
class TenantConf:
    """What the fair queue needs of a tenant's entitlements. ``None`` limits mean none."""

    weight: int
    max_concurrency: int | None
    rate_per_s: float | None
    burst: int
    tiers: tuple[str, ...]
    suspended: bool = False
    # The version of the tenant row ``suspended`` was read from (its ``updated_at``, µs): the
    # queue keeps the status of the newest row it was told, whatever order processes write in.
    status_version: int = 0

    def __post_init__(self) -> None:
        _at_least("weight", self.weight, 1)
        _at_least("burst", self.burst, 1)
        if self.max_concurrency is not None:
            _at_least("max_concurrency", self.max_concurrency, 0)
        if self.rate_per_s is not None and not 0 < self.rate_per_s < math.inf:
            raise ValueError(f"rate_per_s is a finite number > 0 or None, not {self.rate_per_s!r}")
        if not set(self.tiers) <= set(TIERS):
            raise ValueError(f"tiers are a subset of {list(TIERS)}, not {list(self.tiers)!r}")

    @classmethod
    def for_tenant(cls, tenant: Tenant) -> TenantConf:
        """From the tenant's effective entitlements; the system tenant has its tier and no limits."""
        if tenant.is_system:
            return cls(weight=1, max_concurrency=None, rate_per_s=None, burst=1, tiers=(SYSTEM_TIER,))
        ent = effective_entitlements(tenant)
        return cls(
            weight=ent.weight,
            max_concurrency=ent.max_concurrency,
            rate_per_s=ent.step_rate_per_s,
            burst=ent.step_burst,
            tiers=tuple(ent.allowed_tiers),
            suspended=not tenant.is_active,
            status_version=int(tenant.updated_at.timestamp() * 1_000_000) if tenant.updated_at else 0,
        )


@dataclass(frozen=True)
class TenantBatch:
    """One tenant's items for ``bulk_enqueue``; ``conf`` defaults to ``TenantConf.for_tenant``;
    ``scopes`` are the admission scope confs its items use, ``key_weights`` the weights of its
    items' fairness keys (see ``enqueue_many``)."""

    tenant: Tenant
    items: Sequence[NewItem]
    conf: TenantConf | None = None
    scopes: Mapping[str, str] = field(default_factory=dict)
    key_weights: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Dequeued:
    """A dispatched item.

    ``waited_ms`` is how long it was due before this dispatch; ``attempt`` counts
    its deliveries (1 the first time). ``delivery`` is this delivery's token,
    unique per tenant: pass it to ack/nack/extend_lease so that a worker whose
    lease ended cannot touch a later delivery of the same item. ``lease_until_ms``
    is when its lease ends (Unix ms, Redis's clock) unless extended.
    ``connection_id`` is the connection of its pool that its admission chose ("" for
    none), ``admitted`` why that one.
    """

    tenant_id: str
    item_id: str
    tier: str
    partition: str
    payload: Any
    waited_ms: int
    attempt: int
    delivery: int
    lease_until_ms: int
    connection_id: str = ""
    admitted: str = ""


class Finished(NamedTuple):
    """An item a worker finished, in the delivery it ran: what ``handoff`` and ``queue_ack`` ack;
    ``work_ms`` is the work it did, measured on the worker (None: unreported, see ``ack``)."""

    tenant: Tenant
    item_id: str
    delivery: int
    work_ms: float | None = None


@dataclass(frozen=True)
class TierStats:
    backlog: int  # items waiting (due or not)
    due: int  # items waiting and due now
    in_flight: int
    oldest_waiting_ms: int  # age of the oldest due item, 0 when none is due


@dataclass(frozen=True)
class QueueStats:
    tiers: dict[str, TierStats]
    backlog: int
    due: int
    in_flight: int
    oldest_waiting_ms: int


@dataclass(frozen=True)
class GlobalTierStats:
    ready_tenants: int
    blocked_tenants: int
    virtual_time: float


@dataclass(frozen=True)
class GlobalStats:
    shard: int
    tiers: dict[str, GlobalTierStats] = field(default_factory=dict)
    timers: int = 0
    in_flight: int = 0
    expired_leases: int = 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _tenant(tenant: Tenant | None) -> Tenant:
    """The tenant whose items an operation touches (``named_or_current``)."""
    return named_or_current(tenant, what="fair-queue items")


def _dispatcher_side() -> None:
    """The cross-tenant operations run outside tenant contexts (or as the system tenant)."""
    tenant = peek_tenant()
    if tenant is not None and not tenant.is_system:
        raise TenantScopeError("the fair queue's dispatcher side crosses tenants: not in a tenant context")


def _check_shard(shard: int) -> int:
    served = queue_shards()
    if isinstance(shard, bool) or not isinstance(shard, int) or shard not in served:
        raise ValueError(f"shard must be in [0, {len(served)}), not {shard!r}")
    return shard


def _at_least(name: str, value: int, low: int) -> int:
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


def _header(shard: int) -> tuple[str, ...]:
    """The ARGV every fair-queue script starts with (``fq_init`` and ``FQ_HEADER`` in fq_lib.lua):
    the shard's key layout, then how items are charged (``DUCTOR_FAIR_COST``, the most one item
    is charged, what an unmeasured kind is estimated at)."""
    return (*_key_header(shard), settings.DUCTOR_FAIR_COST, str(settings.DUCTOR_FAIR_MAX_COST_MS),
            str(settings.DUCTOR_FAIR_FIRST_COST_MS))


def global_key(name: str, *, shard: int = 0) -> str:
    """A cross-tenant index key of the shard (``ready:<tier>``, ``timers``, ``inflight`` …)."""
    return global_redis_key("fq", name, shard=shard)


def _run(name: str, keys: list[str], args: Sequence[Any], batch: scripts.Batch | None = None,
         again: Callable[[], Any] | None = None) -> Any:
    libraries = _ADMISSION if name in ("fq_dequeue", "fq_admit_peek", "fq_why") else _LIBRARIES
    return scripts.run(LUA_DIR / f"{name}.lua", keys, list(args), libraries=libraries, batch=batch, again=again)


def shard_script(name: str, shard: int, keys: list[str], args: Sequence[Any]) -> Any:
    """Run ``scheduling/lua/<name>.lua`` of another scheduling module that works on the fair queue's
    own layout (the reshard's): loaded with ``fq_lib.lua``, given the shard's header. One round trip."""
    return _run(name, keys, [*_header(shard), *args])


def _tenant_call(name: str, tenant: Tenant, *args: Any, batch: scripts.Batch | None = None) -> Any:
    """One tenant-side script of the tenant, in its shard; followed there should it move meanwhile
    (``tenant_moves``; queued on ``batch``, a fenced call is made again when the batch runs)."""
    tenant_id = str(tenant.pk)

    def attempt(on: scripts.Batch | None = None, again: Callable[[], Any] | None = None) -> Any:
        # The keys and header of the tenant's shard as this process knows it at each try.
        keys, header = [redis_key("fq", "items", tenant=tenant)], _header(shard_of(tenant_id))
        return _run(name, keys, [*header, tenant_id, *args], on, again)

    def followed() -> Any:
        return tenant_moves.follow(tenant_id, attempt)

    if batch is not None:
        return attempt(batch, followed)
    return followed()


def _delivery(delivery: int | None) -> str:
    if delivery is None:
        return ""
    return str(_at_least("delivery", delivery, 1))


def _name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"{kind} is a non-empty str of at most {MAX_NAME_LENGTH} characters, not {value!r}")
    return value


def _item_args(item: NewItem, conf: TenantConf) -> list[Any]:
    if item.tier not in conf.tiers:
        raise TierNotAllowed(f"tier {item.tier!r} is not allowed; allowed: {list(conf.tiers)}")
    if isinstance(item.cost, bool) or not isinstance(item.cost, int) or item.cost < 1:
        raise ValueError(f"cost is an int >= 1, not {item.cost!r}")
    payload = json.dumps(item.payload, separators=(",", ":"))
    if len(payload.encode()) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"payload is larger than {MAX_PAYLOAD_BYTES} bytes")
    kind = item.kind
    if kind is None:
        kind = str(item.payload.get("kind", "")) if isinstance(item.payload, dict) else ""
    return [
        _name("item_id", item.item_id),
        item.tier,
        _name("partition", item.partition),
        _at_least("delay_ms", item.delay_ms, 0),
        item.cost,
        payload,
        "" if item.scope is None else _name("scope", item.scope),
        kind[:MAX_NAME_LENGTH],
        "" if item.order_ms is None else _ms("order_ms", item.order_ms),
        _fairness_key(item.key),
    ]


def _fairness_key(key: str) -> str:
    if not isinstance(key, str) or len(key) > MAX_NAME_LENGTH:
        raise ValueError(f"key is a str of at most {MAX_NAME_LENGTH} characters, not {key!r}")
    return key


def _key_weight_args(weights: Mapping[str, int]) -> list[Any]:
    for key, weight in weights.items():
        _fairness_key(key)
        _at_least(f"the weight of key {key!r}", weight, 1)
    return [len(weights), *(part for key, weight in weights.items() for part in (key, weight))]


def _conf_args(conf: TenantConf) -> list[Any]:
    return [
        conf.weight,
        -1 if conf.max_concurrency is None else conf.max_concurrency,
        0 if conf.rate_per_s is None else repr(float(conf.rate_per_s)),
        conf.burst,
        1 if conf.suspended else 0,
        conf.status_version,
    ]


def _scope_args(scopes: Mapping[str, str]) -> list[Any]:
    for name in scopes:
        if not name.startswith(SCOPE_FIELDS):
            raise ValueError(f"an admission scope is named 'pool:<id>' or 'connection:<id>', not {name!r}")
    return [len(scopes), *(part for name, conf in scopes.items() for part in (name, conf))]


def _segments(
    tenant: Tenant, items: Sequence[NewItem], conf: TenantConf, scopes: Mapping[str, str],
    key_weights: Mapping[str, int] | None = None,
) -> list[tuple[int, list[Any]]]:
    """The tenant's items as script ARGV segments of at most ``ITEMS_PER_CALL`` items each:
    (item count, args), each with the weights of ``key_weights`` (fairness key -> weight; 1 puts a
    key back to the default). Every item is validated before any is written."""
    flat = [_item_args(item, conf) for item in items]
    head = [str(tenant.pk), *_conf_args(conf), *_scope_args(scopes), *_key_weight_args(key_weights or {})]
    return [
        (len(chunk), [*head, len(chunk), *(arg for args in chunk for arg in args)])
        for chunk in (flat[i : i + ITEMS_PER_CALL] for i in range(0, len(flat), ITEMS_PER_CALL))
    ]


def enqueue(
    item_id: str,
    *,
    tier: str,
    partition: str,
    payload: Any = None,
    delay_ms: int = 0,
    cost: int = 1,
    scope: str | None = None,
    scopes: Mapping[str, str] | None = None,
    kind: str | None = None,
    order_ms: float | None = None,
    key: str = "",
    tenant: Tenant | None = None,
) -> EnqueueResult:
    """Enqueue one item of the tenant, due ``delay_ms`` after now (Redis TIME); ``scope`` and
    ``scopes`` as ``NewItem.scope`` and ``enqueue_many`` say.

    One Redis round trip for the queue (the tenant's entitlements come from their
    cache), atomic, O(log n). Idempotent and coalescing: an id already waiting
    keeps its item and takes the earlier due time (``EXISTS``/``ADVANCED``); an id
    in flight runs again after its ack, with this payload (``RERUN``). Also
    records the tenant's weight and limits for dequeue. Raises ``TierNotAllowed``
    for a tier outside the tenant's plan, ``ValueError`` for a bad argument and
    ``TenantScopeError`` without a tenant.
    """
    item = NewItem(item_id, tier, partition, payload, delay_ms, cost, scope, kind, order_ms, key)
    return enqueue_many([item], scopes=scopes, tenant=tenant)[0]


def enqueue_many(
    items: Sequence[NewItem], *, scopes: Mapping[str, str] | None = None,
    key_weights: Mapping[str, int] | None = None, tenant: Tenant | None = None,
) -> list[EnqueueResult]:
    """Enqueue several items of one tenant, like ``enqueue`` for each, in order.

    ``scopes`` are the confs (``"pool:<id>"`` / ``"connection:<id>"`` -> JSON, from
    ``scheduling.admission``) of the pools the items need and of their connections:
    written with the items, so dequeue admits them by the routing table of now.
    ``key_weights`` (fairness key -> weight >= 1; a key not named keeps the weight it has,
    1 by default) are written with them too. One
    round trip per ``ITEMS_PER_CALL`` items, each atomic; every item is validated
    before any is written. Raises like ``enqueue``.
    """
    tenant = _tenant(tenant)
    results: list[EnqueueResult] = []
    for _, args in _segments(tenant, items, TenantConf.for_tenant(tenant), scopes or {}, key_weights):
        results.extend(_ENQUEUE_CODES[int(code)] for code in _enqueue_segment(tenant, args))
    return results


def _enqueue_segment(tenant: Tenant, args: list[Any]) -> list[Any]:
    """One ``fq_enqueue`` call of one tenant's segment, in its shard, followed should it move."""
    return list(tenant_moves.follow(str(tenant.pk), lambda: _enqueue_call(tenant, args)))


def _enqueue_call(tenant: Tenant, args: list[Any], batch: scripts.Batch | None = None,
                  again: Callable[[], Any] | None = None) -> Any:
    """The ``fq_enqueue`` call of one tenant's segment, in its shard (``_run``'s ``batch``, ``again``)."""
    return _run("fq_enqueue", [redis_key("fq", "items", tenant=tenant)],
                [*_header(shard_of(str(tenant.pk))), *args], batch, again)


# The enqueues held for the next ``handoff`` of the context (``holding_enqueues``): each one
# tenant's segment, as ``_segments`` made it.
_held: ContextVar[list[tuple[Tenant, list[Any]]] | None] = ContextVar("ductor_held_enqueues", default=None)


def enqueue_soon(items: Sequence[NewItem], *, scopes: Mapping[str, str] | None = None,
                 tenant: Tenant | None = None) -> None:
    """``enqueue_many`` without its results: inside ``holding_enqueues()`` the items wait for that
    block's next ``handoff`` and travel in its round trip; elsewhere they are sent at once. Validated
    now either way (raises like ``enqueue_many``)."""
    held = _held.get()
    if held is None:
        enqueue_many(items, scopes=scopes, tenant=tenant)
        return
    tenant = _tenant(tenant)
    held.extend((tenant, args) for _, args in _segments(tenant, items, TenantConf.for_tenant(tenant), scopes or {}))


@contextmanager
def holding_enqueues() -> Iterator[None]:
    """A worker's block in which ``enqueue_soon`` holds its items for the block's next ``handoff``,
    which sends them first in its round trip (so its dequeue already sees them): the next steps
    that an item's commit makes ready cost no round trip of their own. Whatever is still held
    when the block ends (no handoff followed, or it failed) is sent then; should that fail too,
    it is logged and left to the reconciler, as a lost enqueue after any commit is."""
    held: list[tuple[Tenant, list[Any]]] = []
    token = _held.set(held)
    try:
        yield
    finally:
        _held.reset(token)
        if held:
            batch = scripts.Batch()
            _queue_held(batch, held)
            try:
                failed = _settle_held(held, batch.execute())
            except Exception as exc:
                failed = [exc]
            if failed:
                log.error("held_enqueues_lost", segments=len(held), error=repr(failed[0]))


def _after_held(calls: Callable[[scripts.Batch], None]) -> list[Any]:
    """The replies of the script calls that ``calls`` puts on a batch, sent after the enqueues
    held in this context (``holding_enqueues``), in one round trip. Held segments that failed stay
    held, for the block's end."""
    batch, held = scripts.Batch(), _held.get() or []
    _queue_held(batch, held)
    sent = len(held)
    calls(batch)
    replies = batch.execute()
    if sent and (failed := _settle_held(held, replies[:sent])):
        log.warning("held_enqueues_failed", segments=len(failed), error=repr(failed[0]))
    return replies[sent:]


def _queue_held(batch: scripts.Batch, held: list[tuple[Tenant, list[Any]]]) -> None:
    """The held segments' ``fq_enqueue`` calls on ``batch`` (each followed where its tenant moved)."""
    for tenant, args in held:
        _enqueue_call(tenant, args, batch, again=partial(_enqueue_segment, tenant, args))


def _settle_held(held: list[tuple[Tenant, list[Any]]], replies: list[Any]) -> list[Exception]:
    """Let go of the held segments that ``replies`` (theirs first) say were enqueued; those that
    failed stay held (an enqueue sent again is coalesced). Returns their errors."""
    failed = [(segment, reply) for segment, reply in zip(held, replies, strict=False) if isinstance(reply, Exception)]
    held[:] = [segment for segment, _ in failed]
    return [reply for _, reply in failed]


def bulk_enqueue(batches: Iterable[TenantBatch], *, pipeline_size: int = 20) -> int:
    """Enqueue the items of many tenants, like ``enqueue_many`` for each: rebuilds and bulk loads.

    The tenants of a shard share script calls (up to ``ITEMS_PER_CALL`` items
    each, every call atomic), sent ``pipeline_size`` calls per round trip (per node of a cluster). A
    batch's ``conf`` (default: the tenant's entitlements) lets a loader that has
    no tenant rows (a benchmark) name the limits. Dispatcher side: refused inside
    a customer tenant's context. Returns how many new items were queued. A call one of whose
    tenants is moving to another shard wrote nothing: each of its tenants' segments is sent
    again alone, where that tenant is (``tenant_moves``).
    """
    _dispatcher_side()
    queued = 0
    calls: list[tuple[list[str], list[Any], list[tuple[Tenant, list[Any]]]]] = []
    # Per shard: the call being filled (its first tenant's items key routes it; its tenants'
    # segments), and its size.
    filling: dict[int, tuple[list[str], list[Any], list[tuple[Tenant, list[Any]]]]] = {}
    sizes: dict[int, int] = {}

    def alone(parts: list[tuple[Tenant, list[Any]]]) -> Callable[[], list[Any]]:
        return lambda: [code for tenant, args in parts for code in _enqueue_segment(tenant, args)]

    def send() -> None:
        nonlocal queued
        batch = scripts.Batch()
        for keys, args, parts in calls:
            _run("fq_enqueue", keys, args, batch, again=alone(parts))
        for codes in batch.execute():
            if isinstance(codes, Exception):
                raise codes
            queued += sum(1 for code in codes if int(code) == 1)
        calls.clear()

    def close(shard: int) -> None:
        calls.append(filling.pop(shard))
        sizes.pop(shard)
        if len(calls) >= pipeline_size:
            send()

    for batch in batches:
        tenant_id = str(batch.tenant.pk)
        shard = shard_of(tenant_id)
        conf = batch.conf or TenantConf.for_tenant(batch.tenant)
        for count, args in _segments(batch.tenant, batch.items, conf, batch.scopes, batch.key_weights):
            if shard in filling and sizes[shard] + count > ITEMS_PER_CALL:
                close(shard)
            if shard not in filling:
                filling[shard] = ([redis_key("fq", "items", tenant=batch.tenant)], list(_header(shard)), [])
                sizes[shard] = 0
            filling[shard][1].extend(args)
            filling[shard][2].append((batch.tenant, args))
            sizes[shard] += count
    for shard in list(filling):
        close(shard)
    if calls:
        send()
    return queued


def dequeue(*, shard: int = 0, lease_ms: int, tiers: Sequence[str] | None = None) -> Dequeued | None:
    """Dispatch the next item of the shard, leased for ``lease_ms``; None when nothing is eligible.

    Strict tier priority (only ``tiers`` when given), SFQ by weight among the
    tier's tenants, then the tenant's earliest-due partition head; never an item
    before it is due, of a locked partition, or of a tenant at its concurrency
    ceiling or held back by its step rate (those are parked, in the same atomic
    step). Takes the tenant's step slot and charges its step rate. One round trip,
    atomic, O(log n) in tenants and partitions; after a mass wake-up (more than
    ``PROMOTE_PER_CALL`` timers due, or ``TENANTS_PER_CALL`` tenants parked) a
    few more calls. Dispatcher side: raises ``TenantScopeError`` inside a
    customer tenant's context.
    """
    items = dequeue_many(shard=shard, lease_ms=lease_ms, tiers=tiers, limit=1)
    return items[0] if items else None


def dequeue_many(
    *, shard: int = 0, lease_ms: int, tiers: Sequence[str] | None = None, limit: int
) -> list[Dequeued]:
    """Up to ``limit`` items of the shard, in the order ``limit`` calls of ``dequeue`` would
    give them, in one round trip (a few more after a mass wake-up); see ``dequeue``."""
    return dequeue_batches(shard=shard, lease_ms=lease_ms, batches=[(tiers, limit)])[0]


def dequeue_batches(
    *, shard: int = 0, lease_ms: int, batches: Sequence[tuple[Sequence[str] | None, int]]
) -> list[list[Dequeued]]:
    """``dequeue_many(tiers=..., limit=...)`` for each ``(tiers, limit)`` of ``batches``, one
    after the other, all in one round trip: a dispatcher takes the system tier with its
    system credits, then the customer tiers with its work credits."""
    _dispatcher_side()
    shard = _check_shard(shard)
    _at_least("lease_ms", lease_ms, 1)
    wanted = [(_tiers(tiers), _at_least("limit", limit, 1)) for tiers, limit in batches]
    results: list[list[Dequeued]] = [[] for _ in wanted]
    pending = list(range(len(wanted)))
    for _ in range(_MAX_CALLS):
        if not pending:
            break
        batch = scripts.Batch()
        for i in pending:
            tiers, limit = wanted[i]
            _queue_dequeue(batch, shard, lease_ms, tiers, limit - len(results[i]))
        again = []
        for i, reply in zip(pending, batch.execute(), strict=True):
            found, more = _dequeue_reply(reply)
            results[i] += found
            if more and len(results[i]) < wanted[i][1]:
                again.append(i)
        pending = again
    return results


def handoff(
    finished: Finished | None, *, shard: int, lease_ms: int, tiers: Sequence[str]
) -> tuple[bool | None, Dequeued | None]:
    """Ack ``finished`` (tenant, item id, delivery), when given, then dequeue the shard's next
    item of ``tiers`` (see ``dequeue``): one round trip for both, in that order, so that the
    slot and the partition the ack frees are already free for the dequeue. The enqueues
    held in this context (``holding_enqueues``) go first in the same round trip.

    For a worker that finishes an item and takes the next one itself. Returns
    whether the ack acked (None without ``finished``) and the item, or None.
    Call it outside any customer tenant's context.
    """
    _dispatcher_side()
    shard = _check_shard(shard)
    _at_least("lease_ms", lease_ms, 1)
    tiers = _tiers(tiers)
    if finished is not None:
        finished = Finished(*finished)

    def calls(batch: scripts.Batch) -> None:
        if finished is not None:
            queue_ack(batch, finished.item_id, delivery=finished.delivery, tenant=finished.tenant,
                      work_ms=finished.work_ms)
        _queue_dequeue(batch, shard, lease_ms, tiers, 1)

    *acked, reply = _after_held(calls)
    if acked and isinstance(acked[0], Exception):
        raise acked[0]
    found, more = _dequeue_reply(reply)
    if not found and more:  # a mass wake-up: finish it the usual way
        found = dequeue_many(shard=shard, lease_ms=lease_ms, tiers=tiers, limit=1)
    return (acked[0] == 1 if acked else None), (found[0] if found else None)


def _queue_dequeue(batch: scripts.Batch, shard: int, lease_ms: int, tiers: list[str], limit: int) -> None:
    args = [*_header(shard), lease_ms, PROMOTE_PER_CALL, TENANTS_PER_CALL, limit, *tiers]
    _run("fq_dequeue", [global_key("timers", shard=shard)], args, batch)


def _dequeue_reply(reply: Any) -> tuple[list[Dequeued], bool]:
    """The items of one ``fq_dequeue`` call, and whether more may be eligible (a mass wake-up
    cut the call short)."""
    if isinstance(reply, Exception):
        raise reply
    status, *found = reply
    return [_dequeued(row) for row in found], _text(status) == "again"


def _tiers(tiers: Sequence[str] | None) -> list[str]:
    """``tiers`` in priority order (every tier when None); a ValueError for unknown ones."""
    if tiers is None:
        return list(TIERS)
    unknown = set(tiers) - set(TIERS)
    if unknown or not tiers:
        raise ValueError(f"tiers are a non-empty subset of {list(TIERS)}, not {list(tiers)!r}")
    return [tier for tier in TIERS if tier in tiers]


def _dequeued(row: Sequence[Any]) -> Dequeued:
    tenant_id, item_id, tier, partition, payload, waited, attempt, delivery, lease_until, conn, why = row
    return Dequeued(
        tenant_id=_text(tenant_id),
        item_id=_text(item_id),
        tier=_text(tier),
        partition=_text(partition),
        payload=json.loads(payload),
        waited_ms=int(waited),
        attempt=int(attempt),
        delivery=int(delivery),
        lease_until_ms=int(lease_until),
        connection_id=_text(conn),
        admitted=_text(why),
    )


def _ms(name: str, value: float) -> str:
    """A finite number of ms >= 0, as a script argument (µs kept as the fraction)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ValueError(f"{name} is a finite number >= 0 or None, not {value!r}")
    return repr(float(value))


def _work(work_ms: float | None) -> str:
    return "" if work_ms is None else _ms("work_ms", work_ms)


def ack(item_id: str, *, delivery: int | None = None, work_ms: float | None = None,
        tenant: Tenant | None = None) -> bool:
    """The item's work is done: end its lease, give its slot back, unlock its partition.

    The item is deleted, unless it was enqueued again while in flight: then it
    waits again. ``work_ms`` is the work it did, as its worker measured it: what
    its tenant is charged (fair by work). None (unreported: a task node on a
    team's worker without ``ductor_sdk``'s hook) charges its time in flight, by
    Redis's clock, which counts its wait in a broker too: at most four times the
    tenant's estimate for its kind. Returns False, changing nothing, when the item (in that
    ``delivery``, when given) is not in flight: idempotent. One round trip,
    atomic; inside ``holding_enqueues()``, the enqueues held so far go first in it. Raises
    ``TenantScopeError`` without a tenant.
    """
    tenant = _tenant(tenant)
    if not _held.get():
        return bool(_tenant_call("fq_ack", tenant, item_id, _delivery(delivery), _work(work_ms)) == 1)
    [acked] = _after_held(partial(queue_ack, item_id=item_id, delivery=delivery, tenant=tenant, work_ms=work_ms))
    if isinstance(acked, Exception):
        raise acked
    return bool(acked == 1)


def queue_ack(batch: scripts.Batch, item_id: str, *, delivery: int | None, tenant: Tenant,
              work_ms: float | None = None) -> None:
    """``ack`` queued on a script ``batch``: its reply in ``batch.execute()`` is 1 when it acked."""
    _tenant_call("fq_ack", tenant, item_id, _delivery(delivery), _work(work_ms), batch=batch)


def nack(
    item_id: str, *, delay_ms: int = 0, delivery: int | None = None, work_ms: float | None = None,
    tenant: Tenant | None = None,
) -> bool:
    """Put an item in flight back in its partition, due ``delay_ms`` from now; its slot is freed.

    ``work_ms`` as for ``ack``. Returns False, changing nothing, when the item (in
    that ``delivery``) is not in flight. One round trip, atomic. Raises
    ``TenantScopeError`` without a tenant.
    """
    _at_least("delay_ms", delay_ms, 0)
    return bool(_tenant_call("fq_nack", _tenant(tenant), item_id, _delivery(delivery), delay_ms,
                             _work(work_ms)) == 1)


def extend_lease(
    item_id: str, *, lease_ms: int, delivery: int | None = None, tenant: Tenant | None = None
) -> bool:
    """Renew an item's lease, and its capacity slot's, to end ``lease_ms`` from now.

    Returns False, changing nothing, when the item is not in flight (in that
    ``delivery``) or its lease has already ended: the reaper owns it then, and a
    worker that gets False should stop. One round trip, atomic. Raises
    ``TenantScopeError`` without a tenant.
    """
    _at_least("lease_ms", lease_ms, 1)
    return bool(_tenant_call("fq_extend", _tenant(tenant), item_id, _delivery(delivery), lease_ms) == 1)


def queue_extend_lease(batch: scripts.Batch, item_id: str, *, lease_ms: int, delivery: int | None,
                       tenant: Tenant) -> None:
    """``extend_lease`` queued on a script ``batch``: its reply is 1 when it renewed."""
    _at_least("lease_ms", lease_ms, 1)
    _tenant_call("fq_extend", tenant, item_id, _delivery(delivery), lease_ms, batch=batch)


def remove(item_id: str, *, tenant: Tenant | None = None) -> bool:
    """Withdraw a waiting item (or cancel the re-run asked for an item in flight).

    An item in flight keeps its lease; ack or nack it. Returns whether anything
    was withdrawn. One round trip, atomic, idempotent. Raises
    ``TenantScopeError`` without a tenant.
    """
    return bool(_tenant_call("fq_remove", _tenant(tenant), item_id) == 1)


def configure(
    *, scopes: Mapping[str, str] | None = None, replace_scopes: bool = False, tenant: Tenant | None = None
) -> int:
    """Bring the tenant's copy of its limits up to date now, instead of at its next enqueue,
    and wake what the change may admit.

    Writes the tenant's conf from its entitlements and status (a tenant parked at an old
    ceiling, or while suspended, is looked at again), and the admission scope confs given
    (see ``enqueue_many``; with ``replace_scopes``, every other scope conf of the tenant is
    deleted): the partitions parked on a changed pool, or on the pools of a changed
    connection, are woken. One round trip, atomic. Returns how many scope confs changed.
    Raises ``TenantScopeError`` without a tenant.
    """
    tenant = _tenant(tenant)
    conf = TenantConf.for_tenant(tenant)
    args = [1, *_conf_args(conf), 1 if replace_scopes else 0, *_scope_args(scopes or {})]
    return int(_tenant_call("fq_configure", tenant, *args))


# Fairness key weights written per script call (``set_key_weights``).
KEY_WEIGHTS_PER_CALL = 1000


def set_key_weights(
    weights: Mapping[str, int], *, replace: bool = False, tenant: Tenant | None = None
) -> int:
    """Set the weights of some of the tenant's fairness keys (key -> weight >= 1; 1 is the default),
    or with ``replace`` make them all of its key weights (every other key weighs 1 again). A
    backlogged key's next service is charged at its new weight. One round trip per
    ``KEY_WEIGHTS_PER_CALL`` keys, each atomic (with ``replace``, the keys of a later call weigh 1
    until it ran). Returns how many weights changed. Raises ``ValueError`` for a bad key or weight
    and ``TenantScopeError`` without a tenant."""
    tenant = _tenant(tenant)
    pairs = list(weights.items())
    _key_weight_args(weights)
    chunks = [pairs[i : i + KEY_WEIGHTS_PER_CALL] for i in range(0, len(pairs), KEY_WEIGHTS_PER_CALL)] or [[]]
    changed = 0
    for n, chunk in enumerate(chunks):
        if chunk or (replace and n == 0):
            changed += int(_tenant_call("fq_key_weights", tenant, 1 if replace and n == 0 else 0,
                                        *_key_weight_args(dict(chunk))))
    return changed


@dataclass(frozen=True)
class MemberView:
    """A pool member as admission sees it now (``admission_peek``)."""

    connection_id: str
    breaker: str  # closed, open or half_open
    in_flight: int
    limit: int | None
    eligible: bool
    why: str
    open_until_ms: int | None = None  # while its breaker is open


@dataclass(frozen=True)
class AdmissionView:
    """How admission would decide an item of a pool now: admitted (with ``connection_id``, ""
    for none) or waiting (``parked`` on the pool's slots, and/or until ``retry_at_ms``)."""

    admitted: bool
    connection_id: str
    why: str
    parked: bool
    retry_at_ms: int | None
    pool_in_flight: int
    pool_limit: int | None
    members: tuple[MemberView, ...]


def admission_peek(
    pool_id: str, pool_conf: str, connections: Mapping[str, str], *, tenant: Tenant | None = None
) -> AdmissionView:
    """How the dequeue would admit an item of the tenant's pool ``pool_id`` right now, given the
    pool's conf and its connections' (JSON, as ``enqueue_many`` takes them): the same decision,
    taking nothing, charging nothing and using no round-robin turn. One round trip, read only.
    Raises ``TenantScopeError`` without a tenant."""
    tenant = _tenant(tenant)
    return _admission_view(_tenant_call("fq_admit_peek", tenant, pool_id, pool_conf, *_scope_args(connections)))


def _limit(value: Any) -> int | None:
    return None if int(value) < 0 else int(value)


def _admission_view(reply: Sequence[Any]) -> AdmissionView:
    """An admission decision as the read-only scripts answer it (admit_lib.lua's ``ad_view``)."""
    ok, conn, why, parked, at, live, limit, members = reply
    return AdmissionView(
        admitted=bool(ok), connection_id=_text(conn), why=_text(why), parked=bool(parked), retry_at_ms=_limit(at),
        pool_in_flight=int(live), pool_limit=_limit(limit),
        members=tuple(
            MemberView(connection_id=_text(cid), breaker=_text(state), in_flight=int(n), limit=_limit(cap),
                       eligible=bool(ok_), why=_text(reason), open_until_ms=_limit(until))
            for cid, state, n, cap, ok_, reason, until in members
        ),
    )


@dataclass(frozen=True)
class ItemHold:
    """What the dequeue would look at for one waiting item of the tenant, now (``holds_of``)."""

    state: str  # "waiting" or "inflight"
    due_ms: int
    tier: str
    partition: str
    partition_holder: str  # the partition's item in flight, "" for none (or this one)
    ahead: int  # items before it in its partition
    suspended: bool
    tenant_limit: int | None
    tenant_in_flight: int
    rate_wait_ms: int
    admission: AdmissionView | None  # None for an item of no pool
    ready_tenants: int  # tenants with due work in its tier, itself included
    now_ms: int


def holds_of(item_ids: Sequence[str], *, tenant: Tenant | None = None) -> list[ItemHold | None]:
    """For each of the tenant's items ``item_ids``, everything the dequeue would weigh for it now,
    in its order: due time, partition, suspension, ceiling, rate, and the admission of its pool
    (from the limits the fair queue holds); None for an item not in the queue. One round trip for
    them all, read only."""
    tenant = _tenant(tenant)
    if not item_ids:
        return []
    batch = scripts.Batch()
    for item_id in item_ids:
        _tenant_call("fq_why", tenant, item_id, batch=batch)
    replies = batch.execute()
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return [_hold(reply) for reply in replies]


def _hold(reply: Sequence[Any]) -> ItemHold | None:
    if not int(reply[0]):
        return None
    (_, state, due, tier, part, holder, ahead, suspended, limit, live, rate_wait, admission, ready,
     now) = reply
    return ItemHold(
        state=_text(state), due_ms=int(float(_text(due))), tier=_text(tier), partition=_text(part),
        partition_holder=_text(holder), ahead=int(ahead), suspended=bool(int(suspended)),
        tenant_limit=_limit(limit), tenant_in_flight=int(live), rate_wait_ms=int(rate_wait),
        admission=_admission_view(admission) if admission else None, ready_tenants=int(ready), now_ms=int(now),
    )


def pending(items: Sequence[tuple[Tenant, str]]) -> list[bool]:
    """For each ``(tenant, item id)``: is the item waiting or in flight? One round trip, read only.

    An item is in its tenant's ``items`` hash from its enqueue to its ack or removal.
    Crosses tenants (each key is its own tenant's): for the system's housekeeping.
    """
    if not items:
        return []
    with get_redis().pipeline(transaction=False) as pipe:
        for tenant, item_id in items:
            pipe.hexists(redis_key("fq", "items", tenant=tenant), item_id)
        return [bool(found) for found in pipe.execute()]


def reap(*, shard: int = 0, limit: int = 100) -> int:
    """Return up to ``limit`` items whose lease ended to their partitions; returns how many.

    A reaped item keeps its due time (its partition's order holds) and is
    delivered again by a later dequeue; its slot was freed by the lease's end.
    One round trip, atomic. Dispatcher side.
    """
    _dispatcher_side()
    shard = _check_shard(shard)
    _at_least("limit", limit, 1)
    return int(_run("fq_reap", [global_key("inflight", shard=shard)], [*_header(shard), limit]))


def next_due_ms(shard: int = 0) -> int | None:
    """How long a dispatcher of the shard may sleep: 0 when work is ready, None when the shard is empty.

    Otherwise the ms until the earliest timer (a due head, a rate, a ceiling's
    lease) or lease end. One round trip, read only. Dispatcher side.
    """
    return due_ms_of(queue_next_due(None, shard))


def queue_next_due(batch: scripts.Batch | None, shard: int) -> Any:
    """``next_due_ms`` queued on a script ``batch`` (read its reply with ``due_ms_of``); without
    one, the call's reply."""
    _dispatcher_side()
    shard = _check_shard(shard)
    return _run("fq_next_due", [global_key("timers", shard=shard)], list(_header(shard)), batch)


def due_ms_of(reply: Any) -> int | None:
    """What ``next_due_ms`` returns, from an ``fq_next_due`` reply (raised when it is an error)."""
    if isinstance(reply, Exception):
        raise reply
    return None if int(reply) < 0 else int(reply)


def wait_for_work(*, shards: Sequence[int] = (0,), timeout_s: float) -> bool:
    """Block until new ready work is signalled on one of the ``shards``, or the timeout; True if
    signalled.

    A dispatcher sleeps here for ``next_due_ms`` at most; an enqueue that makes
    a tenant ready, or sets an earlier timer, wakes one sleeper. The wait is cut
    to ``MAX_WAIT_S`` (below the client's socket timeout) and raised to 1 ms (Redis
    counts a blocking timeout in whole ms, and 0 ms would mean forever);
    ``timeout_s <= 0`` only takes a pending signal. One Redis waits on every shard's signal
    at once. A Redis Cluster cannot (a command's keys share one slot): there, the shards'
    pending signals are taken (a round trip per node), then the first shard's is waited on
    for ``CLUSTER_WAKE_SLICE_S`` at most, and so on until the timeout, so that a signal of
    another shard waits that long at most. Dispatcher side.
    """
    _dispatcher_side()
    keys = [global_key("wake", shard=_check_shard(shard)) for shard in shards]
    redis = get_redis()
    timeout_s = min(timeout_s, MAX_WAIT_S)
    if timeout_s > 0 and (len(keys) == 1 or not is_cluster(redis)):
        return redis.blpop(keys, timeout=max(timeout_s, MIN_WAIT_S)) is not None
    deadline = time.monotonic() + timeout_s
    while not any(per_node(keys, _take_signals(keys))):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if redis.blpop(keys[:1], timeout=max(min(left, CLUSTER_WAKE_SLICE_S), MIN_WAIT_S)) is not None:
            return True
    return True


def _take_signals(keys: list[str]) -> Callable[[Any, list[int]], bool]:
    """For ``per_node``: take the pending signals of a server's ``keys``; whether there was one."""
    def take(server: Any, positions: list[int]) -> bool:
        with server.pipeline(transaction=False) as pipe:
            for position in positions:
                pipe.lpop(keys[position])
            return any(token is not None for token in pipe.execute())
    return take


def stats(tenant: Tenant | None = None) -> QueueStats:
    """The tenant's queue: backlog, due, in flight and oldest due age, per tier and in total.

    Only the tenant's own keys are read. One round trip, read only. Raises
    ``TenantScopeError`` without a tenant.
    """
    rows = _tenant_call("fq_stats", _tenant(tenant))
    tiers = {
        _text(tier): TierStats(int(backlog), int(due), int(flight), int(age))
        for tier, backlog, due, flight, age in rows
    }
    return QueueStats(
        tiers=tiers,
        backlog=sum(s.backlog for s in tiers.values()),
        due=sum(s.due for s in tiers.values()),
        in_flight=sum(s.in_flight for s in tiers.values()),
        oldest_waiting_ms=max(s.oldest_waiting_ms for s in tiers.values()),
    )


# The window of the work shares: FQ_WORK_BUCKETS buckets of FQ_WORK_BUCKET_MS (fq_lib.lua).
WORK_WINDOW_S = 60


@dataclass(frozen=True)
class WorkShare:
    """A tenant's share of its shard's worker time over the last ``WORK_WINDOW_S`` (the customer
    tiers'): ``work_ms`` is what its items' workers measured, ``share`` its fraction of all of it,
    ``fair_share`` the fraction its weight entitles it to among the tenants that worked then (each
    ``WORK_WINDOW_S / 6`` bucket's weight share, averaged over the buckets by their work)."""

    tenant_id: str
    weight: int
    work_ms: float
    share: float
    fair_share: float


def _shares(rows: list[tuple[float, float, float, bool]]) -> tuple[float, float, float]:
    """(work, share, fair share) from per-bucket (work, total, weights of those that worked,
    whether it worked), for a tenant of weight 1: the caller scales the fair share."""
    total = sum(row[1] for row in rows)
    work = sum(row[0] for row in rows)
    if total <= 0:
        return work, 0.0, 0.0
    fair = sum(t / w for _, t, w, worked in rows if worked and w > 0)
    return work, work / total, fair / total


ShareT = TypeVar("ShareT", "WorkShare", "KeyShare")


def _ranked(make: Callable[[str, int, float, float, float], ShareT], per_owner: dict[str, dict[int, float]],
            weights: dict[str, int], totals: Sequence[tuple[float, float]], limit: int) -> list[ShareT]:
    """The ``limit`` owners (tenants, or a tenant's keys) that did the most work, most first, each
    ``make(owner, weight, work_ms, share, fair_share)``, from their work per bucket and each bucket's
    (total work, weights of those that worked then)."""
    out = []
    for owner, by_bucket in per_owner.items():
        rows = [(by_bucket.get(b, 0.0), t, w, b in by_bucket) for b, (t, w) in enumerate(totals)]
        work, share, fair = _shares(rows)
        out.append(make(owner, weights[owner], round(work, 3), round(share, 4),
                        round(min(1.0, fair * weights[owner]), 4)))
    return sorted(out, key=lambda s: -s.work_ms)[:limit]


@dataclass(frozen=True)
class KeyShare:
    """One of a tenant's fairness keys over the last ``WORK_WINDOW_S``: ``work_ms`` its items did,
    ``share`` its fraction of the tenant's work, ``fair_share`` the fraction of it its weight entitles
    it to among the tenant's keys that worked then (work of no key counts as key "" of weight 1)."""

    key: str
    weight: int
    work_ms: float
    share: float
    fair_share: float


@dataclass(frozen=True)
class TenantWork(WorkShare):
    """A tenant's ``WorkShare``, with its ``KEYS_SHOWN`` fairness keys that did the most work."""

    keys: tuple[KeyShare, ...] = ()


# How many of a tenant's fairness keys its work share shows (the ones that did the most work), and
# how many of each bucket's are read (FQ_WORK_KEYS in fq_work.lua).
KEYS_SHOWN = 20
KEYS_READ = 50


def work_share(tenant: Tenant | None = None) -> TenantWork:
    """The tenant's own ``WorkShare`` and its keys' (``TenantWork``). One round trip, read only;
    nothing of any other tenant but the shard's totals that a share is a fraction of. Raises
    ``TenantScopeError`` without a tenant."""
    tenant = _tenant(tenant)
    buckets = [(float(a), float(b), float(c), int(d) == 1, float(e), rest)
               for a, b, c, d, e, *rest in _tenant_call("fq_work", tenant)]
    work, share, fair = _shares([row[:4] for row in buckets])
    weight = TenantConf.for_tenant(tenant).weight
    return TenantWork(str(tenant.pk), weight, round(work, 3), round(share, 4), round(min(1.0, fair * weight), 4),
                      keys=_key_shares(buckets))


def _key_shares(buckets: list[tuple[float, float, float, bool, float, list[Any]]]) -> tuple[KeyShare, ...]:
    """The ``KEYS_SHOWN`` keys with the most work, from per-bucket rows (the tenant's work, …, the
    weights of its keys that worked, then key, work, weight per key of the bucket's top keys)."""
    per_key: dict[str, dict[int, float]] = {}  # key -> bucket -> its work there
    weights: dict[str, int] = {}
    totals: list[tuple[float, float]] = []  # per bucket: the tenant's work, the weights of its keys that worked
    for b, (tenant_work, _, _, _, key_weights, rest) in enumerate(buckets):
        keyed = 0.0
        for i in range(0, len(rest), 3):
            key = _text(rest[i])
            per_key.setdefault(key, {})[b] = float(rest[i + 1])
            weights[key] = int(rest[i + 2])
            keyed += float(rest[i + 1])
        # Work of no key is key "" (weight 1): what the keys leave, once every key of the bucket is read.
        unkeyed = tenant_work - keyed if len(rest) < 3 * KEYS_READ else 0.0
        if unkeyed > 1e-6:
            per_key.setdefault("", {})[b] = unkeyed
            weights[""] = 1
            key_weights += 1
        totals.append((tenant_work, key_weights))
    if set(per_key) <= {""}:
        return ()  # no work under a fairness key: the tenant's own share says it all
    return tuple(_ranked(KeyShare, per_key, weights, totals, KEYS_SHOWN))


def work_shares(shard: int = 0, *, limit: int = 20) -> list[WorkShare]:
    """The ``limit`` tenants of the shard that did the most work over the window, most first. One
    round trip, read only. Dispatcher side (the platform view)."""
    _dispatcher_side()
    shard = _check_shard(shard)
    _at_least("limit", limit, 1)
    buckets = _run("fq_work", [global_key("timers", shard=shard)], [*_header(shard), ""])
    per_tenant: dict[str, dict[int, float]] = {}  # tenant -> bucket -> its work there
    totals: list[tuple[float, float]] = []  # per bucket: all the work, the weights of those that worked
    weights: dict[str, int] = {}
    for b, (total, weight_sum, *rest) in enumerate(buckets):
        totals.append((float(total), float(weight_sum)))
        for i in range(0, len(rest), 3):
            tenant_id = _text(rest[i])
            per_tenant.setdefault(tenant_id, {})[b] = float(rest[i + 1])
            weights[tenant_id] = int(rest[i + 2])
    return _ranked(WorkShare, per_tenant, weights, totals, limit)


@dataclass(frozen=True)
class TenantDepth:
    tenant_id: str
    backlog: int  # items waiting
    due: int
    in_flight: int


@dataclass(frozen=True)
class ShardDepth:
    """A shard's queue summed over its tenants, and its largest tenants (``depth``)."""

    shard: int
    tiers: dict[str, TierStats]
    tenants: int  # tenants with items
    largest: list[TenantDepth]


DEPTH_CHUNK = 500  # tenants summed per script call: each call stays short


def depth(shard: int = 0, *, top: int = 0) -> ShardDepth:
    """The shard's items per tier summed over every tenant that has any (waiting, due, in flight,
    oldest due age), and its ``top`` tenants with the most items. Read only; dispatcher side.

    Reads the shard's backlog index (tenant -> items, kept by the scripts that create and delete
    items) in calls of ``DEPTH_CHUNK`` tenants: the cost grows with the tenants that have work, and
    no call holds Redis for long. Counts of one scrape may mix moments (a few milliseconds apart).
    """
    _dispatcher_side()
    shard = _check_shard(shard)
    sums = {tier: [0, 0, 0, -1] for tier in TIERS}
    largest: list[TenantDepth] = []
    first, total, now = 0, 1, 0
    while first < total:
        rows, _, total, now, named = _run(
            "fq_depth", [global_key("backlog", shard=shard)],
            [*_header(shard), first, first + DEPTH_CHUNK - 1, top if first == 0 else 0])
        for tier, waiting, due, flight, earliest in rows:
            s = sums[_text(tier)]
            s[0], s[1], s[2] = s[0] + int(waiting), s[1] + int(due), s[2] + int(flight)
            if int(earliest) >= 0 and (s[3] < 0 or int(earliest) < s[3]):
                s[3] = int(earliest)
        largest += [TenantDepth(_text(tid), int(w), int(d), int(f)) for tid, w, d, f in named]
        first += DEPTH_CHUNK
    tiers = {tier: TierStats(w, d, f, max(0, int(now) - e) if e >= 0 and d else 0)
             for tier, (w, d, f, e) in sums.items()}
    return ShardDepth(shard, tiers, int(total), largest)


def global_stats(shard: int = 0) -> GlobalStats:
    """The shard's cross-tenant indexes: ready and blocked tenants per tier, timers, leases.

    For platform admins: counts only, no tenant's items. One round trip, read
    only. Dispatcher side.
    """
    _dispatcher_side()
    shard = _check_shard(shard)
    tiers, timers, in_flight, expired = _run(
        "fq_global_stats", [global_key("timers", shard=shard)], list(_header(shard))
    )
    return GlobalStats(
        shard=shard,
        tiers={
            _text(tier): GlobalTierStats(int(ready), int(blocked), float(_text(vtime)))
            for tier, ready, blocked, vtime in tiers
        },
        timers=int(timers),
        in_flight=int(in_flight),
        expired_leases=int(expired),
    )
