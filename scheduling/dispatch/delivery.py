"""One delivery of a fair-queue item on a worker: its lease, its handler, its outcome.

At least once: a delivery whose lease was lost (the item was delivered again
elsewhere, or already finished) does nothing. Knowing that needs a Redis round
trip only when the lease may have ended, or when Celery delivers a message
again: a delivery that starts with more than ``FRESH_LEASE_FRACTION`` of its
lease left cannot have been superseded (an item is delivered again only after
its lease), so it runs at once: it was admitted at dequeue (its tenant's, pool's
and connection's slots and rates taken), so it never has to wait or come back.
While the handler runs, the process's renewal thread renews the item's lease,
and with it every slot its admission took.
A handler that returns has its item acked (by the caller, off the task's
path); one that raises has it put back, due ``DUCTOR_FAILED_ITEM_DELAY_MS`` later, twice that
after its second failure in a row, and so on up to ``DUCTOR_FAILED_ITEM_MAX_DELAY_MS``.
Either way the ack or the nack carries the handler's own run time, measured
here around the call alone: what the fair queue charges the tenant (fair by work).
Either way what it reports (``Failed``, or the exception) goes to the task's
``task_events.Report``, which shows it to Celery's tools.
The handler runs in the item's span (``ductor.item.<kind>``), a child of the
trace context its payload carries, however the item came (a Celery message or
a handoff): never of the task that happens to be running it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import Any

import structlog
from django.conf import settings

from ductor_project.core import metrics, tracing
from ductor_project.core.context import id_text
from ductor_project.core.renewals import renewals
from scheduling import fair_queue
from scheduling.dispatch import credits, task_events
from scheduling.dispatch.handlers import ItemContext, handler_for
from scheduling.fair_queue import Finished
from tenants.models import Tenant

log = structlog.get_logger(__name__)

# A delivery that starts with more than this fraction of its item's lease left runs without asking
# Redis whether it is still the live one (it must be). Tolerates worker clocks that are off from
# Redis's by up to (1 - this) x the lease.
FRESH_LEASE_FRACTION = 0.5


class Outcome(StrEnum):
    OK = "ok"  # the handler returned: ack the item
    FAILED = "failed"  # the handler raised: the item was put back for later
    STALE = "stale"  # not the live delivery any more: nothing ran
    DROPPED = "dropped"  # no handler for its kind, or no such tenant: acked without running


@dataclass(frozen=True)
class Delivery:
    """One delivery of an item to this worker: from a Celery message (its fields are
    ``execute_item``'s arguments), or handed off."""

    item_id: str
    delivery: int
    kind: str
    body: dict[str, Any]
    tier: str
    partition: str
    waited_ms: int = 0
    lease_until_ms: int = 0
    connection_id: str = ""
    admitted: str = ""

    @classmethod
    def of(cls, item: fair_queue.Dequeued) -> Delivery:
        body = item.payload if isinstance(item.payload, dict) else {"value": item.payload}
        return cls(item.item_id, item.delivery, str(body.get("kind", "")), body, item.tier, item.partition,
                   item.waited_ms, item.lease_until_ms, item.connection_id, item.admitted)

    @property
    def names(self) -> dict[str, str]:
        """What each line its delivery logs names it by: its item, and the run its body names (a
        tick's, a step's, a webhook delivery's), which the handler's own binding no longer gives
        once it returned or raised."""
        run_id = self.body.get("run_id")
        return {"item_id": self.item_id, "run_id": str(run_id)} if run_id else {"item_id": self.item_id}

    def context(self, tenant: Tenant) -> ItemContext:
        return ItemContext(tenant_id=id_text(tenant), item_id=self.item_id, tier=self.tier,
                           partition=self.partition, delivery=self.delivery, waited_ms=self.waited_ms,
                           connection_id=self.connection_id, admitted=self.admitted)


def run_delivery(
    tenant: Tenant, item: Delivery, *, queue: str, credit: str, check_lease: bool = False
) -> tuple[Outcome, Finished | None]:
    """Run one delivery in ``tenant``'s context (already entered); its outcome, and the ack it
    needs (None when it needs none). See the module docs."""
    renew_in_s = _lease_check(item, check_lease)
    if renew_in_s is None:
        log.info("stale_delivery_dropped", delivery=item.delivery, **item.names)
        return Outcome.STALE, None
    finished = Finished(tenant, item.item_id, item.delivery)
    handler = handler_for(item.kind)
    if handler is None:
        log.error("no_handler_for_item", kind=item.kind, **item.names)
        return Outcome.DROPPED, finished
    lease_ms = settings.DUCTOR_LEASE_MS
    hold = renewals.hold(partial(_renew, finished, lease_ms, queue, credit), every_s=lease_ms / 3000,
                         first_in_s=renew_in_s)
    started = time.perf_counter()
    ran = Stopwatch()
    try:
        with (tracing.item_span(f"ductor.item.{item.kind}", item.body, item_id=item.item_id, delivery=item.delivery),
              structlog.contextvars.bound_contextvars(item_id=item.item_id, kind=item.kind),
              task_events.running(id_text(tenant), item.item_id, item.delivery, item.body) as shown, ran):
            shown.failed = handler(item.context(tenant), item.body)
    except Exception:
        renewals.release(hold)
        log.exception("item_handler_failed", kind=item.kind, **item.names)
        _record(tenant, item, Outcome.FAILED, time.perf_counter() - started, ran.ms)
        fair_queue.nack(item.item_id, delay_ms=settings.DUCTOR_FAILED_ITEM_DELAY_MS,
                        max_delay_ms=settings.DUCTOR_FAILED_ITEM_MAX_DELAY_MS, delivery=item.delivery, work_ms=ran.ms)
        return Outcome.FAILED, None
    renewals.release(hold)
    _record(tenant, item, Outcome.OK, time.perf_counter() - started, ran.ms)
    return Outcome.OK, finished._replace(work_ms=ran.ms)


def _record(tenant: Tenant, item: Delivery, outcome: Outcome, seconds: float, work_ms: float) -> None:
    """A delivery whose handler ran: its duration in the metrics, and its one ``item_finished`` log
    record with the work its tenant is charged (the demo charts the tenants' shares of worker time
    from these, joined to their ``dispatched`` records by tenant and delivery)."""
    metrics.ITEM_DURATION.labels(item.kind, outcome).observe(seconds)
    log.info("item_finished", tenant_id=id_text(tenant), delivery=item.delivery, kind=item.kind,
             outcome=str(outcome), work_ms=round(work_ms, 3), **item.names)


class Stopwatch:
    """How long the block it wraps ran (``ms``): the handler's own run time, what its tenant is charged."""

    ms = 0.0

    def __enter__(self) -> None:
        self._began = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.ms = (time.perf_counter() - self._began) * 1000


def _lease_check(item: Delivery, check_lease: bool) -> float | None:
    """When the renewal thread should first renew this delivery's lease, or None when the
    delivery is not the live one (its lease was lost)."""
    lease_ms = settings.DUCTOR_LEASE_MS
    left_ms = item.lease_until_ms - time.time() * 1000
    if left_ms > lease_ms * FRESH_LEASE_FRACTION and not check_lease:
        return max(left_ms - lease_ms * 2 / 3, 0) / 1000
    if fair_queue.extend_lease(item.item_id, lease_ms=lease_ms, delivery=item.delivery):
        return lease_ms / 3000
    return None


def _renew(finished: Finished, lease_ms: int, queue: str, credit: str) -> bool:
    """Renew a running item's lease (and its slots'), and its credit as running; False once lost."""
    if not fair_queue.extend_lease(finished.item_id, lease_ms=lease_ms, delivery=finished.delivery,
                                   tenant=finished.tenant):
        log.warning("lease_lost", item_id=finished.item_id, tenant_id=str(finished.tenant.pk))
        return False
    credits.mark_running(queue, [credit] if credit else [], lease_ms / 1000)
    return True
