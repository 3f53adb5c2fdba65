"""Cancelling many runs at once (``POST /api/v1/runs/cancel``): by ids and the run list's filters,
the active runs only, a bounded batch a call, within the tenant. Real PostgreSQL and Redis, no
workers: a test ticks a run itself (see ``test_api``)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from ductor_project.core.context import tenant_context
from tenants import services as tenant_services
from tests.conftest import api_client, error_code
from tests.tenants.helpers import staff_client
from tests.waiting import until_another_waits_on_a_lock
from tests.workflows.test_api import assert_invalid, create, start, tick
from workflows.models import RunEvent, WorkflowRun

pytestmark = pytest.mark.usefixtures("redis_client")


def cancel(client: APIClient, **body: Any) -> dict[str, Any]:
    response = client.post("/api/v1/runs/cancel", body, format="json")
    assert response.status_code == 200, response.content
    return dict(response.json())


def test_the_active_runs_that_match_are_asked_to_stop_once_and_end_cancelled(client_a, tenant_a):
    create(client_a, "w")
    create(client_a, "other")
    acme = [start(client_a, workflow="w", fairness_key="acme", tags=["eu"]) for _ in range(3)]
    finished = start(client_a, workflow="w", fairness_key="acme", tags=["eu"])
    globex = start(client_a, workflow="w", fairness_key="globex", tags=["eu"])
    elsewhere = start(client_a, workflow="other", fairness_key="acme", tags=["eu"])
    with tenant_context(tenant_a[0]):
        WorkflowRun.objects.filter(pk=finished["id"]).update(status="succeeded")

    answer = cancel(client_a, workflow="w", fairness_key="acme", tag=["eu"])

    assert answer == {"cancelled": 3, "runs": [run["id"] for run in acme], "more": False}  # oldest first
    assert cancel(client_a, workflow="w", fairness_key="acme") == {"cancelled": 0, "runs": [], "more": False}
    with tenant_context(tenant_a[0]):
        requested = set(WorkflowRun.objects.filter(cancel_requested=True).values_list("id", flat=True))
        assert {str(run_id) for run_id in requested} == {run["id"] for run in acme}
        assert RunEvent.objects.filter(type="cancel_requested").count() == 3  # once each
    for run in acme:
        tick(tenant_a[0], run["id"])
        assert client_a.get(f"/api/v1/runs/{run['id']}").json()["status"] == "cancelled"
    for run, status in ((finished, "succeeded"), (globex, "running"), (elsewhere, "running")):
        assert client_a.get(f"/api/v1/runs/{run['id']}").json()["status"] == status


def test_by_ids_a_call_takes_at_most_its_limit_and_says_when_more_are_left(client_a):
    create(client_a, "w")
    runs = [start(client_a, workflow="w")["id"] for _ in range(3)]
    left_alone = start(client_a, workflow="w")["id"]

    first = cancel(client_a, ids=runs, limit=2)
    second = cancel(client_a, ids=runs, limit=2)

    assert first == {"cancelled": 2, "runs": runs[:2], "more": True}
    assert second == {"cancelled": 1, "runs": runs[2:], "more": False}
    assert client_a.get(f"/api/v1/runs/{left_alone}").json()["cancel_requested"] is False


def test_another_tenant_s_runs_are_never_cancelled_by_id_or_by_filter(client_a, client_b, tenant_b):
    create(client_b, "w")
    theirs = start(client_b, workflow="w", fairness_key="acme")
    create(client_a, "w")

    assert cancel(client_a, ids=[theirs["id"]]) == {"cancelled": 0, "runs": [], "more": False}
    assert cancel(client_a, workflow="w", fairness_key="acme") == {"cancelled": 0, "runs": [], "more": False}
    assert client_b.get(f"/api/v1/runs/{theirs['id']}").json()["cancel_requested"] is False
    with tenant_context(tenant_b[0]):
        assert not RunEvent.objects.filter(run_id=theirs["id"], type="cancel_requested").exists()


def test_a_cancel_without_ids_or_filter_and_bad_fields_are_refused_naming_the_field(client_a):
    create(client_a, "w")
    run = start(client_a, workflow="w")

    assert_invalid(client_a.post("/api/v1/runs/cancel", {}, format="json"), "ids", "at least one filter")
    assert_invalid(client_a.post("/api/v1/runs/cancel", {"limit": 5}, format="json"), "ids")
    assert_invalid(client_a.post("/api/v1/runs/cancel", {"ids": ["nope"]}, format="json"), "ids[0]")
    assert_invalid(client_a.post("/api/v1/runs/cancel", {"workflow": "w", "limit": 501}, format="json"), "limit")
    assert_invalid(client_a.post("/api/v1/runs/cancel", {"tag": "eu"}, format="json"), "tag")
    unknown = client_a.post("/api/v1/runs/cancel", {"workflow": "w", "status": "running"}, format="json")
    assert (unknown.status_code, error_code(unknown)) == (400, "unknown_field")
    assert client_a.get(f"/api/v1/runs/{run['id']}").json()["cancel_requested"] is False


def test_a_read_only_key_cannot_cancel_runs(client_a, tenant_a):
    create(client_a, "w")
    run = start(client_a, workflow="w")
    with tenant_context(tenant_a[0]):
        _, raw = tenant_services.api_key_create(name="reader", scopes=["read"])

    refused = api_client(raw).post("/api/v1/runs/cancel", {"ids": [run["id"]]}, format="json")

    assert refused.status_code == 403
    assert client_a.get(f"/api/v1/runs/{run['id']}").json()["cancel_requested"] is False


def admin_as(username: str, tenant: Any, role: str) -> Client:
    return staff_client(username, tenant, role, "workflows.view_workflowrun", "workflows.change_workflowrun")


def cancel_in_admin(client: Client, *ids: Any) -> Any:
    return client.post(reverse("admin:workflows_workflowrun_changelist"),
                       {"action": "cancel_selected", "_selected_action": [str(pk) for pk in ids]}, follow=True)


def test_staff_cancel_the_selected_runs_of_their_tenant_in_the_admin(client_a, client_b, tenant_a):
    create(client_a, "w")
    create(client_b, "w")
    ours = [start(client_a, workflow="w")["id"] for _ in range(2)]
    theirs = start(client_b, workflow="w")["id"]

    viewer = cancel_in_admin(admin_as("viewer-a", tenant_a[0], "viewer"), ours[0])
    assert b"run(s) asked to stop" not in viewer.content  # not an action of theirs: nothing is done
    assert client_a.get(f"/api/v1/runs/{ours[0]}").json()["cancel_requested"] is False
    done = cancel_in_admin(admin_as("owner-a", tenant_a[0], "owner"), *ours, theirs)

    assert b"2 run(s) asked to stop" in done.content
    assert all(client_a.get(f"/api/v1/runs/{run_id}").json()["cancel_requested"] for run_id in ours)
    assert client_b.get(f"/api/v1/runs/{theirs}").json()["cancel_requested"] is False


def test_a_run_that_continued_while_the_cancel_waited_for_it_has_its_successor_cancelled(
    transactional_db, tenant_a, monkeypatch
):
    """A ContinueAsNew loop: the cancel waits for the run its tick holds; the tick ends it as
    ``continued`` and starts its successor, which the cancel's first statement cannot see. Before,
    such a cancel asked no run to stop, and the loop went on."""
    import threading

    from django.db import connections, transaction

    from workflows import services

    tenant = tenant_a[0]
    with tenant_context(tenant):
        services.workflow_put(name="loop", spec={"nodes": [{"id": "a", "type": "action", "action": "noop"}]})
        first, _ = services.run_start(workflow="loop")
    holding, results = threading.Event(), {}

    def tick_that_continues() -> None:
        try:
            with tenant_context(tenant), transaction.atomic():
                locked = WorkflowRun.objects.select_for_update().get(pk=first.pk)
                holding.set()
                until_another_waits_on_a_lock()  # the cancel, for this run
                locked.status = WorkflowRun.Status.CONTINUED
                locked.save(update_fields=["status", "updated_at"])
                results["successor"], _ = services.run_start(workflow="loop")
        finally:
            connections.close_all()

    ticking = threading.Thread(target=tick_that_continues)
    ticking.start()
    assert holding.wait(15)
    with tenant_context(tenant):
        cancelled, more = services.run_cancel_many(filters={"workflow": "loop"}, limit=10)
    ticking.join(30)

    assert ([run.pk for run in cancelled], more) == ([results["successor"].pk], False)
    with tenant_context(tenant):
        assert WorkflowRun.objects.get(pk=results["successor"].pk).cancel_requested
