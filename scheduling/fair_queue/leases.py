"""An item in flight, from its worker's side: ``ack``, ``nack``, ``extend_lease``, and ``remove`` of
a waiting one. Each names the item's delivery, so that a worker whose lease ended cannot touch
a later delivery of it; each is one round trip, atomic, idempotent.
"""

from __future__ import annotations

from functools import partial

from ductor_project.core import scripts
from scheduling.fair_queue.enqueuing import after_held, holding
from scheduling.fair_queue.layout import at_least, delivery_arg, tenant_call, tenant_of, work_arg
from tenants.models import Tenant


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
    tenant = tenant_of(tenant)
    if not holding():
        return bool(tenant_call("fq_ack", tenant, item_id, delivery_arg(delivery), work_arg(work_ms)) == 1)
    [acked] = after_held(partial(queue_ack, item_id=item_id, delivery=delivery, tenant=tenant, work_ms=work_ms))
    if isinstance(acked, Exception):
        raise acked
    return bool(acked == 1)


def queue_ack(batch: scripts.Batch, item_id: str, *, delivery: int | None, tenant: Tenant,
              work_ms: float | None = None) -> None:
    """``ack`` queued on a script ``batch``: its reply in ``batch.execute()`` is 1 when it acked."""
    tenant_call("fq_ack", tenant, item_id, delivery_arg(delivery), work_arg(work_ms), batch=batch)


def nack(
    item_id: str, *, delay_ms: int = 0, max_delay_ms: int | None = None, delivery: int | None = None,
    work_ms: float | None = None, tenant: Tenant | None = None,
) -> bool:
    """Put an item in flight back in its partition, due ``delay_ms`` from now; its slot is freed.

    With ``max_delay_ms``, the delay doubles with each failure in a row of the item
    (each nack; an ack that keeps the item starts the count over), up to that: the
    first nack waits ``delay_ms``, the second twice that, and so on. ``work_ms`` as for
    ``ack``. Returns False, changing nothing, when the item (in that ``delivery``) is
    not in flight. One round trip, atomic. Raises ``TenantScopeError`` without a tenant.
    """
    at_least("delay_ms", delay_ms, 0)
    longest = ""
    if max_delay_ms is not None:
        at_least("max_delay_ms", max_delay_ms, delay_ms)
        longest = str(max_delay_ms)
    return bool(tenant_call("fq_nack", tenant_of(tenant), item_id, delivery_arg(delivery), delay_ms,
                             work_arg(work_ms), longest) == 1)


def extend_lease(
    item_id: str, *, lease_ms: int, delivery: int | None = None, tenant: Tenant | None = None
) -> bool:
    """Renew an item's lease, and its capacity slot's, to end ``lease_ms`` from now.

    Returns False, changing nothing, when the item is not in flight (in that
    ``delivery``) or its lease has already ended: the reaper owns it then, and a
    worker that gets False should stop. One round trip, atomic. Raises
    ``TenantScopeError`` without a tenant.
    """
    at_least("lease_ms", lease_ms, 1)
    return bool(tenant_call("fq_extend", tenant_of(tenant), item_id, delivery_arg(delivery), lease_ms) == 1)


def queue_extend_lease(batch: scripts.Batch, item_id: str, *, lease_ms: int, delivery: int | None,
                       tenant: Tenant) -> None:
    """``extend_lease`` queued on a script ``batch``: its reply is 1 when it renewed."""
    at_least("lease_ms", lease_ms, 1)
    tenant_call("fq_extend", tenant, item_id, delivery_arg(delivery), lease_ms, batch=batch)


def remove(item_id: str, *, tenant: Tenant | None = None) -> bool:
    """Withdraw a waiting item (or cancel the re-run asked for an item in flight).

    An item in flight keeps its lease; ack or nack it. Returns whether anything
    was withdrawn. One round trip, atomic, idempotent; inside ``holding_enqueues()``,
    the enqueues held so far go first in it, so an item enqueued and then withdrawn
    in that block (a step a tick starts and ends at once) is withdrawn, not left
    to be enqueued after its removal. Raises ``TenantScopeError`` without a tenant.
    """
    tenant = tenant_of(tenant)
    if not holding():
        return bool(tenant_call("fq_remove", tenant, item_id) == 1)
    [removed] = after_held(partial(queue_remove, item_id=item_id, tenant=tenant))
    if isinstance(removed, Exception):
        raise removed
    return bool(removed == 1)


def queue_remove(batch: scripts.Batch, item_id: str, *, tenant: Tenant) -> None:
    """``remove`` queued on a script ``batch``: its reply is 1 when it withdrew something."""
    tenant_call("fq_remove", tenant, item_id, batch=batch)

