"""The worker helpers on a real Celery app (not eager): the step context from the headers, the
``ductor.task_failed`` errback forwarding to the real Redis broker, and ``@step``'s JSON check."""

from __future__ import annotations

import ast
import base64
import contextvars
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from multiprocessing import get_context
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.signals import task_postrun, task_prerun, task_unknown
from celery.utils.nodenames import gethostname
from django.conf import settings
from ductor_sdk.worker import (
    ERRBACK_TASK,
    RESULTS_QUEUE,
    NonRetryable,
    NotInStep,
    NotJSONSafe,
    StepCancelled,
    StepContext,
    cancel_requested,
    cancels,
    current_step,
    current_step_or_none,
    heartbeat,
    install,
    step,
)
from ductor_sdk.worker.context import from_request
from ductor_sdk.worker.errback import error_of
from ductor_sdk.worker.signals import on_task_unknown

HEADERS = {
    "ductor_tenant_id": "t-1", "ductor_run_id": "r-1", "ductor_step_id": "s-1", "ductor_node_id": "charge",
    "ductor_attempt": 2, "ductor_idempotency_key": "s-1:2", "ductor_workflow": "billing",
}
EXPECTED = StepContext(tenant_id="t-1", run_id="r-1", step_id="s-1", node_id="charge", attempt=2,
                       idempotency_key="s-1:2", workflow="billing")


@pytest.fixture
def app() -> Iterator[Celery]:
    """The team's own Celery app, on this run's Redis as its broker."""
    team = Celery("team", set_as_current=False)
    team.conf.update(task_always_eager=False, broker_url=settings.REDIS_URL, broker_connection_retry=False)
    install(team)
    install(team)
    yield team
    team.close()


class FakeTask:
    """What the signal handlers read of a task: its request."""

    def __init__(self, request: object) -> None:
        self.request = request


def send(signal: Any, task: Any, task_id: str) -> None:
    """Send a task signal as Celery's tracer does; a handler that raised is a failure here."""
    responses = signal.send(sender=task, task_id=task_id, task=task, args=(), kwargs={}, retval=None, state="SUCCESS")
    assert [response for _, response in responses if isinstance(response, Exception)] == []


def test_current_step_outside_a_ductor_step_raises_a_lookup_error() -> None:
    assert current_step_or_none() is None
    with pytest.raises(NotInStep, match="outside a Ductor step") as outside:
        current_step()
    assert isinstance(outside.value, LookupError)


def test_the_signal_handlers_set_the_step_from_the_headers_and_reset_it_after_the_task(app: Celery) -> None:
    seen: list[StepContext | None] = []

    @step(app, name="team.charge")
    def charge() -> dict[str, str]:
        seen.append(current_step_or_none())
        return {"key": current_step().idempotency_key}

    for request in ({"id": "task-1", **HEADERS}, {"id": "task-2", "headers": HEADERS}):
        charge.push_request(**request)
        send(task_prerun, charge, request["id"])
        assert charge.run() == {"key": "s-1:2"}
        send(task_postrun, charge, request["id"])
        charge.pop_request()
        assert current_step_or_none() is None

    assert seen == [EXPECTED, EXPECTED]


def test_a_task_without_ductor_headers_never_sees_the_previous_task_s_step(app: Celery) -> None:
    ductor_task, plain_task = FakeTask(SimpleNamespace(**HEADERS)), FakeTask(None)

    send(task_prerun, ductor_task, "task-1")  # its postrun never comes (the worker lost it)
    assert current_step() == EXPECTED
    send(task_prerun, plain_task, "task-2")
    assert current_step_or_none() is None
    send(task_postrun, plain_task, "task-2")
    send(task_postrun, ductor_task, "task-1")
    assert current_step_or_none() is None


def test_two_deliveries_of_one_task_in_a_threads_pool_each_keep_their_own_step(app: Celery) -> None:
    """A message delivered again while its first delivery still runs (its visibility timeout passed)
    runs in another thread of a threads pool, under the same task id. Whichever ends first, each
    thread's task sees its own step until it ends, and none of its handlers raises."""
    first = FakeTask(SimpleNamespace(**HEADERS))
    second = FakeTask(SimpleNamespace(**{**HEADERS, "ductor_attempt": 3, "ductor_idempotency_key": "s-1:3"}))
    both_started, first_ended = threading.Barrier(2), threading.Event()
    seen: dict[str, list[Any]] = {"first": [], "second": []}
    failures: list[BaseException] = []

    def deliver(name: str, task: FakeTask) -> None:
        try:
            send(task_prerun, task, "task-1")
            both_started.wait(timeout=10)
            if name == "second":
                first_ended.wait(timeout=10)  # the first delivery ends while this one still runs
            seen[name].append(current_step().attempt)
            send(task_postrun, task, "task-1")
            seen[name].append(current_step_or_none())
        except BaseException as exc:  # the thread's failure is the test's
            failures.append(exc)
        finally:
            if name == "first":
                first_ended.set()

    threads = [threading.Thread(target=deliver, args=("first", first)),
               threading.Thread(target=deliver, args=("second", second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert failures == []
    assert seen == {"first": [2, None], "second": [3, None]}


def test_celery_s_own_tracer_gives_the_task_its_step_from_nested_headers(app: Celery) -> None:
    @step(app, name="team.whoami")
    def whoami() -> dict[str, Any]:
        return {"node": current_step().node_id, "attempt": current_step().attempt}

    assert whoami.apply(headers=HEADERS).get() == {"node": "charge", "attempt": 2}
    assert whoami.apply().failed()  # not a Ductor step: current_step() raised
    assert current_step_or_none() is None


def test_a_team_s_test_runs_its_task_as_a_step_the_way_its_doc_shows() -> None:
    """docs/your-code.md (testing your tasks): ``apply`` with the headers as text, on an app whose
    broker is ``memory://``, gives the task its step (the attempt a number), no deadline, and a
    heartbeat that goes nowhere."""
    doc = (Path(__file__).parents[2] / "docs" / "your-code.md").read_text()
    headers = ast.literal_eval(re.search(r"^STEP = (\{.*?\})$", doc, re.DOTALL | re.MULTILINE).group(1))
    team = Celery("team-tests", broker="memory://", set_as_current=False)
    install(team)

    @step(team, name="team.doc_charge")
    def charge(order: str, amount: int) -> dict[str, Any]:
        heartbeat({"done": 1})
        ctx = current_step()
        return {"order": order, "attempt": ctx.attempt, "key": ctx.idempotency_key, "deadline": ctx.deadline}

    try:
        done = charge.apply(kwargs={"order": "A-1", "amount": 1200}, headers=headers).get()
    finally:
        team.close()
    assert done == {"order": "A-1", "attempt": 2, "key": "r-1:charge:2", "deadline": None}
    assert current_step_or_none() is None


def test_a_step_s_deadline_is_its_message_s_expiry(app: Celery) -> None:
    @step(app, name="team.deadline")
    def deadline() -> str | None:
        found = current_step().deadline
        return found.isoformat() if found else None

    seen = []
    for expires in ("2030-01-02T03:04:05+00:00", None):  # as a worker's request has the message's headers
        deadline.push_request(id="task-1", **HEADERS, expires=expires)
        send(task_prerun, deadline, "task-1")
        seen.append(deadline.run())
        send(task_postrun, deadline, "task-1")
        deadline.pop_request()
    assert seen == ["2030-01-02T03:04:05+00:00", None]
    for unusable in ("soon", "2030-01-02T03:04:05"):  # not a time; a time without its zone
        request = SimpleNamespace(**HEADERS, expires=unusable)
        assert from_request(request) == EXPECTED


def test_install_connects_each_handler_once_and_registers_the_errback(app: Celery) -> None:
    uids = [key[0] for key, _ in task_prerun.receivers + task_postrun.receivers]

    assert uids.count("ductor_sdk.worker.prerun") == 1
    assert uids.count("ductor_sdk.worker.postrun") == 1
    assert [key[0] for key, _ in task_unknown.receivers].count("ductor_sdk.worker.unknown") == 1
    assert ERRBACK_TASK in app.tasks


def _messages(redis: Any, queue: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in redis.lrange(queue, 0, -1)]


def test_a_failed_task_s_errback_runs_where_it_failed_and_forwards_the_exception(app: Celery, redis_client) -> None:
    @step(app, name="team.decline")
    def decline(order: str) -> None:
        raise ValueError(f"card declined for {order}")

    errback = app.signature(ERRBACK_TASK, kwargs={"step_id": "s-1"})
    result = decline.apply(args=["o-7"], task_id="task-7", link_error=errback)

    messages = _messages(redis_client, RESULTS_QUEUE)
    assert result.failed()
    assert len(messages) == 1
    args, kwargs, _ = json.loads(base64.b64decode(messages[0]["body"]))
    assert messages[0]["headers"]["task"] == ERRBACK_TASK
    assert args == ["task-7"]
    assert kwargs == {"step_id": "s-1",
                      "error": {"type": "ValueError", "module": "builtins", "message": "card declined for o-7"}}
    assert _messages(redis_client, "celery") == []  # not published as a plain task with the task id only


class CardDeclined(NonRetryable):
    """A team's own failure that trying again cannot mend (module level: Celery pickles it)."""


class OwnError(Exception):
    ductor_retryable = False


def test_a_task_that_says_its_failure_is_not_retryable_is_forwarded_so(app: Celery, redis_client) -> None:
    @step(app, name="team.charge")
    def charge(kind: str) -> None:
        raise {"declined": CardDeclined, "own": OwnError, "plain": ValueError}[kind](kind)

    for kind in ("declined", "own", "plain"):
        charge.apply(args=[kind], link_error=app.signature(ERRBACK_TASK, kwargs={"step_id": "s-1"}))
    errors = [json.loads(base64.b64decode(message["body"]))[1]["error"]
              for message in _messages(redis_client, RESULTS_QUEUE)]
    assert sorted((error["type"], error.get("retryable", True)) for error in errors) == [
        ("CardDeclined", False), ("OwnError", False), ("ValueError", True)]


class OutOfStock(Exception):
    """A team's own failure whose arguments do not rebuild it (a keyword-only one): Celery cannot
    pickle it, and hands the errback a stand-in."""

    def __init__(self, *, sku: str) -> None:
        super().__init__(f"{sku} is out of stock")


def test_an_exception_celery_cannot_pickle_is_forwarded_by_its_own_type_and_message(app: Celery, redis_client) -> None:
    @step(app, name="team.reserve")
    def reserve(sku: str) -> None:
        raise OutOfStock(sku=sku)

    reserve.apply(args=["ab-1"], link_error=app.signature(ERRBACK_TASK, kwargs={"step_id": "s-1"}))

    [message] = _messages(redis_client, RESULTS_QUEUE)
    error = json.loads(base64.b64decode(message["body"]))[1]["error"]
    assert error == {"type": "OutOfStock", "module": __name__, "message": "ab-1 is out of stock"}


def test_the_outcome_ductor_gets_back_carries_how_long_the_task_ran_and_where(app: Celery, redis_client) -> None:
    @step(app, name="team.slow")
    def slow() -> dict[str, Any]:
        time.sleep(0.05)
        return {}

    @step(app, name="team.slow_decline")
    def slow_decline() -> None:
        time.sleep(0.05)
        raise ValueError("declined")

    def ids() -> dict[str, Any]:  # each message's own, as each task's request has its callbacks
        return {"step_id": "s-1", "item_id": "i-1", "delivery": 1}

    slow.apply(headers=HEADERS, link=app.signature("ductor.task_succeeded", kwargs=ids(), queue=RESULTS_QUEUE))
    slow_decline.apply(headers=HEADERS, link_error=app.signature(ERRBACK_TASK, kwargs=ids()))
    slow.apply(link=app.signature("ductor.task_succeeded", kwargs=ids(), queue=RESULTS_QUEUE))  # not a Ductor step

    outcomes = [json.loads(base64.b64decode(m["body"]))[1] for m in _messages(redis_client, RESULTS_QUEUE)]
    assert len(outcomes) == 3
    succeeded, plain, failed = sorted(outcomes, key=lambda kwargs: ("error" in kwargs, "work_ms" not in kwargs))
    assert 50 <= succeeded["work_ms"] < 5_000
    assert 50 <= failed["work_ms"] < 5_000
    assert failed["error"]["type"] == "ValueError"
    assert succeeded["worker"] == failed["worker"] == gethostname()  # the worker's node name
    assert "work_ms" not in plain  # no step ran: nothing to report
    assert "worker" not in plain
    assert current_step_or_none() is None


def test_the_errback_never_raises_and_forwards_an_exception_whose_message_cannot_be_read(
    app: Celery, redis_client
) -> None:
    """Before, nothing was forwarded, and the step failed only at its timeout."""
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no message")

    app.tasks[ERRBACK_TASK](SimpleNamespace(id="task-8"), Unprintable(), None, step_id="s-8")

    [message] = _messages(redis_client, RESULTS_QUEUE)
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    assert args == ["task-8"]
    assert kwargs == {"step_id": "s-8", "error": {
        "type": "Unprintable", "module": __name__,
        "message": "(its message could not be read: RuntimeError in its __str__)"}}


def test_the_errback_never_raises(app: Celery, redis_client) -> None:
    app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens there: the publish fails

    app.tasks[ERRBACK_TASK](SimpleNamespace(id="task-9"), ValueError("declined"), None, step_id="s-9")

    assert _messages(redis_client, RESULTS_QUEUE) == []


def test_step_refuses_a_result_that_is_not_json_naming_the_task_and_the_type(app: Celery) -> None:
    @step(app, name="team.report")
    def report(value: Any) -> Any:
        return value

    @step(app)
    def unnamed() -> object:
        return object()

    assert report({"a": [1, 2.5, None, True, "x"]}) == {"a": [1, 2.5, None, True, "x"]}  # plain call, no Ductor
    with pytest.raises(TypeError, match=r"task 'team.report' .* result\['a'\]\[1\]\['b'\] is of type set"):
        report({"a": [1, {"b": {2}}]})
    with pytest.raises(TypeError, match="JSON has no such number"):
        report.run(float("nan"))
    with pytest.raises(TypeError, match=r"task 'tests\.sdk\.test_worker\.unnamed' .* result is of type object"):
        unnamed()


def test_a_bound_step_gets_its_task_first_and_its_result_is_checked(app: Celery) -> None:
    @step(app, name="team.bound", bind=True)
    def bound(task: Any, times: int) -> Any:
        return {"name": task.name, "times": times} if times else {task}

    assert bound(2) == {"name": "team.bound", "times": 2}  # callers pass no task
    assert bound.apply(args=(3,)).get() == {"name": "team.bound", "times": 3}
    with pytest.raises(NotJSONSafe, match=r"task 'team\.bound'"):
        bound(0)


def test_a_result_that_is_not_json_fails_the_step_for_good(app: Celery) -> None:
    @step(app, name="team.opaque")
    def opaque() -> object:
        return object()

    with pytest.raises(NotJSONSafe) as refused:
        opaque()
    assert isinstance(refused.value, TypeError)
    assert error_of(refused.value)["retryable"] is False  # the same code returns the same value again


def _held(app: Celery, queue: str) -> Any:
    """The next message of ``queue``, as a worker's consumer holds it (a real kombu message)."""
    with app.connection_for_read() as connection:
        message = connection.channel().basic_get(queue, no_ack=True)
    assert message is not None
    return message


def test_a_step_s_message_for_a_task_the_worker_lacks_fails_the_step_through_its_errback(
        app: Celery, redis_client) -> None:
    queue = "team-unknown"
    ids = {"step_id": "s-9", "item_id": "i-9", "delivery": 1, "tenant_id": "t-1"}
    app.send_task("team.missing", kwargs={"order": "o-1"}, queue=queue, headers=HEADERS, task_id="task-9",
                  link=app.signature("ductor.task_succeeded", kwargs=ids, queue=RESULTS_QUEUE),
                  link_error=app.signature(ERRBACK_TASK, kwargs=ids))
    app.send_task("team.missing", queue=queue, task_id="task-10")  # not a Ductor step: nothing to tell
    worker = SimpleNamespace(app=app, hostname="team-1@host")
    for task_id in ("task-9", "task-10"):
        on_task_unknown(sender=worker, message=_held(app, queue), name="team.missing", id=task_id)

    messages = _messages(redis_client, RESULTS_QUEUE)
    assert len(messages) == 1
    assert messages[0]["headers"]["task"] == ERRBACK_TASK
    assert messages[0]["headers"]["ductor_tenant_id"] == "t-1"
    args, kwargs, _ = json.loads(base64.b64decode(messages[0]["body"]))
    assert args == ["task-9"]
    error = kwargs.pop("error")
    assert kwargs == ids
    assert error["type"] == "NotRegistered"
    assert error["module"] == "celery.exceptions"
    assert error["message"].startswith("task 'team.missing' is not registered on team-1@host")
    assert "retryable" not in error  # another worker may have the task


def test_the_unknown_task_hook_never_raises(app: Celery, redis_client) -> None:
    broken = SimpleNamespace(decode=lambda: (_ for _ in ()).throw(ValueError("undecodable")))
    on_task_unknown(sender=SimpleNamespace(app=app), message=broken, name="x", id="task-11")
    on_task_unknown(sender=None, message=None, name=None, id=None)
    assert _messages(redis_client, RESULTS_QUEUE) == []


def test_the_client_and_the_worker_helpers_import_without_celery() -> None:
    code = ("import sys; sys.modules['celery'] = None\n"
            "import ductor_sdk, ductor_sdk.worker\n"
            "ductor_sdk.Client('http://localhost', 'dct_x_y').close()\n"
            "assert ductor_sdk.worker.current_step_or_none() is None")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_ductors_own_tasks_stay_off_a_team_app_made_in_the_same_process():
    """A team's app that shares a process with Ductor (a test, a monolith) keeps its own
    ``ductor.task_failed`` errback: Ductor's tasks are not shared with other apps."""
    from celery import Celery
    from ductor_sdk.worker import install

    import workflows.tasks  # noqa: F401  (Ductor's own ductor.task_failed, registered on Ductor's app)

    team = Celery("team-shared-process", set_as_current=False)
    install(team)
    assert "forwarder" in team.tasks["ductor.task_failed"].run.__qualname__


def test_a_step_is_a_task_of_its_own_app_alone():
    """Two apps of one process (two test cases, a monolith) each keep their own step of one name."""
    first = Celery("team-first", set_as_current=False)
    second = Celery("team-second", set_as_current=False)

    @step(first, name="team.same_name")
    def one() -> str:
        return "first"

    @step(second, name="team.same_name")
    def other() -> str:
        return "second"

    assert (first.tasks["team.same_name"].run(), second.tasks["team.same_name"].run()) == ("first", "second")
    assert "team.same_name" not in Celery("team-third", set_as_current=False).tasks


def test_a_whole_number_too_long_for_json_text_is_named_where_it_is(app: Celery) -> None:
    """Python writes no whole number of more than 4,300 digits as text: the refusal names that
    number, not the object that holds it."""
    @step(app, name="team.factorial")
    def factorial() -> dict[str, Any]:
        return {"n": 3, "digits": [1, 10**5000]}

    with pytest.raises(NotJSONSafe, match=r"result\['digits'\]\[1\] is of type int \(too many digits"):
        factorial()


@pytest.mark.parametrize("team_conf", [
    pytest.param({"task_create_missing_queues": False}, id="no-missing-queues"),
    pytest.param({"task_routes": {"*": {"queue": "elsewhere", "exchange": "elsewhere", "routing_key": "elsewhere"}}},
                 id="routes-everything-elsewhere"),
])
def test_the_errback_reaches_ductor_results_whatever_the_team_app_routes_and_declares(
        app: Celery, redis_client, team_conf: dict[str, Any]) -> None:
    """A team app that creates no queue it does not list, or routes every task to its own exchange,
    still forwards a failure into ``ductor.results`` (it was refused, or sent elsewhere: the step
    waited for its timeout)."""
    app.conf.update(team_conf)

    @step(app, name="team.decline")
    def decline(order: str) -> None:
        raise ValueError(f"card declined for {order}")

    errback = app.signature(ERRBACK_TASK, kwargs={"step_id": "s-1"})
    decline.apply(args=["o-7"], task_id="task-7", link_error=errback)

    (message,) = _messages(redis_client, RESULTS_QUEUE)
    assert message["headers"]["task"] == ERRBACK_TASK
    assert _messages(redis_client, "elsewhere") == []


@pytest.mark.parametrize(("accept", "warned"), [
    (["pickle"], True), (["msgpack", "application/x-python-serialize"], True),
    (["json"], False), (["pickle", "application/json"], False), (None, False),
])
def test_a_worker_that_refuses_json_says_so_as_it_starts(caplog, accept: list[str] | None, warned: bool) -> None:
    """Ductor sends each step's message as JSON: a worker whose ``accept_content`` leaves JSON out
    discards them all, and each step waits for its timeout. It warns once, as it starts."""
    from celery.signals import worker_init

    team = Celery("team", set_as_current=False)
    install(team)
    if accept is not None:
        team.conf.accept_content = accept  # set after install, as an app configured later does
    other = Celery("other", set_as_current=False)
    other.conf.accept_content = ["pickle"]

    class FakeWorker:
        def __init__(self, app: Celery) -> None:
            self.app = app

    with caplog.at_level("WARNING", logger="ductor_sdk.worker.signals"):
        worker_init.send(sender=FakeWorker(other))  # another app's worker: not this one's to judge
        worker_init.send(sender=FakeWorker(team))
    found = [r.getMessage() for r in caplog.records if "does not accept JSON" in r.getMessage()]
    assert len(found) == (1 if warned else 0)
    team.close()
    other.close()


@pytest.mark.parametrize(("options", "warned"), [
    ({"global_keyprefix": "billing:"}, True), ({"visibility_timeout": 3600}, False), (None, False),
])
def test_a_worker_whose_broker_keys_take_a_prefix_says_so_as_it_starts(
        caplog, options: dict[str, Any] | None, warned: bool) -> None:
    """Ductor sends each step's message to the queue's own key: a worker whose Redis keys take a
    ``global_keyprefix`` never sees them (nor Ductor its outcomes). It warns once, as it starts."""
    from celery.signals import worker_init

    team = Celery("team", set_as_current=False)
    install(team)
    if options is not None:
        team.conf.broker_transport_options = options

    class FakeWorker:
        app = team

    with caplog.at_level("WARNING", logger="ductor_sdk.worker.signals"):
        worker_init.send(sender=FakeWorker())
    found = [r.getMessage() for r in caplog.records if "global_keyprefix" in r.getMessage()]
    assert len(found) == (1 if warned else 0)
    team.close()


# -- heartbeats ----------------------------------------------------------------------------------


def _heartbeats(redis: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The heartbeats sent to Ductor, in the order sent (the queue's list takes each at its head): each
    message's headers and keyword arguments."""
    return [(message["headers"], json.loads(base64.b64decode(message["body"]))[1])
            for message in reversed(_messages(redis, RESULTS_QUEUE))
            if message["headers"]["task"] == "ductor.task_heartbeat"]


def test_a_step_whose_node_asks_for_heartbeats_sends_its_first_as_it_starts_and_then_at_most_every_third(
        app: Celery, redis_client) -> None:
    @step(app, name="team.transcode")
    def transcode() -> list[bool]:
        assert current_step().heartbeat_s == 3
        return [heartbeat({"chunks": 1}), heartbeat({"chunks": 2})]  # within a second of the first: held

    assert transcode.apply(headers={**HEADERS, "ductor_heartbeat_s": 3}).get() == [False, False]
    beats = _heartbeats(redis_client)
    assert [kwargs for _headers, kwargs in beats] == [{"step_id": "s-1", "tenant_id": "t-1", "worker": gethostname()}]
    assert beats[0][0]["ductor_tenant_id"] == "t-1"


def test_idor_a_step_whose_header_names_a_tiny_heartbeat_s_sends_no_more_than_three_heartbeats_a_second(
        app: Celery, redis_client, monkeypatch) -> None:
    """Heartbeats go to ``ductor.results``, which every tenant's task outcomes share: a heartbeat_s
    of a millisecond (a spec saved before the floor) did not make the task send one per call."""
    from ductor_sdk.worker import heartbeats

    clock = iter([100.0, 100.1, 100.2, 100.4])  # the first heartbeat, then the task's three
    monkeypatch.setattr(heartbeats, "time", SimpleNamespace(monotonic=lambda: next(clock)))

    @step(app, name="team.transcode")
    def transcode() -> list[bool]:
        return [heartbeat({"chunks": 1}), heartbeat({"chunks": 2}), heartbeat({"chunks": 3})]

    assert transcode.apply(headers={**HEADERS, "ductor_heartbeat_s": 0.001}).get() == [False, False, True]
    assert [kwargs.get("details") for _headers, kwargs in _heartbeats(redis_client)] == [None, {"chunks": 3}]


def test_a_held_heartbeat_s_details_go_with_the_next_one_sent(app: Celery, redis_client, monkeypatch) -> None:
    from ductor_sdk.worker import heartbeats

    clock = iter([100.0, 100.5, 102.0, 102.1])  # the first heartbeat, then the task's three
    monkeypatch.setattr(heartbeats, "time", SimpleNamespace(monotonic=lambda: next(clock)))  # its clock alone

    @step(app, name="team.transcode")
    def transcode() -> list[bool]:
        return [heartbeat({"chunks": 1}), heartbeat({"chunks": 2}), heartbeat()]

    assert transcode.apply(headers={**HEADERS, "ductor_heartbeat_s": 3}).get() == [False, True, False]
    assert [kwargs.get("details") for _headers, kwargs in _heartbeats(redis_client)] == [None, {"chunks": 2}]


def test_a_step_without_heartbeat_s_sends_none_until_the_task_reports_progress(app: Celery, redis_client) -> None:
    @step(app, name="team.transcode")
    def transcode() -> list[bool]:
        assert current_step().heartbeat_s is None
        return [heartbeat({"chunks": 1}), heartbeat({"chunks": 2})]

    assert transcode.apply(headers=HEADERS).get() == [True, False]
    assert [kwargs.get("details") for _headers, kwargs in _heartbeats(redis_client)] == [{"chunks": 1}]


def test_a_retry_reads_the_progress_its_earlier_attempt_reported(app: Celery) -> None:
    @step(app, name="team.transcode")
    def transcode() -> Any:
        return current_step().heartbeat_details

    assert transcode.apply(headers={**HEADERS, "ductor_heartbeat_details": {"chunks": 3}}).get() == {"chunks": 3}
    assert transcode.apply(headers=HEADERS).get() is None


def test_a_heartbeat_outside_a_step_or_with_details_that_are_not_json_raises(app: Celery, redis_client) -> None:
    with pytest.raises(NotInStep):
        heartbeat({"chunks": 1})

    @step(app, name="team.transcode")
    def transcode() -> None:
        heartbeat({"when": object()})

    with pytest.raises(TypeError, match="heartbeat details must be JSON"):
        transcode.apply(headers=HEADERS).get()
    assert _heartbeats(redis_client) == []


def test_threads_of_a_task_send_one_heartbeat_per_interval_and_keep_the_details_of_a_call_meanwhile(
        monkeypatch) -> None:
    """A thread run in the task's context (``copy_context().run``) shares its heartbeats: a call while
    another thread's heartbeat is on its way sends nothing, and its details go with the next one."""
    from ductor_sdk.worker import heartbeats

    clock = [100.0]
    monkeypatch.setattr(heartbeats, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    sent: list[Any] = []
    publishing, published = threading.Event(), threading.Event()

    def to_ductor(app: Any, task: str, *, args: list[Any], kwargs: dict[str, Any]) -> None:
        sent.append(kwargs.get("details"))
        if len(sent) == 1:  # the first heartbeat is on its way until the test lets it go
            publishing.set()
            assert published.wait(30)

    monkeypatch.setattr(heartbeats, "to_ductor", to_ductor)
    token = heartbeats.begin(SimpleNamespace(), EXPECTED)  # no heartbeat_s: the task's first call sends
    try:
        worker = threading.Thread(target=contextvars.copy_context().run, args=(heartbeat, {"chunks": 1}))
        worker.start()
        assert publishing.wait(30)
        meanwhile = heartbeat({"chunks": 2})
        published.set()
        worker.join(30)
        clock[0] += heartbeats.INTERVAL_S
        later = heartbeat()
    finally:
        heartbeats.end(token)
    assert (meanwhile, later) == (False, True)
    assert sent == [{"chunks": 1}, {"chunks": 2}]


@pytest.mark.parametrize("value", [0, -1, "3", True, float("nan")])
def test_an_unusable_heartbeat_s_header_asks_for_no_heartbeats(value: Any) -> None:
    assert from_request(SimpleNamespace(**HEADERS, ductor_heartbeat_s=value)).heartbeat_s is None


# -- told that the step ended ---------------------------------------------------------------------


def test_a_step_told_it_ended_raises_step_cancelled_at_its_next_heartbeat_and_sends_nothing(
        app: Celery, redis_client) -> None:
    """Ductor's ``ductor_cancel`` command (as the worker's remote control runs it) marks the step; the
    task's next ``heartbeat()`` raises, ``cancel_requested()`` says so, and another step is not told."""
    from celery.worker.control import Panel

    ended, other = str(uuid.uuid4()), str(uuid.uuid4())
    assert Panel.data[cancels.COMMAND](None, task_id=ended) == {"ok": f"step {ended} marked as ended"}

    @step(app, name="team.transcode")
    def transcode() -> list[Any]:
        asked = cancel_requested()
        try:
            heartbeat({"chunks": 1})
        except StepCancelled as exc:
            return [asked, str(exc)]
        return [asked, None]

    asked, raised = transcode.apply(headers={**HEADERS, "ductor_step_id": ended}).get()
    assert asked is True
    assert f"step {ended} (billing/charge, attempt 2) has ended" in raised
    assert _heartbeats(redis_client) == []
    assert transcode.apply(headers={**HEADERS, "ductor_step_id": other}).get() == [False, None]
    assert [kwargs["step_id"] for _headers, kwargs in _heartbeats(redis_client)] == [other]


def test_the_command_refuses_what_is_not_a_step_id() -> None:
    assert "not a step id" in cancels.cancel(None, task_id="s-1; DROP")["error"]
    assert cancels.cancel(None, task_id="")["error"]


def test_a_board_keeps_its_newest_ids_and_matches_whole_slots_alone() -> None:
    board = cancels.Board()
    first, *rest = [str(uuid.uuid4()) for _ in range(cancels.SLOTS + 1)]
    board.mark(first)
    board.mark(first)  # marked once
    assert board.holds(first)
    for step_id in rest[:-1]:
        board.mark(step_id)
    assert board.holds(first)  # the board is full, nothing overwritten yet
    board.mark(rest[-1])
    assert not board.holds(first)  # the oldest made room
    assert all(board.holds(step_id) for step_id in rest)
    straddling = (rest[0][18:] + rest[1][:18])  # the end of one slot and the start of the next
    assert not board.holds(straddling)


def _holds_once_marked(board: cancels.Board, step_id: str, marked: Any, answer: Any) -> None:
    marked.wait(30)
    answer.send(board.holds(step_id))


def test_the_pool_processes_forked_after_the_board_was_made_see_what_the_main_process_marks() -> None:
    """As a prefork worker's: the board is made at ``install``, its pool processes fork after, and the
    main process (where remote control runs) marks a step once they run."""
    board, step_id = cancels.Board(), str(uuid.uuid4())
    forked = get_context("fork")
    marked, (answer, asked) = forked.Event(), forked.Pipe()
    child = forked.Process(target=_holds_once_marked, args=(board, step_id, marked, asked))
    child.start()
    try:
        board.mark(step_id)
        marked.set()
        assert answer.poll(30)
        assert answer.recv() is True
    finally:
        child.join(30)
