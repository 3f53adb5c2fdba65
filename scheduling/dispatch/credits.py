"""Worker slots and dispatch credits: how many messages may be published to each Celery queue.

A message is published only with a credit, and credits are reserved
atomically (``lua/broker_reserve.lua``) for all dispatchers at once: per Celery
queue, the messages published but not finished never exceed the live worker
slots plus ``DUCTOR_DISPATCH_BUFFER``, so at most the buffer (plus the idle
slots) waits unstarted in Celery. Workers register their slots per queue with
a heartbeat; credits and registrations are Redis ZSET members scored by
expiry, so a crashed worker's or a lost message's entries age out instead of
leaking. A reserved credit lives ``RESERVED_TTL_S`` until its message is
published (``mark_sent``), so a dispatcher killed between the two loses its
credits for seconds, not for a credit's lifetime. A finished task signals its
freed credit; a dispatcher without credits sleeps on that signal instead of
polling.

Global keys (they cross tenants; all in shard 0's hash slot):

- ``broker:workers:<queue>``: ZSET ``<host>|<slots>`` -> registration expiry (s, Redis TIME)
- ``broker:outstanding:<queue>``: ZSET credit -> expiry: reserved or published, not yet seen running
- ``broker:running:<queue>``: ZSET credit -> expiry (the item's lease): renewed by a running task
- ``broker:freed:<queue>``: LIST, at most one token: a credit freed
- ``broker:credit-seq``: STRING, the last credit id
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings

from ductor_project.celery import RESULTS_QUEUE, SYSTEM_QUEUE, WORK_QUEUE
from ductor_project.core import scripts
from ductor_project.core.keys import global_redis_key
from ductor_project.core.redis import get_redis, on_node
from scheduling import LUA_DIR, fair_queue

SYSTEM_TIER = fair_queue.SYSTEM_TIER
CUSTOMER_TIERS = [tier for tier in fair_queue.TIERS if tier != SYSTEM_TIER]
QUEUES = (SYSTEM_QUEUE, WORK_QUEUE)
WORKER_TTL_S = 20.0
# How long a credit of a published message lives if no worker ever starts it (a lost message).
OUTSTANDING_TTL_S = 60.0
# How long a reserved credit lives until its message is published (or it is given back).
RESERVED_TTL_S = 5.0
# Shortest blocking wait: Redis 6.2 truncates a timeout to whole ms, and 0 ms means "forever".
MIN_WAIT_S = 0.01
_RESERVE, _MARK = LUA_DIR / "broker_reserve.lua", LUA_DIR / "broker_mark.lua"  # made once: see fair_queue.layout


def queue_for(tier: str) -> str:
    """The Celery queue of a tier's items: ``ductor.system`` for the system tier, else the work queue."""
    return SYSTEM_QUEUE if tier == SYSTEM_TIER else WORK_QUEUE


def tiers_of(queue: str) -> list[str]:
    """The fair-queue tiers whose items go to ``queue``."""
    return [SYSTEM_TIER] if queue == SYSTEM_QUEUE else CUSTOMER_TIERS


def _key(*parts: str) -> str:
    return global_redis_key("broker", *parts)


def _queue_keys(queue: str) -> list[str]:
    return [_key("workers", queue), _key("outstanding", queue), _key("running", queue)]


def _now() -> float:
    """Now by the clock of the server that holds the credits (the scripts' own clock)."""
    seconds, micros = on_node(_key("credit-seq"), lambda server: server.time())
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


def readiness() -> dict[str, Any]:
    """``/readyz``'s check (``ductor_project.health.register_check``): each of Ductor's queues (the
    steps', the system's, the outcomes of task nodes') has a live worker slot; the live slots by
    queue, and the queues no live worker consumes named. Without one, what is sent there waits."""
    slots = {queue: worker_slots(queue) for queue in (WORK_QUEUE, SYSTEM_QUEUE, RESULTS_QUEUE)}
    result: dict[str, Any] = {"slots": slots}
    unserved = [queue for queue, count in slots.items() if not count]
    if unserved:
        result.update(ok=False, error=f"no live worker consumes {', '.join(unserved)}")
    return result


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
    trip. Each credit is a new outstanding entry that lives ``RESERVED_TTL_S``:
    pass it in a message and ``mark_sent`` it, or give it back.
    """
    queues = list(wanted)
    keys = [key for queue in queues for key in _queue_keys(queue)] + [_key("credit-seq")]
    args: list[Any] = [settings.DUCTOR_DISPATCH_BUFFER, RESERVED_TTL_S]
    for queue in queues:
        returned = (give_back or {}).get(queue, [])
        args += [wanted[queue], len(returned), *returned]
    taken = scripts.run(_RESERVE, keys, args)
    return {queue: [c.decode() if isinstance(c, bytes) else str(c) for c in got]
            for queue, got in zip(queues, taken, strict=True)}


def credit_lifetime_s() -> float:
    """How long a credit counts before its task is seen running: the renewal thread's first
    renewal (a third of the lease after the start) moves it to ``running``."""
    return max(OUTSTANDING_TTL_S, settings.DUCTOR_LEASE_MS / 1000)


def mark_sent(queue: str, credits: list[str]) -> None:
    """The credits' messages were published: they count until a worker starts them, for
    ``credit_lifetime_s()`` at most. One round trip."""
    if credits:
        keys = [_key("outstanding", queue), _key("running", queue), _key("freed", queue)]
        scripts.run(_MARK, keys, ["sent", credit_lifetime_s(), *credits])


def mark_running(queue: str, credits: list[str], lease_s: float) -> None:
    """The credits' tasks started (or still run): they count as running for ``lease_s``. One round trip."""
    if credits:
        keys = [_key("outstanding", queue), _key("running", queue), _key("freed", queue)]
        scripts.run(_MARK, keys, ["run", lease_s, *credits])


def free_credits(queue: str, credits: list[str], *, signal: bool = True, batch: scripts.Batch | None = None) -> None:
    """Give credits back (task finished, or credit unused). One round trip, idempotent.

    ``signal`` wakes a dispatcher waiting for credits; a dispatcher giving back
    what it did not use passes False (it would only wake itself). With ``batch``,
    the call is only queued on it.
    """
    if credits:
        keys = [_key("outstanding", queue), _key("running", queue), _key("freed", queue)]
        scripts.run(_MARK, keys, ["free" if signal else "unused", 0, *credits], batch=batch)


def wait_for_credit(*, timeout_s: float) -> bool:
    """Block until a credit is freed on any queue, or the timeout; True if one was."""
    keys = [_key("freed", queue) for queue in QUEUES]
    return get_redis().blpop(keys, timeout=blocking_wait_s(timeout_s)) is not None


def blocking_wait_s(seconds: float) -> float:
    """A blocking wait of ``seconds`` as Redis should be given it: in whole ms, never 0 (forever)."""
    # Round up to whole ms (plus a margin) so that Redis never truncates the wait to 0 = forever.
    return (int(max(seconds, MIN_WAIT_S) * 1000) + 1.5) / 1000

