"""Handoff: a worker process that finishes an item takes the next one of its queue itself.

It does not give its slot back and wait for a dispatcher to publish the next
item into Celery: in one round trip (``fair_queue.handoff``) it acks what it
finished and dequeues the next item of its Celery queue's tiers, by the same
fair dequeue a dispatcher runs, at the moment the slot frees, so the fair
order holds when execution starts. The slot keeps its dispatch credit
meanwhile, so the credit bound holds. A chain lasts at most
``DUCTOR_HANDOFF_MS`` per Celery message (0 turns handoff off).

If the process dies mid-chain, the items it acked are done; Celery delivers
the chain's first message again, flagged as redelivered, so the worker asks
Redis about its lease and drops it; the item it was running comes back after
its lease.

An item of a kind with a publisher (a task node's) is held while the team's
worker runs it, and acked when its outcome comes back: ``settle_published``
then takes, in the ack's round trip, the next item of that kind the fair order
gives, and hands it to its publisher, as a dispatcher would have. The round
trips of both wake no dispatcher for the item they take (``fair_queue.handoff``).
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from django.conf import settings

from ductor_project.celery import WORK_QUEUE
from ductor_project.core import metrics
from ductor_project.core.context import id_text, no_tenant
from ductor_project.core.keys import shard_of
from scheduling import fair_queue
from scheduling.dispatch import credits
from scheduling.dispatch.delivery import Delivery, Outcome, run_delivery
from scheduling.dispatch.handlers import hand_to_publishers
from scheduling.fair_queue import Finished
from tenants.tasking import UnknownTenant, acting_for, restore_tenant

log = structlog.get_logger(__name__)


def log_dispatch(item: fair_queue.Dequeued, **extra: Any) -> None:
    """The one ``dispatched`` record of each item leaving the fair queue (the demo counts them);
    it names the run of an item whose payload names one (a tick's, a step's, a webhook delivery's)."""
    run_id = item.payload.get("run_id") if isinstance(item.payload, dict) else None
    if run_id:
        extra = {"run_id": str(run_id), **extra}
    log.info("dispatched", tenant_id=item.tenant_id, item_id=item.item_id, delivery=item.delivery, tier=item.tier,
             partition=item.partition, waited_ms=item.waited_ms, **extra)
    metrics.DISPATCH_WAIT.labels(item.tier).observe(item.waited_ms / 1000)


def deadline() -> float:
    """When a chain that starts with a task starting now must stop (``time.monotonic()``)."""
    return time.monotonic() + settings.DUCTOR_HANDOFF_MS / 1000


def chain(first: Finished | None, *, queue: str, credit: str, shard: int, until: float,
          ) -> tuple[Outcome | None, Finished | None]:
    """Run the next items of ``queue`` on ``shard``, each in its own tenant's context, after
    ``first`` (acked on the way), until nothing is due or ``until`` (``deadline()`` at the
    task's start) has passed. Returns the last outcome (None when none ran) and the ack still
    owed (the caller's finisher sends it)."""
    outcome, ack = None, first
    while time.monotonic() < until:
        try:
            item = _next(ack, queue, shard)
        except Exception:
            log.warning("handoff_failed", exc_info=True)
            break  # the ack is sent again by the finisher: acks are idempotent
        ack = None
        if item is None:
            break
        outcome, ack = _run(item, queue, credit)
    return outcome, ack


def _next(finished: Finished | None, queue: str, shard: int) -> fair_queue.Dequeued | None:
    """Ack ``finished`` and take the next item of ``queue``'s tiers on ``shard``: one round trip."""
    with no_tenant():
        acked, item = fair_queue.handoff(finished, shard=shard, lease_ms=settings.DUCTOR_LEASE_MS,
                                         tiers=credits.tiers_of(queue))
    if finished is not None and not acked:
        log.warning("ack_of_lost_lease", item_id=finished.item_id, tenant_id=str(finished.tenant.pk))
    if item is not None:
        log_dispatch(item, handoff=True)
    return item


def settle_published(finished: Finished, *, kind: str) -> fair_queue.Dequeued | None:
    """Ack ``finished``, an item of a kind with a publisher whose outcome came back (a task
    node's), and in the same round trip take its shard's next item of the work queue's tiers if
    the fair order gives one of ``kind``, and hand it to the publisher, as a dispatcher would
    have: the Ductor worker that kept a task step's outcome publishes its run's next task step,
    and no dispatcher is woken for it (``fair_queue.handoff``). Returns the item it took, or None.
    Should the round trip fail, the ack is sent alone (acks are idempotent), and raises if that
    fails too."""
    try:
        with no_tenant():
            _, item = fair_queue.handoff(finished, shard=shard_of(id_text(finished.tenant)),
                                         lease_ms=settings.DUCTOR_LEASE_MS, tiers=credits.tiers_of(WORK_QUEUE),
                                         kind=kind)
    except Exception:
        log.warning("handoff_failed", exc_info=True)
        fair_queue.ack(finished.item_id, delivery=finished.delivery, work_ms=finished.work_ms,
                       tenant=finished.tenant)
        return None
    if item is not None:
        log_dispatch(item, handoff=True)
        hand_to_publishers([item])
    return item


def _run(item: fair_queue.Dequeued, queue: str, credit: str) -> tuple[Outcome, Finished | None]:
    """Run a handed-off item the way ``@tenant_task`` runs a message: in its own tenant's context
    alone. An item of a kind with a publisher (a task node's) is handed to it, as the dispatcher
    would: it stays leased until its outcome acks it."""
    if not hand_to_publishers([item]):
        return Outcome.OK, None
    try:
        tenant = restore_tenant(item.tenant_id)
    except UnknownTenant:  # deleted since: its items go with it
        log.error("handoff_unknown_tenant", item_id=item.item_id, tenant_id=item.tenant_id)
        return Outcome.DROPPED, None
    with acting_for(tenant):
        return run_delivery(tenant, Delivery.of(item), queue=queue, credit=credit)
