"""``Coordinator``: the reaper, the reconcilers and the housekeepers, in a loop that survives what
it depends on.

Each pass first asks whether Redis lost its data (``epoch.RedisWatch``): if it
did, every reconciler repairs everything at once. A failing pass (PostgreSQL
or Redis away) is logged, the database connections it may have left unusable
are closed, and the next pass starts afresh: the coordinator recovers like a
Celery task does.
"""

from __future__ import annotations

import contextlib
import threading
import time

import structlog
from django.db import connections

from ductor_project.core import heartbeats, metrics
from scheduling.coordinator.epoch import RedisWatch
from scheduling.coordinator.housekeeping import housekeep_all
from scheduling.coordinator.reaper import reap_all
from scheduling.coordinator.reconcile import reconcile_all
from tenants.tasking import refresh_db_connections

log = structlog.get_logger(__name__)


class Coordinator:
    """Reaps expired leases every ``interval_s``, and reconciles Redis with PostgreSQL and runs the
    housekeepers (retention) every ``reconcile_every_s``."""

    def __init__(self, *, interval_s: float = 1.0, reconcile_every_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self.reconcile_every_s = reconcile_every_s
        self._last_reconcile = 0.0
        self._redis = RedisWatch()

    def tick(self) -> dict[str, int]:
        started = time.perf_counter()
        refresh_db_connections()
        full = self._redis.lost()
        reaped = reap_all()
        repaired = removed = 0
        if full or time.monotonic() - self._last_reconcile >= self.reconcile_every_s:
            repaired = reconcile_all(full=full)
            if full:
                self._redis.repaired(repaired)
            removed = housekeep_all()
            self._last_reconcile = time.monotonic()
        if reaped or repaired or removed:
            log.info("coordinator_tick", reaped=reaped, repaired=repaired, removed=removed)
        metrics.REAPED.inc(reaped)
        metrics.REPAIRS.inc(repaired)
        metrics.LOOP_PASS.labels(heartbeats.COORDINATOR).observe(time.perf_counter() - started)
        return {"reaped": reaped, "repaired": repaired, "removed": removed}

    def run_forever(self, stop: threading.Event) -> None:
        """Tick every ``interval_s`` until ``stop`` is set; each pass that worked beats
        (``heartbeats``), one that failed does not."""
        beater = heartbeats.Beater(heartbeats.COORDINATOR)
        try:
            while not stop.is_set():
                try:
                    self.tick()
                    beater.passed()
                except Exception:
                    log.exception("coordinator_tick_failed")
                    # A connection the failure broke would fail every later pass: the next one reconnects.
                    connections.close_all()
                stop.wait(self.interval_s)
        finally:
            with contextlib.suppress(Exception):
                beater.stop()
