"""``retry.non_retryable``: the failures a node's retry policy does not try again, named by their
error code or, for a task, their exception's type (alone or with its module)."""

from __future__ import annotations

from typing import Any

import pytest

from ductor_project.core.context import tenant_context
from tenants.models import Tenant
from tests.conftest import api_client, error_code
from workflows import services
from workflows.engine import timers
from workflows.models import StepRun, TaskCatalogEntry
from workflows.spec import Retry
from workflows.tasks import task_failed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_client")]


def failing_step(tenant: Tenant, non_retryable: list[str]) -> StepRun:
    """A running first attempt of a task node of ``tenant`` whose policy tries three times."""
    TaskCatalogEntry.objects.get_or_create(name="team.add", defaults={"queue": "team"})
    retry = {"max_attempts": 3, "backoff_s": 0.1, "non_retryable": non_retryable}
    with tenant_context(tenant):
        services.workflow_put(name="w", spec={"nodes": [{"id": "t", "type": "task", "task": "team.add",
                                                         "retry": retry}]})
        run, _ = services.run_start(workflow="w")
        step = StepRun.objects.get(run=run)
        StepRun.objects.filter(pk=step.pk).update(status=StepRun.Status.RUNNING)
        return step


def attempts_after(tenant: Tenant, step: StepRun, error: dict[str, Any]) -> list[tuple[int, str]]:
    task_failed.apply(args=["celery-id"], kwargs={"tenant_id": str(tenant.pk), "step_id": str(step.pk),
                                                  "item_id": f"step:{step.pk}", "delivery": 1, "error": error}).get()
    with tenant_context(tenant):
        return list(StepRun.objects.filter(run_id=step.run_id).order_by("attempt").values_list("attempt", "status"))


@pytest.mark.parametrize(("names", "retried"), [
    ([], True),
    (["CardDeclined"], False),
    (["billing.errors.CardDeclined"], False),
    (["task_failed"], False),
    (["other.CardDeclined", "ValueError"], True),  # another module's type of that name is not it
])
def test_a_task_s_exception_named_by_non_retryable_is_not_tried_again(tenant_a, names, retried):
    step = failing_step(tenant_a[0], names)
    attempts = attempts_after(tenant_a[0], step, {"type": "CardDeclined", "module": "billing.errors",
                                                  "message": "card declined"})
    assert attempts == ([(1, "failed"), (2, "scheduled")] if retried else [(1, "failed")])


def test_a_timeout_named_by_non_retryable_is_not_tried_again(tenant_a):
    step = failing_step(tenant_a[0], ["timeout"])
    with tenant_context(tenant_a[0]):
        timers.step_timeout(str(step.pk), {})
        attempts = list(StepRun.objects.filter(run_id=step.run_id).values_list("attempt", "status"))
    assert attempts == [(1, "failed")]


def test_a_failure_that_is_not_retryable_stays_so_whatever_the_list():
    assert not Retry(non_retryable=()).retries({"code": "task_failed", "retryable": False})
    assert Retry(non_retryable=("timeout",)).retries({"code": "server_error", "retryable": True})
    assert not Retry(non_retryable=("timeout",)).retries(None)


@pytest.mark.parametrize(("value", "field"), [
    ("CardDeclined", "spec.nodes[0].retry.non_retryable"),
    (["ok", 5], "spec.nodes[0].retry.non_retryable[1]"),
    (["no spaces"], "spec.nodes[0].retry.non_retryable[0]"),
    (["trailing."], "spec.nodes[0].retry.non_retryable[0]"),
    (["ValueError\n"], "spec.nodes[0].retry.non_retryable[0]"),  # a name and a line break are not a name
    (["x"] * 51, "spec.nodes[0].retry.non_retryable"),
])
def test_a_bad_non_retryable_is_refused_naming_the_field(tenant_a, value, field):
    response = api_client(tenant_a[1]).post("/api/v1/workflows", {"name": "w", "spec": {"nodes": [
        {"id": "e", "type": "action", "action": "echo", "retry": {"non_retryable": value}}]}}, format="json")
    assert response.status_code == 400
    assert error_code(response) == "invalid"
    assert field in response.json()["error"]["details"]


def test_non_retryable_is_kept_without_repeats_and_left_out_when_empty(tenant_a):
    with tenant_context(tenant_a[0]):
        kept, _ = services.workflow_put(name="w", spec={"nodes": [
            {"id": "e", "type": "action", "action": "echo",
             "retry": {"max_attempts": 2, "non_retryable": ["timeout", "ValueError", "timeout"]}}]})
        plain, _ = services.workflow_put(name="v", spec={"nodes": [
            {"id": "e", "type": "action", "action": "echo", "retry": {"non_retryable": []}}]})
    assert kept.spec["nodes"][0]["retry"]["non_retryable"] == ["timeout", "ValueError"]
    assert "non_retryable" not in plain.spec["nodes"][0]["retry"]
