"""What Celery's tools (Flower, ``celery events``, the worker's log) show of fair-queue items.

Every item runs in a ``ductor.execute_item`` task, which alone would show rows all alike, every
one a success. So:

- **Names.** The dispatcher publishes each message under a *shadow* name that says what its
  item runs (``task_name``): ``ductor.<kind>``, then ``:<workflow>/<node>`` for a step or
  ``:<wake>`` for a coordinator wake-up; and with short arguments (``task_kwargs``, its
  ``kwargsrepr``): its tenant, item and delivery, and the run, node and attempt its payload
  names. Both are read from the payload (no round trip), and the names stay few: kinds,
  workflows and node ids, never a run's id.
- **Failures.** When a message's own item failed, its handler having raised (the item was put
  back) or returned ``Failed`` (a step whose action failed: the engine recorded it, the item is
  acked), the task raises ``ItemFailed`` at its very end, once its ack went to the finisher.
  Celery reports the task failed (``task-failed``), logs one line (an expected exception, in
  the task's ``throws``), retries nothing and acks the message (``acks_late`` acks a failure:
  ``task_acks_on_failure_or_timeout``, on by default).
- **Handoff.** An item that a task runs by handoff has no message of its own: the task sends
  task events for it (received, started, then succeeded or failed) under a uuid of its own, with
  the name and arguments a message of it would have had, and the message's task as its parent
  and root. They go in one publish at the end of the task, and only while the worker sends task
  events (``-E``, or turned on by Flower or ``celery control enable_events``): ``ItemRequest``
  tells the task whether it does.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import structlog
from celery.worker.request import Request

from ductor_project.celery import app
from scheduling.dispatch.handlers import Failed

log = structlog.get_logger(__name__)

# The field of a task's request in which ``ItemRequest`` says whether the worker sends task events.
TASK_EVENTS = "ductor_task_events"
# Payload fields shown in a task's arguments when the payload has them (the engine's and the coordinator's).
SHOWN_FIELDS = ("run_id", "node_id", "attempt", "wake", "ref")
# Payload fields that name what an item runs, after its kind.
NAMING_FIELDS = ("workflow", "node_id", "wake")
NAME_MAX = 200
VALUE_MAX = 100
ERROR_MAX = 500


def task_name(body: dict[str, Any]) -> str:
    """The name shown for an item with payload ``body``, e.g. ``ductor.step:checkout/charge``,
    ``ductor.wakeup:step_timeout`` or ``ductor.tick``. At most ``NAME_MAX`` characters."""
    name = f"ductor.{body.get('kind') or 'item'}"
    detail = "/".join(str(body[key]) for key in NAMING_FIELDS if body.get(key))
    return (f"{name}:{detail}" if detail else name)[:NAME_MAX]


def task_kwargs(tenant_id: str, item_id: str, delivery: int, body: dict[str, Any]) -> str:
    """The arguments shown for an item (a ``kwargsrepr``): its tenant, id and delivery, and the
    ``SHOWN_FIELDS`` its payload has. Never the whole payload: its repr was most of a publish's CPU."""
    shown: dict[str, Any] = {"tenant_id": tenant_id, "item_id": item_id, "delivery": delivery}
    for key in SHOWN_FIELDS:
        value = body.get(key)
        if value is not None:
            shown[key] = value if isinstance(value, int) else str(value)[:VALUE_MAX]
    return repr(shown)


class ItemFailed(Exception):
    """Raised by ``execute_item`` at its very end when its own item failed, so that Celery reports
    the task failed. Everything was done by then (the item acked or put back): nothing retries it."""


class ItemRequest(Request):
    """The worker's request for an ``execute_item`` message: it tells the task (the request field
    ``TASK_EVENTS``) whether this worker sends task events right now, which the pool process that
    runs the task cannot know otherwise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        eventer = self.eventer
        self.request_dict[TASK_EVENTS] = bool(
            eventer is not None and eventer.enabled and self.task.send_events
            and (not eventer.groups or "task" in eventer.groups)
        )


@dataclass
class Shown:
    """One delivery while its handler runs: the handler's report that its work failed, if it did."""

    failed: Failed | None = None


class Report:
    """What one ``execute_item`` task tells Celery's tools: whether its own item failed, and the
    task events of the items it ran by handoff. Deliveries report to it while it is ``active``."""

    def __init__(self, request: Any, *, item_id: str, delivery: int) -> None:
        self.task_id = str(request.id or "")
        self.hostname = str(request.hostname or "")
        self.events_on = bool(getattr(request, TASK_EVENTS, False))
        self._own = (item_id, delivery)
        self.failure: str | None = None  # why the message's own item failed
        self._events: list[tuple[str, dict[str, Any]]] = []

    @contextmanager
    def active(self) -> Iterator[Report]:
        """The deliveries that run inside the block report to this one."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    def ran(self, tenant_id: str, item_id: str, delivery: int, body: dict[str, Any], *, started: float,
            failed: Failed | None) -> None:
        """A delivery's handler ended (``started``: ``time.time()`` when it began)."""
        if (item_id, delivery) == self._own:
            self.failure = failed.error if failed is not None else None
        elif self.events_on:
            kwargs = task_kwargs(tenant_id, item_id, delivery, body)
            self._events += _handed_off(self.task_id, task_name(body), kwargs, started=started, failed=failed)

    def publish(self) -> None:
        """Send the task events of the handed-off items, in one publish. Never raises: they only
        inform (a broker away loses them)."""
        events, self._events = self._events, []
        if not events:
            return
        try:
            with app.producer_or_acquire() as producer:
                dispatcher = app.events.Dispatcher(producer.connection, hostname=self.hostname,
                                                   channel=producer.channel, buffer_group=["task"],
                                                   buffer_limit=len(events) + 1)
                for kind, fields in events:
                    dispatcher.send(kind, **fields)
                dispatcher.flush(errors=False)
                dispatcher.close()
        except Exception:
            log.warning("task_events_not_sent", events=len(events), exc_info=True)

    def raise_if_failed(self) -> None:
        """Raise ``ItemFailed`` if the message's own item failed."""
        if self.failure is not None:
            raise ItemFailed(self.failure)


_current: ContextVar[Report | None] = ContextVar("ductor_task_report", default=None)


@contextmanager
def running(tenant_id: str, item_id: str, delivery: int, body: dict[str, Any]) -> Iterator[Shown]:
    """Around a delivery's handler: what it reports (``Shown.failed``, or the exception it raises,
    which goes on) goes to the ``Report`` of the task it runs in, if any."""
    report, shown = _current.get(), Shown()
    if report is None:
        yield shown
        return
    started = time.time()
    try:
        yield shown
    except Exception as exc:
        shown.failed = Failed(f"{type(exc).__name__}: {exc}"[:ERROR_MAX])
        raise
    finally:
        report.ran(tenant_id, item_id, delivery, body, started=started, failed=shown.failed)


def _handed_off(parent_id: str, name: str, kwargs: str, *, started: float,
                failed: Failed | None) -> list[tuple[str, dict[str, Any]]]:
    """The task events of one handed-off delivery, as a message of it would have had them."""
    task_id, ended = str(uuid.uuid4()), time.time()
    events: list[tuple[str, dict[str, Any]]] = [
        ("task-received", {"uuid": task_id, "name": name, "args": "()", "kwargs": kwargs, "root_id": parent_id,
                           "parent_id": parent_id, "retries": 0, "eta": None, "expires": None,
                           "timestamp": started}),
        ("task-started", {"uuid": task_id, "timestamp": started}),
    ]
    if failed is None:
        events.append(("task-succeeded", {"uuid": task_id, "result": repr("ok"), "runtime": ended - started,
                                          "timestamp": ended}))
    else:
        events.append(("task-failed", {"uuid": task_id, "exception": repr(ItemFailed(failed.error)),
                                       "traceback": "", "timestamp": ended}))
    return events
