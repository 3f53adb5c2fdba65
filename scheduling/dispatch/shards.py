"""Which shards each dispatcher serves: the fair queue's shards split between the live dispatchers.

A dispatcher is live while it beats within ``DUCTOR_HEARTBEAT_STALE_S`` (``heartbeats``). Each
shard goes to ``k = ceil(live / shards)`` live dispatchers, and each dispatcher gets ``shards * k /
live`` of them, rounded down or up (``split``): with more shards than dispatchers each serves its
even share alone; with fewer, every shard is served by more than one (a dequeue is atomic, so two
dispatchers on one shard share its work). Which dispatcher gets which shard follows a rendezvous
rank (a hash of the shard and the dispatcher's name), so a dispatcher that joins or leaves moves
few shards besides those it takes or gives.

Each dispatcher works the plan out for itself from the beats, at most once per
``heartbeats.BEAT_EVERY_S``, and writes the shards it serves beside its beat
(``heartbeats.record_shards``). A dispatcher that died keeps its shards until its beat goes stale:
for up to ``DUCTOR_HEARTBEAT_STALE_S`` nobody else takes them (unless ``k`` > 1). ``unserved``
lists the shards no live dispatcher serves; ``/readyz`` and the platform queue view show them.
A dispatcher started with ``--shards`` serves those, whatever the others do, and the others split
every shard between themselves without it (it writes its shards marked as its own).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Collection
from typing import Any

import structlog
from django.conf import settings

from ductor_project.core import heartbeats
from ductor_project.core.keys import queue_shards

log = structlog.get_logger(__name__)


def _rank(shard: int, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{shard}:{name}".encode(), digest_size=8).digest(), "big")


def split(names: Collection[str], shards: int) -> dict[int, list[str]]:
    """Each shard's dispatchers among ``names``: ``k = ceil(names / shards)`` per shard, every
    dispatcher given ``floor`` or ``ceil`` of ``shards * k / names`` of them. The pairs are taken
    in the order of their rendezvous rank (a hash of the shard and the name), a pair only while
    its shard wants a dispatcher and its dispatcher has room: the same split wherever it is worked
    out, which moves few shards when a dispatcher joins or leaves. (Plain rendezvous hashing, each
    shard to its best-ranked, could give one of two dispatchers all four shards.)"""
    ordered = sorted(set(names))
    k = max(1, math.ceil(len(ordered) / shards))
    base, extra = divmod(shards * k, len(ordered))
    load = dict.fromkeys(ordered, 0)
    out: dict[int, list[str]] = {shard: [] for shard in range(shards)}
    pairs = sorted(((_rank(shard, name), name, shard) for shard in range(shards) for name in ordered), reverse=True)
    for _, name, shard in pairs:
        if len(out[shard]) >= k or load[name] > base or (load[name] == base and not extra):
            continue
        if load[name] == base:
            extra -= 1
        out[shard].append(name)
        load[name] += 1
    for owners in out.values():  # a shard the quotas left short (rare): the least loaded fill it
        for name in sorted(ordered, key=lambda name: (load[name], name)):
            if len(owners) >= k:
                break
            if name not in owners:
                owners.append(name)
                load[name] += 1
    return out


def assigned(name: str, live: Collection[str], shards: int) -> list[int]:
    """The shards of ``shards`` that dispatcher ``name`` serves among the ``live`` ones (it counts
    itself live whatever ``live`` says: it is running)."""
    return [shard for shard, owners in split(set(live) | {name}, shards).items() if name in owners]


def live_dispatchers() -> dict[str, float]:
    """The dispatchers that share the split: those that beat within the stale bound, with their beats'
    ages (s), but for those started with shards of their own, which serve only those."""
    stale_s = settings.DUCTOR_HEARTBEAT_STALE_S
    pinned = heartbeats.pinned_dispatchers()
    return {name: age for name, age in heartbeats.ages(heartbeats.DISPATCHER).items()
            if age <= stale_s and name not in pinned}


class ShardPlan:
    """A dispatcher's shards: ``fixed`` ones, or its share of the split, worked out again at most
    every ``every_s`` (and written beside its beat)."""

    def __init__(self, fixed: list[int] | None = None, *, name: str | None = None,
                 every_s: float = heartbeats.BEAT_EVERY_S) -> None:
        self.fixed = fixed
        self.name = name or heartbeats.process_name()
        self.every_s = every_s
        self._shards = list(fixed) if fixed is not None else list(queue_shards())
        self._at = float("-inf")
        self._warned = False

    def shards(self) -> list[int]:
        """The shards to serve now. Reads the beats at most every ``every_s``; should that fail
        (Redis away), the last plan holds."""
        now = time.monotonic()
        if now - self._at >= self.every_s:
            self._at = now
            try:
                if self.fixed is None:
                    self._shards = assigned(self.name, live_dispatchers(), len(queue_shards()))
                heartbeats.record_shards(self.name, self._shards, pinned=self.fixed is not None)
            except Exception:  # the round's own Redis calls will fail and be retried the usual way
                log.warning("shard_plan_unread", shards=self._shards, exc_info=True)
        # A shard a reshard stopped serving since the plan was made (drained), or one a dispatcher
        # started with its own shards was pinned to: passed over while it is not served.
        served = queue_shards()
        shards = [shard for shard in self._shards if shard in served]
        if self.fixed is not None and len(shards) < len(self._shards) and not self._warned:
            self._warned = True
            log.warning("pinned_shards_not_served", shards=self._shards, served=len(served))
        elif len(shards) == len(self._shards):
            self._warned = False
        return shards

    def stop(self) -> None:
        heartbeats.forget_shards(self.name)


def serving() -> dict[int, list[str]]:
    """Each shard's live dispatchers, by the shards they last wrote (a live dispatcher that wrote
    none, one from before the split, serves every shard)."""
    every = queue_shards()
    written = heartbeats.shards_served()
    beats = heartbeats.ages(heartbeats.DISPATCHER)
    for gone in written.keys() - beats.keys():  # its beat was forgotten: so is what it served
        heartbeats.forget_shards(gone)
    stale_s = settings.DUCTOR_HEARTBEAT_STALE_S
    out: dict[int, list[str]] = {shard: [] for shard in every}
    for name in sorted(name for name, age in beats.items() if age <= stale_s):
        for shard in written.get(name, every):
            if shard in out:
                out[shard].append(name)
    return out


def unserved() -> list[int]:
    """The shards no live dispatcher serves: their due items wait until one does."""
    return [shard for shard, names in serving().items() if not names]


def readiness() -> dict[str, Any]:
    """``/readyz``'s check (``ductor_project.health.register_check``): every shard is served."""
    missing = unserved()
    result: dict[str, Any] = {"shards": len(queue_shards()), "unserved": missing}
    if missing:
        result.update(ok=False, error=f"no live dispatcher serves shard(s) {', '.join(map(str, missing))}")
    return result
