"""``install(app)``: what a team's Celery app needs to run Ductor's ``task`` nodes.

- ``task_prerun`` / ``task_postrun`` handlers set and reset the current step
  (``current_step()``) from each task's headers, and what ``heartbeat()``
  sends through; a step whose node asks for heartbeats sends its first as it
  starts. They are connected once per
  process, whatever the number of calls (``dispatch_uid``).
- The ``ductor.task_failed`` errback: see ``ductor_sdk.worker.errback``.
- A ``before_task_publish`` handler adds the task's run time (``work_ms``, from
  its ``task_prerun`` to the publish of its outcome) and the worker it ran on
  (``worker``, its Celery node name) to the outcome Ductor gets back
  (``ductor.task_succeeded``, ``ductor.task_failed``): the first is what its
  tenant is charged in Ductor's fair queue. Without it Ductor charges the
  task's time in flight (its wait in the broker too), bounded by what the
  tenant's tasks usually take.
- A ``worker_init`` handler warns, as the worker starts, if it does not accept
  JSON (it would refuse every step's message), or if its Redis keys take a
  ``global_keyprefix`` (it would never see them).
- The ``ductor_cancel`` remote control command, by which Ductor answers a
  heartbeat of a step that has ended: see ``ductor_sdk.worker.cancels``.
- A ``task_unknown`` handler: a message for a task this worker does not have
  (a catalog name its code does not register, a worker started without the
  module) is discarded by Celery, and its errbacks are not called. For a
  Ductor step, the handler sends Ductor's errback itself, so that the step
  fails at once with ``NotRegistered`` (retryable: another worker may have the
  task) rather than at the end of its timeout.

Celery is imported here only, when ``install`` is called.
"""

from __future__ import annotations

import logging
import math
import time
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

from ductor_sdk.worker import cancels, context, heartbeats
from ductor_sdk.worker.errback import ERRBACK_TASK, MAX_MESSAGE_CHARS, forward, register_errback

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)

# The outcomes Ductor's callbacks carry back: the task's run time is added to them.
OUTCOME_TASKS = frozenset({"ductor.task_succeeded", ERRBACK_TASK})

_Tokens = tuple[Token[context.StepContext | None], Token[float | None], Token[Any], Token[str | None]]
# What each running task's ``task_prerun`` set, innermost last, with its task id: its ``task_postrun``
# resets it in the context that set it. Each thread (or greenlet) of a pool has its own, so two
# deliveries of one task running at once in a threads pool never reset each other's.
_running: ContextVar[tuple[tuple[str, _Tokens], ...]] = ContextVar("ductor_running_tasks", default=())
# When the running task started (time.perf_counter()), while it runs for a Ductor step.
_started: ContextVar[float | None] = ContextVar("ductor_step_started", default=None)
# The worker it runs on (its Celery node name), while it runs for a Ductor step.
_worker: ContextVar[str | None] = ContextVar("ductor_step_worker", default=None)


def on_task_prerun(sender: Any = None, task_id: str | None = None, task: Any = None, **_: Any) -> None:
    """Before a task: its step (from its headers) becomes the current one; no step without headers.
    A step whose node asks for heartbeats sends its first (``heartbeat``)."""
    request = getattr(task or sender, "request", None)
    step = context.from_request(request) if request is not None else None
    token = context.enter(step)
    started = _started.set(time.perf_counter() if step else None)
    hostname = getattr(request, "hostname", None)
    worker = _worker.set(hostname if step and isinstance(hostname, str) else None)
    beats = heartbeats.begin(getattr(task or sender, "app", None), step, _worker.get())
    _running.set((*_running.get(), (task_id or "", (token, started, beats, worker))))


def on_task_postrun(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    """After a task: the step it ran with is no longer current."""
    running = _running.get()
    found = [at for at, (running_id, _) in enumerate(running) if running_id == (task_id or "")]
    if not found:
        context.enter(None)
        _started.set(None)
        _worker.set(None)
        heartbeats.begin(None, None)
        return
    at = found[-1]
    _running.set(running[:at] + running[at + 1:])
    step_token, started_token, beats_token, worker_token = running[at][1]
    heartbeats.end(beats_token)
    _worker.reset(worker_token)
    _started.reset(started_token)
    context.leave(step_token)


def _kwargs_of(body: Any) -> dict[str, Any] | None:
    """The keyword arguments of a message body (Celery's protocol 2: ``(args, kwargs, embed)``;
    protocol 1: a dict with ``kwargs``)."""
    if isinstance(body, (tuple, list)) and len(body) >= 2 and isinstance(body[1], dict):
        return body[1]
    kwargs = body.get("kwargs") if isinstance(body, dict) else None
    return kwargs if isinstance(kwargs, dict) else None


def on_before_task_publish(sender: Any = None, body: Any = None, **_: Any) -> None:
    """The outcome of the running Ductor step goes out (Celery's link, or the errback): it carries
    how long the task ran, in ms, and the worker it ran on. Nothing else is touched."""
    started = _started.get()
    if started is None or sender not in OUTCOME_TASKS:
        return
    kwargs = _kwargs_of(body)
    if kwargs is not None and "step_id" in kwargs:
        work_ms = (time.perf_counter() - started) * 1000
        if math.isfinite(work_ms) and work_ms >= 0:
            kwargs["work_ms"] = round(work_ms, 3)
        worker = _worker.get()
        if worker:
            kwargs["worker"] = worker


def _errbacks_of(body: Any) -> list[dict[str, Any]]:
    """Ductor's errbacks (``ductor.task_failed`` signatures) of a message body (protocol 2's embed)."""
    embed = body[2] if isinstance(body, (tuple, list)) and len(body) >= 3 and isinstance(body[2], dict) else {}
    found = embed.get("errbacks") or []
    if not isinstance(found, list):
        return []
    return [e for e in found if isinstance(e, dict) and e.get("task") == ERRBACK_TASK]


def on_task_unknown(sender: Any = None, message: Any = None, name: str | None = None, id: str | None = None,
                    **_: Any) -> None:
    """A message for a task this worker does not have (Celery discards it): if it is a Ductor step's,
    tell Ductor through its errback. Never raises."""
    try:
        errbacks = _errbacks_of(message.decode()) if message is not None else []
        if not errbacks:
            return
        app = sender.app
        worker = getattr(sender, "hostname", None) or "this worker"
        text = (f"task {name!r} is not registered on {worker}: Celery discarded the message (check the "
                f"task's name in Ductor's catalog and the modules the worker imports)")
        error = {"type": "NotRegistered", "module": "celery.exceptions", "message": text[:MAX_MESSAGE_CHARS]}
        for errback in errbacks:
            kwargs = errback.get("kwargs")
            forward(app, str(id), dict(kwargs) if isinstance(kwargs, dict) else {}, error)
    except Exception:
        log.exception("ductor_unknown_task_not_forwarded", extra={"task_id": id, "task": name})


def refuses_json(app: Celery) -> bool:
    """Whether ``app``'s workers refuse JSON messages (its ``accept_content`` names neither ``json``
    nor ``application/json``), which is what Ductor sends every step's message as."""
    accepted = {str(content).lower() for content in app.conf.accept_content or ()}
    return not accepted & {"json", "application/json"}


def key_prefix(app: Celery) -> str:
    """The prefix ``app`` puts before every Redis key of its broker (kombu's ``global_keyprefix``
    transport option), or "" for none."""
    options = app.conf.broker_transport_options or {}
    return str(options.get("global_keyprefix") or "") if isinstance(options, dict) else ""


def _startup_check(app: Celery) -> Any:
    """A ``worker_init`` handler for ``app``: it warns, once, as the worker starts, of a setting
    under which no step can finish, naming it. Read when the worker starts, once the app's
    configuration is complete, not when ``install`` is called.

    - A worker that refuses JSON discards every step's message (Celery logs
      ``ContentDisallowed`` for each), and each step fails at its timeout.
    - A worker whose Redis keys take a ``global_keyprefix`` reads its queues under that prefix,
      where Ductor does not send the steps' messages, and sends the outcomes under it too, where
      Ductor does not read them: each step fails at its timeout."""

    def check(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        if refuses_json(app):
            log.warning(
                "ductor_sdk: this worker does not accept JSON (accept_content=%r): it refuses every "
                "message Ductor sends for a step, and the step fails at its timeout. Add 'json' to "
                "accept_content (task_serializer may stay as it is)", list(app.conf.accept_content or ()))
        prefix = key_prefix(app)
        if prefix:
            log.warning(
                "ductor_sdk: this worker's broker keys take the prefix %r (broker_transport_options' "
                "global_keyprefix): it never sees the messages Ductor sends for steps, and Ductor never "
                "sees its outcomes, so each step fails at its timeout. Run the worker of Ductor's steps "
                "without global_keyprefix", prefix)

    return check


def install(app: Celery) -> None:
    """Prepare ``app`` (the team's Celery app) for Ductor's task nodes. Idempotent."""
    from celery.signals import before_task_publish, task_postrun, task_prerun, task_unknown, worker_init

    task_prerun.connect(on_task_prerun, weak=False, dispatch_uid="ductor_sdk.worker.prerun")
    task_postrun.connect(on_task_postrun, weak=False, dispatch_uid="ductor_sdk.worker.postrun")
    before_task_publish.connect(on_before_task_publish, weak=False, dispatch_uid="ductor_sdk.worker.outcome")
    task_unknown.connect(on_task_unknown, weak=False, dispatch_uid="ductor_sdk.worker.unknown")
    worker_init.connect(_startup_check(app), weak=False, dispatch_uid=f"ductor_sdk.worker.startup.{id(app)}")
    register_errback(app)
    cancels.register_command()
