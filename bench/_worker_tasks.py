"""What the benchmarks' Ductor workers import (``--include bench._worker_tasks``); not product code.

- Item kind ``bench.sleep``: appends ``"<tenant slug>|<item id>"`` to the global bench list
  ``STARTS`` when it starts (the slug read from the tenant context the worker entered),
  then runs the built-in ``sleep_ms`` handler. RPUSH is atomic, so the list is the order in
  which tasks actually started.
- Task ``bench.noop``: a plain Celery task (no fair queue, no tenant) for the same-worker
  no-op baseline of ``bench/dispatch.py``.
"""

from __future__ import annotations

from typing import Any

from ductor_project.celery import app
from ductor_project.core.context import current_tenant
from ductor_project.core.keys import global_redis_key
from ductor_project.core.redis import get_redis
from scheduling import broker

STARTS = global_redis_key("bench", "starts")


def _sleep_recorded(ctx: broker.ItemContext, body: dict[str, Any]) -> None:
    get_redis().rpush(STARTS, f"{current_tenant().slug}|{ctx.item_id}")
    broker.sleep_ms(ctx, body)


broker.register_handler("bench.sleep", _sleep_recorded)


@app.task(name="bench.noop", ignore_result=True)
def noop() -> None:
    """Plain Celery no-op. Results ignored, like ``execute_item``'s: the stricter baseline."""
