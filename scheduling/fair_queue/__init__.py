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

**Modules.** ``layout`` (the shard's key layout, the script runner, the argument checks),
``items`` (what goes in and comes out, and its encoding as script arguments), ``enqueuing``,
``confs`` (a tenant's limits and key weights between enqueues), ``leases`` (ack, nack, extend,
remove), ``dequeuing`` (the dispatcher's side: dequeue, handoff, reap, waits), ``explain`` (why an
item waits) and ``inspection`` (stats, work shares, depth). Callers use the names below.
"""

from scheduling.fair_queue.confs import KEY_WEIGHTS_PER_CALL, configure, set_key_weights
from scheduling.fair_queue.dequeuing import (
    dequeue,
    dequeue_batches,
    dequeue_many,
    due_ms_of,
    handoff,
    next_due_ms,
    queue_next_due,
    reap,
    wait_for_work,
)
from scheduling.fair_queue.enqueuing import bulk_enqueue, enqueue, enqueue_many, enqueue_soon, holding_enqueues
from scheduling.fair_queue.explain import AdmissionView, ItemHold, MemberView, admission_peek, holds_of, pending
from scheduling.fair_queue.inspection import (
    DEPTH_CHUNK,
    KEYS_SHOWN,
    WORK_WINDOW_S,
    GlobalStats,
    GlobalTierStats,
    KeyShare,
    QueueStats,
    ShardDepth,
    TenantDepth,
    TenantWork,
    TierStats,
    WorkShare,
    depth,
    global_stats,
    stats,
    work_share,
    work_shares,
)
from scheduling.fair_queue.items import (
    Dequeued,
    EnqueueResult,
    Finished,
    NewItem,
    TenantBatch,
    TenantConf,
    TierNotAllowed,
)
from scheduling.fair_queue.layout import (
    ITEMS_PER_CALL,
    MAX_PAYLOAD_BYTES,
    MAX_WAIT_S,
    PROMOTE_PER_CALL,
    SYSTEM_TIER,
    TENANTS_PER_CALL,
    TIERS,
    global_key,
    shard_script,
)
from scheduling.fair_queue.leases import ack, extend_lease, nack, queue_ack, queue_extend_lease, remove

__all__ = [
    "DEPTH_CHUNK", "ITEMS_PER_CALL", "KEYS_SHOWN", "KEY_WEIGHTS_PER_CALL", "MAX_PAYLOAD_BYTES", "MAX_WAIT_S",
    "PROMOTE_PER_CALL", "SYSTEM_TIER", "TENANTS_PER_CALL", "TIERS", "WORK_WINDOW_S",
    "AdmissionView", "Dequeued", "EnqueueResult", "Finished", "GlobalStats", "GlobalTierStats", "ItemHold",
    "KeyShare", "MemberView", "NewItem", "QueueStats", "ShardDepth", "TenantBatch", "TenantConf", "TenantDepth",
    "TenantWork", "TierNotAllowed", "TierStats", "WorkShare",
    "ack", "admission_peek", "bulk_enqueue", "configure", "depth", "dequeue", "dequeue_batches", "dequeue_many",
    "due_ms_of", "enqueue", "enqueue_many", "enqueue_soon", "extend_lease", "global_key", "global_stats", "handoff",
    "holding_enqueues", "holds_of", "nack", "next_due_ms", "pending", "queue_ack", "queue_extend_lease",
    "queue_next_due", "reap", "remove", "set_key_weights", "shard_script", "stats", "wait_for_work", "work_share",
    "work_shares",
]
