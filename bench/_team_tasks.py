"""The team's own Celery app of ``bench/tasks.py``: not Ductor, no Django; not product code.

Its worker consumes ``team`` on Ductor's broker (``TEAM_BROKER_URL``) and keeps
results in ``TEAM_RESULT_BACKEND``. ``team.noop`` counts itself in
``BENCH_COUNT_KEY``; ``team.record`` appends its tenant's slug to
``BENCH_STARTS_KEY`` as it starts, then sleeps.

    TEAM_BROKER_URL=... celery -A bench._team_tasks worker -Q team
"""

from __future__ import annotations

import os
import time
from functools import cache
from typing import Any

import redis
from celery import Celery

app = Celery("team-bench", broker=os.environ.get("TEAM_BROKER_URL"), backend=os.environ.get("TEAM_RESULT_BACKEND"))
app.conf.update(task_default_queue="team", worker_prefetch_multiplier=1, task_serializer="json",
                accept_content=["json"], worker_hijack_root_logger=False)


@cache
def _redis() -> Any:
    return redis.Redis.from_url(os.environ["TEAM_BROKER_URL"])


@app.task(name="team.noop")
def noop(**ignored: Any) -> dict[str, Any]:
    _redis().incr(os.environ["BENCH_COUNT_KEY"])
    return {}


@app.task(name="team.record")
def record(slug: str, ms: int) -> dict[str, Any]:
    _redis().rpush(os.environ["BENCH_STARTS_KEY"], slug)
    time.sleep(ms / 1000)
    return {}
