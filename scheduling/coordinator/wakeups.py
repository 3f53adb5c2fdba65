"""Timers: wake-ups of the system tenant that act, when due, in the owning tenant's context.

``schedule_wakeup(tenant, ref, kind=..., delay_s=...)`` stores a system-tier
item in the fair queue on one of the coordinator's partitions. When it falls
due a worker of ``ductor.system`` runs it: the wake-up registered for its
kind re-checks, inside the owning tenant's context, that it still matters,
and then enqueues the real work under that tenant. One wake-up per
``(tenant, kind, ref)`` waits at a time. The apps register their kinds in
``AppConfig.ready()``.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

import structlog
from django.utils import timezone

from ductor_project.core import tracing
from ductor_project.core.context import tenant_context
from ductor_project.core.keys import redis_key
from ductor_project.core.redis import get_redis
from scheduling import fair_queue
from scheduling.dispatch.credits import SYSTEM_TIER
from scheduling.dispatch.handlers import ItemContext
from tenants.models import Tenant, system_context

log = structlog.get_logger(__name__)

# The fair queue's item kind of a wake-up (its handler is ``run_wakeup``).
ITEM_KIND = "wakeup"
# Each owning tenant's wake-ups spread over this many partitions of their own: a partition keeps
# the fairness key it was made with, and the owner is the key (see ``schedule_wakeup``).
WAKEUP_PARTITIONS = 16

Wakeup = Callable[[str, dict[str, Any]], None]
_wakeups: dict[str, Wakeup] = {}


def register_wakeup(kind: str, fire: Wakeup) -> None:
    """``fire(ref, data)`` runs in the owning tenant's context when a ``kind`` wake-up falls due."""
    _wakeups[kind] = fire


def schedule_wakeup(
    tenant: Tenant, ref: str, at: datetime | None = None, *, kind: str, data: dict[str, Any] | None = None,
    delay_s: float | None = None,
) -> str:
    """Wake ``kind`` for ``ref`` of ``tenant`` at ``at`` (or after ``delay_s``). Returns the item id.

    Idempotent per ``(tenant, kind, ref)``: while one wake-up waits, scheduling
    another keeps the earlier one (its handler re-checks and reschedules). The
    owning tenant is the item's fairness key in the system tier. One Redis round
    trip. Raises ``ValueError`` for a kind no app registered.
    """
    if kind not in _wakeups:
        raise ValueError(f"no wake-up handler registered for '{kind}'")
    if delay_s is None:
        delay_s = max(0.0, ((at or timezone.now()) - timezone.now()).total_seconds())
    item_id = f"{_prefix(tenant.pk)}{kind}:{ref}"
    partition = f"wake:{tenant.pk}:{zlib.crc32(item_id.encode()) % WAKEUP_PARTITIONS}"
    # With the trace of what schedules it: the work it wakes (a retry, a tick) goes on in that trace.
    payload = tracing.inject({"kind": ITEM_KIND, "tenant_id": str(tenant.pk), "wake": kind, "ref": ref,
                              "data": data or {}})
    with system_context():
        # Every tenant's wake-ups are the system tenant's items: keyed by their owner, so that the
        # owners share the system tier in turn (fair by work), and one tenant's thousand sleeps or
        # cancels due at once do not hold up another's timer due a moment later.
        fair_queue.enqueue(item_id, tier=SYSTEM_TIER, partition=partition, payload=payload,
                           delay_ms=int(delay_s * 1000), key=str(tenant.pk))
    return item_id


def _prefix(tenant_id: object) -> str:
    """What the ids of a tenant's wake-ups begin with (``schedule_wakeup``)."""
    return f"wake:{tenant_id}:"


def withdraw_tenant_wakeups(tenant_id: str) -> int:
    """Withdraw the waiting wake-ups (sleeps, retries, timeouts, schedules) of the tenant ``tenant_id``,
    being deleted: they are the system tenant's items. One found in flight runs and is dropped, as any
    wake-up of a tenant that no longer exists is. A scan of the system tenant's items; how many."""
    system = Tenant.system()
    items = redis_key("fq", "items", tenant=system)
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", _prefix(tenant_id)) + "*"
    found = [name.decode() if isinstance(name, bytes) else str(name)
             for name, _ in get_redis().hscan_iter(items, match=pattern, count=1000)]
    with tenant_context(system):
        return sum(fair_queue.remove(item_id) for item_id in found)


def run_wakeup(ctx: ItemContext, body: dict[str, Any]) -> None:
    """The item handler of wake-ups: the registered wake-up, in the owning tenant's context."""
    tenant = Tenant.objects.filter(pk=body["tenant_id"]).first()
    fire = _wakeups.get(str(body.get("wake")))
    if tenant is None or fire is None:
        log.warning("wakeup_dropped", target_tenant=body.get("tenant_id"), wake=body.get("wake"))
        return
    with tenant_context(tenant):
        fire(str(body["ref"]), dict(body.get("data") or {}))
