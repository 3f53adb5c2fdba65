"""A run's history: append-only events, written in the transaction of the change they record
(gathered into one ``INSERT`` per tick by ``journal``).

Other parts of the product follow a run's history through *listeners* (``register_listener``, in
``AppConfig.ready()``): ``record_event`` calls each one with the event, in the event's transaction,
so what a listener writes commits or rolls back with the change the event records (the webhooks'
deliveries of a run's outcome, ``workflows.triggers.webhooks``). ``record_event`` is on the hot path
of every run: a listener returns at once for the events it does not follow.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import structlog

from ductor_project.core.payloads import json_text
from workflows.engine.journal import add_event
from workflows.models import WorkflowRun

log = structlog.get_logger(__name__)

# ``listener(run, type_, node_id, data)``: ``data`` is the event's data, as ``record_event`` took it.
Listener = Callable[[WorkflowRun, str, str, dict[str, Any]], None]
_listeners: list[Listener] = []


def register_listener(listener: Listener) -> None:
    """Have ``record_event`` call ``listener`` after each event it appends (see the module docs).
    Registering it again changes nothing."""
    if listener not in _listeners:
        _listeners.append(listener)


def record_event(run: WorkflowRun, type_: str, node_id: str = "", **data: Any) -> None:
    """Append an event to the run's history (inside the caller's transaction, run row locked),
    then tell the listeners, in that transaction."""
    add_event(run, type_, node_id, data)
    log.info(f"run_{type_}", run_id=str(run.id), node_id=node_id or None, **_logged(data))
    for listener in _listeners:
        listener(run, type_, node_id, data)


def _logged(data: dict[str, Any]) -> dict[str, Any]:
    """What an event's log line says of its data: its attempt and its error's code, where it has
    them; never a message or a payload, which the run's history keeps."""
    return {name: data[name] for name, kind in (("attempt", int), ("error", str))
            if isinstance(data.get(name), kind) and not isinstance(data[name], bool)}


def jsonable(value: Any) -> Any:
    """``value`` as JSON would carry it (dates in ISO 8601 and other objects as text: ``json_text``)."""
    return json.loads(json.dumps(value, default=json_text))
