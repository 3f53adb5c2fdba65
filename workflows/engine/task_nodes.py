"""Task nodes: the team's own Celery tasks as steps, published once the fair queue admitted them.

A task node's attempt is a fair-queue item of kind ``task``, routed like an
action (its pool balances the tenant's celery connections, and the pool's and
connection's concurrency bound its messages in flight). The dispatcher hands
the items it dequeued to ``publish`` (and so does the Ductor worker that keeps
an outcome, for the next task step it takes: below), which, per tenant:

1. marks their steps running (one ``UPDATE``), skipping those that moved on
   (cancelled meanwhile: their items are acked), and fails for good those the
   catalog no longer lets their tenant call, or whose input its entry's schema
   now refuses (the catalog changed while they waited for their slots);
2. sends each (a first delivery, or a delivery again within the step's
   timeout: its publish was not confirmed) with ``send_task`` to the queue of
   the connection its admission chose (else the catalog's default queue), on
   that connection's broker, with the rendered input as keyword arguments (or
   one argument), the step's identity in the headers (``HEADERS``) and
   Celery's own ``link`` / ``link_error`` callbacks to
   ``ductor.task_succeeded`` / ``ductor.task_failed`` on ``ductor.results``;
3. extends each item's lease to the end of the step's timeout, so the slots it
   holds stay held while the team's worker runs it: the timeout is the lease.
   The message expires then too (Celery's ``expires``): a worker that takes it
   later (it was down, or its queue was long) discards it unrun, as the step
   has timed out and its retry, if any, has its own message.
   An item delivered again once its step's timeout has passed (the reaper
   returned it: no result came) times the step out (``timers.step_timeout``).

The callbacks record the outcome and tick the run in one transaction
(``steps.record_outcome``), then ack the item, which frees its slots and
charges its tenant the task's run time (reported by ``ductor_sdk``'s worker
hook; without it, its time in flight, bounded by the fair queue). The ack's
round trip also takes the next item the fair order gives if it is a task
node's, which this worker then publishes, as a dispatcher would have, and no
dispatcher is woken for it (``handoff.settle_published``). A task
that raised fails the step as retryable, with its exception's type and
message: given by ``ductor_sdk``'s worker hook, else read from the result
backend (the hook also says when the exception is ``NonRetryable``: the step
then fails for good). A worker that died with the task is noticed by the timeout, which
fails the step as retryable and acks the item (a cancel acks it at once). A
result that arrives after a timeout or a cancel is recorded in the history and
changes nothing else.
Delivery is at least once: an item whose publish was not confirmed (its
publisher died, the broker was away) is published again after its lease.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from functools import cache
from typing import Any

import structlog
from celery import Celery
from django.conf import settings
from django.utils import timezone

from ductor_project.celery import RESULTS_QUEUE
from ductor_project.celery import app as ductor_app
from ductor_project.core import scripts, tracing
from ductor_project.core.context import current_tenant
from ductor_project.core.errors import StepErrorCode
from ductor_project.core.payloads import storable
from scheduling import circuit, fair_queue
from scheduling.connection_config import DEFAULT_BROKER, queue_name_error
from scheduling.dispatch.handoff import settle_published
from scheduling.fair_queue import Dequeued, Finished
from scheduling.routing_table import MemberInfo, routing_table
from tenants.tasking import UnknownTenant, acting_for, restore_tenant
from workflows import catalog
from workflows.engine.attempts import Outcome, payload_refusal
from workflows.engine.brokers import NoQueue, broker_app
from workflows.engine.events import jsonable
from workflows.engine.items import TASK
from workflows.engine.nodes import task_refusal
from workflows.engine.statements import start_tasks
from workflows.engine.steps import admission_trace, record_outcome
from workflows.engine.timers import step_timeout
from workflows.models import StepRun

SStatus = StepRun.Status

log = structlog.get_logger(__name__)

# The headers of a task node's message; the team's task reads them (``ductor_sdk.worker``).
HEADERS = ("ductor_tenant_id", "ductor_run_id", "ductor_step_id", "ductor_node_id", "ductor_attempt",
           "ductor_idempotency_key", "ductor_workflow")


# Only when the step has them: the most seconds between two heartbeats (the node's ``heartbeat_s``),
# and the progress the last heartbeat of its node's earlier attempt reported (``heartbeats``).
HEARTBEAT_S_HEADER, HEARTBEAT_DETAILS_HEADER = "ductor_heartbeat_s", "ductor_heartbeat_details"


# What Celery's events and logs show of a success callback's argument, the task's result (the step's
# output, which the run's history keeps).
RESULT_REPR = "(<the task's result>,)"


# Where the team's worker sends the callbacks: straight into ``ductor.results`` through the default
# (anonymous) exchange, which routes by the queue's name on Redis and AMQP alike. Not as ``queue``:
# the team's app would look that name up among its own queues, and an app with
# ``task_create_missing_queues=False`` (or routes naming an exchange) refused or misrouted every
# callback, so that each step timed out. The exchange type, never declared, only keeps Celery from
# replacing the routing key with the name of the app's default queue (it does so for an empty
# exchange of type ``direct``).
RESULTS_DESTINATION: dict[str, str] = {"exchange": "", "routing_key": RESULTS_QUEUE, "exchange_type": "anonymous"}


def publish(items: list[Dequeued]) -> None:
    """The publisher of ``task`` items (a dispatcher's, or a worker's after an outcome): each
    tenant's, in its context."""
    by_tenant: dict[str, list[Dequeued]] = {}
    for item in items:
        by_tenant.setdefault(item.tenant_id, []).append(item)
    with ExitStack() as held:
        producers = Producers(held)
        for tenant_id, group in by_tenant.items():
            try:
                tenant = restore_tenant(tenant_id)
            except UnknownTenant:
                log.error("task_items_of_unknown_tenant", tenant_id=tenant_id, items=len(group))
                continue
            with acting_for(tenant, tenant_id=tenant_id):
                _publish_tenant(group, producers)


class Producers:
    """One producer per broker for a batch's publishes, taken from its app's pool at its first and
    given back when the batch ends (``held``), not taken and given back for each message."""

    def __init__(self, held: ExitStack) -> None:
        self._held = held
        self._open: dict[int, Any] = {}

    def of(self, app: Celery) -> Any:
        if id(app) not in self._open:
            self._open[id(app)] = self._held.enter_context(app.producer_or_acquire())
        return self._open[id(app)]


def _publish_tenant(group: list[Dequeued], producers: Producers) -> None:
    routes = [(item, *_queue_of(item)) for item in group]
    steps = start_tasks([str(item.payload["step_id"]) for item in group],
                        {str(item.payload["step_id"]): _admission(item, member, queue)
                         for item, member, queue in routes})
    batch = scripts.Batch()
    tenant = current_tenant()
    now = timezone.now()
    for item, member, queue in routes:
        step = steps.get(str(item.payload["step_id"]))
        if step is None:  # cancelled or finished since it was queued
            fair_queue.queue_ack(batch, item.item_id, delivery=item.delivery, tenant=tenant)
            continue
        timeout_s = float(item.payload.get("timeout_s") or settings.DUCTOR_TASK_TIMEOUT_S)
        left_ms = int((timeout_s - (now - (step.started_at or now)).total_seconds()) * 1000)
        if left_ms <= 0:  # its lease, the timeout, ended with no result
            step_timeout(str(step.id), {"message": (
                f"no outcome from task '{item.payload.get('name')}' on queue '{queue or '(none)'}' within its "
                f"timeout of {timeout_s:g} s: the task is still running, its worker died with it, or no worker "
                f"consumes that queue")})
            continue
        # The catalog may have changed while the attempt waited for its slots.
        refusal = task_refusal({"task": str(item.payload.get("name"))}, step.input) or _queue_refusal(member, queue)
        if refusal is not None:
            record_outcome(step.id, step.run_id, refusal)
            fair_queue.queue_ack(batch, item.item_id, delivery=item.delivery, tenant=tenant)
            continue
        try:
            _send(item, step, member, queue, producers, expires_s=left_ms / 1000)
        except NoQueue as exc:
            _fail_unsent(step, item, str(exc))
            continue
        except Exception:
            # Not confirmed: the item stays leased and is published again after its lease.
            log.exception("task_publish_failed", step_id=str(step.id), run_id=str(step.run_id),
                          node_id=step.node_id, attempt=step.attempt, task=item.payload.get("name"))
            continue
        fair_queue.queue_extend_lease(batch, item.item_id, lease_ms=left_ms, delivery=item.delivery, tenant=tenant)
        log.info("task_published", item_id=item.item_id, step_id=str(step.id), run_id=str(step.run_id),
                 node_id=step.node_id, attempt=step.attempt, task=item.payload.get("name"), queue=queue,
                 delivery=item.delivery, waited_ms=item.waited_ms)
    if len(batch):
        batch.execute()


def _queue_of(item: Dequeued) -> tuple[MemberInfo | None, str]:
    """The celery connection its admission chose (None: the catalog queue's own scope admitted it),
    and the queue the task goes to ("" for none)."""
    member = routing_table().member(item.connection_id) if item.connection_id else None
    return member, (member.queue if member else "") or str(item.payload.get("queue") or "")


def _queue_refusal(member: MemberInfo | None, queue: str) -> Outcome | None:
    """Why the attempt may not go to ``queue`` through ``member``, the celery connection its routing
    chose (``_queue_of``), or None: a name that is no queue (a key the broker keeps for something
    else, named by a connection stored before such names were refused: ``queue_name_error``), or a
    queue of Ductor's own broker that the catalog keeps for other tenants' tasks
    (``catalog.kept_for_others``). The step then fails for good, and nothing is sent."""
    problem = queue_name_error(queue) if member is not None else None
    if member is not None and problem is not None:
        return Outcome.failed(StepErrorCode.ROUTING_DENIED, f"connection '{member.name}' sends to queue '{queue}': "
                              f"it {problem}", connection=member.name, queue=queue)
    if member is None or (member.broker or DEFAULT_BROKER) != DEFAULT_BROKER or not catalog.kept_for_others(queue):
        return None
    return Outcome.failed(StepErrorCode.ROUTING_DENIED,
                          f"connection '{member.name}' sends to queue '{queue}', which the task catalog keeps for "
                          f"tasks this tenant may not call", connection=member.name, queue=queue)


def _admission(item: Dequeued, member: MemberInfo | None, queue: str) -> dict[str, Any]:
    """What the step's trace keeps of the item's admission (``_queue_of``), as its outcome's callback
    says it: the celery connection its message goes through (none when the catalog queue's own scope
    admitted it), and why that one; and the queue it goes to (``queue``: the connection's, else the
    catalog's, which ``task.queue`` names whatever the routing), with its broker (``broker``) when
    that is not Ductor's own."""
    trace = admission_trace(member.connection_id if member else "", item.admitted)
    if not queue:
        return trace
    broker = member.broker if member and member.broker else DEFAULT_BROKER
    return {**trace, "queue": queue, **({"broker": broker} if broker != DEFAULT_BROKER else {})}


def _send(item: Dequeued, step: StepRun, member: MemberInfo | None, queue: str, producers: Producers, *,
          expires_s: float) -> None:
    """Send the step's task to ``queue`` through ``member`` (``_queue_of``), to expire with its
    lease, ``expires_s`` from now."""
    call = item.payload
    if not queue:
        raise NoQueue(f"task '{call.get('name')}' has no queue: its catalog entry names none and its "
                      f"routing chose no celery connection")
    app = broker_app(member.broker if member and member.broker else DEFAULT_BROKER)
    tenant_id = str(current_tenant().pk)
    ids = {"tenant_id": tenant_id, "step_id": str(step.id), "run_id": str(step.run_id), "item_id": item.item_id,
           "delivery": item.delivery, "connection_id": member.connection_id if member else "",
           "admitted": item.admitted, "deadline": round(time.time() + expires_s, 3)}
    value = step.input
    args, kwargs = ([], dict(value or {})) if call.get("arguments", "kwargs") == "kwargs" else ([value], {})
    # In the step's trace: Celery's instrumentation puts it in the message's headers, and the callbacks
    # carry it too, so that the outcome goes on in it even from a team's worker that does not trace.
    with tracing.item_span("ductor.task.publish", call, item_id=item.item_id, run_id=str(step.run_id),
                           node_id=step.node_id, attempt=step.attempt, queue=queue):
        # The callbacks store no result (``ignore_result``), so the team's worker's publish of one
        # subscribes to no result channel; nothing awaits it: the outcome comes back in them.
        traced: dict[str, Any] = {"headers": tracing.headers()} if tracing.enabled else {}
        # Their arguments' text for Celery's events and logs, given here: else the team's worker
        # makes it with Celery's ``saferepr``, in Python, for every outcome (a quarter of what the
        # callback's publish costs it), and copies the task's result into it.
        # On Redis, neither publish declares its queue (see ``_undeclared``).
        undeclared = _undeclared(app)
        # JSON, whatever the team's app sends its own messages as: the team's worker publishes the
        # callbacks with its app's ``task_serializer`` unless they name one, and Ductor's results
        # workers take JSON alone, so a team on pickle or msgpack lost every success (its step
        # timed out and ran again).
        callback = {**RESULTS_DESTINATION, "ignore_result": True, "kwargsrepr": repr(ids), "serializer": "json",
                    **undeclared, **traced}
        headers = dict(zip(HEADERS, (tenant_id, str(step.run_id), str(step.id), step.node_id, step.attempt,
                                     f"{step.run_id}:{step.node_id}:{step.attempt}", str(call.get("workflow", ""))),
                           strict=True))
        if call.get("heartbeat_s"):
            headers[HEARTBEAT_S_HEADER] = call["heartbeat_s"]
        if step.heartbeat_details is not None:
            headers[HEARTBEAT_DETAILS_HEADER] = step.heartbeat_details
        app.send_task(
            str(call["name"]), args=args, kwargs=kwargs, queue=queue, task_id=str(step.id),
            producer=producers.of(app), expires=expires_s, headers=headers, **undeclared,
            link=ductor_app.signature("ductor.task_succeeded", kwargs=ids, argsrepr=RESULT_REPR, **callback),
            link_error=ductor_app.signature("ductor.task_failed", kwargs=ids, **callback),
        )


@cache
def _undeclared(app: Celery) -> dict[str, Any]:
    """The publish options that leave a message's queue undeclared, on a Redis broker: there a queue
    needs no declaring (a message sent to a queue by name goes straight into its list), and Celery
    otherwise looks its declaration up again for every message it publishes: a fifth of what
    sending a callback cost the team's worker (a profile of its pool process, 2026-12-06). On any
    other broker (AMQP), nothing: there a
    queue must exist before a message sent to it is kept, and Celery declares it as usual."""
    redis = app.connection_for_write().transport.driver_type == "redis"
    return {"declare": []} if redis else {}


def queue_depth(queue: str, broker: str = DEFAULT_BROKER) -> int | None:
    """How many messages wait in the team's ``queue`` on ``broker`` (none taken by a worker yet), or
    None when the broker cannot tell now. One request to that broker."""
    try:
        with broker_app(broker or DEFAULT_BROKER).connection_for_read() as connection:
            channel: Any = connection.default_channel
            if hasattr(channel, "_size"):  # kombu's Redis channel: an empty queue has no key to declare
                return int(channel._size(queue))
            return int(channel.queue_declare(queue=queue, passive=True).message_count)
    except Exception:  # a broker away, a queue AMQP does not know: nothing to tell
        log.info("task_queue_depth_unknown", queue=queue, broker=broker)
        return None


def _fail_unsent(step: StepRun, item: Dequeued, message: str) -> None:
    record_outcome(step.id, step.run_id, Outcome.failed(StepErrorCode.PUBLISH_FAILED, message))
    fair_queue.ack(item.item_id, delivery=item.delivery)


# -- the outcome, from Celery's callbacks (``workflows.tasks``) ---------------------------------


@dataclass(frozen=True)
class Sent:
    """Which message a callback answers: its step, its item's delivery, its admission."""

    step_id: str
    item_id: str
    delivery: int
    connection_id: str = ""
    admitted: str = ""
    run_id: str = ""  # "" in a message published before it was sent: then read from the step
    work_ms: float | None = None  # how long the task ran, if the team's worker said (ductor_sdk)
    deadline: float | None = None  # the end of its timeout, its lease (Unix time); None: not known
    worker: str = ""  # the Celery worker (its node name) that ran it, if the team's worker said (ductor_sdk)


def _finite(value: Any) -> float | None:
    """A callback's number, if it is one JSON carries as a number (not a bool) and finite; else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def reported_work(value: Any) -> float | None:
    """The run time a team's worker reported with an outcome (``ductor_sdk``'s hook adds it), if it
    is a usable one: a finite number of ms >= 0. Anything else is ignored, never refused: the
    outcome counts; its tenant is then charged the task's time in flight (see ``fair_queue.ack``)."""
    found = _finite(value)
    return found if found is not None and found >= 0 else None


# The longest worker name kept: Celery's node names are a host name with a prefix.
WORKER_MAX = 255


def worker_name(value: Any) -> str:
    """The Celery worker a team's worker named with an outcome or a heartbeat (``ductor_sdk``'s hook adds
    its node name), if it is a usable one: a string, cut to ``WORKER_MAX``, each character no column
    keeps (a NUL) replaced (``storable``); else "". The name is the team's to choose."""
    return storable(value[:WORKER_MAX]) if isinstance(value, str) else ""


def deadline_of(value: Any) -> float | None:
    """The end of an attempt's timeout its callback carries (Unix time), if it is a usable one: a
    finite number. Anything else, or none (a message sent before callbacks carried it), is None."""
    return _finite(value)


def task_succeeded(result: Any, sent: Sent) -> None:
    """The team's task returned ``result``: the step's output (held to the plan's payload limit)."""
    _keep(sent, payload_refusal(result, "output") or Outcome.succeeded(jsonable(result)))


def task_failed(task_id: str, sent: Sent, error: Mapping[str, Any] | None = None) -> None:
    """The team's task raised: the step fails with the exception's type and message (``error``, from
    ``ductor_sdk``'s worker hook, else the result backend's record of it), as retryable unless the
    hook says the exception is not (``ductor_sdk.worker.NonRetryable``)."""
    found = dict(error) if isinstance(error, Mapping) else exception_of(task_id)
    kind, message = str(found.get("type") or "Exception"), str(found.get("message") or "")[:2000]
    outcome = Outcome.failed(StepErrorCode.TASK_FAILED, f"{kind}: {message}" if message else kind,
                             retryable=found.get("retryable") is not False,
                             exception={"type": kind, "module": str(found.get("module") or "")})
    _keep(sent, outcome)


def exception_of(task_id: str) -> dict[str, str]:
    """The exception a failed task left in Ductor's result backend (shared with the team's app),
    or an unknown one."""
    try:
        meta = ductor_app.backend.get_task_meta(task_id)
    except Exception:
        log.warning("task_exception_unreadable", celery_task_id=task_id)
        meta = {}
    exc = meta.get("result") if meta.get("status") == "FAILURE" else None
    if isinstance(exc, BaseException):
        return {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)}
    return {"type": "TaskFailed", "message": "the task raised; its exception is not known here (install "
                                             "ductor_sdk's worker hook, or share Ductor's result backend)"}


def _keep(sent: Sent, outcome: Outcome) -> None:
    run_id = sent.run_id or StepRun.objects.filter(pk=sent.step_id).values_list("run_id", flat=True).first()
    # The next steps its commit makes ready are enqueued in the ack's round trip.
    late_s = time.time() - sent.deadline if sent.deadline is not None else 0.0
    with fair_queue.holding_enqueues():
        if run_id is not None:
            if late_s > 0:
                # Past its timeout: the attempt times out, whether or not the reaper has returned its
                # item yet (it looks every second, and not at all while no coordinator runs), and the
                # outcome is discarded, as it would have been had the timeout been seen first. The
                # timeout is what its connection's breaker counts (``timers.step_timeout``).
                step_timeout(sent.step_id, {"message": f"the task ran past its timeout: its outcome came "
                                                       f"{late_s:.1f} s after it"})
            record_outcome(sent.step_id, run_id, outcome, admission=(sent.connection_id, sent.admitted),
                           worker=sent.worker)
        if late_s <= 0:
            _breaker_outcome(sent, outcome)
        # Its slots free once the outcome is kept (a late result's ack changes nothing); its tenant is
        # charged the run time its worker reported, else its time in flight (bounded). The same round
        # trip takes the next task step the fair order gives, which this worker publishes.
        settle_published(Finished(current_tenant(), sent.item_id, sent.delivery, sent.work_ms), kind=TASK)


def _breaker_outcome(sent: Sent, outcome: Outcome) -> None:
    """Feed the breaker of the celery connection the attempt was sent through, as ``http.request``
    feeds its connection's: a task that raised a retryable exception (its worker group failing: a
    dependency down, a task it does not register) counts as a failure, and any other outcome (a
    result, or a failure the task says is for good) as a success, since the workers answered. An
    outcome that came after the attempt's timeout is not counted: the timeout was (a failure:
    ``timers.step_timeout``). An attempt sent to its catalog queue, through no connection, feeds no
    breaker."""
    if not sent.connection_id:
        return
    error = outcome.error or {}
    if outcome.status == SStatus.FAILED and error.get("code") == StepErrorCode.TASK_FAILED and error.get("retryable"):
        circuit.record_failure(sent.connection_id)
    else:
        circuit.record_success(sent.connection_id)
