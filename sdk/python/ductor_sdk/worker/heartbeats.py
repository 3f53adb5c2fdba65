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
``INTERVAL_S`` for a node without it, whose heartbeats only report progress;
never more often than ``MIN_INTERVAL_S``);
a call in between keeps its details for the next one sent (from any thread
of the task that runs in its context: ``contextvars.copy_context().run``). The details (JSON)
the node's next attempt is given are the last ones Ductor received. Each names
the worker that sends it: a heartbeat of a step that has ended is answered to
that worker, and the task's next ``heartbeat()`` raises ``StepCancelled``
(``ductor_sdk.worker.cancels``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

from ductor_sdk.worker import cancels, context
from ductor_sdk.worker.errback import to_ductor

if TYPE_CHECKING:
    from celery import Celery

HEARTBEAT_TASK = "ductor.task_heartbeat"
# The most often a task without ``heartbeat_s`` reports its progress, in seconds.
INTERVAL_S = 10.0
# The most often any task sends one: a third of the shortest ``heartbeat_s`` a spec may give (1 s).
# Each is a message on ``ductor.results``, which every tenant's task outcomes share: a step whose
# header names a shorter one (a spec saved before that floor) never sends more often than this.
MIN_INTERVAL_S = 1.0 / 3
# No details wait to be sent.
_NOTHING = object()

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Beats:
    """The heartbeats of the running step's task: its app, the worker it runs on (its Celery node
    name, where Ductor answers), when the last was sent, what waits to go."""

    app: Celery
    step: context.StepContext
    worker: str | None = None
    sent_at: float | None = None
    pending: Any = _NOTHING
    # Guards sent_at and pending: the task's threads that run in its context share these heartbeats.
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def interval_s(self) -> float:
        return max(self.step.heartbeat_s / 3, MIN_INTERVAL_S) if self.step.heartbeat_s else INTERVAL_S


_beats: ContextVar[_Beats | None] = ContextVar("ductor_step_heartbeats", default=None)


def begin(app: Celery | None, step: context.StepContext | None, worker: str | None = None) -> Token[_Beats | None]:
    """The running task's step (None: no step) sends its heartbeats through ``app``, from the worker
    named ``worker``; a step whose node asks for heartbeats sends its first one now. ``end`` the
    token after the task."""
    beats = _Beats(app, step, worker or None) if app is not None and step is not None else None
    token = _beats.set(beats)
    if beats is not None and beats.step.heartbeat_s:
        _send(beats, time.monotonic())
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
    Raises ``StepCancelled`` once Ductor has told this worker that the step ended (nothing is sent
    then), ``NotInStep`` outside a Ductor step, and ``TypeError`` for details that are not JSON."""
    beats = _running()
    if cancels.requested(beats.step.step_id):
        raise cancels.StepCancelled(f"step {beats.step.step_id} ({beats.step.workflow}/{beats.step.node_id}, "
                                    f"attempt {beats.step.attempt}) has ended: its result would be discarded")
    if details is not None:
        try:
            json.dumps(details, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"heartbeat details must be JSON: {exc}") from None
        with beats.lock:
            beats.pending = details
    return _send(beats, time.monotonic())


def cancel_requested() -> bool:
    """Whether Ductor has told this worker that the running step has ended (its next ``heartbeat()``
    would raise ``StepCancelled``). Sends nothing. Raises ``NotInStep`` outside a Ductor step."""
    return cancels.requested(_running().step.step_id)


def _running() -> _Beats:
    """The running step's heartbeats; ``NotInStep`` outside one."""
    beats = _beats.get()
    if beats is None:
        context.current_step()  # raises NotInStep outside a step
        raise context.NotInStep("heartbeat() was called in a step whose task has no Celery app")
    return beats


def _send(beats: _Beats, now: float) -> bool:
    """Send a heartbeat of ``beats``' step at ``now`` (``time.monotonic()``), with the details that
    wait, unless one was sent within the interval (False then: they wait for the next). The
    interval and the details are taken under the lock, before the publish, which runs outside it:
    a call from another thread of the task meanwhile keeps its details for the next one, and sends
    none of its own. False when the publish failed: the interval is given back, and the details,
    unless newer ones wait."""
    with beats.lock:
        before, taken = beats.sent_at, beats.pending
        if before is not None and now - before < beats.interval_s:
            return False
        beats.sent_at, beats.pending = now, _NOTHING
    kwargs: dict[str, Any] = {"step_id": beats.step.step_id, "tenant_id": beats.step.tenant_id}
    if beats.worker:
        kwargs["worker"] = beats.worker
    if taken is not _NOTHING:
        kwargs["details"] = taken
    try:
        to_ductor(beats.app, HEARTBEAT_TASK, args=[], kwargs=kwargs)
    except Exception:
        log.exception("ductor_heartbeat_not_sent", extra={"step_id": beats.step.step_id})
        with beats.lock:
            if beats.sent_at == now:
                beats.sent_at = before
            if beats.pending is _NOTHING:
                beats.pending = taken
        return False
    return True
