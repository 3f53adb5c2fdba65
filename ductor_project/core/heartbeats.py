"""Heartbeats of the long-running loops: the coordinator's and the dispatchers'.

A loop beats after each pass that worked (it reached PostgreSQL and Redis as it
needed), so a coordinator whose database went away stops beating though its
process lives: ``/readyz`` reports it, and ``manage.py up`` restarts a child
whose beat went stale. Beats are stamped with Redis ``TIME`` (one clock for
every machine) in one global ZSET per kind (``g:hb:<kind>``: process name ->
last beat); beats older than ``FORGET_MS`` are dropped, and a process that
stops cleanly withdraws its own.

A process is named by ``DUCTOR_PROCESS_NAME`` (``up`` sets it per child), else
``<host>-<pid>``.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from ductor_project.core.keys import global_redis_key
from ductor_project.core.redis import get_redis, on_node
from ductor_project.core.scripts import run

COORDINATOR = "coordinator"
DISPATCHER = "dispatcher"
KINDS = (COORDINATOR, DISPATCHER)
FORGET_MS = 3600 * 1000
# A busy loop beats at most this often. A stale bound (``DUCTOR_HEARTBEAT_STALE_S``) must exceed it
# plus the longest a healthy loop waits between passes (a dispatcher's idle wait, a coordinator's
# interval) plus a pass, or a healthy loop looks stale between two beats.
BEAT_EVERY_S = 1.0
_SCRIPT = Path(__file__).parent / "lua" / "heartbeat.lua"


def process_name() -> str:
    """This process's name in the heartbeats."""
    return os.environ.get("DUCTOR_PROCESS_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def _key(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown heartbeat kind {kind!r}")
    return global_redis_key("hb", kind)


def beat(kind: str, name: str | None = None) -> None:
    """Record that ``name``'s (by default this process's) loop of ``kind`` completed a pass now."""
    run(_SCRIPT, [_key(kind)], [name or process_name(), FORGET_MS])


def forget(kind: str, name: str | None = None) -> None:
    """Withdraw a stopping process's heartbeat."""
    get_redis().zrem(_key(kind), name or process_name())


def _shards_key() -> str:
    return global_redis_key("hb", "dispatcher-shards")


# Written before the shards of a dispatcher started with its own (``--shards``): the split leaves it out.
_PINNED = "="


def record_shards(name: str, shards: list[int], *, pinned: bool = False) -> None:
    """Write which fair-queue shards dispatcher ``name`` serves (``scheduling.dispatch.shards``), and
    whether they are its own (``pinned``) rather than its share of the split."""
    get_redis().hset(_shards_key(), name, (_PINNED if pinned else "") + ",".join(str(shard) for shard in shards))


def forget_shards(name: str) -> None:
    get_redis().hdel(_shards_key(), name)


def shards_served() -> dict[str, list[int]]:
    """The shards each dispatcher last wrote that it serves (stale ones too: see ``ages``)."""
    return {name: shards for name, (shards, _) in _written().items()}


def pinned_dispatchers() -> set[str]:
    """The dispatchers that serve shards of their own (``--shards``), not a share of the split."""
    return {name for name, (_, pinned) in _written().items() if pinned}


def _written() -> dict[str, tuple[list[int], bool]]:
    found = get_redis().hgetall(_shards_key())
    out: dict[str, tuple[list[int], bool]] = {}
    for name, value in found.items():
        text = value.decode() if isinstance(value, bytes) else str(value)
        shards = [int(s) for s in text.removeprefix(_PINNED).split(",") if s]
        out[name.decode() if isinstance(name, bytes) else str(name)] = (shards, text.startswith(_PINNED))
    return out


def ages(kind: str) -> dict[str, float]:
    """Seconds since each process of ``kind`` last beat, by the clock of the Redis server that
    stamped the beats (one round trip)."""
    key = _key(kind)

    def read(server: Any) -> list[Any]:
        with server.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.zrange(key, 0, -1, withscores=True)
            return list(pipe.execute())

    (seconds, micros), beats = on_node(key, read)
    now_ms = seconds * 1000 + micros / 1000
    return {(m.decode() if isinstance(m, bytes) else str(m)): max(0.0, (now_ms - score) / 1000)
            for m, score in beats}


class Beater:
    """Beats for a loop at most once per ``every_s`` (a busy dispatcher passes far more often)."""

    def __init__(self, kind: str, *, every_s: float = BEAT_EVERY_S) -> None:
        self.kind = kind
        self.every_s = every_s
        self._last = float("-inf")

    def passed(self) -> None:
        """The loop completed a pass: beat, unless it did less than ``every_s`` ago."""
        now = time.monotonic()
        if now - self._last >= self.every_s:
            beat(self.kind)
            self._last = now

    def stop(self) -> None:
        forget(self.kind)
