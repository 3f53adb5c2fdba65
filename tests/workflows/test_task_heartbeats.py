"""Task nodes' heartbeats (``heartbeat_s``), in this process: the spec's field, the heartbeats
``ductor.task_heartbeat`` records (for the tenant it names only), the wake-up that times a silent
task out, and the progress a retry is published with. End to end with a team's worker:
``test_task_nodes_e2e``."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ductor_project.core.context import tenant_context
from scheduling import fair_queue
from scheduling.fair_queue import Dequeued
from tenants.models import Tenant
from tests.conftest import api_client, broker_redis, error_code
from workflows import services
from workflows.engine import task_nodes, timers
from workflows.engine.reconcile import reconcile_runs
from workflows.engine.statements import start_tasks
from workflows.engine.tick import tick
from workflows.models import RunEvent, StepRun, TaskCatalogEntry
from workflows.tasks import task_heartbeat

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_client")]


def node(**extra: Any) -> dict[str, Any]:
    return {"id": "t", "type": "task", "task": "team.add", **extra}


def running_task_step(tenant: Tenant, **extra: Any) -> StepRun:
    """A run of a one-task workflow of ``tenant`` (its node with ``extra``), its step running."""
    TaskCatalogEntry.objects.get_or_create(name="team.add", defaults={"queue": "team"})
    with tenant_context(tenant):
        services.workflow_put(name="w", spec={"nodes": [node(**extra)]})
        run, _ = services.run_start(workflow="w")
        step = StepRun.objects.get(run=run)
        StepRun.objects.filter(pk=step.pk).update(status=StepRun.Status.RUNNING, started_at=timezone.now())
        return StepRun.objects.get(pk=step.pk)


def beat(tenant: Tenant, step: StepRun, **kwargs: Any) -> None:
    task_heartbeat.apply(kwargs={"tenant_id": str(tenant.pk), "step_id": str(step.pk), **kwargs}).get()


def reread(tenant: Tenant, step: StepRun) -> StepRun:
    with tenant_context(tenant):
        return StepRun.objects.get(pk=step.pk)


# -- the spec ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "field", "words"), [
    ({"heartbeat_s": 0}, "heartbeat_s", "0 < x"),
    # Each heartbeat is a message on the results queue every tenant's outcomes share: a tenant does
    # not lift the bound on how often its tasks send them.
    ({"heartbeat_s": 0.001}, "heartbeat_s", "must be at least 1 s"),
    ({"heartbeat_s": "5"}, "heartbeat_s", "must be a number of seconds"),
    ({"heartbeat_s": True}, "heartbeat_s", "must be a number of seconds"),
    ({"heartbeat_s": 90, "timeout_s": 60}, "heartbeat_s", "at most the node's timeout_s (60 s)"),
    ({"heartbeat_s": 10**400}, "heartbeat_s", "must be a number of seconds"),  # past what a float holds
    ({"heartbeat_s": 5, "timeout_s": 10**400}, "timeout_s", "must be a number of seconds"),
])
def test_a_bad_heartbeat_s_is_refused_naming_the_field(tenant_a, extra, field, words):
    TaskCatalogEntry.objects.create(name="team.add", queue="team")
    response = api_client(tenant_a[1]).post("/api/v1/workflows", {"name": "w", "spec": {"nodes": [node(**extra)]}},
                                            format="json")
    assert response.status_code == 400
    assert error_code(response) == "invalid"
    details = response.json()["error"]["details"]
    assert words in " ".join(details[f"spec.nodes[0].{field}"])


def test_heartbeat_s_belongs_to_task_nodes_alone(tenant_a):
    response = api_client(tenant_a[1]).post("/api/v1/workflows", {"name": "w", "spec": {"nodes": [
        {"id": "e", "type": "action", "action": "echo", "heartbeat_s": 5}]}}, format="json")
    assert response.status_code == 400
    details = response.json()["error"]["details"]
    assert "is not allowed on a 'action' node" in " ".join(details["spec.nodes[0].heartbeat_s"])


def test_a_task_node_keeps_its_heartbeat_s_and_publishes_it(tenant_a):
    step = running_task_step(tenant_a[0], heartbeat_s=5, timeout_s=30)
    assert step.routing["task"]["heartbeat_s"] == 5
    with tenant_context(tenant_a[0]):
        version, _ = services.workflow_put(name="w2", spec={"nodes": [node(heartbeat_s=2.5)]})
    assert version.spec["nodes"][0]["heartbeat_s"] == 2.5


# -- heartbeats --------------------------------------------------------------------------------


def test_a_heartbeat_records_its_time_and_details_and_none_keeps_the_last(tenant_a):
    step = running_task_step(tenant_a[0], heartbeat_s=5)
    beat(tenant_a[0], step, details={"chunks": 2})
    first = reread(tenant_a[0], step)
    assert first.heartbeat_at is not None
    assert first.heartbeat_details == {"chunks": 2}
    beat(tenant_a[0], step)
    second = reread(tenant_a[0], step)
    assert second.heartbeat_at > first.heartbeat_at
    assert second.heartbeat_details == {"chunks": 2}


def test_a_heartbeat_naming_another_tenants_step_changes_nothing(tenant_a, tenant_b):
    victim = running_task_step(tenant_b[0], heartbeat_s=5)
    beat(tenant_a[0], victim, details={"forged": True})
    untouched = reread(tenant_b[0], victim)
    assert (untouched.heartbeat_at, untouched.heartbeat_details) == (None, None)


def test_a_heartbeat_with_no_tenant_is_refused_without_running(tenant_b):
    victim = running_task_step(tenant_b[0], heartbeat_s=5)
    result = task_heartbeat.apply(kwargs={"step_id": str(victim.pk), "details": {"forged": True}})
    assert result.state != "SUCCESS"
    assert reread(tenant_b[0], victim).heartbeat_at is None


@pytest.mark.parametrize("step_id", ["not-a-uuid", "00000000-0000-0000-0000-000000000000"])
def test_a_heartbeat_of_no_step_is_ignored(tenant_a, step_id):
    result = task_heartbeat.apply(kwargs={"tenant_id": str(tenant_a[0].pk), "step_id": step_id})
    assert result.state == "SUCCESS"


def test_a_heartbeat_of_an_attempt_that_ended_changes_nothing(tenant_a):
    step = running_task_step(tenant_a[0], heartbeat_s=5)
    with tenant_context(tenant_a[0]):
        StepRun.objects.filter(pk=step.pk).update(status=StepRun.Status.FAILED)
    beat(tenant_a[0], step, details={"chunks": 9})
    assert reread(tenant_a[0], step).heartbeat_details is None


@pytest.fixture
def told(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any], Any]]:
    """The remote control commands Ductor's broker app broadcasts (none is sent)."""
    from workflows.engine import brokers

    sent: list[tuple[str, dict[str, Any], Any]] = []
    monkeypatch.setattr(brokers.broker_app("default").control, "broadcast",
                        lambda command, arguments=None, destination=None, **_: sent.append(
                            (command, arguments or {}, destination)))
    return sent


@pytest.mark.parametrize("status", [StepRun.Status.CANCELLED, StepRun.Status.FAILED, StepRun.Status.SUCCEEDED])
def test_a_heartbeat_of_an_attempt_that_ended_is_answered_to_its_worker_alone(tenant_a, told, status):
    step = running_task_step(tenant_a[0], heartbeat_s=5)
    with tenant_context(tenant_a[0]):
        StepRun.objects.filter(pk=step.pk).update(status=status)
    beat(tenant_a[0], step, worker="team-1@host")
    assert told == [("ductor_cancel", {"task_id": str(step.pk)}, ["team-1@host"])]


def test_a_heartbeat_names_the_worker_on_the_attempt_s_trace_and_a_cancel_tells_that_worker_at_once(
        tenant_a, told):
    """The attempt's trace names where its task runs, from its first heartbeat; when the attempt ends
    (its run cancelled), its messages are revoked and that worker is told, without waiting for the
    task's next heartbeat."""
    step = running_task_step(tenant_a[0], heartbeat_s=5)
    with tenant_context(tenant_a[0]):
        start_tasks([str(step.pk)])  # its message sent
    beat(tenant_a[0], step, worker="team-1@host")
    assert reread(tenant_a[0], step).routing["worker"] == "team-1@host"
    assert told == []
    with tenant_context(tenant_a[0]):
        services.run_cancel(run=step.run)
        tick(step.run_id)
        assert StepRun.objects.get(pk=step.pk).status == "cancelled"
    revoke, cancel = told  # Celery's revoke is a broadcast too: to every worker of the broker
    assert (revoke[0], revoke[1]["task_id"], revoke[2]) == ("revoke", str(step.pk), None)
    assert cancel == ("ductor_cancel", {"task_id": str(step.pk)}, ["team-1@host"])


def test_a_heartbeat_of_a_running_attempt_or_from_no_named_worker_is_not_answered(tenant_a, told):
    step = running_task_step(tenant_a[0], heartbeat_s=5)
    beat(tenant_a[0], step, worker="team-1@host")
    with tenant_context(tenant_a[0]):
        StepRun.objects.filter(pk=step.pk).update(status=StepRun.Status.CANCELLED)
    beat(tenant_a[0], step)  # an SDK that names no worker
    assert told == []


def test_a_heartbeat_naming_another_tenants_ended_step_is_not_answered(tenant_a, tenant_b, told):
    victim = running_task_step(tenant_b[0], heartbeat_s=5)
    with tenant_context(tenant_b[0]):
        StepRun.objects.filter(pk=victim.pk).update(status=StepRun.Status.CANCELLED)
    beat(tenant_a[0], victim, worker="team-1@host")
    assert told == []


def test_details_over_the_plans_payload_limit_are_dropped_and_the_heartbeat_counts(tenant_a):
    step = running_task_step(tenant_a[0], heartbeat_s=5)
    beat(tenant_a[0], step, details={"chunks": 1})
    beat(tenant_a[0], step, details={"blob": "x" * (2 * 1024 * 1024)})
    kept = reread(tenant_a[0], step)
    assert kept.heartbeat_details == {"chunks": 1}
    assert kept.heartbeat_at is not None


# -- the wake-up -------------------------------------------------------------------------------


def test_a_task_silent_for_its_heartbeat_s_times_out_as_retryable(tenant_a):
    step = running_task_step(tenant_a[0], heartbeat_s=5)
    beat(tenant_a[0], step)
    with tenant_context(tenant_a[0]):
        StepRun.objects.filter(pk=step.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=6))
        timers.heartbeat_due(str(step.pk), {})
        ended = StepRun.objects.get(pk=step.pk)
        history = list(RunEvent.objects.filter(run_id=step.run_id).values_list("type", flat=True))
    assert (ended.status, ended.error["code"], ended.error["retryable"]) == ("failed", "timeout", True)
    assert "no heartbeat from the task within its heartbeat_s of 5 s" in ended.error["message"]
    assert "step_timed_out" in history


def test_a_task_that_beat_within_its_heartbeat_s_runs_on(tenant_a):
    step = running_task_step(tenant_a[0], heartbeat_s=5)
    beat(tenant_a[0], step)
    with tenant_context(tenant_a[0]):
        timers.heartbeat_due(str(step.pk), {})
    assert reread(tenant_a[0], step).status == "running"


def test_a_task_that_never_beat_is_left_to_its_timeout(tenant_a):
    """The heartbeat's clock starts with the task (its first heartbeat): a message still waiting in the
    team's queue is bounded by the node's timeout alone."""
    step = running_task_step(tenant_a[0], heartbeat_s=5)
    with tenant_context(tenant_a[0]):
        timers.heartbeat_due(str(step.pk), {})
    assert reread(tenant_a[0], step).status == "running"


# -- the retry ---------------------------------------------------------------------------------


def retry_of(tenant: Tenant, step: StepRun) -> StepRun:
    """The step's node's next attempt, queued (as its retry once its backoff ended)."""
    with tenant_context(tenant):
        StepRun.objects.filter(pk=step.pk).update(status=StepRun.Status.FAILED)
        return StepRun.objects.create(run_id=step.run_id, node_id=step.node_id, node_type=step.node_type, attempt=2,
                                      status=StepRun.Status.QUEUED, routing=step.routing, input=step.input)


def test_a_retry_is_started_with_the_progress_its_earlier_attempt_reported(tenant_a):
    step = running_task_step(tenant_a[0], heartbeat_s=5)
    beat(tenant_a[0], step, details={"chunks": 3})
    retry = retry_of(tenant_a[0], step)
    with tenant_context(tenant_a[0]):
        started = start_tasks([str(retry.pk)])
    assert started[str(retry.pk)].heartbeat_details == {"chunks": 3}


def test_a_first_attempt_has_no_progress_to_resume_from(tenant_a):
    step = running_task_step(tenant_a[0], heartbeat_s=5)
    with tenant_context(tenant_a[0]):
        StepRun.objects.filter(pk=step.pk).update(status=StepRun.Status.QUEUED)
        started = start_tasks([str(step.pk)])
    assert started[str(step.pk)].heartbeat_details is None


def test_the_retrys_message_carries_its_heartbeat_s_and_the_progress_to_resume_from(tenant_a):
    broker = broker_redis()
    broker.delete("team")
    step = running_task_step(tenant_a[0], heartbeat_s=5)
    beat(tenant_a[0], step, details={"chunks": 3})
    retry = retry_of(tenant_a[0], step)
    item = Dequeued(tenant_id=str(tenant_a[0].pk), item_id=f"step:{retry.pk}", tier="standard", partition="p",
                    payload={"kind": "task", "step_id": str(retry.pk), **retry.routing["task"]},
                    waited_ms=0, attempt=2, delivery=1, lease_until_ms=0)
    task_nodes.publish([item])
    message = json.loads(broker.rpop("team"))
    assert message["headers"]["ductor_heartbeat_s"] == 5
    assert message["headers"]["ductor_heartbeat_details"] == {"chunks": 3}
    _args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    assert kwargs == {}


def test_the_reconciler_arms_a_heartbeat_wake_up_again_after_redis_lost_it(tenant_a, redis_client):
    step = running_task_step(tenant_a[0], heartbeat_s=5)
    beat(tenant_a[0], step)  # the first: it arms the wake-up, which the later ones count on
    wake = f"wake:{tenant_a[0].pk}:heartbeat_due:{step.pk}"
    assert fair_queue.pending([(Tenant.system(), wake)]) == [True]
    redis_client.flushdb()

    reconcile_runs(full=True)

    assert fair_queue.pending([(Tenant.system(), wake)]) == [True]


def test_a_heartbeat_a_later_release_sent_with_more_arguments_is_recorded(tenant_a):
    step = running_task_step(tenant_a[0], heartbeat_s=5)
    beat(tenant_a[0], step, details={"done": 3}, added_by_a_later_release={"any": 1})
    assert reread(tenant_a[0], step).heartbeat_details == {"done": 3}
