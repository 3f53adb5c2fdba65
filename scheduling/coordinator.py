"""The coordinator: timers and housekeeping, as work of the system tenant.

- **Wake-ups.** ``schedule_wakeup(tenant, ref, at)`` stores a system-tenant
  item with a due time in the fair queue (tier ``system``, on the coordinator's
  partitions, Celery queue ``ductor.system``), so timers never compete with
  customer work and customer backlog never delays them. When one falls due, a
  worker runs it: the handler registered for its kind re-checks, inside the
  owning tenant's context, that it still matters, and then enqueues the real
  work under that tenant. One wake-up per ``(tenant, ref)`` waits at a time.
- **Housekeeping.** ``Coordinator.tick()`` reaps expired leases and runs the
  registered reconcilers, which rebuild Redis state from PostgreSQL (the
  source of truth) — for example re-enqueueing runnable runs after a Redis
  flush. It runs in ``manage.py run_coordinator``.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

import structlog
from django.conf import settings
from django.utils import timezone

from ductor_project.core.context import tenant_context
from scheduling import fair_queue
from scheduling.broker import SYSTEM_TIER, ItemContext, register_handler
from tenants.models import Tenant, system_context

log = structlog.get_logger(__name__)

WAKEUP_PARTITIONS = 16

Wakeup = Callable[[str, dict[str, Any]], None]
_wakeups: dict[str, Wakeup] = {}
_reconcilers: list[Callable[[], int]] = []


def register_wakeup(kind: str, fire: Wakeup) -> None:
    """``fire(ref, data)`` runs in the owning tenant's context when a ``kind`` wake-up falls due."""
    _wakeups[kind] = fire


def register_reconciler(reconcile: Callable[[], int]) -> None:
    """``reconcile()`` repairs Redis from PostgreSQL; returns how many things it fixed."""
    _reconcilers.append(reconcile)


def schedule_wakeup(
    tenant: Tenant, ref: str, at: datetime | None = None, *, kind: str, data: dict[str, Any] | None = None,
    delay_s: float | None = None,
) -> str:
    """Wake ``kind`` for ``ref`` of ``tenant`` at ``at`` (or after ``delay_s``). Returns the item id.

    Idempotent per ``(tenant, kind, ref)``: while one wake-up waits, scheduling
    another keeps the earlier one (its handler re-checks and reschedules).
    """
    if kind not in _wakeups:
        raise ValueError(f"no wake-up handler registered for '{kind}'")
    if delay_s is None:
        delay_s = max(0.0, ((at or timezone.now()) - timezone.now()).total_seconds())
    item_id = f"wake:{tenant.pk}:{kind}:{ref}"
    partition = f"wake:{zlib.crc32(item_id.encode()) % WAKEUP_PARTITIONS}"
    payload = {"kind": "wakeup", "tenant_id": str(tenant.pk), "wake": kind, "ref": ref, "data": data or {}}
    with system_context():
        fair_queue.enqueue(item_id, tier=SYSTEM_TIER, partition=partition, payload=payload,
                           delay_ms=int(delay_s * 1000))
    return item_id


def _run_wakeup(ctx: ItemContext, body: dict[str, Any]) -> None:
    tenant = Tenant.objects.filter(pk=body["tenant_id"]).first()
    fire = _wakeups.get(str(body.get("wake")))
    if tenant is None or fire is None:
        log.warning("wakeup_dropped", target_tenant=body.get("tenant_id"), wake=body.get("wake"))
        return
    with tenant_context(tenant):
        fire(str(body["ref"]), dict(body.get("data") or {}))


register_handler("wakeup", _run_wakeup)


class Coordinator:
    """Reaps expired leases and reconciles Redis with PostgreSQL, every ``interval_s``."""

    def __init__(self, *, interval_s: float = 1.0, reconcile_every_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self.reconcile_every_s = reconcile_every_s
        self._last_reconcile = 0.0

    def tick(self) -> dict[str, int]:
        reaped = sum(fair_queue.reap(shard=shard) for shard in range(settings.DUCTOR_QUEUE_SHARDS))
        repaired = 0
        if time.monotonic() - self._last_reconcile >= self.reconcile_every_s:
            for reconcile in _reconcilers:
                repaired += reconcile()
            self._last_reconcile = time.monotonic()
        if reaped or repaired:
            log.info("coordinator_tick", reaped=reaped, repaired=repaired)
        return {"reaped": reaped, "repaired": repaired}

    def run_forever(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("coordinator_tick_failed")
            stop.wait(self.interval_s)
