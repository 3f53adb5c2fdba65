"""A workflow's ``timeout_s``: its runs fail with ``run_timed_out`` once it has passed since their
start (or their retry), in this process: the spec's field, the wake-up (``tick.run_timeout``) and
what it leaves alone. End to end, with the coordinator: ``test_engine_e2e``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ductor_project.core.context import tenant_context
from scheduling import fair_queue
from tenants.models import Tenant
from tests.conftest import api_client, error_code
from workflows import services
from workflows.engine.reconcile import reconcile_runs
from workflows.engine.tick import RUN_TIMEOUT, run_timeout, tick
from workflows.models import StepRun, WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_client")]

NAP = {"id": "nap", "type": "sleep", "duration_s": 600}


def sleeping_run(tenant: Tenant, timeout_s: float | None = 60, started_s_ago: float = 0) -> WorkflowRun:
    """A run of ``tenant`` sleeping for ten minutes, bounded by ``timeout_s``, started that long ago."""
    spec: dict[str, Any] = {"nodes": [NAP]}
    if timeout_s is not None:
        spec["timeout_s"] = timeout_s
    with tenant_context(tenant):
        services.workflow_put(name="w", spec=spec)
        run, _ = services.run_start(workflow="w")
        past = timezone.now() - timedelta(seconds=started_s_ago)
        WorkflowRun.objects.filter(pk=run.pk).update(started_at=past, created_at=past)
        return WorkflowRun.objects.get(pk=run.pk)


def fire(tenant: Tenant, run: WorkflowRun) -> WorkflowRun:
    with tenant_context(tenant):
        run_timeout(str(run.pk), {})
        return WorkflowRun.objects.get(pk=run.pk)


@pytest.mark.parametrize("value", [0, -1, "60", True, None, 366 * 86_400 + 1,
                                   pytest.param(10**400, id="past-a-float")])
def test_a_bad_timeout_s_is_refused_naming_the_field(tenant_a, value):
    response = api_client(tenant_a[1]).post("/api/v1/workflows", {"name": "w", "spec": {
        "nodes": [NAP], "timeout_s": value}}, format="json")
    assert response.status_code == 400
    assert error_code(response) == "invalid"
    assert "spec.timeout_s" in response.json()["error"]["details"]


def test_the_run_timed_out_message_writes_a_long_timeout_in_whole_seconds(tenant_a):
    thirty_days = 30 * 86_400
    run = fire(tenant_a[0], sleeping_run(tenant_a[0], timeout_s=thirty_days, started_s_ago=thirty_days + 1))
    assert run.error["error"]["message"] == "the run went on past its timeout_s of 2592000 s"


def test_a_run_past_its_timeout_fails_and_its_active_steps_are_cancelled(tenant_a):
    run = fire(tenant_a[0], sleeping_run(tenant_a[0], timeout_s=60, started_s_ago=61))
    assert run.status == "failed"
    assert run.error == {"node": None, "attempt": None, "error": {
        "code": "run_timed_out", "retryable": False, "message": "the run went on past its timeout_s of 60 s"}}
    with tenant_context(tenant_a[0]):
        assert StepRun.objects.get(run=run).status == "cancelled"


def test_a_run_asked_to_cancel_whose_timeout_comes_first_ends_cancelled(tenant_a):
    """The cancel was asked first: the run ends as it asked, not failed with a cancel still pending,
    which a retry of the run would carry out at once."""
    run = sleeping_run(tenant_a[0], timeout_s=60, started_s_ago=61)
    with tenant_context(tenant_a[0]):
        services.run_cancel(run=run)

    run = fire(tenant_a[0], run)  # before the cancel's own wake-up

    assert (run.status, run.error) == ("cancelled", None)
    with tenant_context(tenant_a[0]):
        assert StepRun.objects.get(run_id=run.pk).status == "cancelled"


def test_a_run_within_its_timeout_goes_on(tenant_a):
    run = fire(tenant_a[0], sleeping_run(tenant_a[0], timeout_s=60, started_s_ago=30))
    assert run.status == "running"


def test_a_run_without_a_timeout_or_that_ended_is_left_alone(tenant_a):
    unbounded = fire(tenant_a[0], sleeping_run(tenant_a[0], timeout_s=None, started_s_ago=10_000))
    assert unbounded.status == "running"
    ended = sleeping_run(tenant_a[0], timeout_s=60, started_s_ago=61)
    with tenant_context(tenant_a[0]):
        WorkflowRun.objects.filter(pk=ended.pk).update(status="succeeded")
    assert fire(tenant_a[0], ended).status == "succeeded"


def test_a_retried_run_has_its_timeout_again_from_the_retry(tenant_a):
    tenant = tenant_a[0]
    run = fire(tenant, sleeping_run(tenant, timeout_s=60, started_s_ago=61))
    assert run.status == "failed"
    with tenant_context(tenant):
        retried = services.run_retry(run=run)
    assert retried.status == "running"
    assert fire(tenant, retried).status == "running"  # 61 s since its start, none since its retry


def test_a_child_that_succeeded_before_the_timeout_is_kept_and_a_retry_does_not_run_it_again(tenant_a):
    """The child's end wakes its parent, whose tick has not come when the deadline does."""
    tenant = tenant_a[0]
    with tenant_context(tenant):
        services.workflow_put(name="leaf", spec={"nodes": [{"id": "w", "type": "wait_for_event", "event": "go"}],
                                                 "output": "$nodes.w.output"})
        services.workflow_put(name="parent", spec={"timeout_s": 60, "output": "$nodes.kid.output", "nodes": [
            {"id": "kid", "type": "subworkflow", "workflow": "leaf"}]})
        parent, _ = services.run_start(workflow="parent")
        child = WorkflowRun.objects.get(parent_run_id=parent.pk)
        tick(child.pk)
        services.run_signal(child.pk, name="go", payload={"paid": True})
        tick(child.pk)
        assert WorkflowRun.objects.get(pk=child.pk).status == "succeeded"
        past = timezone.now() - timedelta(seconds=61)
        WorkflowRun.objects.filter(pk=parent.pk).update(started_at=past, created_at=past)

    ended = fire(tenant, parent)

    assert (ended.status, ended.error["error"]["code"]) == ("failed", "run_timed_out")
    with tenant_context(tenant):
        kid = StepRun.objects.get(run_id=parent.pk, node_id="kid")
        assert (kid.status, kid.output) == ("succeeded", {"paid": True})
        retried = services.run_retry(run=ended)
        assert (retried.status, retried.output) == ("succeeded", {"paid": True})
        assert WorkflowRun.objects.filter(parent_run_id=parent.pk).count() == 1  # not run again


def test_a_wait_a_signal_resumed_before_the_timeout_keeps_it_for_a_retry(tenant_a):
    tenant = tenant_a[0]
    with tenant_context(tenant):
        services.workflow_put(name="w", spec={"timeout_s": 60, "output": "$nodes.paid.output", "nodes": [
            {"id": "paid", "type": "wait_for_event", "event": "order.paid"}]})
        run, _ = services.run_start(workflow="w")
        services.run_signal(run.pk, name="order.paid", payload={"amount": 12})
        past = timezone.now() - timedelta(seconds=61)
        WorkflowRun.objects.filter(pk=run.pk).update(started_at=past, created_at=past)

    ended = fire(tenant, run)

    assert ended.status == "failed"
    with tenant_context(tenant):
        retried = services.run_retry(run=ended)
    assert (retried.status, retried.output) == ("succeeded", {"amount": 12})


def test_the_wake_up_of_another_tenants_run_changes_nothing(tenant_a, tenant_b):
    victim = sleeping_run(tenant_b[0], timeout_s=60, started_s_ago=61)
    with tenant_context(tenant_a[0]):
        run_timeout(str(victim.pk), {})
    with tenant_context(tenant_b[0]):
        assert WorkflowRun.objects.get(pk=victim.pk).status == "running"


def test_timeout_s_is_kept_in_the_version(tenant_a):
    with tenant_context(tenant_a[0]):
        version, _ = services.workflow_put(name="w", spec={"nodes": [NAP], "timeout_s": 90})
    assert version.spec["timeout_s"] == 90


def run_timeout_pending(tenant: Tenant, run: WorkflowRun) -> bool:
    return fair_queue.pending([(Tenant.system(), f"wake:{tenant.pk}:{RUN_TIMEOUT}:{run.pk}")])[0]


def test_the_reconciler_arms_a_runs_timeout_again_after_redis_lost_it(tenant_a, redis_client):
    run = sleeping_run(tenant_a[0], timeout_s=60)
    assert run_timeout_pending(tenant_a[0], run)  # armed by its first tick
    redis_client.flushdb()  # the wake-up is gone with everything else
    assert not run_timeout_pending(tenant_a[0], run)

    reconcile_runs(full=True)

    assert run_timeout_pending(tenant_a[0], run)
