"""The fair broker layer: from the fair queue into Celery, without undoing the fairness.

Celery's own consumption is not fair (queue rotation, prefetch, redelivery
after the visibility timeout), so the fair order must hold when execution
starts. Work therefore waits in the fair queue, not in Celery:

- **Dispatchers** (``manage.py run_dispatcher``; any number) dequeue items
  tenant-first and publish one Celery message per item. Dequeue is atomic, so
  dispatchers never hand out the same item twice.
- **Credits.** A message is published only with a credit, and credits are
  reserved atomically (``lua/broker_reserve.lua``) for all dispatchers at
  once: per Celery queue, the messages published but not finished never exceed
  the live worker slots plus ``DUCTOR_DISPATCH_BUFFER``, so at most the buffer
  (plus the idle slots) waits unstarted in Celery. Workers register their slots
  per queue with a heartbeat; credits and registrations are Redis ZSET members
  scored by expiry, so a crashed worker's or a lost message's entries age out
  instead of leaking. A finished task signals its freed credit; a dispatcher
  without credits sleeps on that signal instead of polling.
- **Workers** run with prefetch disabled, ``acks_late`` and
  ``reject_on_worker_lost``. ``execute_item`` runs inside the item's tenant
  context (``@tenant_task``), checks that its delivery is still the live one (a
  fencing token) when its lease may have run out or Celery delivers the message
  again, holds a suspended tenant's item back, has the process's renewal thread
  renew the lease while the handler runs, then acks the item (releasing its
  capacity slot and partition) or nacks it with a delay. Its Celery result is
  not stored: the fair queue is the record of what ran.
- **Handoff.** A worker process that finishes an item does not wait for a
  dispatcher to fill its slot again: in one round trip it acks the item and
  dequeues the next one of the same Celery queue's tiers, by the same fair
  dequeue, and runs it in that item's own tenant context; so on for at most
  ``DUCTOR_HANDOFF_MS`` per message (0 turns it off). The slot keeps its
  credit meanwhile, so the credit bound holds. When nothing is due, the last
  ack and the credit go to the process's renewal thread, sent right after the
  task, off its path. Dispatchers start work on idle slots; a saturated worker
  feeds itself, at the moment a slot frees, in the fair order.
- System-tenant work goes to the reserved ``ductor.system`` Celery queue.

Handlers are registered per item kind with ``register_handler``. Round trips
per item: handed off, one (the ack of the previous item and the dequeue);
dispatched, the dispatcher's credit reservation and dequeue (one each, shared
by the items of a round) and the publish, and on the worker's path none (a
fresh delivery needs no lease check), with the ack and the credit release sent
together right after, in the background.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog
from celery import signals
from django.conf import settings

from ductor_project.celery import SYSTEM_QUEUE, WORK_QUEUE
from ductor_project.core import scripts
from ductor_project.core.context import current_tenant, no_tenant, tenant_context
from ductor_project.core.keys import global_redis_key, shard_of
from ductor_project.core.redis import get_redis
from ductor_project.core.renewals import renewals
from scheduling import LUA_DIR, fair_queue
from tenants.models import Tenant
from tenants.tasking import cached_tenant, refresh_db_connections, tenant_task

log = structlog.get_logger(__name__)

SYSTEM_TIER = fair_queue.SYSTEM_TIER
CUSTOMER_TIERS = [tier for tier in fair_queue.TIERS if tier != SYSTEM_TIER]
QUEUES = (SYSTEM_QUEUE, WORK_QUEUE)
HEARTBEAT_S = 5.0
WORKER_TTL_S = 20.0
# How long a credit of a published message lives if no worker ever starts it (a lost message).
OUTSTANDING_TTL_S = 60.0
# Credits a dispatcher reserves per call, at most (it gives back what it does not use).
RESERVE_BATCH = 1000
# A dispatcher without credits sleeps until a credit frees, or this long at most (so system
# work waits at most this long while the work queue is saturated).
CREDIT_WAIT_S = 0.05
# A dispatcher with nothing due sleeps until new work is signalled, or this long at most.
IDLE_WAIT_S = 0.5
# Shortest blocking wait: Redis 6.2 truncates a timeout to whole ms, and 0 ms means "forever".
MIN_WAIT_S = 0.01
ERROR_BACKOFF_S = 1.0
# A task that starts with more than this fraction of its item's lease left runs without asking
# Redis whether its delivery is still the live one (it must be). Tolerates worker clocks that
# are off from Redis's by up to (1 - this) x the lease.
FRESH_LEASE_FRACTION = 0.5
MAX_SLEEP_MS = 60_000


class RetryLater(Exception):
    """Raised by a handler to put its item back in the queue after ``delay_s``."""

    def __init__(self, delay_s: float, reason: str = "") -> None:
        super().__init__(reason or f"retry in {delay_s}s")
        self.delay_s = delay_s


@dataclass(frozen=True)
class ItemContext:
    """What a handler is told about the item it runs."""

    tenant_id: str
    item_id: str
    tier: str
    partition: str
    delivery: int
    waited_ms: int


Handler = Callable[[ItemContext, dict[str, Any]], None]
_handlers: dict[str, Handler] = {}


def register_handler(kind: str, handler: Handler) -> None:
    """Route fair-queue items whose payload has ``kind`` to ``handler``."""
    _handlers[kind] = handler


def _noop(ctx: ItemContext, body: dict[str, Any]) -> None:
    """The built-in no-op handler (benchmarks and smoke tests)."""


def sleep_ms(ctx: ItemContext, body: dict[str, Any]) -> None:
    """The built-in ``sleep_ms`` handler: sleeps ``body["ms"]`` (at most ``MAX_SLEEP_MS``); benchmarks."""
    time.sleep(min(max(int(body.get("ms", 0)), 0), MAX_SLEEP_MS) / 1000)


register_handler("noop", _noop)
register_handler("sleep_ms", sleep_ms)


def queue_for(tier: str) -> str:
    """The Celery queue of a tier's items: ``ductor.system`` for the system tier, else the work queue."""
    return SYSTEM_QUEUE if tier == SYSTEM_TIER else WORK_QUEUE


# -- worker slots and credits -------------------------------------------------------------
#
# Global keys (they cross tenants; all in shard 0's hash slot):
#   broker:workers:<queue>      ZSET "<host>|<slots>" -> registration expiry (s, Redis TIME)
#   broker:outstanding:<queue>  ZSET credit -> expiry: reserved or published, not yet seen running
#   broker:running:<queue>      ZSET credit -> expiry (the item's lease): renewed by a running task
#   broker:freed:<queue>        LIST at most one token: a credit freed
#   broker:credit-seq           STRING the last credit id

def _key(*parts: str) -> str:
    return global_redis_key("broker", *parts)


def _queue_keys(queue: str) -> list[str]:
    return [_key("workers", queue), _key("outstanding", queue), _key("running", queue)]


def _now() -> float:
    seconds, micros = get_redis().time()
    return float(seconds) + micros / 1_000_000


def register_worker(hostname: str, queues: list[str], slots: int) -> None:
    """Announce (or refresh) a worker's slots per queue; they expire unless refreshed."""
    redis = get_redis()
    now = _now()
    with redis.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.zadd(_key("workers", queue), {f"{hostname}|{slots}": now + WORKER_TTL_S})
            pipe.zremrangebyscore(_key("workers", queue), "-inf", now)
        pipe.execute()


def unregister_worker(hostname: str, queues: list[str], slots: int) -> None:
    """Withdraw a worker's slots at once (a warm shutdown), instead of letting them expire."""
    redis = get_redis()
    for queue in queues:
        redis.zrem(_key("workers", queue), f"{hostname}|{slots}")


def worker_slots(queue: str) -> int:
    """Live worker slots consuming ``queue``."""
    members = get_redis().zrangebyscore(_key("workers", queue), _now(), "+inf")
    return sum(int(m.decode().rsplit("|", 1)[1]) for m in members)


def busy(queue: str) -> int:
    """Credits in use on ``queue``: messages published and not finished (outstanding + running)."""
    redis = get_redis()
    now = _now()
    with redis.pipeline(transaction=False) as pipe:
        pipe.zcount(_key("outstanding", queue), now, "+inf")
        pipe.zcount(_key("running", queue), now, "+inf")
        outstanding, running = pipe.execute()
    return int(outstanding) + int(running)


def outstanding(queue: str) -> int:
    """Messages published on ``queue`` and not yet seen running: not started, or started less
    than a lease renewal ago (tasks are not marked at start, to save a round trip)."""
    return int(get_redis().zcount(_key("outstanding", queue), _now(), "+inf"))


def credits(queue: str) -> int:
    """How many more messages may be published to ``queue`` now (read only; may be negative)."""
    return worker_slots(queue) + settings.DUCTOR_DISPATCH_BUFFER - busy(queue)


def reserve_credits(
    wanted: Mapping[str, int], *, give_back: Mapping[str, list[str]] | None = None
) -> dict[str, list[str]]:
    """Take up to ``wanted[queue]`` credits per queue, atomically for all dispatchers.

    ``give_back`` frees a dispatcher's unused credits in the same step. One round
    trip. Each credit is a new outstanding entry that lives ``credit_lifetime_s()``
    unless a worker renews it; pass it in the message, or give it back.
    """
    queues = list(wanted)
    keys = [key for queue in queues for key in _queue_keys(queue)] + [_key("credit-seq")]
    args: list[Any] = [settings.DUCTOR_DISPATCH_BUFFER, credit_lifetime_s()]
    for queue in queues:
        returned = (give_back or {}).get(queue, [])
        args += [wanted[queue], len(returned), *returned]
    taken = scripts.run(LUA_DIR / "broker_reserve.lua", keys, args)
    return {queue: [c.decode() if isinstance(c, bytes) else str(c) for c in got]
            for queue, got in zip(queues, taken, strict=True)}


def credit_lifetime_s() -> float:
    """How long a credit counts before its task is seen running: the renewal thread's first
    renewal (a third of the lease after the start) moves it to ``running``."""
    return max(OUTSTANDING_TTL_S, settings.DUCTOR_LEASE_MS / 1000)


def mark_running(queue: str, credits: list[str], lease_s: float) -> None:
    """The credits' tasks started (or still run): they count as running for ``lease_s``. One round trip."""
    if credits:
        keys = [_key("outstanding", queue), _key("running", queue), _key("freed", queue)]
        scripts.run(LUA_DIR / "broker_mark.lua", keys, ["run", lease_s, *credits])


def free_credits(queue: str, credits: list[str], *, signal: bool = True, batch: scripts.Batch | None = None) -> None:
    """Give credits back (task finished, or credit unused). One round trip, idempotent.

    ``signal`` wakes a dispatcher waiting for credits; a dispatcher giving back
    what it did not use passes False (it would only wake itself). With ``batch``,
    the call is only queued on it.
    """
    if credits:
        keys = [_key("outstanding", queue), _key("running", queue), _key("freed", queue)]
        scripts.run(LUA_DIR / "broker_mark.lua", keys, ["free" if signal else "unused", 0, *credits], batch=batch)


def wait_for_credit(*, timeout_s: float) -> bool:
    """Block until a credit is freed on any queue, or the timeout; True if one was."""
    keys = [_key("freed", queue) for queue in QUEUES]
    return get_redis().blpop(keys, timeout=_wait_s(timeout_s)) is not None


def _wait_s(seconds: float) -> float:
    # Round up to whole ms (plus a margin) so that Redis never truncates the wait to 0 = forever.
    return (int(max(seconds, MIN_WAIT_S) * 1000) + 1.5) / 1000


# -- the worker side ------------------------------------------------------------------------

class _Finisher:
    """Acks the items a worker process finished and gives their dispatch credits back, from the
    process's renewal thread (``ductor_project.core.renewals``), while the process already takes its
    next task: round trips off every task's path.

    Acks, then credits, go in one round trip. What is still pending when the process
    stops is sent by ``flush``; a crash loses at most the last few ms of them: such an
    item runs again after its lease (at least once), such a credit ages out.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._frees: dict[str, list[str]] = {}
        self._acks: list[tuple[Tenant, str, int]] = []
        self._pid = os.getpid()

    def later(self, queue: str, credit: str, ack: tuple[Tenant, str, int] | None = None) -> None:
        """Ack the item ``(tenant, item id, delivery)``, if given, then free ``credit``, soon."""
        with self._lock:
            if self._pid != os.getpid():  # a fork's copy of the parent's pending work is not ours
                self._pid = os.getpid()
                self._frees, self._acks = {}, []
            if ack is not None:
                self._acks.append(ack)
            if credit:
                self._frees.setdefault(queue, []).append(credit)
        renewals.wake()

    def flush(self) -> None:
        """Send the pending acks, then free the pending credits: one round trip, from the calling thread."""
        with self._lock:
            acks, self._acks = self._acks, []
            frees, self._frees = self._frees, {}
        if not acks and not frees:
            return
        batch = scripts.Batch()
        try:
            for tenant, item_id, delivery in acks:
                fair_queue.queue_ack(batch, item_id, delivery=delivery, tenant=tenant)
            for queue, credits in frees.items():
                free_credits(queue, credits, batch=batch)
            replies = batch.execute()
        except Exception:
            # Redis away: those items run again after their leases; the credits age out.
            log.exception("item_ack_failed", acks=len(acks), credits=sum(map(len, frees.values())))
            return
        for (tenant, item_id, _delivery), reply in zip(acks, replies, strict=False):
            if isinstance(reply, Exception):
                log.error("item_ack_failed", item_id=item_id, tenant_id=str(tenant.pk), error=str(reply))
            elif reply != 1:
                log.warning("ack_of_lost_lease", item_id=item_id, tenant_id=str(tenant.pk))


def _renew_item(tenant: Tenant, item_id: str, delivery: int, lease_ms: int, queue: str, credit: str) -> bool:
    """Renew a running item's lease, and its credit as running; False once the lease is lost."""
    if not fair_queue.extend_lease(item_id, lease_ms=lease_ms, delivery=delivery, tenant=tenant):
        log.warning("lease_lost", item_id=item_id, tenant_id=str(tenant.pk))
        return False
    mark_running(queue, [credit] if credit else [], lease_ms / 1000)
    return True


_finisher = _Finisher()
renewals.after_wake(_finisher.flush)


@dataclass(frozen=True)
class _Delivery:
    """One delivery of an item to this worker: from a Celery message, or handed off."""

    item_id: str
    delivery: int
    kind: str
    body: dict[str, Any]
    tier: str
    partition: str
    waited_ms: int
    lease_until_ms: int

    @classmethod
    def of(cls, item: fair_queue.Dequeued) -> _Delivery:
        body = item.payload if isinstance(item.payload, dict) else {"value": item.payload}
        return cls(item.item_id, item.delivery, str(body.get("kind", "noop")), body, item.tier, item.partition,
                   item.waited_ms, item.lease_until_ms)


@tenant_task(name="ductor.execute_item", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def execute_item(item_id: str, delivery: int, kind: str, body: dict[str, Any], tier: str, partition: str,
                 waited_ms: int = 0, credit: str = "", lease_until_ms: int = 0) -> str:
    """Run one fair-queue item on a worker, inside its tenant context; then the next
    items of the same Celery queue, until nothing is due or the task has run for
    ``DUCTOR_HANDOFF_MS`` (see ``_run`` and ``_handoff``). Returns the outcome of the
    last one.

    The ack of the last item and the dispatch credit go to the process's renewal
    thread, sent right after the task, whatever happened.
    """
    queue = queue_for(tier)
    tenant = current_tenant()
    # A message Celery delivers again (its worker process died) may be of an item this worker
    # already finished and acked before handing off: ask Redis, however fresh its lease looks.
    redelivered = bool((execute_item.request.delivery_info or {}).get("redelivered"))
    deadline = time.monotonic() + settings.DUCTOR_HANDOFF_MS / 1000
    ack = None
    try:
        outcome, ack = _run(tenant, _Delivery(item_id, delivery, kind, body, tier, partition, waited_ms,
                                              lease_until_ms), queue, credit, check_lease=redelivered)
        shard = shard_of(str(tenant.pk))
        while time.monotonic() < deadline:
            finished, ack = ack, None
            try:
                item = _handoff(finished, queue, shard)
            except Exception:
                log.warning("handoff_failed", exc_info=True)
                ack = finished  # sent again by the renewal thread: acks are idempotent
                break
            if item is None:
                break
            outcome, ack = _run_handed_off(item, queue, credit)
        return outcome
    finally:
        _finisher.later(queue, credit, ack)


def _handoff(finished: tuple[Tenant, str, int] | None, queue: str, shard: int) -> fair_queue.Dequeued | None:
    """Ack ``finished`` and take the next item of ``queue``'s tiers on ``shard``: one round trip.

    The worker process keeps its slot (and its dispatch credit) instead of giving
    it back and waiting for a dispatcher to publish the next item into Celery. The
    next item is chosen by the same fair dequeue a dispatcher would run, at the
    moment the slot frees, so the fair order holds when execution starts.
    """
    tiers = [SYSTEM_TIER] if queue == SYSTEM_QUEUE else CUSTOMER_TIERS
    with no_tenant():
        acked, item = fair_queue.handoff(finished, shard=shard, lease_ms=settings.DUCTOR_LEASE_MS, tiers=tiers)
    if finished is not None and not acked:
        log.warning("ack_of_lost_lease", item_id=finished[1], tenant_id=str(finished[0].pk))
    if item is not None:
        _log_dispatch(item, handoff=True)
    return item


def _log_dispatch(item: fair_queue.Dequeued, **extra: Any) -> None:
    """The one ``dispatched`` record of each item leaving the fair queue (the demo counts them)."""
    log.info("dispatched", tenant_id=item.tenant_id, item_id=item.item_id, tier=item.tier,
             partition=item.partition, waited_ms=item.waited_ms, **extra)


def _run_handed_off(item: fair_queue.Dequeued, queue: str, credit: str) -> tuple[str, tuple[Tenant, str, int] | None]:
    """``_run`` a handed-off item the way ``@tenant_task`` runs a message: in its own tenant's
    context alone, with the database connections checked first."""
    refresh_db_connections()
    tenant = cached_tenant(item.tenant_id)
    if tenant is None:  # deleted since: its items go with it
        log.error("handoff_unknown_tenant", item_id=item.item_id, tenant_id=item.tenant_id)
        return "dropped", None
    with no_tenant(), tenant_context(tenant):
        return _run(tenant, _Delivery.of(item), queue, credit)


def _run(
    tenant: Tenant, item: _Delivery, queue: str, credit: str, *, check_lease: bool = False
) -> tuple[str, tuple[Tenant, str, int] | None]:
    """Run one delivery in ``tenant``'s context; its outcome, and the ack it needs, if any.

    At-least-once: a delivery whose lease was lost (the item was re-delivered
    elsewhere, or already finished) does nothing. That needs asking Redis only
    when the lease may have ended, or when ``check_lease``: a delivery that
    starts with more than ``FRESH_LEASE_FRACTION`` of its lease left cannot have
    been superseded (an item is delivered again only after its lease), so it runs
    at once. A handler that returns has its item acked (by the caller), one that
    raises has it nacked here (``RetryLater``: after its delay); the process's
    renewal thread renews the lease meanwhile. A suspended tenant's item waits
    (``DUCTOR_SUSPENDED_ITEM_DELAY_MS``) instead of running.
    """
    lease_ms = settings.DUCTOR_LEASE_MS
    item_id, delivery, kind = item.item_id, item.delivery, item.kind
    left_ms = item.lease_until_ms - time.time() * 1000
    if left_ms > lease_ms * FRESH_LEASE_FRACTION and not check_lease:
        renew_in_s = max(left_ms - lease_ms * 2 / 3, 0) / 1000
    elif fair_queue.extend_lease(item_id, lease_ms=lease_ms, delivery=delivery):
        renew_in_s = lease_ms / 3000
    else:
        log.info("stale_delivery_dropped", item_id=item_id, delivery=delivery)
        return "stale", None
    if not tenant.is_active:
        fair_queue.nack(item_id, delay_ms=settings.DUCTOR_SUSPENDED_ITEM_DELAY_MS, delivery=delivery)
        log.info("item_held_tenant_suspended", item_id=item_id, kind=kind)
        return "suspended", None
    handler = _handlers.get(kind)
    if handler is None:
        log.error("no_handler_for_item", item_id=item_id, kind=kind)
        return "dropped", (tenant, item_id, delivery)
    ctx = ItemContext(tenant_id=str(tenant.pk), item_id=item_id, tier=item.tier, partition=item.partition,
                      delivery=delivery, waited_ms=item.waited_ms)
    hold = renewals.hold(partial(_renew_item, tenant, item_id, delivery, lease_ms, queue, credit),
                         every_s=lease_ms / 3000, first_in_s=renew_in_s)
    try:
        with structlog.contextvars.bound_contextvars(item_id=item_id, kind=kind):
            handler(ctx, item.body)
    except RetryLater as retry:
        renewals.release(hold)
        fair_queue.nack(item_id, delay_ms=int(retry.delay_s * 1000), delivery=delivery)
        return "retry", None
    except Exception:
        renewals.release(hold)
        log.exception("item_handler_failed", item_id=item_id, kind=kind)
        fair_queue.nack(item_id, delay_ms=settings.DUCTOR_FAILED_ITEM_DELAY_MS, delivery=delivery)
        return "failed", None
    renewals.release(hold)
    return "ok", (tenant, item_id, delivery)


_registration: dict[str, Any] = {}
_stopping = threading.Event()


@signals.worker_ready.connect
def _on_worker_ready(sender: Any = None, **kwargs: Any) -> None:
    consumer = sender
    hostname = getattr(consumer, "hostname", None) or socket.gethostname()
    queues = [q.name for q in consumer.task_consumer.queues] if consumer is not None else [WORK_QUEUE]
    slots = int(getattr(getattr(consumer, "pool", None), "num_processes", None) or os.cpu_count() or 1)
    _registration.update(hostname=hostname, queues=queues, slots=slots)

    def heartbeat() -> None:
        while not _stopping.is_set():
            try:
                register_worker(hostname, queues, slots)
            except Exception:
                log.warning("worker_heartbeat_failed", hostname=hostname)
            _stopping.wait(HEARTBEAT_S)

    threading.Thread(target=heartbeat, daemon=True, name="ductor-heartbeat").start()


@signals.worker_process_shutdown.connect
def _on_worker_process_shutdown(**kwargs: Any) -> None:
    _finisher.flush()


@signals.worker_shutting_down.connect
def _on_worker_shutting_down(**kwargs: Any) -> None:
    """A stopping worker's slots stop counting at once, not after ``WORKER_TTL_S``."""
    _finisher.flush()  # the solo and threads pools run tasks in this process
    _stopping.set()
    if _registration:
        try:
            unregister_worker(**_registration)
        except Exception:
            log.warning("worker_unregister_failed", hostname=_registration.get("hostname"))


# -- the dispatcher -------------------------------------------------------------------------

class Dispatcher:
    """Moves due items tenant-first from the fair queue into Celery, within the credits.

    Credits it did not use stay with it until its next round, where they are given
    back in the same call that takes new ones, or until it goes idle.
    """

    def __init__(self, *, shards: list[int] | None = None, reap_every_s: float = 1.0) -> None:
        self.shards = shards if shards is not None else list(range(settings.DUCTOR_QUEUE_SHARDS))
        self.reap_every_s = reap_every_s
        self._last_reap = 0.0
        self._held: dict[str, list[str]] = {queue: [] for queue in QUEUES}
        self._starved = False
        self.dispatched = 0

    def _publish(self, item: fair_queue.Dequeued, credit: str, producer: Any) -> None:
        execute_item.apply_async(
            # _Delivery's fields are execute_item's arguments.
            kwargs={"tenant_id": item.tenant_id, "credit": credit, **vars(_Delivery.of(item))},
            queue=queue_for(item.tier),
            producer=producer,
            # Celery would saferepr() the whole payload for these headers (monitoring only):
            # most of a publish's CPU. The ids say which item it is.
            argsrepr="()",
            kwargsrepr=f"{{'tenant_id': '{item.tenant_id}', 'item_id': {item.item_id!r}, "
                       f"'delivery': {item.delivery}}}",
        )
        _log_dispatch(item)

    def _reap(self) -> None:
        now = time.monotonic()
        if now - self._last_reap >= self.reap_every_s:
            for shard in self.shards:
                fair_queue.reap(shard=shard)
            self._last_reap = now

    def give_back(self) -> None:
        """Free the credits this dispatcher holds (before it sleeps or stops)."""
        for queue, unused in self._held.items():
            if unused:
                free_credits(queue, unused, signal=False)
        self._held = {queue: [] for queue in QUEUES}

    def run_once(self) -> int:
        """Dispatch as many due items as the credits allow. Returns how many.

        Credits of both queues are taken in one call (which also gives back the
        ones held since the last round). Per shard, one round trip dequeues the
        system tier with the system credits, then the customer tiers with the
        work credits, as many items as the credits allow.
        """
        self._reap()
        held = self._held
        self._held = {queue: [] for queue in QUEUES}  # should the call fail, those age out
        self._held = reserve_credits({queue: RESERVE_BATCH for queue in QUEUES}, give_back=held)
        no_system_credit = not self._held[SYSTEM_QUEUE]
        dispatched = 0
        groups = [(queue, tiers) for queue, tiers in ((SYSTEM_QUEUE, [SYSTEM_TIER]), (WORK_QUEUE, CUSTOMER_TIERS))
                  if self._held[queue]]
        if groups:
            for shard in self.shards:
                batches = fair_queue.dequeue_batches(
                    shard=shard, lease_ms=settings.DUCTOR_LEASE_MS,
                    batches=[(tiers, len(self._held[queue])) for queue, tiers in groups])
                for (queue, _), items in zip(groups, batches, strict=True):
                    dispatched += self._publish_all(queue, items)
        # Out of work credits (or without a system credit): the next round waits for a freed one.
        self._starved = no_system_credit or not self._held[WORK_QUEUE]
        self.dispatched += dispatched
        return dispatched

    def _publish_all(self, queue: str, items: list[fair_queue.Dequeued]) -> int:
        """Publish ``items``, each with one of the credits held for ``queue``."""
        credits = self._held[queue]
        with execute_item.app.producer_or_acquire() as producer:
            for item in items:
                credit = credits.pop()
                try:
                    self._publish(item, credit, producer)
                except Exception:
                    # The items stay leased and come back after their lease; the credits now.
                    free_credits(queue, [credit], signal=False)
                    raise
        return len(items)

    def _idle(self) -> None:
        """Sleep until something may be dispatchable: a freed credit, new work, or a due timer."""
        if self._starved:
            # Not on the work signal too: every ack pushes it, so a saturated dispatcher would
            # spin. The credits it holds (often the system queue's) go back next round.
            wait_for_credit(timeout_s=CREDIT_WAIT_S)
            return
        self.give_back()
        wait_s = IDLE_WAIT_S
        for shard in self.shards:
            due = fair_queue.next_due_ms(shard=shard)
            if due is not None:
                wait_s = min(wait_s, due / 1000)
        fair_queue.wait_for_work(shard=self.shards[0] if self.shards else 0, timeout_s=_wait_s(wait_s))

    def run_forever(self, stop: threading.Event) -> None:
        """Dispatch until ``stop`` is set. A failing round (Redis away) is logged and retried."""
        try:
            while not stop.is_set():
                try:
                    if not self.run_once() or self._starved:
                        self._idle()
                except Exception:
                    log.exception("dispatcher_round_failed")
                    stop.wait(ERROR_BACKOFF_S)
        finally:
            with contextlib.suppress(Exception):
                self.give_back()
