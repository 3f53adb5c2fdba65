"""What the queue holds and who its workers worked for: a tenant's queue (``stats``), its share of
the work (``work_share``, its keys' too), the shard's heaviest tenants (``work_shares``), its depth
summed over tenants (``depth``) and its cross-tenant indexes (``global_stats``). Read only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from scheduling.fair_queue.items import TenantConf
from scheduling.fair_queue.layout import (
    TIERS,
    at_least,
    check_shard,
    dispatcher_side,
    global_key,
    run_script,
    script_header,
    tenant_call,
    tenant_of,
    text,
)
from tenants.models import Tenant


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



def stats(tenant: Tenant | None = None) -> QueueStats:
    """The tenant's queue: backlog, due, in flight and oldest due age, per tier and in total.

    Only the tenant's own keys are read. One round trip, read only. Raises
    ``TenantScopeError`` without a tenant.
    """
    rows = tenant_call("fq_stats", tenant_of(tenant))
    tiers = {
        text(tier): TierStats(int(backlog), int(due), int(flight), int(age))
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
    tenant = tenant_of(tenant)
    buckets = [(float(a), float(b), float(c), int(d) == 1, float(e), rest)
               for a, b, c, d, e, *rest in tenant_call("fq_work", tenant)]
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
            key = text(rest[i])
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
    dispatcher_side()
    shard = check_shard(shard)
    at_least("limit", limit, 1)
    buckets = run_script("fq_work", [global_key("timers", shard=shard)], [*script_header(shard), ""])
    per_tenant: dict[str, dict[int, float]] = {}  # tenant -> bucket -> its work there
    totals: list[tuple[float, float]] = []  # per bucket: all the work, the weights of those that worked
    weights: dict[str, int] = {}
    for b, (total, weight_sum, *rest) in enumerate(buckets):
        totals.append((float(total), float(weight_sum)))
        for i in range(0, len(rest), 3):
            tenant_id = text(rest[i])
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
    dispatcher_side()
    shard = check_shard(shard)
    sums = {tier: [0, 0, 0, -1] for tier in TIERS}
    largest: list[TenantDepth] = []
    first, total, now = 0, 1, 0
    while first < total:
        rows, _, total, now, named = run_script(
            "fq_depth", [global_key("backlog", shard=shard)],
            [*script_header(shard), first, first + DEPTH_CHUNK - 1, top if first == 0 else 0])
        for tier, waiting, due, flight, earliest in rows:
            s = sums[text(tier)]
            s[0], s[1], s[2] = s[0] + int(waiting), s[1] + int(due), s[2] + int(flight)
            if int(earliest) >= 0 and (s[3] < 0 or int(earliest) < s[3]):
                s[3] = int(earliest)
        largest += [TenantDepth(text(tid), int(w), int(d), int(f)) for tid, w, d, f in named]
        first += DEPTH_CHUNK
    tiers = {tier: TierStats(w, d, f, max(0, int(now) - e) if e >= 0 and d else 0)
             for tier, (w, d, f, e) in sums.items()}
    return ShardDepth(shard, tiers, int(total), largest)


def global_stats(shard: int = 0) -> GlobalStats:
    """The shard's cross-tenant indexes: ready and blocked tenants per tier, timers, leases.

    For platform admins: counts only, no tenant's items. One round trip, read
    only. Dispatcher side.
    """
    dispatcher_side()
    shard = check_shard(shard)
    tiers, timers, in_flight, expired = run_script(
        "fq_global_stats", [global_key("timers", shard=shard)], list(script_header(shard))
    )
    return GlobalStats(
        shard=shard,
        tiers={
            text(tier): GlobalTierStats(int(ready), int(blocked), float(text(vtime)))
            for tier, ready, blocked, vtime in tiers
        },
        timers=int(timers),
        in_flight=int(in_flight),
        expired_leases=int(expired),
    )
