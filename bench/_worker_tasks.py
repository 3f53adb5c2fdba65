"""What the benchmarks' Ductor workers import (``--include bench._worker_tasks``); not product code.

- Item kind ``bench.noop``: does nothing (the end-to-end dispatch figure).
- Item kind ``bench.sleep``: appends ``"<tenant slug>|<item id>"`` to the global bench list
  ``STARTS`` when it starts (the slug read from the tenant context the worker entered),
  then sleeps ``body["ms"]``. RPUSH is atomic, so the list is the order in which tasks
  actually started.
- Item kind ``bench.work``: sleeps ``body["ms"]`` and records ``"<tenant slug>|<start>|<end>"``
  (Unix seconds) for the global bench list ``WORK``: the worker time each item took, for shares of
  it. The records go in batches (every ``WORK_FLUSH`` items or ``WORK_FLUSH_S``), so that the
  handler's time is the item's sleep, as the fair queue measures it, not a Redis round trip more.
- Task ``bench.noop``: a plain Celery task (no fair queue, no tenant) for the same-worker
  no-op baseline of ``bench/dispatch.py``.
"""

from __future__ import annotations

import time
from typing import Any

from ductor_project.celery import app
from ductor_project.core.context import current_tenant
from ductor_project.core.keys import global_redis_key
from ductor_project.core.redis import get_redis
from scheduling.dispatch.handlers import ItemContext, register_handler

STARTS = global_redis_key("bench", "starts")
WORK = global_redis_key("bench", "work")


def _noop(ctx: ItemContext, body: dict[str, Any]) -> None:
    """Nothing: what a fair-queue item costs by itself."""


def _sleep_recorded(ctx: ItemContext, body: dict[str, Any]) -> None:
    get_redis().rpush(STARTS, f"{current_tenant().slug}|{ctx.item_id}")
    time.sleep(min(max(int(body.get("ms", 0)), 0), 60_000) / 1000)


WORK_FLUSH, WORK_FLUSH_S = 50, 0.2
_work: list[str] = []
_flushed = [time.monotonic()]


def _work_recorded(ctx: ItemContext, body: dict[str, Any]) -> None:
    started = time.time()
    time.sleep(min(max(int(body.get("ms", 0)), 0), 60_000) / 1000)
    _work.append(f"{current_tenant().slug}|{started:.6f}|{time.time():.6f}")
    if len(_work) >= WORK_FLUSH or time.monotonic() - _flushed[0] > WORK_FLUSH_S:
        get_redis().rpush(WORK, *_work)
        _work.clear()
        _flushed[0] = time.monotonic()


# Loaded with ``--include``, as a plugin of the benchmark's workers: registering is its job.
register_handler("bench.noop", _noop)
register_handler("bench.sleep", _sleep_recorded)
register_handler("bench.work", _work_recorded)


@app.task(name="bench.noop", ignore_result=True)
def noop() -> None:
    """Plain Celery no-op. Results ignored, like ``execute_item``'s: the stricter baseline."""
