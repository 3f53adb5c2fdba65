"""The Ductor step a Celery task is running for, read from its message headers.

Ductor publishes a ``task`` node's message with the headers ``ductor_tenant_id``,
``ductor_run_id``, ``ductor_step_id``, ``ductor_node_id``, ``ductor_attempt``,
``ductor_idempotency_key`` and ``ductor_workflow``. Celery 5 shows custom
headers as attributes of ``task.request``, or inside ``task.request.headers``:
both are read. The message expires when the step times out (Celery's own
``expires``: a worker that takes it later discards it unrun); that moment is the
step's ``deadline``. A node with ``heartbeat_s`` adds ``ductor_heartbeat_s``, and
a retry whose earlier attempt reported progress adds ``ductor_heartbeat_details``
(``ductor_sdk.worker.heartbeat``). The step is held in a ``ContextVar`` that the signal handlers of
``ductor_sdk.worker.install`` set before each task and reset after it, so a
task never sees the previous task's step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from contextvars import ContextVar, Token
from datetime import datetime
from typing import Any

HEADER_PREFIX = "ductor_"
FIELDS = ("tenant_id", "run_id", "step_id", "node_id", "attempt", "idempotency_key", "workflow")


class NotInStep(LookupError):
    """``current_step()`` outside a task that Ductor started (or in a worker without ``install(app)``)."""


@dataclasses.dataclass(frozen=True)
class StepContext:
    """The step a task runs for. ``idempotency_key`` is the same for every delivery of one attempt
    and differs between attempts: use it to make the task's side effects happen once. ``deadline``:
    when the step times out (an aware datetime; None if the message did not say), after which its
    outcome is only kept in the run's history. ``heartbeat_s``: the most seconds between two
    heartbeats (``heartbeat``) before the step times out, None when the node asks for none.
    ``heartbeat_details``: the progress the last heartbeat of an earlier attempt of this node
    reported (None: none did), for the task to resume from."""

    tenant_id: str
    run_id: str
    step_id: str
    node_id: str
    attempt: int
    idempotency_key: str
    workflow: str
    deadline: datetime | None = None
    heartbeat_s: float | None = None
    heartbeat_details: Any = None


_current: ContextVar[StepContext | None] = ContextVar("ductor_step", default=None)


def _header(request: Any, name: str) -> Any:
    value = getattr(request, name, None)
    if value is None:
        nested = getattr(request, "headers", None)
        if isinstance(nested, Mapping):
            value = nested.get(name)
    return value


def from_request(request: Any) -> StepContext | None:
    """The step of a task request (``task.request``) that carries Ductor's headers, else None."""
    values = {name: _header(request, HEADER_PREFIX + name) for name in FIELDS}
    if values["run_id"] is None or values["step_id"] is None:
        return None
    attempt = values.pop("attempt")
    strings = {name: "" if value is None else str(value) for name, value in values.items()}
    return StepContext(attempt=int(attempt) if attempt is not None else 1, deadline=_deadline(request),
                       heartbeat_s=_seconds(_header(request, HEADER_PREFIX + "heartbeat_s")),
                       heartbeat_details=_header(request, HEADER_PREFIX + "heartbeat_details"), **strings)


def _seconds(value: Any) -> float | None:
    """A header's number of seconds, if it is a usable one (finite, > 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def _deadline(request: Any) -> datetime | None:
    """The message's expiry (Celery gives it as an ISO 8601 text, or a datetime), if it has a usable one."""
    value = getattr(request, "expires", None)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    return value if isinstance(value, datetime) and value.tzinfo is not None else None


def enter(step: StepContext | None) -> Token[StepContext | None]:
    """Make ``step`` the current one (None: no step); ``leave`` the token afterwards."""
    return _current.set(step)


def leave(token: Token[StepContext | None]) -> None:
    try:
        _current.reset(token)
    except ValueError:  # set in another context: the step must still not outlive its task
        _current.set(None)


def current_step_or_none() -> StepContext | None:
    """The step the running task works for, or None outside a Ductor step."""
    return _current.get()


def current_step() -> StepContext:
    """The step the running task works for; raises ``NotInStep`` (a ``LookupError``) outside one."""
    step = _current.get()
    if step is None:
        raise NotInStep(
            "current_step() was called outside a Ductor step: the running task (if any) was not started "
            "by Ductor, or ductor_sdk.worker.install(app) was not called in this worker"
        )
    return step
