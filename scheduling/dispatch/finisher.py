"""Acks and freed credits, sent off the task's path.

A worker process that finished an item hands its ack and its dispatch credit
to the process's renewal thread (``ductor_project.core.renewals``), and takes
its next task meanwhile: acks, then credits, go in one round trip right after
the task. What is still pending when the process stops is sent by ``flush``;
a crash loses at most the last few ms of them: such an item runs again after
its lease (at least once), such a credit ages out. What a send could not
deliver (Redis away) stays pending, and goes with the thread's next look.
"""

from __future__ import annotations

import os
import threading

import structlog

from ductor_project.core import scripts
from ductor_project.core.renewals import renewals
from scheduling import fair_queue
from scheduling.dispatch import credits
from scheduling.fair_queue import Finished

log = structlog.get_logger(__name__)


class Finisher:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Held while a flush sends: a flush returns once what was pending at its call is sent, even
        # when another thread (the renewal thread) took it to send a moment before.
        self._sending = threading.Lock()
        self._frees: dict[str, list[str]] = {}
        self._acks: list[Finished] = []
        self._pid = os.getpid()

    def later(self, queue: str, credit: str, ack: Finished | None = None) -> None:
        """Ack ``ack``, if given, then free ``credit``, soon (from the renewal thread)."""
        with self._lock:
            if self._pid != os.getpid():  # a fork's copy of the parent's pending work is not ours
                self._pid = os.getpid()
                self._frees, self._acks = {}, []
                self._sending = threading.Lock()
            if ack is not None:
                self._acks.append(ack)
            if credit:
                self._frees.setdefault(queue, []).append(credit)
        renewals.wake()

    def flush(self) -> None:
        """Send the pending acks, then free the pending credits: one round trip, from the calling thread.
        Returns once everything pending when it was called has been sent, by it or by a flush of another
        thread that was sending it (a warm shutdown, and a test, can count on that)."""
        with self._sending:
            self._send()

    def _send(self) -> None:
        with self._lock:
            acks, self._acks = self._acks, []
            frees, self._frees = self._frees, {}
        if not acks and not frees:
            return
        batch = scripts.Batch()
        try:
            for ack in acks:
                fair_queue.queue_ack(batch, ack.item_id, delivery=ack.delivery, tenant=ack.tenant,
                                     work_ms=ack.work_ms)
            for queue, held in frees.items():
                credits.free_credits(queue, held, batch=batch)
            replies = batch.execute()
        except Exception:
            # Redis away: kept, and sent again at the thread's next look (both are idempotent), so
            # that once Redis answers the items are not left leased nor their credits counted.
            log.exception("item_ack_failed", acks=len(acks), credits=sum(map(len, frees.values())))
            self._keep(acks, frees)
            return
        for ack, reply in zip(acks, replies, strict=False):
            if isinstance(reply, Exception):
                log.error("item_ack_failed", item_id=ack.item_id, tenant_id=str(ack.tenant.pk), error=str(reply))
            elif reply != 1:
                log.warning("ack_of_lost_lease", item_id=ack.item_id, tenant_id=str(ack.tenant.pk))

    def _keep(self, acks: list[Finished], frees: dict[str, list[str]]) -> None:
        """Put back, ahead of what came meanwhile, what a failed send took."""
        with self._lock:
            self._acks[:0] = acks
            for queue, held in frees.items():
                self._frees[queue] = held + self._frees.get(queue, [])


# The process's one finisher; the renewal thread flushes it each time it wakes.
finisher = Finisher()
