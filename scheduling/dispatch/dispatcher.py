"""The dispatcher: due items, tenant-first, from the fair queue into Celery, within the credits.

``manage.py run_dispatcher`` runs one; any number may run at once, because a
dequeue is atomic. Each round reserves credits for both Celery queues (one
call, which also gives back the ones held since the last round), dequeues per
shard the system tier with the system credits and the customer tiers with
the work credits (one round trip), and publishes one ``ductor.execute_item``
message per item (shown as what it runs: ``task_events``): ``ductor.system``
for the system tier, ``ductor.work`` for the rest. Items of a kind with a
publisher (task nodes) go to it instead, and use no credit: they come in the fair
order with the others, and once no work credit is left, the customer tiers'
dequeue still takes up to ``RESERVE_BATCH`` of them, passing over (for that call
only, in their place) the tenants whose next item would need one. An item it
dequeued was admitted already (every slot and rate it needs taken), so a
published message runs when a worker slot takes it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import structlog
from django.conf import settings

from ductor_project.celery import SYSTEM_QUEUE, WORK_QUEUE
from ductor_project.core import heartbeats, metrics, scripts, tracing
from scheduling import fair_queue
from scheduling.dispatch import credits, task_events
from scheduling.dispatch.credits import CUSTOMER_TIERS, QUEUES, SYSTEM_TIER
from scheduling.dispatch.delivery import Delivery
from scheduling.dispatch.handlers import hand_to_publishers, publisher_kinds
from scheduling.dispatch.handoff import log_dispatch
from scheduling.dispatch.shards import ShardPlan
from scheduling.dispatch.worker import execute_item, message_kwargs

log = structlog.get_logger(__name__)

# Credits a dispatcher asks for per queue and round: at first ``RESERVE_MIN``, doubled after a round
# that used all it got (more was due), at most ``RESERVE_BATCH``; after a round that used fewer,
# twice what it used. Each credit is a Redis entry made and, unused, removed again: a round of a
# few due items costs a few, not one per idle slot of the fleet.
RESERVE_MIN = 8
RESERVE_BATCH = 1000
# A dispatcher without credits sleeps until a credit frees, or this long at most (so system
# work waits at most this long while the work queue is saturated).
CREDIT_WAIT_S = 0.05
# A dispatcher with nothing due sleeps until new work is signalled, or this long at most.
IDLE_WAIT_S = 0.5
ERROR_BACKOFF_S = 1.0


class Dispatcher:
    """Moves due items tenant-first from the fair queue into Celery, within the credits.

    Credits it did not use in a round go back before it sleeps, whatever it sleeps on.
    (Kept across a sleep, they could split the credits between two dispatchers for good:
    one holding the system queue's, the other the work queue's, each waiting for the
    credits the other holds, so that neither went idle and no credit ever came back.)
    """

    def __init__(self, *, shards: list[int] | None = None) -> None:
        # Its shards: ``shards``, or its share of them among the live dispatchers (``ShardPlan``).
        self.plan = ShardPlan(shards)
        self._held: dict[str, list[str]] = {queue: [] for queue in QUEUES}
        self._ask = dict.fromkeys(QUEUES, RESERVE_MIN)
        self._starved = False
        self._drained = False
        self.dispatched = 0

    @property
    def shards(self) -> list[int]:
        return self.plan.shards()

    def run_once(self) -> int:
        """Dispatch as many due items as the credits allow. Returns how many. The credits it did not
        use stay held (``give_back``) until its next round, which frees them in the same call as it
        takes new ones, or until it sleeps."""
        held = self._held
        self._held = {queue: [] for queue in QUEUES}  # should the call fail, those age out
        self._held = credits.reserve_credits(self._ask, give_back=held)
        reserved = {queue: len(taken) for queue, taken in self._held.items()}
        no_system_credit = not self._held[SYSTEM_QUEUE]
        free_kinds = publisher_kinds()  # task nodes': they use no credit
        dispatched = 0
        drained = True  # every dequeue came back short of what it asked: nothing more is due now
        for shard in self.shards:
            # The credits left after the shards before: a queue whose credits they used up waits,
            # but for the customer tiers' items of the free kinds, up to RESERVE_BATCH of them. (With
            # a work credit left, those come in the fair order with the others, each given back.)
            free_only = RESERVE_BATCH if free_kinds and not self._held[WORK_QUEUE] else 0
            groups = [(SYSTEM_QUEUE, [SYSTEM_TIER], 0), (WORK_QUEUE, CUSTOMER_TIERS, free_only)]
            groups = [(queue, tiers, free) for queue, tiers, free in groups if self._held[queue] or free]
            if not groups:
                break
            wanted = [(tiers, len(self._held[queue]), free) for queue, tiers, free in groups]
            batches = fair_queue.dequeue_batches(shard=shard, lease_ms=settings.DUCTOR_LEASE_MS, batches=wanted,
                                                 free_kinds=free_kinds if free_only else ())
            for (queue, _, _), (_, limit, _), items in zip(groups, wanted, batches, strict=True):
                # Without a credit (limit 0) it cannot tell: it is out of credits, and waits for one.
                drained = drained and len(items) < limit
                if items:  # an empty dequeue takes no producer from the pool
                    dispatched += self._publish_all(queue, items)
        # Out of work credits (or without a system credit): the next round waits for a freed one.
        # A round that used all it asked for, and got all of it, is not out: it asks for more.
        used_up = not self._held[WORK_QUEUE] and reserved[WORK_QUEUE] < self._ask[WORK_QUEUE]
        self._starved = no_system_credit or used_up
        for queue, got in reserved.items():
            used = got - len(self._held[queue])
            wanted_more = used == got == self._ask[queue]
            self._ask[queue] = min(RESERVE_BATCH, max(RESERVE_MIN, 2 * self._ask[queue] if wanted_more else 2 * used))
        # Drained: the next round would find nothing, so the dispatcher sleeps at once; what was
        # enqueued since its dequeue left a wake-up signal, which ends that sleep at once.
        self._drained = drained
        self.dispatched += dispatched
        return dispatched

    def _publish_all(self, queue: str, items: list[fair_queue.Dequeued]) -> int:
        """Publish ``items``, each with one of the credits held for ``queue``, then keep those
        credits for as long as a published message may wait. Items of a kind with a publisher
        go to it, without a credit."""
        total = len(items)
        items = hand_to_publishers(items)
        if not items:  # all handed over (task nodes' items): no producer to take from the pool
            return total
        held = self._held[queue]
        sent: list[str] = []
        try:
            with execute_item.app.producer_or_acquire() as producer:
                for item in items:
                    credit = held.pop()
                    try:
                        self._publish(item, credit, producer)
                    except Exception:
                        # The items stay leased and come back after their lease; the credit now.
                        credits.free_credits(queue, [credit], signal=False)
                        raise
                    sent.append(credit)
        finally:
            credits.mark_sent(queue, sent)
        return total

    def _publish(self, item: fair_queue.Dequeued, credit: str, producer: Any) -> None:
        delivery = Delivery.of(item)
        # In the item's trace: the message's headers carry it on (Celery's instrumentation).
        with tracing.item_span("ductor.dispatch", item.payload, tenant_id=item.tenant_id, item_id=item.item_id):
            execute_item.apply_async(
                kwargs=message_kwargs(delivery, tenant_id=item.tenant_id, credit=credit),
                queue=credits.queue_for(item.tier),
                producer=producer,
                # What Celery's tools show (task_events): what the item runs, and its ids. Celery would
                # saferepr() the whole payload for the arguments: most of a publish's CPU.
                shadow=task_events.task_name(delivery.body),
                argsrepr="()",
                kwargsrepr=task_events.task_kwargs(item.tenant_id, item.item_id, item.delivery, delivery.body),
            )
        log_dispatch(item)

    def give_back(self, batch: scripts.Batch | None = None) -> None:
        """Free the credits this dispatcher holds (before it sleeps or stops); with ``batch``,
        only queued on it."""
        for queue, unused in self._held.items():
            if unused:
                credits.free_credits(queue, unused, signal=False, batch=batch)
        self._held = {queue: [] for queue in QUEUES}

    def _idle(self) -> None:
        """Give back the credits it holds, then sleep until something may be dispatchable: a freed
        credit (when it ran out of credits), new work on one of its shards, or a due timer. The
        credits and its shards' next due times go in one round trip (one per node of a cluster)."""
        shards = [] if self._starved else self.shards
        batch = scripts.Batch()
        self.give_back(batch)
        given = len(batch)
        for shard in shards:
            fair_queue.queue_next_due(batch, shard)
        replies = batch.execute() if len(batch) else []
        for reply in replies[:given]:
            if isinstance(reply, Exception):
                raise reply
        if self._starved:
            # Not on the work signal too: every ack pushes it, so a saturated dispatcher would spin.
            credits.wait_for_credit(timeout_s=CREDIT_WAIT_S)
            return
        if not shards:
            # It serves no shard now (more dispatchers than shards): the wake signals are the
            # others', and one taken here would leave a shard's own dispatcher asleep.
            time.sleep(IDLE_WAIT_S)
            return
        wait_s = IDLE_WAIT_S
        for reply in replies[given:]:
            due = fair_queue.due_ms_of(reply)
            if due is not None:
                wait_s = min(wait_s, due / 1000)
        fair_queue.wait_for_work(shards=shards, timeout_s=credits.blocking_wait_s(wait_s))

    def _after_failure(self) -> None:
        """A round failed after it may have reserved credits: they go back before the back-off, and
        the next round asks for the fewest. (Held through it, round after round, the credits of a
        dispatcher whose every round fails would leave the others none: no work would run.)"""
        self._ask = dict.fromkeys(QUEUES, RESERVE_MIN)
        try:
            self.give_back()
        except Exception:  # Redis away: they expire with their reservation (credits.RESERVED_TTL_S)
            self._held = {queue: [] for queue in QUEUES}

    def run_forever(self, stop: threading.Event) -> None:
        """Dispatch until ``stop`` is set. A failing round (Redis away) is logged and retried; the
        rounds that work beat (``heartbeats``, at most once a second)."""
        beater = heartbeats.Beater(heartbeats.DISPATCHER)
        try:
            while not stop.is_set():
                try:
                    started = time.perf_counter()
                    dispatched = self.run_once()
                    metrics.LOOP_PASS.labels(heartbeats.DISPATCHER).observe(time.perf_counter() - started)
                    if not dispatched or self._starved or self._drained:
                        self._idle()
                    beater.passed()
                except Exception:
                    log.exception("dispatcher_round_failed")
                    self._after_failure()
                    stop.wait(ERROR_BACKOFF_S)
        finally:
            with contextlib.suppress(Exception):
                self.give_back()
            with contextlib.suppress(Exception):
                beater.stop()
            with contextlib.suppress(Exception):
                self.plan.stop()
