"""The ``ductor.task_failed`` errback, registered in the team's app by ``install``.

Ductor attaches ``link_error=signature("ductor.task_failed", ...)`` to a task
node's message. A worker that has a task of that name whose function takes
``(request, exc, traceback, **kwargs)`` calls it synchronously, where the task
failed, with the exception itself. This one forwards the exception's type,
module and message, and whether it may be retried (``failures``), to Ductor
on the ``ductor.results`` queue, with the signature's own kwargs. It never raises: a failing errback must not hide the
task's failure. Without it, Celery publishes the errback as a plain task
holding only the task id, and Ductor reads the exception from the result backend.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ductor_sdk.worker.failures import is_retryable

if TYPE_CHECKING:
    from celery import Celery

ERRBACK_TASK = "ductor.task_failed"
TENANT_HEADER = "ductor_tenant_id"
RESULTS_QUEUE = "ductor.results"
MAX_MESSAGE_CHARS = 2000
# Straight into ``ductor.results`` through the default (anonymous) exchange, which routes by the
# queue's name on Redis and AMQP alike, as Ductor's own callbacks go. Not as ``queue``: the team's app
# would look that name up among its own queues, and one with ``task_create_missing_queues=False``
# refused the errback (or its routes naming an exchange sent it elsewhere). The exchange type, never
# declared, only keeps Celery from replacing the routing key with the name of the app's default queue.
RESULTS_EXCHANGE, RESULTS_EXCHANGE_TYPE = "", "anonymous"

log = logging.getLogger(__name__)
_registered: weakref.WeakSet[Celery] = weakref.WeakSet()  # the apps that have the errback


def error_of(exc: BaseException) -> dict[str, Any]:
    """What Ductor records of a task's exception; ``retryable`` False when it says so (``failures``).

    An exception Celery could not pickle (one whose arguments do not rebuild it, a lock among
    them...) reaches the errback as Celery's stand-in, ``UnpickleableExceptionWrapper``: it is
    recorded by the type, module and message of the exception the task raised, which a node's
    ``retry.non_retryable`` names. The stand-in has none of its attributes: it is retryable."""
    kind, module, text = type(exc).__name__, type(exc).__module__, lambda: str(exc)
    raised = getattr(exc, "exc_cls_name", None)
    if kind == "UnpickleableExceptionWrapper" and isinstance(raised, str):
        kind, module = raised, str(getattr(exc, "exc_module", None) or "")
        args = getattr(exc, "exc_args", None)
        if isinstance(args, tuple | list):  # as the exception's own ``str`` makes it of its arguments
            text = lambda: "" if not args else str(args[0]) if len(args) == 1 else str(tuple(args))  # noqa: E731
    error: dict[str, Any] = {"type": kind, "module": module, "message": _message(text)[:MAX_MESSAGE_CHARS]}
    try:
        retryable = is_retryable(exc)
    except Exception:  # an attribute that raises: it does not say the failure is for good
        retryable = True
    if not retryable:
        error["retryable"] = False
    return error


def _message(text: Callable[[], str]) -> str:
    """The exception's message, ``text()``; when making it raises (a ``__str__`` that fails), a
    message that says so, so that the failure still reaches Ductor at once, not at the step's timeout."""
    try:
        return text()
    except Exception as exc:
        return f"(its message could not be read: {type(exc).__name__} in its __str__)"


def forward(app: Celery, task_id: str, kwargs: dict[str, Any], error: dict[str, Any]) -> None:
    """Send Ductor's errback (its signature's ``kwargs``) for the task ``task_id`` that failed with
    ``error`` (``error_of``) to ``ductor.results``, through ``app``'s broker. Raises what the publish
    raises."""
    to_ductor(app, ERRBACK_TASK, args=[task_id], kwargs={**kwargs, "error": error})


def to_ductor(app: Celery, task: str, *, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Send Ductor's ``task`` to ``ductor.results`` through ``app``'s broker, its tenant from
    ``kwargs["tenant_id"]``. Raises what the publish raises."""
    tenant = kwargs.get("tenant_id")
    app.send_task(
        task, args=args, kwargs=kwargs,
        exchange=RESULTS_EXCHANGE, routing_key=RESULTS_QUEUE, exchange_type=RESULTS_EXCHANGE_TYPE,
        serializer="json",  # what Ductor's workers accept, whatever the team's app defaults to
        # Ductor's tasks carry their tenant as an argument and a header, which must agree.
        headers={TENANT_HEADER: str(tenant)} if tenant else None,
    )


def forwarder(app: Celery) -> Callable[..., None]:
    """The errback function of ``app``: forwards the failure to Ductor, never raises."""

    def task_failed(request: Any, exc: BaseException, traceback: Any, **kwargs: Any) -> None:
        try:
            forward(app, request.id, kwargs, error_of(exc))
        except Exception:
            log.exception("ductor_task_failed_not_forwarded", extra={"task_id": getattr(request, "id", None)})

    return task_failed


def register_errback(app: Celery) -> None:
    """Register ``ductor.task_failed`` in ``app``, once per app (a second call changes nothing)."""
    if app in _registered:
        return
    app.task(name=ERRBACK_TASK, shared=False)(forwarder(app))
    _registered.add(app)
