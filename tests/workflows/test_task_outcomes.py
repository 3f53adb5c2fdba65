"""Task nodes' outcomes and publishing, in this process: each acts for the tenant it names only.

The callbacks (``ductor.task_succeeded`` / ``ductor.task_failed``, run here
through Celery's ``apply``: the worker's code path without a broker) and the
dispatcher's publisher act in the tenant of the message or item; another
tenant's step is out of their reach.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import pytest

from ductor_project.core.context import tenant_context
from scheduling.fair_queue import Dequeued
from tenants.models import Tenant
from workflows import services
from workflows.engine import task_nodes
from workflows.models import RunEvent, StepRun, TaskCatalogEntry
from workflows.tasks import task_failed, task_succeeded

# Transactional: a run's first tick runs once its start commits.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_client")]


def running_task_step(tenant: Tenant) -> StepRun:
    """A run of a one-task workflow of ``tenant``, its step marked running (as once published)."""
    TaskCatalogEntry.objects.get_or_create(name="team.add", defaults={"queue": "team"})
    with tenant_context(tenant):
        services.workflow_put(name="w", spec={"nodes": [{"id": "t", "type": "task", "task": "team.add"}]})
        run, _ = services.run_start(workflow="w")
        step = StepRun.objects.get(run=run)
        StepRun.objects.filter(pk=step.pk).update(status=StepRun.Status.RUNNING)
        return step


def queued_task_item(tenant: Any) -> Dequeued:
    """A task step of ``tenant`` queued, and its item as a dispatcher dequeues it (``team.add``)."""
    step = running_task_step(tenant)
    with tenant_context(tenant):
        StepRun.objects.filter(pk=step.pk).update(status=StepRun.Status.QUEUED)
    return Dequeued(tenant_id=str(tenant.pk), item_id=f"step:{step.pk}", tier="standard", partition="p",
                    payload={"kind": "task", "step_id": str(step.pk), "name": "team.add", "queue": "team",
                             "timeout_s": 30},
                    waited_ms=0, attempt=1, delivery=1, lease_until_ms=0)


def status_of(tenant: Tenant, step: StepRun) -> str:
    with tenant_context(tenant):
        return StepRun.objects.get(pk=step.pk).status


def ids(step: StepRun) -> dict[str, Any]:
    return {"step_id": str(step.pk), "item_id": f"step:{step.pk}", "delivery": 1}


def test_a_result_naming_another_tenant_changes_nothing_of_the_step(tenant_a, tenant_b):
    victim = running_task_step(tenant_b[0])
    task_succeeded.apply(args=[{"sum": 1}], kwargs={"tenant_id": str(tenant_a[0].pk), **ids(victim)}).get()
    task_failed.apply(args=["celery-id"], kwargs={"tenant_id": str(tenant_a[0].pk), **ids(victim),
                                                  "error": {"type": "ValueError", "message": "x"}}).get()
    assert status_of(tenant_b[0], victim) == "running"
    task_succeeded.apply(args=[{"sum": 1}], kwargs={"tenant_id": str(tenant_b[0].pk), **ids(victim)}).get()
    assert status_of(tenant_b[0], victim) == "succeeded"


def test_a_result_with_no_tenant_is_refused_without_running(tenant_b):
    victim = running_task_step(tenant_b[0])
    result = task_succeeded.apply(args=[{"sum": 1}], kwargs=ids(victim))
    assert result.state != "SUCCESS"  # refused (rejected), never run
    assert status_of(tenant_b[0], victim) == "running"


@pytest.mark.parametrize("callback", [task_succeeded, task_failed])
@pytest.mark.parametrize("mangled", [
    {"step_id": "nope"}, {"step_id": 7}, {"run_id": "nope"}, {"item_id": {"a": 1}}, {"item_id": ""},
    {"delivery": "abc"}, {"delivery": 0}, {"delivery": True}, {"connection_id": 5},
])
def test_an_outcome_whose_message_names_no_attempt_is_refused_and_changes_nothing(tenant_b, callback, mangled):
    """A message on ``ductor.results`` that is not what Ductor's callbacks send (made up, mangled)
    is refused as it comes: it raised deep in the outcome's recording (a malformed UUID in a query,
    a delivery the fair queue refuses) after the step's outcome was kept, and its item stayed in flight."""
    step = running_task_step(tenant_b[0])
    args = [{"sum": 1}] if callback is task_succeeded else ["celery-id"]
    fields = {"tenant_id": str(tenant_b[0].pk), **ids(step), "run_id": str(step.run_id), **mangled}
    result = callback.apply(args=args, kwargs=fields)
    assert result.state == "SUCCESS", result.traceback
    assert status_of(tenant_b[0], step) == "running"


def test_a_failure_keeps_the_exceptions_type_and_message_and_may_be_retried(tenant_b):
    step = running_task_step(tenant_b[0])
    task_failed.apply(args=["celery-id"], kwargs={"tenant_id": str(tenant_b[0].pk), **ids(step),
                                                  "error": {"type": "OutOfStock", "module": "shop.services",
                                                            "message": "2 in stock"}}).get()
    with tenant_context(tenant_b[0]):
        error = StepRun.objects.get(pk=step.pk).error
    assert error["code"] == "task_failed"
    assert error["message"] == "OutOfStock: 2 in stock"
    assert error["retryable"] is True
    assert error["exception"] == {"type": "OutOfStock", "module": "shop.services"}


@pytest.mark.parametrize("callback", [task_succeeded, task_failed])
def test_an_outcome_that_comes_after_its_timeout_is_discarded_though_the_reaper_has_not_seen_it_yet(
        tenant_b, callback):
    """The timeout is the item's lease, which the coordinator's reaper notices within a second or so
    (and not at all while no coordinator runs): an outcome that comes in between times the step out
    itself and is discarded, as it would have been after the reap."""
    step = running_task_step(tenant_b[0])
    args = [{"sum": 1}] if callback is task_succeeded else ["celery-id"]
    callback.apply(args=args, kwargs={"tenant_id": str(tenant_b[0].pk), **ids(step),
                                      "deadline": time.time() - 0.5}).get()
    with tenant_context(tenant_b[0]):
        ended = StepRun.objects.get(pk=step.pk)
        history = list(RunEvent.objects.filter(run_id=step.run_id).order_by("seq").values_list("type", flat=True))
    assert (ended.status, ended.error["code"], ended.output) == ("failed", "timeout", None)
    assert history.index("step_timed_out") < history.index("step_result_discarded")
    with tenant_context(tenant_b[0]):
        came = RunEvent.objects.get(run_id=step.run_id, type="step_result_discarded").data
    if callback is task_succeeded:  # the late result itself is in the history
        assert (came["result"], came["output"]) == ("succeeded", {"sum": 1})
    else:
        assert (came["result"], came["error"]["code"]) == ("failed", "task_failed")


@pytest.mark.parametrize("callback", [task_succeeded, task_failed])
def test_an_outcome_whose_callback_a_later_release_signed_with_more_arguments_is_kept(tenant_b, callback):
    """A callback's arguments are those of the release that published its task, which may run for
    hours: one published by a later release (before a rollback, or while the deploy rolls) names an
    argument this release does not know, which is passed over."""
    step = running_task_step(tenant_b[0])
    args = [{"sum": 1}] if callback is task_succeeded else ["celery-id"]
    callback.apply(args=args, kwargs={"tenant_id": str(tenant_b[0].pk), **ids(step),
                                      "added_by_a_later_release": {"any": 1}}).get()
    assert status_of(tenant_b[0], step) == ("succeeded" if callback is task_succeeded else "failed")


@pytest.mark.parametrize("callback", [task_succeeded, task_failed])
def test_an_outcome_from_a_worker_whose_name_holds_a_nul_is_kept_with_the_name_made_storable(tenant_b, callback):
    """The worker's name is the team's to choose, and PostgreSQL keeps no NUL in a JSON column: the
    outcome's commit was refused, the outcome lost, and the step ran again after its timeout."""
    step = running_task_step(tenant_b[0])
    args = [{"sum": 1}] if callback is task_succeeded else ["celery-id"]
    callback.apply(args=args, kwargs={"tenant_id": str(tenant_b[0].pk), **ids(step), "worker": "team\x00@host",
                                      "error": {"type": "Bad\x00Error", "message": "no\x00"}}
                   if callback is task_failed else
                   {"tenant_id": str(tenant_b[0].pk), **ids(step), "worker": "team\x00@host"}).get()
    assert status_of(tenant_b[0], step) == ("succeeded" if callback is task_succeeded else "failed")
    with tenant_context(tenant_b[0]):
        kept = StepRun.objects.get(pk=step.pk)
    assert kept.routing["worker"] == "team\ufffd@host"


def test_an_outcome_within_its_timeout_is_kept(tenant_b):
    step = running_task_step(tenant_b[0])
    task_succeeded.apply(args=[{"sum": 1}], kwargs={"tenant_id": str(tenant_b[0].pk), **ids(step),
                                                    "deadline": time.time() + 60}).get()
    assert status_of(tenant_b[0], step) == "succeeded"


@pytest.mark.parametrize(("callback", "worker", "kept"), [
    (task_succeeded, "team-1@host", "team-1@host"),
    (task_failed, "team-2@host", "team-2@host"),
    (task_succeeded, {"not": "a name"}, None),  # what is not a name is not kept; the outcome is
    (task_succeeded, "w" * 300 + "@host", "w" * 255),
])
def test_the_worker_an_outcome_names_goes_on_the_attempt_s_trace(tenant_b, callback, worker, kept):
    step = running_task_step(tenant_b[0])
    args = [{"sum": 1}] if callback is task_succeeded else ["celery-id"]
    callback.apply(args=args, kwargs={"tenant_id": str(tenant_b[0].pk), **ids(step), "worker": worker}).get()
    with tenant_context(tenant_b[0]):
        ended = StepRun.objects.get(pk=step.pk)
    assert ended.status == ("succeeded" if callback is task_succeeded else "failed")
    assert (ended.routing or {}).get("worker") == kept


@pytest.mark.parametrize(("result", "field", "why"), [
    ({"s": "a\x00b"}, "output.s", "NUL"),
    ({"k\x00": 1}, "output.k\ufffd", "NUL"),  # the key as its error can be stored
    ({"s": "a\ud800b"}, "output.s", "lone surrogate"),
    ({"b": b"hello"}, "output.b", "Bytes are not JSON"),
    ("\x00", "output", "NUL"),
    ({"n": float("inf")}, "output.n", "too large"),
])
def test_a_result_no_payload_keeps_fails_the_step_for_good_naming_where(tenant_b, result, field, why):
    """A NUL character or a lone surrogate cannot be stored, and bytes would be kept as Python's
    repr: the step fails at once, not retried, naming where. Before, the outcome's commit failed,
    nothing was kept, and the step waited for its timeout, then failed as if its worker had died."""
    step = running_task_step(tenant_b[0])
    task_succeeded.apply(args=[result], kwargs={"tenant_id": str(tenant_b[0].pk), **ids(step)}).get()
    with tenant_context(tenant_b[0]):
        kept = StepRun.objects.get(pk=step.pk)
    assert (kept.status, kept.output, kept.error["code"], kept.error["retryable"]) == (
        "failed", None, "invalid_payload", False)
    assert kept.error["field"] == field
    assert why in kept.error["message"]


def test_a_failure_whose_message_quotes_a_nul_or_a_lone_surrogate_is_kept_with_them_replaced(tenant_b):
    step = running_task_step(tenant_b[0])
    task_failed.apply(args=["celery-id"], kwargs={"tenant_id": str(tenant_b[0].pk), **ids(step),
                                                  "error": {"type": "Value\x00Error", "module": "shop",
                                                            "message": "bad\x00byte \ud800"}}).get()
    with tenant_context(tenant_b[0]):
        error = StepRun.objects.get(pk=step.pk).error
    assert (error["code"], error["message"]) == ("task_failed", "Value\ufffdError: bad\ufffdbyte \ufffd")
    assert error["exception"]["type"] == "Value\ufffdError"


def test_a_failure_the_task_says_is_not_retryable_fails_the_step_for_good(tenant_b):
    TaskCatalogEntry.objects.create(name="team.add", queue="team")
    with tenant_context(tenant_b[0]):
        services.workflow_put(name="w", spec={"nodes": [{"id": "t", "type": "task", "task": "team.add",
                                                         "retry": {"max_attempts": 3, "backoff_s": 1}}]})
        run, _ = services.run_start(workflow="w")
        step = StepRun.objects.get(run=run)
        StepRun.objects.filter(pk=step.pk).update(status=StepRun.Status.RUNNING)
    task_failed.apply(args=["celery-id"], kwargs={"tenant_id": str(tenant_b[0].pk), **ids(step),
                                                  "error": {"type": "CardDeclined", "module": "shop.payments",
                                                            "message": "declined", "retryable": False}}).get()
    with tenant_context(tenant_b[0]):
        attempts = list(StepRun.objects.filter(run=run).values_list("attempt", "status", "error__retryable"))
        run.refresh_from_db()
    assert attempts == [(1, "failed", False)]  # no second attempt, whatever the policy allows
    assert run.status == "failed"


def test_the_publisher_acts_for_the_items_tenant_only(tenant_a, tenant_b):
    victim = running_task_step(tenant_b[0])
    with tenant_context(tenant_b[0]):
        StepRun.objects.filter(pk=victim.pk).update(status=StepRun.Status.QUEUED)
    forged = Dequeued(tenant_id=str(tenant_a[0].pk), item_id=f"step:{victim.pk}", tier="standard",
                      partition="p", payload={"kind": "task", "step_id": str(victim.pk), "name": "team.add",
                                              "queue": "team", "timeout_s": 30},
                      waited_ms=0, attempt=1, delivery=1, lease_until_ms=0)  # tenant B's step, "tenant A's" item
    task_nodes.publish([forged])
    assert status_of(tenant_b[0], victim) == "queued"  # not marked running, not sent


def test_the_run_time_a_team_worker_reports_is_what_its_tenant_is_charged(tenant_b, redis_client):
    from ductor_project.core.context import no_tenant
    from ductor_project.core.keys import redis_key
    from scheduling import fair_queue as fq

    tenant = tenant_b[0]
    step = running_task_step(tenant)
    item_id = f"taskitem:{step.pk}"
    fq.enqueue_many([fq.NewItem(item_id, "standard", "p-task", {"kind": "task"}, kind="task")], tenant=tenant)
    with no_tenant():
        taken = [fq.dequeue(lease_ms=30_000) for _ in range(5)]
    mine = next(item for item in taken if item is not None and item.item_id == item_id)

    task_succeeded.apply(args=[{"sum": 1}], kwargs={"tenant_id": str(tenant.pk), **ids(step), "item_id": item_id,
                                                    "delivery": mine.delivery, "work_ms": 250.0}).get()

    assert status_of(tenant, step) == "succeeded"
    assert float(redis_client.hget(redis_key("fq", "est", tenant=tenant), "task")) == 250.0  # its first sample


@pytest.mark.parametrize("value", [None, -1, float("nan"), float("inf"), True, "250", [250]])
def test_an_unusable_run_time_is_ignored_never_refused(value):
    assert task_nodes.reported_work(value) is None


def test_a_usable_run_time_is_kept():
    assert task_nodes.reported_work(0) == 0.0
    assert task_nodes.reported_work(12.5) == 12.5


def test_a_batch_of_task_items_is_published_through_one_producer_per_broker(tenant_a, tenant_b, monkeypatch):
    steps = [running_task_step(owner) for owner, _ in (tenant_a, tenant_b, tenant_b)]
    for step in steps:
        with tenant_context(step.tenant):
            StepRun.objects.filter(pk=step.pk).update(status=StepRun.Status.QUEUED)
    items = [Dequeued(tenant_id=str(step.tenant_id), item_id=f"step:{step.pk}", tier="standard", partition="p",
                      payload={"kind": "task", "step_id": str(step.pk), "name": "team.add", "queue": "team",
                               "timeout_s": 30},
                      waited_ms=0, attempt=1, delivery=1, lease_until_ms=0) for step in steps]
    app, taken = task_nodes.broker_app("default"), []
    real = app.producer_or_acquire

    def producer_or_acquire(*args: Any, **kwargs: Any) -> Any:
        taken.append(1)
        return real(*args, **kwargs)

    sent: list[Any] = []
    monkeypatch.setattr(app, "producer_or_acquire", producer_or_acquire)
    monkeypatch.setattr(app, "send_task", lambda *args, **kwargs: sent.append(kwargs["producer"]))
    task_nodes.publish(items)
    assert len(sent) == 3  # every item sent, of both tenants
    assert len(taken) == 1
    assert len({id(producer) for producer in sent}) == 1
    assert [status_of(step.tenant, step) for step in steps] == ["running"] * 3


def test_an_input_its_entrys_schema_cannot_check_fails_the_step_for_good_and_ends_the_run(tenant_b):
    """A schema stored before references were checked (one that does not resolve) fails the attempt
    with ``invalid_input``, saying why; the run ends instead of its tick failing again and again."""
    TaskCatalogEntry.objects.create(name="team.add", queue="team", input_schema={"$ref": "#/nope"})
    with tenant_context(tenant_b[0]):
        services.workflow_put(name="w", spec={"nodes": [{"id": "t", "type": "task", "task": "team.add",
                                                         "input": "$input"}]})
        run, _ = services.run_start(workflow="w", input={"a": 1})
        step = StepRun.objects.get(run=run)
        run.refresh_from_db()
    assert (step.status, step.error["code"], step.error["retryable"]) == ("failed", "invalid_input", False)
    assert "does not resolve" in step.error["message"]
    assert run.status == "failed"


def test_the_callbacks_carry_their_arguments_text_so_the_team_worker_does_not_build_it(tenant_a, monkeypatch):
    """Celery writes a message's arguments as text for its events and logs (``saferepr``, in
    Python). The callbacks' text comes with them: the team's worker sends a callback without
    making it, and the task's result, the step's output, is not copied into it."""
    import celery.app.amqp as amqp
    from celery import Celery, signature

    item = queued_task_item(tenant_a[0])
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(task_nodes.broker_app("default"), "send_task", lambda *args, **kwargs: sent.append(kwargs))
    task_nodes.publish([item])
    (message,) = sent

    team = Celery("team", broker="memory://", set_as_current=False)  # the team's app: the callbacks' publisher
    published: list[Any] = []
    monkeypatch.setattr(team.amqp, "send_task_message", lambda producer, name, msg, **options: published.append(msg))
    made = amqp.saferepr

    def no_saferepr(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("the team's worker made a callback's arguments' text")

    monkeypatch.setattr(amqp, "saferepr", no_saferepr)
    # As the team's worker has them: JSON, out of the task's message.
    link, link_error = (json.loads(json.dumps(message[name])) for name in ("link", "link_error"))
    signature(link, app=team).apply_async(({"secret": "output"},))
    monkeypatch.setattr(amqp, "saferepr", made)  # the errback's one argument, the task's id: Celery's text of it
    signature(link_error, app=team).apply_async(("task-id",))

    succeeded, failed = (msg[0] for msg in published)  # each message's headers
    assert succeeded["kwargsrepr"] == repr(link["kwargs"])
    assert succeeded["argsrepr"] == task_nodes.RESULT_REPR
    assert failed["kwargsrepr"] == repr(link_error["kwargs"])
    assert failed["argsrepr"] == "('task-id',)"


def test_on_redis_neither_the_task_nor_its_callback_declares_its_queue(tenant_a):
    """On a Redis broker a queue needs no declaring: the task goes into its queue's list, the team's
    worker sends the callback into ``ductor.results``, and neither publish writes kombu's binding
    of its queue (which Celery otherwise looks up again for every message it publishes)."""
    import base64

    from celery import Celery, signature
    from django.conf import settings

    from ductor_project.celery import RESULTS_QUEUE
    from tests.conftest import broker_redis

    broker = broker_redis()
    bindings = [f"_kombu.binding.{queue}" for queue in ("team", RESULTS_QUEUE)]
    broker.delete("team", RESULTS_QUEUE, *bindings)
    item = queued_task_item(tenant_a[0])
    task_nodes.publish([item])
    message = json.loads(broker.rpop("team"))  # as the team's worker takes it
    _args, _kwargs, embed = json.loads(base64.b64decode(message["body"]))
    team = Celery("team", broker=settings.CELERY_BROKER_URL, set_as_current=False)  # kombu's own Redis transport
    try:
        signature(embed["callbacks"][0], app=team).apply_async(({"sum": 3},))
    finally:
        team.close()

    callback = json.loads(broker.rpop(RESULTS_QUEUE))
    assert (callback["headers"]["task"], message["headers"]["task"]) == ("ductor.task_succeeded", "team.add")
    assert [key for key in bindings if broker.exists(key)] == []


def test_a_task_s_message_expires_when_its_step_times_out(tenant_a):
    """A worker that takes the message after the step's timeout (it was down, its queue was long)
    discards it unrun: the step has timed out, and its retry has a message of its own."""
    from datetime import UTC, datetime, timedelta

    from tests.conftest import broker_redis

    broker = broker_redis()
    broker.delete("team")
    item = queued_task_item(tenant_a[0])  # its timeout: 30 s
    before = datetime.now(UTC)
    task_nodes.publish([item])
    message = json.loads(broker.rpop("team"))

    expires = datetime.fromisoformat(message["headers"]["expires"])
    assert before + timedelta(seconds=29) < expires < datetime.now(UTC) + timedelta(seconds=31)


def test_the_worker_that_keeps_a_task_step_s_outcome_publishes_its_run_s_next_task_step(
    tenant_a, redis_client, monkeypatch
):
    """A task step's outcome takes, in its ack's round trip, the next item the fair order gives when
    it is a task node's, and publishes it as the dispatcher would have: here, the run's second step.
    No dispatcher is woken for it."""
    from ductor_project.core.context import no_tenant
    from ductor_project.core.keys import shard_of
    from scheduling import fair_queue as fq

    tenant = tenant_a[0]
    shard = shard_of(str(tenant.pk))
    TaskCatalogEntry.objects.get_or_create(name="team.add", defaults={"queue": "team"})
    sent: list[str] = []
    monkeypatch.setattr(task_nodes.broker_app("default"), "send_task", lambda name, **kwargs: sent.append(name))
    with tenant_context(tenant):
        services.workflow_put(name="two", spec={"nodes": [
            {"id": "a", "type": "task", "task": "team.add"},
            {"id": "b", "type": "task", "task": "team.add", "depends_on": ["a"]},
        ]})
        run, _ = services.run_start(workflow="two")
    with no_tenant():
        first = fq.dequeue(lease_ms=30_000, shard=shard)
    assert first is not None
    task_nodes.publish([first])  # the dispatcher's publish of the first step
    assert sent == ["team.add"]
    redis_client.delete(fq.global_key("wake", shard=shard))  # the start's signal, taken
    with tenant_context(tenant):
        a = StepRun.objects.get(run=run, node_id="a")

    task_succeeded.apply(args=[{"sum": 1}], kwargs={"tenant_id": str(tenant.pk), "step_id": str(a.pk),
                                                    "item_id": first.item_id, "delivery": first.delivery,
                                                    "run_id": str(run.pk)}).get()

    assert sent == ["team.add", "team.add"]  # b, published by the worker that kept a's outcome
    with tenant_context(tenant):
        assert StepRun.objects.get(run=run, node_id="b").status == "running"
    assert redis_client.llen(fq.global_key("wake", shard=shard)) == 0  # no dispatcher woken for it
    with no_tenant():
        assert fq.dequeue(lease_ms=30_000, shard=shard) is None  # b's item is out, leased


def test_the_next_task_step_an_outcome_takes_of_another_tenant_is_published_as_that_tenant_s(
    tenant_a, tenant_b, redis_client, monkeypatch
):
    """The fair order may give the worker that keeps tenant A's outcome tenant B's task step: it is
    published in B's context, marked running among B's steps, with B in its headers."""
    from ductor_project.core.context import no_tenant
    from ductor_project.core.keys import shard_of
    from scheduling import fair_queue as fq

    a_tenant, b_tenant = tenant_a[0], tenant_b[0]
    assert shard_of(str(a_tenant.pk)) == shard_of(str(b_tenant.pk))  # one shard: the handoff sees both
    TaskCatalogEntry.objects.get_or_create(name="team.add", defaults={"queue": "team"})
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(task_nodes.broker_app("default"), "send_task", lambda name, **kwargs: sent.append(kwargs))
    one = {"nodes": [{"id": "t", "type": "task", "task": "team.add"}]}
    with tenant_context(a_tenant):
        services.workflow_put(name="w", spec=one)
        a_run, _ = services.run_start(workflow="w")
    with no_tenant():
        a_item = fq.dequeue(lease_ms=30_000, shard=shard_of(str(a_tenant.pk)))
    assert a_item is not None
    task_nodes.publish([a_item])
    with tenant_context(b_tenant):
        services.workflow_put(name="w", spec=one)
        b_run, _ = services.run_start(workflow="w")
    with tenant_context(a_tenant):
        a_step = StepRun.objects.get(run=a_run)

    task_succeeded.apply(args=[{"sum": 1}], kwargs={"tenant_id": str(a_tenant.pk), "step_id": str(a_step.pk),
                                                    "item_id": a_item.item_id, "delivery": a_item.delivery,
                                                    "run_id": str(a_run.pk)}).get()

    assert len(sent) == 2
    assert sent[1]["headers"]["ductor_tenant_id"] == str(b_tenant.pk)
    with tenant_context(b_tenant):
        assert StepRun.objects.get(run=b_run).status == "running"
    with tenant_context(a_tenant):
        assert StepRun.objects.get(run=a_run).status == "succeeded"
        assert not StepRun.objects.filter(run=b_run).exists()  # B's step is not A's to see


@pytest.mark.parametrize("change", [{"enabled": False}, {"plans": ["free"]}, {"tenants": ["someone-else"]},
                                    {"input_schema": {"type": "object", "required": ["order"]}}])
def test_an_attempt_queued_before_its_catalog_entry_changed_is_not_published_when_the_entry_refuses_it(
    tenant_a, change
):
    """Each attempt checks the catalog again when it is published, not only when it was queued: a
    task disabled, taken away from the tenant's plan or slug, or given a schema its input does not
    match while the attempt waited for its slots is not called; the step fails for good."""
    from tests.conftest import broker_redis

    broker = broker_redis()
    broker.delete("team")
    item = queued_task_item(tenant_a[0])
    entry = TaskCatalogEntry.objects.get(name="team.add")
    for field, value in change.items():
        setattr(entry, field, value)
    entry.save()

    task_nodes.publish([item])

    assert broker.llen("team") == 0
    with tenant_context(tenant_a[0]):
        step = StepRun.objects.get(pk=item.payload["step_id"])
    code = "invalid_input" if "input_schema" in change else "task_not_allowed"
    assert (step.status, step.error["code"], step.error["retryable"]) == ("failed", code, False)


def test_an_attempt_the_catalog_still_allows_is_published(tenant_a):
    from tests.conftest import broker_redis

    broker = broker_redis()
    broker.delete("team")
    item = queued_task_item(tenant_a[0])
    TaskCatalogEntry.objects.filter(name="team.add").update(description="edited")  # allows it still
    task_nodes.publish([item])
    assert broker.llen("team") == 1
    assert status_of(tenant_a[0], StepRun(pk=item.payload["step_id"])) == "running"


def test_the_line_of_a_published_task_attempt_names_its_node_and_attempt(tenant_a, logged):
    """An operator reading the dispatcher's line sees which node of the run went to the team's queue."""
    from tests.conftest import broker_redis

    broker_redis().delete("team")
    item = queued_task_item(tenant_a[0])
    task_nodes.publish([item])
    (published,) = [event for event in logged.json("workflows.engine.task_nodes") if event["event"] == "task_published"]
    assert (published["node_id"], published["attempt"]) == ("t", 1)
    assert (published["tenant_id"], published["step_id"]) == (str(tenant_a[0].pk), item.payload["step_id"])


def test_the_outcomes_of_tasks_sent_through_a_celery_connection_feed_its_breaker(tenant_a, redis_client, settings):
    """A task that raised (retryable) is a failure of the worker group behind the connection: enough
    of them in a row open its breaker, so a failover pool moves on; a result closes it again. A failure
    the task says is for good is the workers' answer (a success), and a task sent through no
    connection feeds no breaker."""
    from scheduling.circuit import breaker_key

    settings.DUCTOR_BREAKER_FAILURES = 3
    connection_id = "5da63979-0526-4af4-9bc8-8ec9a3d715b2"
    tenant_id = str(tenant_a[0].pk)
    with tenant_context(tenant_a[0]):
        key = breaker_key(connection_id)

    def failed(*, retryable: bool = True, connection: str = connection_id) -> None:
        step = running_task_step(tenant_a[0])
        task_failed.apply(args=["celery-id"], kwargs={
            "tenant_id": tenant_id, **ids(step), "connection_id": connection,
            "error": {"type": "ConnectionError", "message": "its database is down", "retryable": retryable}}).get()

    failed()
    failed(connection="")
    failed()
    assert (int(redis_client.hget(key, "failures") or 0), redis_client.hget(key, "open_until")) == (2, None)
    failed(retryable=False)  # the task's own answer: the workers work
    assert int(redis_client.hget(key, "failures") or 0) == 0
    for _ in range(3):
        failed()
    assert redis_client.hget(key, "open_until") is not None  # open: admission passes it over

    step = running_task_step(tenant_a[0])
    task_succeeded.apply(args=[{"sum": 3}], kwargs={"tenant_id": tenant_id, **ids(step),
                                                    "connection_id": connection_id}).get()
    assert int(redis_client.hget(key, "failures") or 0) == 0



def celery_connection(tenant: Tenant, queue: str = "team-a") -> str:
    """A celery connection of ``tenant``'s (``team-a``), on ``queue``, the first member of a
    ``failover`` pool: its id."""
    from scheduling import services as scheduling_services
    from scheduling.services import MemberSpec

    with tenant_context(tenant):
        made = scheduling_services.connection_create(name="team-a", kind="celery", config={"queue": queue})
        scheduling_services.pool_create(name="team", strategy="failover", is_default=False,
                                        members=[MemberSpec(made.name)])
        return str(made.pk)


def published_through(tenant: Tenant, connection_id: str) -> Dequeued:
    """A task step of ``tenant`` published as its admission chose: through its celery connection
    ``connection_id``. Its item, as delivered then."""
    from tests.conftest import broker_redis

    item = replace(queued_task_item(tenant), connection_id=connection_id,
                   admitted="the pool's only member" if connection_id else "")
    task_nodes.publish([item])
    broker_redis().delete("team", "team-a")  # the team's worker never takes it
    return item


def timed_out(tenant: Tenant, item: Dequeued) -> StepRun:
    """The item's lease, its step's timeout, ended with no outcome: the reaper returned it, and a
    publisher takes it again. Its step then."""
    from datetime import timedelta

    from django.utils import timezone

    with tenant_context(tenant):
        StepRun.objects.filter(pk=item.payload["step_id"]).update(started_at=timezone.now() - timedelta(seconds=31))
    task_nodes.publish([replace(item, delivery=item.delivery + 1)])
    with tenant_context(tenant):
        return StepRun.objects.get(pk=item.payload["step_id"])


def test_a_published_task_steps_trace_names_the_connection_its_message_went_through(tenant_a):
    """Where a task went is in its step's trace as soon as it is sent, before any outcome: it is what
    a timeout is blamed on."""
    connection_id = celery_connection(tenant_a[0])
    item = published_through(tenant_a[0], connection_id)
    with tenant_context(tenant_a[0]):
        step = StepRun.objects.get(pk=item.payload["step_id"])
    assert step.status == "running"
    assert step.routing["connection"] == {"id": connection_id, "name": "team-a"}
    assert step.routing["admitted"] == "the pool's only member"
    assert (step.routing["queue"], step.routing["task"]["queue"]) == ("team-a", "team")  # the connection's


def test_a_task_step_that_times_out_counts_against_its_connections_breaker(tenant_a, redis_client, settings):
    """No outcome within the timeout (the connection's workers are gone, or stuck) is a failure of the
    worker group the message went to: enough of them in a row open its breaker, so a failover pool
    sends the retries to its next member."""
    from scheduling.circuit import breaker_key

    settings.DUCTOR_BREAKER_FAILURES = 2
    tenant = tenant_a[0]
    connection_id = celery_connection(tenant)
    with tenant_context(tenant):
        key = breaker_key(connection_id)

    step = timed_out(tenant, published_through(tenant, connection_id))
    assert (step.status, step.error["code"]) == ("failed", "timeout")
    assert (int(redis_client.hget(key, "failures") or 0), redis_client.hget(key, "open_until")) == (1, None)
    timed_out(tenant, published_through(tenant, connection_id))
    assert redis_client.hget(key, "open_until") is not None  # open: admission passes it over


def test_a_task_step_sent_through_no_connection_feeds_no_breaker_when_it_times_out(tenant_a, redis_client):
    step = timed_out(tenant_a[0], published_through(tenant_a[0], ""))
    assert (step.status, step.error["code"]) == ("failed", "timeout")
    assert (step.routing["connection"], step.routing["queue"]) == (None, "team")  # the catalog's
    assert list(redis_client.scan_iter(match="*breaker*")) == []


def test_an_outcome_after_the_timeout_counts_once_as_the_timeout(tenant_a, redis_client):
    """A result that comes after the timeout does not close the breaker the timeout counted against:
    the worker group did not answer in time."""
    from scheduling.circuit import breaker_key

    connection_id = celery_connection(tenant_a[0])
    item = published_through(tenant_a[0], connection_id)
    with tenant_context(tenant_a[0]):
        key = breaker_key(connection_id)
    step = StepRun(pk=item.payload["step_id"])
    task_succeeded.apply(args=[{"sum": 1}], kwargs={"tenant_id": str(tenant_a[0].pk), **ids(step),
                                                    "connection_id": connection_id,
                                                    "deadline": time.time() - 0.5}).get()
    assert status_of(tenant_a[0], step) == "failed"
    assert int(redis_client.hget(key, "failures") or 0) == 1


@pytest.mark.parametrize("serializer", ["pickle", "msgpack", "yaml"])
def test_a_team_app_that_sends_its_messages_in_another_format_sends_the_callbacks_as_json(
        tenant_a, monkeypatch, serializer):
    """Ductor's results workers take JSON alone. The team's worker publishes a callback with its
    app's ``task_serializer`` unless the callback names one: the callbacks name JSON, so that a team
    whose app speaks pickle or msgpack does not lose every success to a refused message."""
    from celery import Celery, signature

    item = queued_task_item(tenant_a[0])
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(task_nodes.broker_app("default"), "send_task", lambda *args, **kwargs: sent.append(kwargs))
    task_nodes.publish([item])
    (message,) = sent

    team = Celery("team", broker="memory://", set_as_current=False)
    team.conf.task_serializer = serializer
    published: list[str] = []
    monkeypatch.setattr(team.amqp, "send_task_message",
                        lambda producer, name, msg, **options: published.append(options["serializer"]))
    link, link_error = (json.loads(json.dumps(message[name])) for name in ("link", "link_error"))
    signature(link, app=team).apply_async(({"sum": 3},))
    signature(link_error, app=team).apply_async(("task-id",))

    assert published == ["json", "json"]


@pytest.mark.parametrize("team_conf", [
    pytest.param({"task_create_missing_queues": False, "task_default_queue": "team"}, id="no-missing-queues"),
    pytest.param({"task_routes": {"*": {"queue": "elsewhere", "exchange": "elsewhere", "routing_key": "elsewhere"}}},
                 id="routes-everything-elsewhere"),
    pytest.param({"task_routes": {"*": {"queue": "elsewhere"}}, "task_default_queue": "team"}, id="routes-by-queue"),
])
def test_the_callbacks_reach_ductor_results_whatever_the_team_app_routes_and_declares(tenant_a, team_conf):
    """The team's worker publishes the callbacks with its own app: one that creates no queue it does
    not list (``task_create_missing_queues=False``), or routes every task to its own exchange, still
    sends them into ``ductor.results``, where Ductor's results workers take them."""
    import base64

    from celery import Celery, signature
    from django.conf import settings

    from ductor_project.celery import RESULTS_QUEUE
    from tests.conftest import broker_redis

    broker = broker_redis()
    broker.delete("team", "elsewhere", RESULTS_QUEUE)
    item = queued_task_item(tenant_a[0])
    task_nodes.publish([item])
    message = json.loads(broker.rpop("team"))  # as the team's worker takes it
    _args, _kwargs, embed = json.loads(base64.b64decode(message["body"]))
    team = Celery("team", broker=settings.CELERY_BROKER_URL, set_as_current=False)
    team.conf.update(team_conf)
    try:
        signature(embed["callbacks"][0], app=team).apply_async(({"sum": 3},))
        signature(embed["errbacks"][0], app=team).apply_async(("task-id",))
    finally:
        team.close()

    names = [json.loads(broker.rpop(RESULTS_QUEUE) or "{}").get("headers", {}).get("task") for _ in range(2)]
    assert names == ["ductor.task_succeeded", "ductor.task_failed"]
    assert broker.llen("elsewhere") == 0


@pytest.mark.parametrize("queue", ["unacked", "1:g:plans:version"])
def test_a_connection_stored_with_a_reserved_key_as_its_queue_sends_nothing_there(tenant_a, queue):
    """A connection stored before such names were refused, naming as its queue a key the broker keeps
    for something else (kombu's unacked messages, which every team worker that emulates acks writes;
    Ductor's cache): nothing is pushed there, which would have made it a list (a worker dies on
    ``WRONGTYPE``, every tenant's read of the cache fails), and the step fails for good."""
    from scheduling.models import Connection
    from tests.conftest import broker_redis

    broker = broker_redis()
    broker.delete(queue)
    connection_id = celery_connection(tenant_a[0], "team-a")
    with tenant_context(tenant_a[0]):
        stored = Connection.objects.get(pk=connection_id)
        stored.config = {"queue": queue, "broker": "default"}
        stored.save()  # as it was stored then: unchecked
    item = replace(queued_task_item(tenant_a[0]), connection_id=connection_id)
    task_nodes.publish([item])
    with tenant_context(tenant_a[0]):
        step = StepRun.objects.get(pk=item.payload["step_id"])
    assert (step.status, step.error["code"], step.error["queue"]) == ("failed", "routing_denied", queue)
    assert step.error["retryable"] is False
    assert broker.type(queue) == b"none"


def test_a_tenant_cannot_send_its_tasks_to_a_queue_the_catalog_keeps_for_other_tenants(tenant_a, tenant_b):
    """``beta-dedicated`` takes the tasks of an entry open to tenant B alone: tenant A's connection to it
    sends nothing there (its task would run on the workers kept for B), and its step fails for good;
    B's own connection to it works, as does A's to a queue no entry names."""
    from tests.conftest import broker_redis

    TaskCatalogEntry.objects.create(name="team.ledger", queue="beta-dedicated", tenants=[tenant_b[0].slug])
    broker = broker_redis()
    broker.delete("beta-dedicated")

    item = replace(queued_task_item(tenant_a[0]), connection_id=celery_connection(tenant_a[0], "beta-dedicated"))
    task_nodes.publish([item])
    with tenant_context(tenant_a[0]):
        step = StepRun.objects.get(pk=item.payload["step_id"])
    assert (step.status, step.error["code"], step.error["queue"]) == ("failed", "routing_denied", "beta-dedicated")
    assert step.error["retryable"] is False
    assert broker.llen("beta-dedicated") == 0

    theirs = replace(queued_task_item(tenant_b[0]), connection_id=celery_connection(tenant_b[0], "beta-dedicated"))
    task_nodes.publish([theirs])
    assert status_of(tenant_b[0], StepRun(pk=theirs.payload["step_id"])) == "running"
    assert broker.llen("beta-dedicated") == 1
    broker.delete("beta-dedicated")


def test_the_log_line_of_an_outcome_discarded_names_its_run(tenant_b, logged):
    """A task node's outcome comes back on a results worker, outside the delivery of any item of its
    run: the line that says it was discarded names the run all the same, for a search by ``run_id``."""
    step = running_task_step(tenant_b[0])
    task_succeeded.apply(args=[{"sum": 1}], kwargs={"tenant_id": str(tenant_b[0].pk), **ids(step),
                                                    "deadline": time.time() - 0.5}).get()
    (line,) = [line for line in logged.json() if line["event"] == "step_result_discarded"]
    assert (line["run_id"], line["step_id"], line["tenant_id"]) == (str(step.run_id), str(step.pk),
                                                                    str(tenant_b[0].pk))
