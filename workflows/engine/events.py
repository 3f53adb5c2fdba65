"""A run's history: append-only events, written in the transaction of the change they record."""

from __future__ import annotations

import json
from typing import Any

import structlog
from django.db.models import Subquery
from django.db.models.functions import Coalesce

from workflows.models import RunEvent, WorkflowRun

log = structlog.get_logger(__name__)


def record_event(run: WorkflowRun, type_: str, node_id: str = "", **data: Any) -> None:
    """Append an event to the run's history (inside the caller's transaction, run row locked)."""
    # The next seq is computed inside the INSERT: one round trip (the run row lock orders writers).
    last = RunEvent.objects.filter(run=run).order_by("-seq").values("seq")[:1]
    RunEvent.objects.create(run=run, seq=Coalesce(Subquery(last), 0) + 1, type=type_, node_id=node_id,
                            data=jsonable(data))
    log.info(f"run_{type_}", run_id=str(run.id), node_id=node_id or None)


def jsonable(value: Any) -> Any:
    """``value`` as JSON would carry it (dates and other objects as text)."""
    return json.loads(json.dumps(value, default=str))
