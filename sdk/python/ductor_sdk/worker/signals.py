"""``install(app)``: what a team's Celery app needs to run Ductor's ``task`` nodes.

- ``task_prerun`` / ``task_postrun`` handlers set and reset the current step
  (``current_step()``) from each task's headers. They are connected once per
  process, whatever the number of calls (``dispatch_uid``).
- The ``ductor.task_failed`` errback: see ``ductor_sdk.worker.errback``.

Celery is imported here only, when ``install`` is called.
"""

from __future__ import annotations

from contextvars import Token
from typing import TYPE_CHECKING, Any

from ductor_sdk.worker import context
from ductor_sdk.worker.errback import register_errback

if TYPE_CHECKING:
    from celery import Celery

_tokens: dict[str, list[Token[context.StepContext | None]]] = {}


def on_task_prerun(sender: Any = None, task_id: str | None = None, task: Any = None, **_: Any) -> None:
    """Before a task: its step (from its headers) becomes the current one; no step without headers."""
    request = getattr(task or sender, "request", None)
    token = context.enter(context.from_request(request) if request is not None else None)
    _tokens.setdefault(task_id or "", []).append(token)


def on_task_postrun(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    """After a task: the step it ran with is no longer current."""
    stack = _tokens.get(task_id or "")
    if not stack:
        context.enter(None)
        return
    context.leave(stack.pop())
    if not stack:
        del _tokens[task_id or ""]


def install(app: Celery) -> None:
    """Prepare ``app`` (the team's Celery app) for Ductor's task nodes. Idempotent."""
    from celery.signals import task_postrun, task_prerun

    task_prerun.connect(on_task_prerun, weak=False, dispatch_uid="ductor_sdk.worker.prerun")
    task_postrun.connect(on_task_postrun, weak=False, dispatch_uid="ductor_sdk.worker.postrun")
    register_errback(app)
