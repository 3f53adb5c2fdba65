"""Retrying many failed runs at once (``POST /api/v1/runs/retry``): by ids and the run list's filters,
the failed root runs only, a bounded batch a call, each as the retry of one run, within the tenant.
The engine is driven in this process (``test_retry_rerun``)."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from ductor_project.core.context import tenant_context
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.conftest import api_client, error_code
from tests.workflows.test_api import assert_invalid
from tests.workflows.test_cancel_many import admin_as
from tests.workflows.test_retry_rerun import DIAMOND, attempts, node, put, run_step, start, status
from workflows import services
from workflows.models import RunEvent, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tenant(redis_client: Any, tenant_a: tuple[Tenant, str]) -> Tenant:
    return tenant_a[0]


def failed(tenant: Tenant, name: str = "diamond", **start_fields: Any) -> WorkflowRun:
    """A run of the diamond (``test_retry_rerun``) whose node b failed, and so the run."""
    with tenant_context(tenant):
        run, _ = services.run_start(workflow=name, input={"order": 1}, **start_fields)
    for node_id in ("a", "c", "b"):
        run_step(tenant, run, node_id)
    assert status(tenant, run) == "failed"
    return run


def retry_many(client: APIClient, **body: Any) -> dict[str, Any]:
    response = client.post("/api/v1/runs/retry", body, format="json")
    assert response.status_code == 200, response.content
    return dict(response.json())


def test_the_failed_runs_that_match_are_retried_once_each_and_finish(tenant, client_a):
    put(tenant, DIAMOND)
    put(tenant, DIAMOND, name="other")
    acme = [failed(tenant, fairness_key="acme", tags=["eu"]) for _ in range(2)]
    globex = failed(tenant, fairness_key="globex", tags=["eu"])
    elsewhere = failed(tenant, "other", fairness_key="acme", tags=["eu"])
    running = start(tenant)

    answer = retry_many(client_a, workflow="diamond", fairness_key="acme", tag=["eu"])

    assert answer == {"retried": 2, "runs": [str(run.pk) for run in acme], "more": False}  # oldest first
    assert retry_many(client_a, workflow="diamond", fairness_key="acme") == {"retried": 0, "runs": [], "more": False}
    for run in acme:
        assert attempts(tenant, run)["b"] == [(1, "failed"), (2, "queued")]  # b again; a and c kept
        assert attempts(tenant, run)["c"] == [(1, "succeeded")]
        run_step(tenant, run, "b")
        run_step(tenant, run, "d")
        assert status(tenant, run) == "succeeded"
    with tenant_context(tenant):
        assert RunEvent.objects.filter(type="retried").count() == 2  # once each
    assert [status(tenant, run) for run in (globex, elsewhere, running)] == ["failed", "failed", "running"]


def test_by_ids_a_call_takes_at_most_its_limit_and_says_when_more_are_left(tenant, client_a):
    put(tenant, DIAMOND)
    runs = [str(failed(tenant).pk) for _ in range(3)]

    first = retry_many(client_a, ids=runs, limit=2)
    second = retry_many(client_a, ids=runs, limit=2)

    assert first == {"retried": 2, "runs": runs[:2], "more": True}
    assert second == {"retried": 1, "runs": runs[2:], "more": False}


def test_a_child_run_is_left_to_its_root(tenant, client_a):
    """A sub-workflow's child that failed is not taken, by id or by filter: retrying its root starts its
    node again, as the retry of one run has it."""
    put(tenant, {"nodes": [node("boom", "fail")]}, name="child")
    put(tenant, {"nodes": [{"id": "sub", "type": "subworkflow", "workflow": "child"}]}, name="parent")
    parent = start(tenant, "parent")
    with tenant_context(tenant):
        child = WorkflowRun.objects.get(parent_run_id=parent.pk)
        WorkflowRun.objects.filter(pk=child.pk).update(status="failed")

    assert retry_many(client_a, ids=[str(child.pk)]) == {"retried": 0, "runs": [], "more": False}
    assert retry_many(client_a, workflow="child") == {"retried": 0, "runs": [], "more": False}
    assert status(tenant, child) == "failed"


def test_another_tenant_s_failed_runs_are_never_retried_by_id_or_by_filter(tenant, client_a, tenant_b):
    theirs_tenant = tenant_b[0]
    put(theirs_tenant, DIAMOND)
    with tenant_context(theirs_tenant):
        run, _ = services.run_start(workflow="diamond", input={"order": 1}, fairness_key="acme")
    for node_id in ("a", "c", "b"):
        run_step(theirs_tenant, run, node_id)
    put(tenant, DIAMOND)

    assert retry_many(client_a, ids=[str(run.pk)]) == {"retried": 0, "runs": [], "more": False}
    assert retry_many(client_a, workflow="diamond", fairness_key="acme") == {"retried": 0, "runs": [], "more": False}
    assert status(theirs_tenant, run) == "failed"
    with tenant_context(theirs_tenant):
        assert not RunEvent.objects.filter(run_id=run.pk, type="retried").exists()


def test_a_retry_of_many_without_ids_or_filter_and_bad_fields_are_refused_naming_the_field(tenant, client_a):
    put(tenant, DIAMOND)
    run = failed(tenant)

    assert_invalid(client_a.post("/api/v1/runs/retry", {}, format="json"), "ids", "a retry of every run")
    assert_invalid(client_a.post("/api/v1/runs/retry", {"limit": 5}, format="json"), "ids")
    assert_invalid(client_a.post("/api/v1/runs/retry", {"ids": ["nope"]}, format="json"), "ids[0]")
    assert_invalid(client_a.post("/api/v1/runs/retry", {"workflow": "diamond", "limit": 501}, format="json"), "limit")
    assert_invalid(client_a.post("/api/v1/runs/retry", {"workflow": "diamond", "limit": 0}, format="json"), "limit")
    unknown = client_a.post("/api/v1/runs/retry", {"workflow": "diamond", "status": "failed"}, format="json")
    assert (unknown.status_code, error_code(unknown)) == (400, "unknown_field")
    assert status(tenant, run) == "failed"


def test_a_read_only_key_cannot_retry_runs(tenant):
    put(tenant, DIAMOND)
    run = failed(tenant)
    with tenant_context(tenant):
        _, raw = tenant_services.api_key_create(name="reader", scopes=["read"])

    refused = api_client(raw).post("/api/v1/runs/retry", {"ids": [str(run.pk)]}, format="json")

    assert refused.status_code == 403
    assert status(tenant, run) == "failed"


def test_staff_retry_the_selected_failed_runs_of_their_tenant_in_the_admin(tenant, tenant_b):
    put(tenant, DIAMOND)
    put(tenant_b[0], DIAMOND)
    ours = [failed(tenant) for _ in range(2)]
    still_running = start(tenant)
    with tenant_context(tenant_b[0]):
        theirs, _ = services.run_start(workflow="diamond", input={"order": 1})
    for node_id in ("a", "c", "b"):
        run_step(tenant_b[0], theirs, node_id)

    done = admin_as("owner-r", tenant, "owner").post(
        reverse("admin:workflows_workflowrun_changelist"),
        {"action": "retry_selected", "_selected_action": [str(run.pk) for run in (*ours, still_running, theirs)]},
        follow=True)

    assert b"2 run(s) retried" in done.content
    assert [status(tenant, run) for run in ours] == ["running", "running"]
    assert status(tenant_b[0], theirs) == "failed"
