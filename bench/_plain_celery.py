"""A plain Celery app with default settings: the baseline of ``bench/fairness.py``, and the stock
baseline of ``bench/workflows.py``; not product code.

One shared queue (``celery``), default prefetch (4 per process), early acks, no
result backend, and kombu's own Redis transport (not Ductor's, ``ductor_project/broker_transport.py``).
No Django, no tenants: the tenant slug is just an argument. ``plain_sleep`` appends
``"<slug>|<item>"`` to the list named by ``BENCH_STARTS_KEY`` when it starts, then sleeps,
exactly like the Ductor side's ``bench.sleep`` handler; ``plain_noop`` does nothing.

    REDIS_URL=... BENCH_STARTS_KEY=... celery -A bench._plain_celery worker
"""

from __future__ import annotations

import os
import time
from functools import cache
from typing import Any

import redis
from celery import Celery

app = Celery("plain", broker=os.environ["REDIS_URL"])
QUEUE = app.conf.task_default_queue


@cache
def _redis() -> Any:
    return redis.Redis.from_url(os.environ["REDIS_URL"])


@app.task(name="bench.plain_sleep")
def plain_sleep(slug: str, item: str, ms: int) -> None:
    _redis().rpush(os.environ["BENCH_STARTS_KEY"], f"{slug}|{item}")
    time.sleep(ms / 1000)


@app.task(name="bench.plain_noop", ignore_result=True)
def plain_noop() -> None:
    pass
