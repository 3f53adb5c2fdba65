"""Lease renewals off the caller's path: one background thread per process.

A worker holds leases while it runs something: the fair-queue item it runs
(``scheduling.dispatch.delivery``, whose lease carries every slot its admission
took), or capacity slots of its own (``capacity.keep_alive``).
``renewals.hold(renew, every_s=...)`` has the process's renewal thread call
``renew()`` every ``every_s`` until ``release`` (or until ``renew`` returns
False: the lease is gone, nothing is left to keep). ``release`` waits for a
renewal of it in progress, so no renewal ever follows it: a finished item's
lease is never taken back.

The thread also runs the ``after_wake`` hooks each time it wakes (the worker's
finisher sends its acks and freed credits from there); ``wake()`` wakes it at once.
The thread starts on first use in each process (a fork copies no threads).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger(__name__)

# The thread looks at least this often, so a lease due later needs no wake-up when it is held.
LOOK_EVERY_S = 1.0


@dataclass(eq=False)
class _Held:
    renew: Callable[[], bool]
    every_s: float
    due_at: float  # time.monotonic()
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: bool = False


class Renewals:
    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._held: dict[int, _Held] = {}
        self._hooks: list[Callable[[], None]] = []
        self._ids = itertools.count()
        self._changed = threading.Event()
        self._wakes_at = 0.0  # when the thread looks next (monotonic); 0: not started
        self._pid = 0

    def after_wake(self, hook: Callable[[], None]) -> None:
        """Run ``hook()`` in the renewal thread each time it wakes (exceptions are logged). Idempotent."""
        if hook not in self._hooks:
            self._hooks.append(hook)

    def hold(self, renew: Callable[[], bool], *, every_s: float, first_in_s: float | None = None) -> int:
        """Call ``renew`` every ``every_s`` (first in ``first_in_s``, default ``every_s``). Returns a key."""
        held = _Held(renew, every_s, time.monotonic() + (every_s if first_in_s is None else first_in_s))
        with self._lock:
            self._ensure_thread()
            key = next(self._ids)
            self._held[key] = held
            # Wake the thread only if it would look too late (no thread switch per hold: a
            # lease renewed every third of 30 s is looked at in time anyway).
            wake = held.due_at < self._wakes_at
        if wake:
            self._changed.set()
        return key

    def release(self, key: int) -> None:
        """Stop renewing ``key``; returns once no renewal of it runs."""
        with self._lock:
            held = self._held.pop(key, None)
        if held is not None:
            with held.lock:
                held.done = True

    def wake(self) -> None:
        """Have the thread run its hooks now."""
        with self._lock:
            self._ensure_thread()
        self._changed.set()

    def _ensure_thread(self) -> None:
        """Start the thread on first use in this process. Holds the lock."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._held.clear()
            self._wakes_at = 0.0
            threading.Thread(target=self._run, daemon=True, name=self.name).start()

    def _run(self) -> None:
        while True:
            self._changed.clear()  # before looking: a later set() makes the wait below return
            for hook in self._hooks:
                try:
                    hook()
                except Exception:
                    log.exception("renewal_hook_failed", thread=self.name)
            now = time.monotonic()
            with self._lock:
                due = [(key, held) for key, held in self._held.items() if held.due_at <= now]
            for key, held in due:
                self._renew(key, held)
            with self._lock:
                soonest = min((held.due_at for held in self._held.values()), default=math.inf)
                self._wakes_at = min(soonest, time.monotonic() + LOOK_EVERY_S)
                wait = self._wakes_at - time.monotonic()
            self._changed.wait(max(wait, 0.001))

    def _renew(self, key: int, held: _Held) -> None:
        with held.lock:
            if held.done:
                return
            held.due_at = time.monotonic() + held.every_s
            try:
                kept = held.renew()
            except Exception:
                log.exception("lease_renewal_failed", thread=self.name)
                return
            if not kept:
                held.done = True
        if not kept:
            with self._lock:
                self._held.pop(key, None)


# The process's renewal thread, shared by every lease a worker process holds.
renewals = Renewals("ductor-renewals")
