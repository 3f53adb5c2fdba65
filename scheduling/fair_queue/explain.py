"""Why an item waits: how admission would decide a pool's item now (``admission_peek``), everything
the dequeue would weigh for a waiting item (``holds_of``), and whether items are still queued
(``pending``). Read only; they take and charge nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ductor_project.core import scripts
from ductor_project.core.keys import redis_key
from ductor_project.core.redis import get_redis
from scheduling.fair_queue.items import scope_args
from scheduling.fair_queue.layout import tenant_call, tenant_of, text
from tenants.models import Tenant


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
    tenant = tenant_of(tenant)
    return _admission_view(tenant_call("fq_admit_peek", tenant, pool_id, pool_conf, *scope_args(connections)))


def _limit(value: Any) -> int | None:
    return None if int(value) < 0 else int(value)


def _admission_view(reply: Sequence[Any]) -> AdmissionView:
    """An admission decision as the read-only scripts answer it (admit_lib.lua's ``ad_view``)."""
    ok, conn, why, parked, at, live, limit, members = reply
    return AdmissionView(
        admitted=bool(ok), connection_id=text(conn), why=text(why), parked=bool(parked), retry_at_ms=_limit(at),
        pool_in_flight=int(live), pool_limit=_limit(limit),
        members=tuple(
            MemberView(connection_id=text(cid), breaker=text(state), in_flight=int(n), limit=_limit(cap),
                       eligible=bool(ok_), why=text(reason), open_until_ms=_limit(until))
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
    now_ms: int
    deliveries: int = 0  # how often it was delivered before: a waiting one failed (or its lease ran out)


def holds_of(item_ids: Sequence[str], *, tenant: Tenant | None = None) -> list[ItemHold | None]:
    """For each of the tenant's items ``item_ids``, everything the dequeue would weigh for it now,
    in its order: due time, partition, suspension, ceiling, rate, and the admission of its pool
    (from the limits the fair queue holds); None for an item not in the queue. One round trip for
    them all, read only."""
    tenant = tenant_of(tenant)
    if not item_ids:
        return []
    batch = scripts.Batch()
    for item_id in item_ids:
        tenant_call("fq_why", tenant, item_id, batch=batch)
    replies = batch.execute()
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return [_hold(reply) for reply in replies]


def _hold(reply: Sequence[Any]) -> ItemHold | None:
    if not int(reply[0]):
        return None
    (_, state, due, tier, part, holder, ahead, suspended, limit, live, rate_wait, admission, now,
     deliveries) = reply
    return ItemHold(
        state=text(state), due_ms=int(float(text(due))), tier=text(tier), partition=text(part),
        partition_holder=text(holder), ahead=int(ahead), suspended=bool(int(suspended)),
        tenant_limit=_limit(limit), tenant_in_flight=int(live), rate_wait_ms=int(rate_wait),
        admission=_admission_view(admission) if admission else None, now_ms=int(now),
        deliveries=int(deliveries),
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

