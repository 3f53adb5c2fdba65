"""The dispatcher's side: ``dequeue`` (admitting every scope in the same atomic step), a worker's
``handoff`` (its ack and its next item in one round trip), the ``reap`` of ended leases, and how
long a dispatcher may sleep (``next_due_ms``, ``wait_for_work``). These cross tenants, and refuse
to run inside a customer tenant's context.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ductor_project.core import scripts
from ductor_project.core.redis import get_redis, is_cluster, per_node
from scheduling.fair_queue.enqueuing import after_held
from scheduling.fair_queue.items import Dequeued, Finished
from scheduling.fair_queue.layout import (
    CLUSTER_WAKE_SLICE_S,
    MAX_DEQUEUE_CALLS,
    MAX_WAIT_S,
    MIN_WAIT_S,
    PROMOTE_PER_CALL,
    TENANTS_PER_CALL,
    TIERS,
    at_least,
    check_shard,
    dispatcher_side,
    global_key,
    quiet_wakes,
    run_script,
    script_header,
    text,
)
from scheduling.fair_queue.leases import queue_ack


def dequeue(*, shard: int = 0, lease_ms: int, tiers: Sequence[str] | None = None) -> Dequeued | None:
    """Dispatch the next item of the shard, leased for ``lease_ms``; None when nothing is eligible.

    Strict tier priority (only ``tiers`` when given), SFQ by weight among the
    tier's tenants, then the tenant's earliest-due partition head; never an item
    before it is due, of a locked partition, or of a tenant at its concurrency
    ceiling or held back by its step rate (those are parked, in the same atomic
    step). Takes the tenant's step slot and charges its step rate. One round trip,
    atomic, O(log n) in tenants and partitions; after a mass wake-up (more than
    ``PROMOTE_PER_CALL`` timers due, or ``TENANTS_PER_CALL`` tenants parked) a
    few more calls. Dispatcher side: raises ``TenantScopeError`` inside a
    customer tenant's context.
    """
    items = dequeue_many(shard=shard, lease_ms=lease_ms, tiers=tiers, limit=1)
    return items[0] if items else None


def dequeue_many(
    *, shard: int = 0, lease_ms: int, tiers: Sequence[str] | None = None, limit: int
) -> list[Dequeued]:
    """Up to ``limit`` items of the shard, in the order ``limit`` calls of ``dequeue`` would
    give them, in one round trip (a few more after a mass wake-up); see ``dequeue``."""
    return dequeue_batches(shard=shard, lease_ms=lease_ms, batches=[(tiers, limit)])[0]


def dequeue_batches(
    *, shard: int = 0, lease_ms: int, batches: Sequence[tuple[Sequence[str] | None, int] | Batched],
    kind: str = "", free_kinds: Collection[str] = (),
) -> list[list[Dequeued]]:
    """``dequeue_many(tiers=..., limit=...)`` for each ``(tiers, limit)`` of ``batches``, one
    after the other, all in one round trip: a dispatcher takes the system tier with its
    system credits, then the customer tiers with its work credits. With ``kind``, only items of
    that kind, each batch stopping at the first item of another (``handoff``).

    With ``free_kinds``, a batch's third number (``(tiers, limit, free)``) is how many items of
    those kinds it may take beside its ``limit`` of others: the items its caller's credits do not
    bound (a dispatcher's task nodes, which go to the team's queue). A tenant whose next item is
    of a class already taken as many times as wanted is passed over for the rest of the call,
    keeping its place in the fair order: with no work credit left, task nodes still go out. A
    call passes over at most 16 tenants (``fq_dequeue.lua``), and a tenant's items behind its own
    next one wait for it."""
    dispatcher_side()
    shard = check_shard(shard)
    at_least("lease_ms", lease_ms, 1)
    free_kinds = sorted(free_kinds)
    wanted = [_batched(entry, bool(free_kinds)) for entry in batches]
    results: list[list[Dequeued]] = [[] for _ in wanted]
    pending = list(range(len(wanted)))
    for _ in range(MAX_DEQUEUE_CALLS):
        if not pending:
            break
        batch = scripts.Batch()
        for i in pending:
            tiers, limit, free = wanted[i]
            free_taken = _of_kinds(results[i], free_kinds)
            _queue_dequeue(batch, shard, lease_ms, tiers, limit - (len(results[i]) - free_taken), kind,
                           ",".join(free_kinds), free - free_taken)
        again = []
        for i, reply in zip(pending, batch.execute(), strict=True):
            found, more = _dequeue_reply(reply)
            results[i] += found
            free_taken = _of_kinds(results[i], free_kinds)
            if more and (len(results[i]) - free_taken < wanted[i][1] or free_taken < wanted[i][2]):
                again.append(i)
        pending = again
    return results


Batched = tuple[Sequence[str] | None, int, int]


def _batched(entry: tuple[Sequence[str] | None, int] | Batched, any_free: bool) -> tuple[list[str], int, int]:
    tiers, limit, free = (*entry, 0) if len(entry) == 2 else entry
    at_least("limit", limit, 0)
    at_least("free", free, 0)
    if free and not any_free:
        raise ValueError(f"free {free} needs free_kinds: without them a batch takes its limit ({limit}) alone")
    if limit + free < 1:
        raise ValueError(f"a batch takes at least one item: limit {limit} and free {free}")
    return _tiers(tiers), limit, free


def _of_kinds(items: Sequence[Dequeued], kinds: Collection[str]) -> int:
    """How many of ``items`` are of one of ``kinds`` (the payload's kind, as the queue reads it)."""
    if not kinds:
        return 0
    return sum(1 for item in items if isinstance(item.payload, dict) and item.payload.get("kind") in kinds)


def handoff(
    finished: Finished | None, *, shard: int, lease_ms: int, tiers: Sequence[str], kind: str = ""
) -> tuple[bool | None, Dequeued | None]:
    """Ack ``finished`` (tenant, item id, delivery), when given, then dequeue the shard's next
    item of ``tiers`` (see ``dequeue``): one round trip for both, in that order, so that the
    slot and the partition the ack frees are already free for the dequeue. The enqueues
    held in this context (``holding_enqueues``) go first in the same round trip. With
    ``kind``, the item the fair order gives next is taken only if it is of that kind (the
    payload's ``kind`` unless the item named its own); else nothing is taken.

    For a worker that finishes an item and takes the next one itself: the tenants the round
    trip makes ready do not wake the dispatchers, unless its dequeue leaves some ready
    (``quiet_wakes``). Returns whether the ack acked (None without ``finished``) and the item,
    or None. Call it outside any customer tenant's context.
    """
    dispatcher_side()
    shard = check_shard(shard)
    at_least("lease_ms", lease_ms, 1)
    tiers = _tiers(tiers)
    if finished is not None:
        finished = Finished(*finished)

    def calls(batch: scripts.Batch) -> None:
        if finished is not None:
            queue_ack(batch, finished.item_id, delivery=finished.delivery, tenant=finished.tenant,
                      work_ms=finished.work_ms)
        _queue_dequeue(batch, shard, lease_ms, tiers, 1, kind)

    with quiet_wakes(shard):
        *acked, reply = after_held(calls)
    if acked and isinstance(acked[0], Exception):
        raise acked[0]
    found, more = _dequeue_reply(reply)
    if not found and more:  # a mass wake-up: finish it the usual way
        found = dequeue_batches(shard=shard, lease_ms=lease_ms, batches=[(tiers, 1)], kind=kind)[0]
    return (acked[0] == 1 if acked else None), (found[0] if found else None)


def _queue_dequeue(batch: scripts.Batch, shard: int, lease_ms: int, tiers: list[str], limit: int,
                   kind: str = "", free_kinds: str = "", free: int = 0) -> None:
    args = [*script_header(shard), lease_ms, PROMOTE_PER_CALL, TENANTS_PER_CALL, limit, kind, free_kinds, free,
            *tiers]
    run_script("fq_dequeue", [global_key("timers", shard=shard)], args, batch)


def _dequeue_reply(reply: Any) -> tuple[list[Dequeued], bool]:
    """The items of one ``fq_dequeue`` call, and whether more may be eligible (a mass wake-up
    cut the call short)."""
    if isinstance(reply, Exception):
        raise reply
    status, *found = reply
    return [_dequeued(row) for row in found], text(status) == "again"


def _tiers(tiers: Sequence[str] | None) -> list[str]:
    """``tiers`` in priority order (every tier when None); a ValueError for unknown ones."""
    if tiers is None:
        return list(TIERS)
    unknown = set(tiers) - set(TIERS)
    if unknown or not tiers:
        raise ValueError(f"tiers are a non-empty subset of {list(TIERS)}, not {list(tiers)!r}")
    return [tier for tier in TIERS if tier in tiers]


def _dequeued(row: Sequence[Any]) -> Dequeued:
    tenant_id, item_id, tier, partition, payload, waited, attempt, delivery, lease_until, conn, why = row
    return Dequeued(
        tenant_id=text(tenant_id),
        item_id=text(item_id),
        tier=text(tier),
        partition=text(partition),
        payload=json.loads(payload),
        waited_ms=int(waited),
        attempt=int(attempt),
        delivery=int(delivery),
        lease_until_ms=int(lease_until),
        connection_id=text(conn),
        admitted=text(why),
    )



def reap(*, shard: int = 0, limit: int = 100) -> int:
    """Return up to ``limit`` items whose lease ended to their partitions; returns how many.

    A reaped item keeps its due time (its partition's order holds) and is
    delivered again by a later dequeue; its slot was freed by the lease's end.
    One round trip, atomic. Dispatcher side.
    """
    dispatcher_side()
    shard = check_shard(shard)
    at_least("limit", limit, 1)
    return int(run_script("fq_reap", [global_key("inflight", shard=shard)], [*script_header(shard), limit]))


def next_due_ms(shard: int = 0) -> int | None:
    """How long a dispatcher of the shard may sleep: 0 when work is ready, None when the shard is empty.

    Otherwise the ms until the earliest timer (a due head, a rate, a ceiling's
    lease) or lease end. One round trip, read only. Dispatcher side.
    """
    return due_ms_of(queue_next_due(None, shard))


def queue_next_due(batch: scripts.Batch | None, shard: int) -> Any:
    """``next_due_ms`` queued on a script ``batch`` (read its reply with ``due_ms_of``); without
    one, the call's reply."""
    dispatcher_side()
    shard = check_shard(shard)
    return run_script("fq_next_due", [global_key("timers", shard=shard)], list(script_header(shard)), batch)


def due_ms_of(reply: Any) -> int | None:
    """What ``next_due_ms`` returns, from an ``fq_next_due`` reply (raised when it is an error)."""
    if isinstance(reply, Exception):
        raise reply
    return None if int(reply) < 0 else int(reply)


def wait_for_work(*, shards: Sequence[int] = (0,), timeout_s: float) -> bool:
    """Block until new ready work is signalled on one of the ``shards``, or the timeout; True if
    signalled.

    A dispatcher sleeps here for ``next_due_ms`` at most; an enqueue that makes
    a tenant ready, or sets an earlier timer, wakes one sleeper. The wait is cut
    to ``MAX_WAIT_S`` (below the client's socket timeout) and raised to 1 ms (Redis
    counts a blocking timeout in whole ms, and 0 ms would mean forever);
    ``timeout_s <= 0`` only takes a pending signal. One Redis waits on every shard's signal
    at once. A Redis Cluster cannot (a command's keys share one slot): there, the shards'
    pending signals are taken (a round trip per node), then the first shard's is waited on
    for ``CLUSTER_WAKE_SLICE_S`` at most, and so on until the timeout, so that a signal of
    another shard waits that long at most. Dispatcher side.
    """
    dispatcher_side()
    keys = [global_key("wake", shard=check_shard(shard)) for shard in shards]
    redis = get_redis()
    timeout_s = min(timeout_s, MAX_WAIT_S)
    if timeout_s > 0 and (len(keys) == 1 or not is_cluster(redis)):
        return redis.blpop(keys, timeout=max(timeout_s, MIN_WAIT_S)) is not None
    deadline = time.monotonic() + timeout_s
    while not any(per_node(keys, _take_signals(keys))):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if redis.blpop(keys[:1], timeout=max(min(left, CLUSTER_WAKE_SLICE_S), MIN_WAIT_S)) is not None:
            return True
    return True


def _take_signals(keys: list[str]) -> Callable[[Any, list[int]], bool]:
    """For ``per_node``: take the pending signals of a server's ``keys``; whether there was one."""
    def take(server: Any, positions: list[int]) -> bool:
        with server.pipeline(transaction=False) as pipe:
            for position in positions:
                pipe.lpop(keys[position])
            return any(token is not None for token in pipe.execute())
    return take

