"""``heartbeat(details)``: a long task tells Ductor it is alive, and how far it got.

A task node with ``heartbeat_s`` times out when, once its task started, no
heartbeat came within ``heartbeat_s`` of the last: a worker that died with the
task (or a task stuck) is noticed then, not at the end of the node's
``timeout_s``. ``install``'s hook sends the first heartbeat as such a task
starts; the task calls ``heartbeat()`` as it makes progress:

    @step(app, name="media.tasks.transcode")
    def transcode(video: str) -> dict[str, Any]:
        done = (current_step().heartbeat_details or {}).get("chunks", 0)  # an earlier attempt's progress
        for chunk in range(done, CHUNKS):
            encode(video, chunk)
            heartbeat({"chunks": chunk + 1})
        return {"chunks": CHUNKS}

Each heartbeat is a small message to ``ductor.results`` through the task's own
app. They are sent at most once per third of ``heartbeat_s`` (once per
``INTERVAL_S`` for a node without it, whose heartbeats only report progress);
a call in between keeps its details for the next one sent. The details (JSON)
the node's next attempt is given are the last ones Ductor received.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

from ductor_sdk.worker import context
from ductor_sdk.worker.errback import to_ductor

if TYPE_CHECKING:
    from celery import Celery

HEARTBEAT_TASK = "ductor.task_heartbeat"
# The most often a task without ``heartbeat_s`` reports its progress, in seconds.
INTERVAL_S = 10.0
# No details wait to be sent.
_NOTHING = object()

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Beats:
    """The heartbeats of the running step's task: its app, when the last was sent, what waits to go."""

    app: Celery
    step: context.StepContext
    sent_at: float | None = None
    pending: Any = _NOTHING

    @property
    def interval_s(self) -> float:
        return self.step.heartbeat_s / 3 if self.step.heartbeat_s else INTERVAL_S


_beats: ContextVar[_Beats | None] = ContextVar("ductor_step_heartbeats", default=None)


def begin(app: Celery | None, step: context.StepContext | None) -> Token[_Beats | None]:
    """The running task's step (None: no step) sends its heartbeats through ``app``; a step whose node
    asks for heartbeats sends its first one now. ``end`` the token after the task."""
    token = _beats.set(_Beats(app, step) if app is not None and step is not None else None)
    if step is not None and step.heartbeat_s:
        heartbeat()
    return token


def end(token: Token[_Beats | None]) -> None:
    try:
        _beats.reset(token)
    except ValueError:  # set in another context: the step's heartbeats must still end with its task
        _beats.set(None)


def heartbeat(details: Any = None) -> bool:
    """Tell Ductor the running step's task is alive, with ``details`` (JSON: its progress, for the
    node's next attempt to resume from; None sends none, and the last ones are kept). True when a
    heartbeat was sent now; False when it waits for the next (sent at most once per third of the
    node's ``heartbeat_s``) or its publish failed (logged, never raised: the task goes on).
    Raises ``NotInStep`` outside a Ductor step, and ``TypeError`` for details that are not JSON."""
    beats = _beats.get()
    if beats is None:
        context.current_step()  # raises NotInStep outside a step
        raise context.NotInStep("heartbeat() was called in a step whose task has no Celery app")
    if details is not None:
        try:
            json.dumps(details, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"heartbeat details must be JSON: {exc}") from None
        beats.pending = details
    now = time.monotonic()
    if beats.sent_at is not None and now - beats.sent_at < beats.interval_s:
        return False
    kwargs: dict[str, Any] = {"step_id": beats.step.step_id, "tenant_id": beats.step.tenant_id}
    if beats.pending is not _NOTHING:
        kwargs["details"] = beats.pending
    try:
        to_ductor(beats.app, HEARTBEAT_TASK, args=[], kwargs=kwargs)
    except Exception:
        log.exception("ductor_heartbeat_not_sent", extra={"step_id": beats.step.step_id})
        return False
    beats.sent_at, beats.pending = now, _NOTHING
    return True
