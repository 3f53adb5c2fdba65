"""Item handlers and a wake-up kind for the broker tests.

Real workers import this module with ``celery ... worker --include
tests.scheduling.broker_handlers``. Each handler appends one JSON record per
event to a global Redis list (``RECORDS``), in the order the events happen, and
counts its runs under a key built inside the item's tenant context (so the
count lands under the tenant the worker was in, not the one the message named).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ductor_project.core.context import current_tenant
from ductor_project.core.keys import global_redis_key, redis_key
from ductor_project.core.redis import get_redis
from scheduling import fair_queue
from scheduling.coordinator.wakeups import register_wakeup
from scheduling.dispatch.handlers import ItemContext, register_handler

RECORDS = global_redis_key("test", "broker", "records")
WAKE_KIND = "test.wake"


def redis_ms() -> float:
    seconds, micros = get_redis().time()
    return float(seconds) * 1000 + micros / 1000


def _record(event: str, ctx: ItemContext | None = None, **extra: Any) -> None:
    tenant = current_tenant()
    row = {
        "event": event,
        "context_tenant": str(tenant.pk),
        "pid": os.getpid(),
        "at_ms": redis_ms(),
        **extra,
    }
    if ctx is not None:
        row.update(item=ctx.item_id, tenant=ctx.tenant_id, delivery=ctx.delivery, partition=ctx.partition)
    get_redis().rpush(RECORDS, json.dumps(row))


def _ran(ctx: ItemContext, body: dict[str, Any]) -> None:
    _record("start", ctx, tag=body.get("tag"))
    # No tenant argument: the key is the tenant in context's.
    get_redis().incr(redis_key("test", "ran"))


def _sleep(ctx: ItemContext, body: dict[str, Any]) -> None:
    """Sleep ``ms``; with ``once``, only the first delivery of the item sleeps."""
    _ran(ctx, body)
    first = get_redis().set(redis_key("test", "slept", ctx.item_id), 1, nx=True)
    if first or not body.get("once"):
        time.sleep(int(body["ms"]) / 1000)
    _record("end", ctx)


def _wake(ref: str, data: dict[str, Any]) -> None:
    """A wake-up: note the tenant in context, then enqueue the real work under it."""
    _record("wake", ref=ref)
    fair_queue.enqueue(f"after-{ref}", tier="standard", partition=ref, payload={"kind": "test.ran"})


def _noop(ctx: ItemContext, body: dict[str, Any]) -> None:
    """Does nothing."""


register_handler("test.noop", _noop)
register_handler("test.ran", _ran)
register_handler("test.sleep", _sleep)
register_wakeup(WAKE_KIND, _wake)


def records(redis: Any) -> list[dict[str, Any]]:
    """Every record written so far, in the order they happened."""
    return [json.loads(raw) for raw in redis.lrange(RECORDS, 0, -1)]
