"""What Celery's tools show of Ductor's work: the task events a real worker sends, as Flower reads them.

A receiver in this process (``app.events.Receiver``, as Flower and ``celery events`` run it)
feeds every event the broker carries into Celery's own ``events.State``, which is what Flower
lists. One worker process and one dispatcher run the engine's steps. The worker sends task
events from its start (``-E``), or from when a broadcast turns them on, as Flower's does. With
a single worker slot, the dispatcher holds no credit while a message runs, so what a message
hands off is known: nothing (``DUCTOR_HANDOFF_MS=0``), or every item due after it (a long
handoff). The names, arguments and failures themselves are checked in this process too
(``Task.apply``: the worker's code path without a broker).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ductor_project.celery import WORK_QUEUE, app
from ductor_project.core.context import tenant_context
from ductor_project.core.keys import redis_key
from ductor_project.stack import Child, Stack
from scheduling import fair_queue as fq
from scheduling.dispatch import task_events
from scheduling.dispatch.finisher import finisher
from scheduling.dispatch.handlers import Failed, ItemContext, _handlers, register_handler
from scheduling.dispatch.worker import execute_item
from tenants.models import Tenant
from tests.conftest import celery_worker_child, service_env, service_stack
from tests.scheduling.helpers import redis_now_ms, sleep_until
from tests.waiting import wait_for
from workflows import services
from workflows.models import WorkflowRun

LEASE_MS = 30_000
CHECKOUT = {"nodes": [
    {"id": "reserve", "type": "action", "action": "noop"},
    {"id": "charge", "type": "action", "action": "fail", "depends_on": ["reserve"],
     "input": {"message": "card declined", "retryable": False}},
]}


# -- what Flower sees -------------------------------------------------------------------------


class Captured:
    """Every Celery event on the broker from ``start`` to ``stop``, fed into ``events.State``
    (Flower's model of the tasks) in a thread of this process."""

    def __init__(self) -> None:
        self.state = app.events.State()
        self.received: dict[str, int] = {}  # task-received events per task uuid
        self._pings = 0
        self._lock = threading.Lock()
        self._connection = app.connection_for_read()
        self._receiver = app.events.Receiver(self._connection, handlers={"*": self._on_event})
        self._thread = threading.Thread(target=self._receiver.capture, kwargs={"wakeup": False}, daemon=True)

    def _on_event(self, event: dict[str, Any]) -> None:
        with self._lock:
            if event["type"] == "test-ping":
                self._pings += 1
                return
            if event["type"] == "task-received":
                self.received[event["uuid"]] = self.received.get(event["uuid"], 0) + 1
            self.state.event(event)

    def start(self) -> None:
        """Capture from now on: returns once an event sent after the receiver subscribed came back
        (a broadcast reaches only the subscribers it finds)."""
        self._thread.start()
        with app.events.default_dispatcher(hostname="test-ping") as dispatcher:
            deadline = time.monotonic() + 30
            while not self._pings:
                assert time.monotonic() < deadline, "the event receiver never subscribed"
                dispatcher.send("test-ping")
                time.sleep(0.1)

    def stop(self) -> None:
        self._receiver.should_stop = True
        self._thread.join(timeout=30)
        self._connection.release()

    def tasks(self, name: str) -> list[Any]:
        """The tasks of that name Flower would list, each as ``events.State`` holds it."""
        with self._lock:
            return [task for task in self.state.tasks.values() if task.name == name]

    def task(self, name: str, state: str) -> Any:
        """The one task of that name, once it reached ``state`` (SUCCESS, FAILURE)."""
        def reached() -> Any:
            found = self.tasks(name)
            return found[0] if len(found) == 1 and found[0].state == state else None

        return wait_for(reached, what=f"a task {name} in {state}: {[(t.name, t.state) for t in self.tasks(name)]}")


@pytest.fixture
def captured() -> Iterator[Captured]:
    events = Captured()
    events.start()
    try:
        yield events
    finally:
        events.stop()


@pytest.fixture
def processes(transactional_db: None, redis_client: Any, monkeypatch: pytest.MonkeyPatch,
              ) -> Iterator[Callable[..., Child]]:
    """``start(handoff_ms=…, events=…)``: one worker process and one dispatcher, with that
    handoff, both stopped afterwards; the worker sends task events from its start (``"-E"``),
    or from when a broadcast turned them on (``"broadcast"``). Returns the worker."""
    stack = service_stack()

    def start(*, handoff_ms: int, events: str) -> Child:
        monkeypatch.setenv("DUCTOR_HANDOFF_MS", str(handoff_ms))  # service_env() passes it on
        if events == "-E":
            worker = celery_worker_child(stack, "--task-events", concurrency=1)
        else:
            worker = broadcast_enabled_worker(stack)
        stack.wait_ready(stack.dispatcher(env=service_env()), timeout_s=60)
        return worker

    try:
        yield start
    finally:
        stack.stop_all(grace_s=20)


def broadcast_enabled_worker(stack: Stack) -> Child:
    """A worker started without ``-E`` whose task events a broadcast then turned on, as Flower
    does in every worker it reaches (with its heartbeats on: a worker without heartbeats, gossip
    and ``-E`` has no event dispatcher to turn on)."""
    name = f"worker-{os.getpid()}-{time.monotonic_ns()}"
    hostname = f"{name}@localhost"
    worker = stack.worker(name, concurrency=1, hostname=hostname, env=service_env(), extra=["--pool", "prefork"])
    stack.wait_ready(worker, timeout_s=60)
    replies = app.control.enable_events(destination=[hostname], reply=True, timeout=10)
    assert replies == [{hostname: {"ok": "task events enabled"}}]
    return worker


def checkout_run(tenant: Tenant) -> WorkflowRun:
    """Start a run of the checkout workflow (``reserve``, then ``charge``, which fails) and wait
    for it to fail."""
    with tenant_context(tenant):
        services.workflow_put(name="checkout", spec=CHECKOUT)
        run, _ = services.run_start(workflow="checkout", input={})

    def ended() -> WorkflowRun | None:
        with tenant_context(tenant):
            found = WorkflowRun.objects.get(pk=run.pk)
        return found if found.is_terminal else None

    ended_run: WorkflowRun = wait_for(ended, what="the checkout run to end")
    assert ended_run.status == "failed"
    return ended_run


def unacked(redis: Any, task_id: str) -> bool:
    """Whether the broker still holds the message of ``task_id`` unacked, or queued again."""
    held = [*redis.hvals("unacked"), *redis.lrange(WORK_QUEUE, 0, -1)]
    return any(task_id.encode() in raw for raw in held)


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_steps_task_is_named_for_its_workflow_and_node_and_fails_once_when_its_action_failed(
    processes, captured, make_tenant, redis_client
):
    processes(handoff_ms=0, events="-E")  # every item by a message of its own
    tenant, _ = make_tenant("events-steps")

    run = checkout_run(tenant)

    reserve = captured.task("ductor.step:checkout/reserve", "SUCCESS")
    charge = captured.task("ductor.step:checkout/charge", "FAILURE")
    for task, node in ((reserve, "reserve"), (charge, "charge")):
        for shown in (f"'tenant_id': '{tenant.pk}'", f"'run_id': '{run.pk}'", f"'node_id': '{node}'", "'attempt': 1"):
            assert shown in task.kwargs
    assert charge.exception.startswith("ItemFailed(")
    assert "charge attempt 1: action_failed: card declined" in charge.exception
    assert charge.parent_id is None  # a message of its own, from the dispatcher
    # Failed once: acked, not delivered again, not retried.
    wait_for(lambda: not unacked(redis_client, charge.uuid), what="the failed message's ack")
    assert captured.received[charge.uuid] == 1
    assert captured.tasks("ductor.step:checkout/charge") == [charge]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_the_items_a_message_hands_off_show_as_tasks_of_their_own_with_it_as_their_parent(
    processes, captured, make_tenant
):
    # Reserve's message runs charge too: it is due when reserve ends, and no other slot takes it.
    worker = processes(handoff_ms=60_000, events="broadcast")
    tenant, _ = make_tenant("events-handoff")

    run = checkout_run(tenant)

    reserve = captured.task("ductor.step:checkout/reserve", "SUCCESS")
    charge = captured.task("ductor.step:checkout/charge", "FAILURE")
    # The message that ran charge: reserve's own (the run's first tick ran where it started), or
    # the tick's that ran both.
    message = captured.state.tasks[charge.parent_id]
    assert message.parent_id is None
    assert message.state == "SUCCESS"  # what it handed off failed, not its own item
    assert charge.root_id == message.uuid
    assert charge in message.children
    assert message.uuid in (reserve.uuid, reserve.parent_id)
    assert charge.worker.hostname == message.worker.hostname == f"{worker.name}@localhost"
    assert charge.received is not None
    assert charge.started is not None
    assert "charge attempt 1: action_failed: card declined" in charge.exception
    for task, node in ((reserve, "reserve"), (charge, "charge")):
        for shown in (f"'tenant_id': '{tenant.pk}'", f"'run_id': '{run.pk}'", f"'node_id': '{node}'"):
            assert shown in task.kwargs
    assert captured.received[charge.uuid] == 1


# -- in this process --------------------------------------------------------------------------


def _failed(ctx: ItemContext, body: dict[str, Any]) -> Failed:
    return Failed(f"{ctx.item_id} failed on purpose")


def _raises(ctx: ItemContext, body: dict[str, Any]) -> None:
    raise RuntimeError("a broken handler")


def _ok(ctx: ItemContext, body: dict[str, Any]) -> None:
    """Does nothing."""


KINDS = {"test.failed": _failed, "test.raises": _raises, "test.ok": _ok}


@pytest.fixture
def kinds() -> Iterator[None]:
    """The handlers of ``KINDS``, in this process, for the test."""
    for kind, handler in KINDS.items():
        register_handler(kind, handler)
    try:
        yield
    finally:
        for kind in KINDS:
            _handlers.pop(kind)


def enqueue(tenant: Tenant, item_id: str, kind: str) -> None:
    fq.enqueue(item_id, tier="standard", partition=item_id, payload={"kind": kind}, tenant=tenant)


def run_message(tenant: Tenant, item_id: str, kind: str, *, then: tuple[str, str] | None = None,
                again: bool = False) -> Any:
    """Enqueue an item of ``kind`` (``again``: it is there already) and run it as a worker runs its
    message, here (with ``then``, an ``(item id, kind)``, enqueued once it was dequeued); its Celery
    result."""
    if not again:
        enqueue(tenant, item_id, kind)
    item = fq.dequeue(lease_ms=LEASE_MS)
    assert item is not None
    assert item.item_id == item_id
    if then is not None:
        enqueue(tenant, *then)
    result = execute_item.apply(kwargs={
        "tenant_id": item.tenant_id, "item_id": item.item_id, "delivery": item.delivery, "kind": kind,
        "body": item.payload, "tier": item.tier, "partition": item.partition, "lease_until_ms": item.lease_until_ms})
    finisher.flush()
    return result


@pytest.mark.django_db(transaction=True)
def test_a_message_whose_item_failed_or_whose_handler_raised_fails_after_its_item_was_acked_or_put_back(
    make_tenant, redis_client, kinds, settings
):
    settings.DUCTOR_HANDOFF_MS = 0
    tenant, _ = make_tenant("events-failed")

    failed = run_message(tenant, "f1", "test.failed")
    assert failed.state == "FAILURE"
    assert isinstance(failed.result, task_events.ItemFailed)
    assert str(failed.result) == "f1 failed on purpose"
    assert (fq.stats(tenant).backlog, fq.stats(tenant).in_flight) == (0, 0)  # done: acked

    settings.DUCTOR_FAILED_ITEM_DELAY_MS, settings.DUCTOR_FAILED_ITEM_MAX_DELAY_MS = 100, 1_000
    for delay in (100, 200):  # put back for later, twice as long after its second failure in a row
        before = int(redis_now_ms(redis_client))  # in whole ms, as the scripts read it
        raised = run_message(tenant, "r1", "test.raises", again=delay > 100)
        assert raised.state == "FAILURE"
        assert str(raised.result) == "RuntimeError: a broken handler"
        assert fq.stats(tenant).backlog == 1
        with tenant_context(tenant):
            due = json.loads(redis_client.hget(redis_key("fq", "items"), "r1"))["due"]
        assert before + delay <= due <= redis_now_ms(redis_client) + delay
        sleep_until(redis_client, due)


@pytest.mark.django_db(transaction=True)
def test_a_handed_off_item_that_failed_leaves_its_message_a_success(make_tenant, redis_client, kinds, settings):
    settings.DUCTOR_HANDOFF_MS = 60_000  # the chain ends when nothing is due
    tenant, _ = make_tenant("events-chain")

    message = run_message(tenant, "first", "test.ok", then=("later", "test.failed"))

    assert message.state == "SUCCESS"
    assert (fq.stats(tenant).backlog, fq.stats(tenant).in_flight) == (0, 0)


def test_the_names_and_arguments_shown_say_what_an_item_runs_and_stay_short():
    step = {"kind": "step", "step_id": "s1", "run_id": "r1", "node_id": "charge", "attempt": 2, "workflow": "checkout",
            "routing": {"big": "x" * 10_000}}
    assert task_events.task_name(step) == "ductor.step:checkout/charge"
    assert task_events.task_name({"kind": "tick", "run_id": "r1"}) == "ductor.tick"
    wakeup = {"kind": "wakeup", "wake": "step_timeout", "ref": "s1"}
    assert task_events.task_name(wakeup) == "ductor.wakeup:step_timeout"
    assert task_events.task_name({}) == "ductor.item"
    assert len(task_events.task_name({"kind": "step", "workflow": "w" * 500})) == task_events.NAME_MAX

    shown = task_events.task_kwargs("t1", "step:s1", 3, step)
    assert shown == ("{'tenant_id': 't1', 'item_id': 'step:s1', 'delivery': 3, 'run_id': 'r1', 'node_id': 'charge', "
                     "'attempt': 2}")
    assert len(task_events.task_kwargs("t1", "i", 1, {"ref": "r" * 10_000})) < 200
