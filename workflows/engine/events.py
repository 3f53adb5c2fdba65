"""A run's history: append-only events, written in the transaction of the change they record
(gathered into one ``INSERT`` per tick by ``journal``)."""

from __future__ import annotations

import json
from typing import Any

import structlog

from workflows.engine.journal import add_event
from workflows.models import WorkflowRun

log = structlog.get_logger(__name__)


def record_event(run: WorkflowRun, type_: str, node_id: str = "", **data: Any) -> None:
    """Append an event to the run's history (inside the caller's transaction, run row locked)."""
    add_event(run, type_, node_id, data)
    log.info(f"run_{type_}", run_id=str(run.id), node_id=node_id or None)


def jsonable(value: Any) -> Any:
    """``value`` as JSON would carry it (dates and other objects as text)."""
    return json.loads(json.dumps(value, default=str))
