"""The team's tasks. They read Ductor's headers straight off the Celery request."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

app = Celery("teamapp", broker=os.environ.get("TEAM_BROKER_URL"), backend=os.environ.get("TEAM_RESULT_BACKEND"))
app.conf.update(task_default_queue="team", worker_prefetch_multiplier=1, task_serializer="json",
                accept_content=["json"], worker_hijack_root_logger=False)

HEADERS = ("ductor_tenant_id", "ductor_run_id", "ductor_step_id", "ductor_node_id", "ductor_attempt",
           "ductor_idempotency_key", "ductor_workflow")


def header(request: Any, name: str) -> Any:
    value = getattr(request, name, None)
    if value is None and isinstance(getattr(request, "headers", None), dict):
        value = request.headers.get(name)
    return value


@app.task(name="team.add")
def add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b}


@app.task(name="team.whoami", bind=True)
def whoami(self: Any, **ignored: Any) -> dict[str, Any]:
    """The Ductor headers this task was sent with."""
    return {name: header(self.request, name) for name in HEADERS}


@app.task(name="team.fail")
def fail(message: str) -> None:
    raise ValueError(message)


@app.task(name="team.slow_first", bind=True)
def slow_first(self: Any, seconds: float) -> dict[str, Any]:
    """Sleeps ``seconds`` on its first attempt only (a worker to kill, a timeout to pass)."""
    attempt = int(header(self.request, "ductor_attempt") or 1)
    if attempt == 1:
        time.sleep(seconds)
    return {"attempt": attempt}


@app.task(name="team.total")
def total(values: list[int]) -> int:
    """A task that takes its input as one argument."""
    return sum(values)
