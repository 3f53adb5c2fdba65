"""The worker side: the Celery task that runs fair-queue items, and the worker process's lifecycle.

Workers run with prefetch disabled, ``acks_late`` and ``reject_on_worker_lost``.
``execute_item`` runs inside the item's tenant context (``@tenant_task``),
runs its delivery (``delivery.run``), then the next items of its Celery queue
by handoff (``handoff.chain``), what each item's commit enqueues held to travel
with the next handoff's round trip (``fair_queue.holding_enqueues``); the last
ack and the dispatch credit go to the process's finisher, sent right after the
task whatever happened. Its Celery
result is not stored: the fair queue is the record of what ran. What Celery's
tools show of it (its name, a failed item as a failed task, the handed-off
items as tasks of their own) is ``task_events``'s.

A worker registers its slots per queue with a heartbeat (``credits``), and
withdraws them at a warm shutdown after flushing the finisher. ``install()``
wires these to Celery's signals; the scheduling app calls it in ``ready()``.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import structlog
from celery import signals

from ductor_project.celery import WORK_QUEUE
from ductor_project.core.context import current_tenant
from ductor_project.core.keys import shard_of
from ductor_project.core.renewals import renewals
from scheduling import fair_queue
from scheduling.dispatch import credits, handoff, task_events
from scheduling.dispatch.delivery import Delivery, run_delivery
from scheduling.dispatch.finisher import finisher
from tenants.tasking import tenant_task

log = structlog.get_logger(__name__)

HEARTBEAT_S = 5.0


@tenant_task(name="ductor.execute_item", acks_late=True, reject_on_worker_lost=True, ignore_result=True,
             throws=(task_events.ItemFailed,), Request=task_events.ItemRequest)
def execute_item(item_id: str, delivery: int, kind: str, body: dict[str, Any], tier: str, partition: str,
                 waited_ms: int = 0, credit: str = "", lease_until_ms: int = 0, connection_id: str = "",
                 admitted: str = "", **later: Any) -> str:
    """Run one fair-queue item on a worker, inside its tenant context; then the next items of the
    same Celery queue, until nothing is due or the task has run for ``DUCTOR_HANDOFF_MS``.
    Returns the outcome of the last one; raises ``ItemFailed`` at the very end if its own item
    failed (``task_events``). An argument it does not know is passed over (``later``): a message a
    later release's dispatcher published (a rolling deploy, a rollback) still runs its item."""
    queue = credits.queue_for(tier)
    tenant = current_tenant()
    # A message Celery delivers again (its worker process died) may be of an item this worker
    # already finished and acked before handing off: ask Redis, however fresh its lease looks.
    redelivered = bool((execute_item.request.delivery_info or {}).get("redelivered"))
    item = Delivery(item_id, delivery, kind, body, tier, partition, waited_ms, lease_until_ms, connection_id,
                    admitted)
    until = handoff.deadline()
    ack = None
    report = task_events.Report(execute_item.request, item_id=item_id, delivery=delivery)
    try:
        # What the items' commits enqueue (the next steps) travels with the next handoff.
        with report.active(), fair_queue.holding_enqueues():
            outcome, ack = run_delivery(tenant, item, queue=queue, credit=credit, check_lease=redelivered)
            last, ack = handoff.chain(ack, queue=queue, credit=credit, shard=shard_of(str(tenant.pk)), until=until)
    finally:
        finisher.later(queue, credit, ack)
        report.publish()
    report.raise_if_failed()
    return str(last or outcome)


def message_kwargs(item: Delivery, *, tenant_id: str, credit: str) -> dict[str, Any]:
    """``execute_item``'s keyword arguments for a delivery published with ``credit``."""
    return {"tenant_id": tenant_id, "credit": credit, "item_id": item.item_id, "delivery": item.delivery,
            "kind": item.kind, "body": item.body, "tier": item.tier, "partition": item.partition,
            "waited_ms": item.waited_ms, "lease_until_ms": item.lease_until_ms,
            "connection_id": item.connection_id, "admitted": item.admitted}


class _Registration:
    """This worker's announced slots, renewed by a heartbeat thread until a warm shutdown."""

    def __init__(self) -> None:
        self.announced: dict[str, Any] = {}
        self.stopping = threading.Event()

    def start(self, consumer: Any) -> None:
        # The worker's own process id beside its Celery name: two workers of one name on one host
        # (a process manager's second `celery worker`, which keeps the default celery@<host>) would
        # otherwise announce one member, their slots counted once, and either's shutdown withdraw both.
        hostname = f"{getattr(consumer, 'hostname', None) or socket.gethostname()}/{os.getpid()}"
        queues = [q.name for q in consumer.task_consumer.queues] if consumer is not None else [WORK_QUEUE]
        slots = int(getattr(getattr(consumer, "pool", None), "num_processes", None) or os.cpu_count() or 1)
        self.announced = {"hostname": hostname, "queues": queues, "slots": slots}
        threading.Thread(target=self._beat, daemon=True, name="ductor-heartbeat").start()

    def _beat(self) -> None:
        while not self.stopping.is_set():
            try:
                credits.register_worker(**self.announced)
            except Exception:
                log.warning("worker_heartbeat_failed", hostname=self.announced.get("hostname"))
            self.stopping.wait(HEARTBEAT_S)

    def withdraw(self) -> None:
        """A stopping worker's slots stop counting at once, not after ``credits.WORKER_TTL_S``."""
        self.stopping.set()
        if self.announced:
            try:
                credits.unregister_worker(**self.announced)
            except Exception:
                log.warning("worker_unregister_failed", hostname=self.announced.get("hostname"))


_registration = _Registration()


def _on_worker_ready(sender: Any = None, **kwargs: Any) -> None:
    _registration.start(sender)


def _on_worker_process_shutdown(**kwargs: Any) -> None:
    finisher.flush()


def _on_worker_shutting_down(**kwargs: Any) -> None:
    finisher.flush()  # the solo and threads pools run tasks in this process
    _registration.withdraw()


def install() -> None:
    """Wire the worker's lifecycle to Celery's signals and the finisher to the renewal thread.
    Idempotent (the scheduling app's ``ready()`` calls it)."""
    signals.worker_ready.connect(_on_worker_ready, dispatch_uid="ductor.worker_ready")
    signals.worker_process_shutdown.connect(_on_worker_process_shutdown, dispatch_uid="ductor.process_shutdown")
    signals.worker_shutting_down.connect(_on_worker_shutting_down, dispatch_uid="ductor.shutting_down")
    renewals.after_wake(finisher.flush)
