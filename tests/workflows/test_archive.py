"""Archiving and deleting workflows, through the API on the real PostgreSQL and Redis: an archived
workflow starts nothing by any path and takes no version, leaves the plan's ``max_workflows``
count, lets its runs in flight finish and comes back when unarchived; a workflow is deleted only
while it has no run; another tenant's workflow is a 404 to all of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from ductor_project.core.context import tenant_context
from ductor_project.core.errors import Conflict
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.conftest import error_code
from tests.tenants.helpers import staff_client
from tests.waiting import in_a_thread, until_another_waits_on_a_lock
from workflows import services
from workflows.engine import tick as engine_tick
from workflows.models import EventTrigger, Schedule, StepRun, WorkflowDefinition, WorkflowRun, WorkflowVersion
from workflows.triggers import firing
from workflows.triggers import services as schedules

pytestmark = pytest.mark.usefixtures("redis_client")

FLOW = {"nodes": [{"id": "a", "type": "action", "action": "noop"}]}


def create(client: APIClient, name: str, code: int = 201) -> Any:
    response = client.post("/api/v1/workflows", {"name": name, "spec": FLOW}, format="json")
    assert response.status_code == code, response.content
    return response.json()


def archive(client: APIClient, name: str, verb: str = "archive", code: int = 200) -> Any:
    response = client.post(f"/api/v1/workflows/{name}/{verb}")
    assert response.status_code == code, response.content
    return response.json()


def names(client: APIClient, **params: str) -> list[str]:
    response = client.get("/api/v1/workflows", params)
    assert response.status_code == 200, response.content
    return [row["name"] for row in response.json()["results"]]


def assert_refused(response: Any, status: int, code: str, field: str) -> None:
    assert response.status_code == status, response.content
    assert error_code(response) == code, response.content
    assert field in response.json()["error"]["details"], response.content


def run_count(tenant: Tenant) -> int:
    with tenant_context(tenant):
        return WorkflowRun.objects.count()


def test_an_archived_workflow_is_listed_apart_and_refuses_every_start_and_every_new_version(client_a, tenant_a):
    create(client_a, "billing")
    create(client_a, "other")
    run = client_a.post("/api/v1/runs", {"workflow": "billing"}, format="json").json()
    first = archive(client_a, "billing")
    assert first["archived_at"] is not None
    assert archive(client_a, "billing")["archived_at"] == first["archived_at"]  # idempotent

    assert names(client_a) == ["other"]
    assert names(client_a, archived="true") == ["billing"]
    assert client_a.get("/api/v1/workflows/billing").json()["archived_at"] == first["archived_at"]
    assert_refused(client_a.get("/api/v1/workflows", {"archived": "maybe"}), 400, "invalid", "archived")

    before = run_count(tenant_a[0])
    assert_refused(client_a.post("/api/v1/runs", {"workflow": "billing"}, format="json"), 409, "conflict",
                   "workflow")
    bulk = client_a.post("/api/v1/runs/bulk", {"runs": [{"workflow": "other"}, {"workflow": "billing"}]},
                         format="json")
    assert_refused(bulk, 400, "invalid", "runs[1].workflow")
    assert "archived" in " ".join(bulk.json()["error"]["details"]["runs[1].workflow"])
    assert_refused(client_a.post(f"/api/v1/runs/{run['id']}/rerun", {}, format="json"), 409, "conflict", "workflow")
    assert run_count(tenant_a[0]) == before  # nothing started, not even the bulk's other run

    assert_refused(client_a.put("/api/v1/workflows/billing", {"spec": FLOW}, format="json"), 409, "conflict", "name")
    assert_refused(client_a.post("/api/v1/workflows", {"name": "billing", "spec": FLOW}, format="json"), 409,
                   "conflict", "name")
    assert client_a.get("/api/v1/workflows/billing").json()["latest_version"] == 1

    assert archive(client_a, "billing", "unarchive")["archived_at"] is None
    assert names(client_a) == ["billing", "other"]
    assert client_a.post("/api/v1/runs", {"workflow": "billing"}, format="json").status_code == 201


def test_a_run_in_flight_finishes_after_its_workflow_is_archived(client_a, tenant_a):
    create(client_a, "billing")
    run = client_a.post("/api/v1/runs", {"workflow": "billing"}, format="json").json()
    archive(client_a, "billing")
    with tenant_context(tenant_a[0]):
        engine_tick.tick(run["id"])  # the step is queued, as before the archive
        assert StepRun.objects.filter(run_id=run["id"], node_id="a").exists()
        assert WorkflowRun.objects.get(pk=run["id"]).status == "running"


def test_archived_workflows_leave_the_plan_s_count_and_unarchiving_needs_room(client_a, tenant_a):
    tenant_services.override_set(tenant=tenant_a[0], field="max_workflows", value=1)
    create(client_a, "first")
    assert error_code(client_a.post("/api/v1/workflows", {"name": "second", "spec": FLOW}, format="json")) \
        == "plan_limit_reached"
    archive(client_a, "first")
    assert client_a.get("/api/v1/entitlements").json()["usage"]["objects"]["workflows"] == 0  # as the ceiling counts
    create(client_a, "second")

    refused = client_a.post("/api/v1/workflows/first/unarchive")
    assert refused.status_code == 403, refused.content
    assert error_code(refused) == "plan_limit_reached"
    assert refused.json()["error"]["details"]["limit"] == "max_workflows"
    assert client_a.get("/api/v1/workflows/first").json()["archived_at"] is not None

    archive(client_a, "second")
    archive(client_a, "first", "unarchive")
    assert names(client_a) == ["first"]


def test_a_workflow_without_runs_is_deleted_with_its_versions_triggers_and_schedules_and_its_name_is_free(
    client_a, tenant_a
):
    create(client_a, "draft")
    client_a.put("/api/v1/workflows/draft", {"spec": FLOW}, format="json")
    trigger = client_a.post("/api/v1/triggers", {"workflow": "draft", "event": "x"}, format="json")
    assert trigger.status_code == 201, trigger.content
    for name, version in (("nightly", None), ("pinned", 1)):
        schedule = client_a.post("/api/v1/schedules", {"name": name, "workflow": "draft", "version": version,
                                                       "cron": "0 3 * * *", "paused": True}, format="json")
        assert schedule.status_code == 201, schedule.content

    response = client_a.delete("/api/v1/workflows/draft")

    assert response.status_code == 204, response.content
    assert client_a.get("/api/v1/workflows/draft").status_code == 404
    with tenant_context(tenant_a[0]):
        assert not WorkflowVersion.objects.exists()
        assert not EventTrigger.objects.exists()
        assert not Schedule.objects.exists()  # else they would start runs of the next workflow of its name
    assert create(client_a, "draft")["latest_version"] == 1


def test_a_workflow_with_runs_is_not_deleted_and_the_409_says_to_archive_it(client_a, tenant_a):
    create(client_a, "billing")
    client_a.post("/api/v1/runs", {"workflow": "billing"}, format="json")
    archive(client_a, "billing")

    response = client_a.delete("/api/v1/workflows/billing")

    assert_refused(response, 409, "conflict", "runs")
    assert "archive it" in response.json()["error"]["message"]
    with tenant_context(tenant_a[0]):
        assert WorkflowDefinition.objects.filter(name="billing").exists()
        assert WorkflowVersion.objects.count() == 1
    assert client_a.delete("/api/v1/workflows/ghost").status_code == 404


def test_an_archived_workflow_s_triggers_schedules_and_sub_workflow_steps_start_nothing(client_a, tenant_a):
    tenant = tenant_a[0]
    create(client_a, "leaf")
    with tenant_context(tenant):
        services.workflow_put(name="parent", spec={"nodes": [{"id": "kid", "type": "subworkflow",
                                                              "workflow": "leaf"}]})
    assert client_a.post("/api/v1/triggers", {"workflow": "leaf", "event": "go"}, format="json").status_code == 201
    with tenant_context(tenant):
        schedule = schedules.schedule_create(name="s", workflow="leaf", interval_s=1, overlap="allow_all")
    archive(client_a, "leaf")

    event = client_a.post("/api/v1/events", {"name": "go"}, format="json")
    assert event.status_code == 201, event.content
    assert event.json()["runs"] == []

    fire = datetime(2025, 1, 1, tzinfo=UTC)
    with tenant_context(tenant):
        (outcome,) = firing.start_fires([(Schedule.objects.get(pk=schedule.pk), fire)])
    assert outcome.run is None
    assert outcome.error is not None
    assert "archived" in outcome.error["message"]
    another = client_a.post("/api/v1/schedules", {"name": "t", "workflow": "leaf", "interval_s": 60}, format="json")
    assert_refused(another, 400, "invalid", "workflow")  # a new schedule of it: refused at once
    trigger = client_a.post("/api/v1/triggers", {"workflow": "leaf", "event": "again"}, format="json")
    assert_refused(trigger, 400, "invalid", "workflow")  # and a new trigger: it would start nothing
    assert "archived" in trigger.json()["error"]["details"]["workflow"][0]
    paused = client_a.post(f"/api/v1/schedules/{schedule.pk}/pause")
    assert (paused.status_code, paused.json()["paused"]) == (200, True)  # its old one can still be paused

    parent = client_a.post("/api/v1/runs", {"workflow": "parent"}, format="json").json()
    with tenant_context(tenant):
        engine_tick.tick(parent["id"])
        kid = StepRun.objects.get(run_id=parent["id"], node_id="kid")
        assert WorkflowRun.objects.filter(parent_run_id=parent["id"]).count() == 0
    assert kid.status == "failed"
    assert kid.error["code"] == "workflow_archived"
    assert not kid.error["retryable"]
    assert run_count(tenant) == 1  # the parent alone


def test_another_tenant_s_workflow_is_a_404_to_archive_unarchive_and_delete_and_stays_as_it_was(
    client_a, client_b, tenant_a
):
    create(client_a, "secret")
    for response in (
        client_b.post("/api/v1/workflows/secret/archive"),
        client_b.post("/api/v1/workflows/secret/unarchive"),
        client_b.delete("/api/v1/workflows/secret"),
    ):
        assert response.status_code == 404, response.content
        assert error_code(response) == "not_found"
    assert names(client_b, archived="true") == []
    assert client_a.get("/api/v1/workflows/secret").json()["archived_at"] is None
    archive(client_a, "secret")
    assert client_b.post("/api/v1/workflows/secret/unarchive").status_code == 404
    assert names(client_a, archived="true") == ["secret"]


# --- the admin ---------------------------------------------------------------------------------


def admin_as(username: str, tenant: Tenant, role: str) -> Client:
    return staff_client(username, tenant, role, "workflows.view_workflowdefinition",
                        "workflows.change_workflowdefinition")


def act(client: Client, verb: str, *ids: Any) -> Any:
    return client.post(reverse("admin:workflows_workflowdefinition_changelist"),
                       {"action": verb, "_selected_action": [str(pk) for pk in ids]}, follow=True)


def archived_at(tenant: Tenant, name: str) -> Any:
    with tenant_context(tenant):
        return WorkflowDefinition.objects.get(name=name).archived_at


def test_staff_archive_and_unarchive_their_tenant_s_workflows_in_the_admin_within_the_plan(
    client_a, client_b, tenant_a, tenant_b
):
    a, b = tenant_a[0], tenant_b[0]
    create(client_a, "billing")
    create(client_b, "theirs")
    with tenant_context(b):
        theirs = WorkflowDefinition.objects.get(name="theirs").pk
    with tenant_context(a):
        billing = WorkflowDefinition.objects.get(name="billing").pk
    owner = admin_as("owner-a", a, "owner")

    page = owner.get(reverse("admin:workflows_workflowdefinition_changelist"))
    assert b"billing" in page.content
    assert b"theirs" not in page.content
    act(owner, "archive", billing, theirs)  # another tenant's id is not in this admin's list
    assert archived_at(a, "billing") is not None
    assert archived_at(b, "theirs") is None

    tenant_services.override_set(tenant=a, field="max_workflows", value=1)
    create(client_a, "second")
    refused = act(owner, "unarchive", billing)
    assert b"allows at most 1 workflows" in refused.content
    assert archived_at(a, "billing") is not None

    viewer = admin_as("viewer-a", a, "viewer")
    with tenant_context(a):
        second = WorkflowDefinition.objects.get(name="second").pk
    act(viewer, "archive", second)  # not an action of theirs: nothing is done
    assert archived_at(a, "second") is None


# --- races --------------------------------------------------------------------------------------


def test_two_creations_of_one_new_name_at_once_make_the_workflow_and_a_second_version(
    transactional_db, tenant_a, monkeypatch
):
    """The first creation holds its new definition until the second waits for it: the second then
    adds version 2. Before, the second found no row to lock, inserted the name too, and its unique
    constraint answered a 500."""
    import threading

    from tests.conftest import in_threads

    manager = type(WorkflowVersion.objects)
    made = manager.create
    first = threading.Lock()

    def create_version(self: Any, **fields: Any) -> Any:
        if self.model is WorkflowVersion and first.acquire(blocking=False):
            until_another_waits_on_a_lock()  # the other creation is under way, waiting for this one
        return made(self, **fields)

    monkeypatch.setattr(manager, "create", create_version)

    def put(_: int) -> Any:
        with tenant_context(tenant_a[0]):
            version, created = services.workflow_put(name="raced", spec=FLOW)
            return version.number, created

    assert sorted(in_threads(2, put)) == [(1, True), (2, False)]
    with tenant_context(tenant_a[0]):
        assert WorkflowDefinition.objects.filter(name="raced").count() == 1


def deletion_in_a_thread(tenant: Tenant, name: str, results: dict[str, Any]) -> Any:
    """The deletion of the workflow ``name``, started in a thread (returned): ``results["delete"]`` is
    ``"deleted"``, or its exception, once it has ended."""

    def delete() -> str:
        with tenant_context(tenant):
            services.workflow_delete(name=name)
        return "deleted"

    return in_a_thread(results, "delete", delete)


@contextmanager
def deleted_meanwhile(tenant: Tenant, monkeypatch: pytest.MonkeyPatch,
                      name: str = "doomed") -> Iterator[dict[str, Any]]:
    """The deletion of the workflow ``name`` in another thread, which locks its versions, then waits
    until a statement of the block waits on a lock it holds. Yields the deletion's result
    (``results["delete"]``: ``"deleted"``, or its exception), there once the block has ended."""
    import threading

    locked, lock = threading.Event(), services.lock_versions
    results: dict[str, Any] = {}

    def lock_then_wait(definition: WorkflowDefinition) -> None:
        lock(definition)
        locked.set()
        until_another_waits_on_a_lock()  # the block's statement, waiting for what the deletion holds

    monkeypatch.setattr(services, "lock_versions", lock_then_wait)
    deleting = deletion_in_a_thread(tenant, name, results)
    assert locked.wait(15)
    try:
        yield results
    finally:
        deleting.join(30)


def test_a_workflow_deleted_while_a_run_of_it_starts_is_gone_and_the_start_is_a_404(
    transactional_db, tenant_a, monkeypatch
):
    """The deletion locks the versions, then waits until the start's commit waits for them: the
    start's reference to its version is checked at its commit, which then finds it deleted. Before,
    the start committed a run of a version the deletion had counted no run of, and the deletion's
    own commit failed (a 500)."""
    from ductor_project.core.errors import NotFound

    with tenant_context(tenant_a[0]):
        services.workflow_put(name="doomed", spec=FLOW)
    with (deleted_meanwhile(tenant_a[0], monkeypatch) as results, pytest.raises(NotFound, match="deleted"),
          tenant_context(tenant_a[0])):
        services.run_start(workflow="doomed")
    assert results["delete"] == "deleted"
    assert run_count(tenant_a[0]) == 0
    with tenant_context(tenant_a[0]):
        assert not WorkflowDefinition.objects.filter(name="doomed").exists()


@pytest.mark.parametrize("made", ["trigger", "schedule"])
def test_a_trigger_or_schedule_made_while_its_workflow_is_deleted_is_refused_and_nothing_is_left(
    transactional_db, tenant_a, monkeypatch, made
):
    """The deletion holds the workflow while it removes its triggers and schedules; a trigger or a
    schedule made meanwhile waits for it, then finds the workflow gone: a 400 naming ``workflow``.
    Before, a trigger made then failed its commit on its reference to the deleted workflow (a 500),
    and a schedule was kept naming a workflow that no longer exists (a later one of that name would
    have had its runs)."""
    from ductor_project.core.errors import ApiError
    from workflows.triggers import events

    with tenant_context(tenant_a[0]):
        services.workflow_put(name="doomed", spec=FLOW)
    make = {"trigger": lambda: events.trigger_create(workflow="doomed", event="order.paid"),
            "schedule": lambda: schedules.schedule_create(name="nightly", workflow="doomed", cron="0 2 * * *")}
    with (deleted_meanwhile(tenant_a[0], monkeypatch) as results, tenant_context(tenant_a[0]),
          pytest.raises(ApiError) as refused):
        make[made]()

    assert (refused.value.error_code, list(refused.value.details)) == ("invalid", ["workflow"])
    assert results["delete"] == "deleted"
    with tenant_context(tenant_a[0]):
        assert not EventTrigger.objects.exists()
        assert not Schedule.objects.exists()


@pytest.mark.parametrize("change", ["create", "update"])
def test_a_webhook_naming_a_workflow_while_it_is_deleted_is_refused_and_nothing_is_left(
    transactional_db, tenant_a, monkeypatch, change
):
    """The deletion takes its name out of the endpoints that name it; an endpoint made or changed to
    name it meanwhile waits for the deletion, then finds the workflow gone: a 400 naming
    ``workflows``. Before, it was kept naming the deleted workflow, so the next workflow given the
    name had its runs sent there, and the endpoint could not be saved back as it read."""
    from ductor_project.core.errors import ApiError
    from workflows.models import WebhookEndpoint
    from workflows.triggers import webhooks

    url = "https://93.184.216.34/hook"
    with tenant_context(tenant_a[0]):
        services.workflow_put(name="doomed", spec=FLOW)
        services.workflow_put(name="kept", spec=FLOW)
        endpoint = webhooks.webhook_create(url=url, events=["run.failed"], workflows=["kept"]).endpoint
    write = {"create": lambda: webhooks.webhook_create(url=url, events=["run.failed"], workflows=["doomed"]),
             "update": lambda: webhooks.webhook_update(endpoint, {"workflows": ["doomed"]})}
    with (deleted_meanwhile(tenant_a[0], monkeypatch) as results, tenant_context(tenant_a[0]),
          pytest.raises(ApiError) as refused):
        write[change]()

    assert (refused.value.error_code, list(refused.value.details)) == ("invalid", ["workflows"])
    assert results["delete"] == "deleted"
    with tenant_context(tenant_a[0]):
        assert list(WebhookEndpoint.objects.values_list("pk", "workflows")) == [(endpoint.pk, ["kept"])]


def test_an_unarchive_and_a_webhook_naming_its_workflow_at_once_both_go_through(
    transactional_db, tenant_a, monkeypatch
):
    """A webhook's create locks the tenant's row (its limit), then the workflows it names, as a
    schedule's and a trigger's create do; an unarchive, which checks the plan's ceiling on that row,
    takes the two in that order too. Before, it locked its workflow first: at once with a webhook
    naming that workflow, each waited for the other, and PostgreSQL aborted one as a deadlock."""
    import threading

    from workflows.triggers import webhooks

    tenant = tenant_a[0]
    with tenant_context(tenant):
        services.workflow_put(name="paused", spec=FLOW)
        services.workflow_archive(name="paused")
    reached, check = threading.Event(), services.enforce_ceiling

    def check_once_another_waits(kind: str, existing: Any) -> None:
        reached.set()
        until_another_waits_on_a_lock()  # the webhook's create, waiting for what the unarchive holds
        check(kind, existing)

    monkeypatch.setattr(services, "enforce_ceiling", check_once_another_waits)

    def unarchive() -> str:
        with tenant_context(tenant):
            services.workflow_unarchive(name="paused")
        return "unarchived"

    results: dict[str, Any] = {}
    unarchiving = in_a_thread(results, "unarchive", unarchive)
    assert reached.wait(15)
    try:
        with tenant_context(tenant):
            made = webhooks.webhook_create(url="https://93.184.216.34/hook", events=["run.failed"],
                                           workflows=["paused"])
    finally:
        unarchiving.join(30)

    assert results["unarchive"] == "unarchived"
    assert made.endpoint.workflows == ["paused"]
    assert archived_at(tenant, "paused") is None


def test_a_deletion_waits_for_a_schedule_firing_then_counts_its_run(transactional_db, tenant_a):
    """A firing holds its schedule's row while it starts the fire's run, whose reference to its version
    is checked at its commit; the deletion takes the workflow's schedules before its versions (the
    order a firing takes them in), so it waits for the firing, counts its run, and is refused with a
    409. Before, it locked the versions first and then waited for the schedule: the firing's commit
    waited for the versions, and PostgreSQL aborted one of them as a deadlock."""
    import threading

    from django.db import transaction

    with tenant_context(tenant_a[0]):
        services.workflow_put(name="nightly", spec=FLOW)
        schedule = schedules.schedule_create(name="nightly", workflow="nightly", cron="0 2 * * *")
    started, commit, results = threading.Event(), threading.Event(), {}

    def fire() -> str:  # as a firing: the schedule's row, then the run of its fire, committed when told
        with tenant_context(tenant_a[0]), transaction.atomic():
            Schedule.objects.select_for_update().get(pk=schedule.pk)
            services.run_start(workflow="nightly", idempotency_key="schedule:fire")
            started.set()
            assert commit.wait(30)
        return "committed"

    firing = in_a_thread(results, "fire", fire)
    assert started.wait(15)

    deleting = deletion_in_a_thread(tenant_a[0], "nightly", results)
    until_another_waits_on_a_lock()  # the deletion, waiting for the schedule the firing holds
    commit.set()
    firing.join(30)
    deleting.join(30)

    assert results["fire"] == "committed"
    assert isinstance(results["delete"], Conflict), results["delete"]
    assert list(results["delete"].details) == ["runs"]
    assert run_count(tenant_a[0]) == 1


def test_a_deletion_and_a_firing_of_two_of_its_schedules_at_once_take_them_in_one_order(transactional_db, tenant_a):
    """A firing locks its tenant's schedules that are due, earliest wake first; the deletion locks the
    workflow's schedules in that order too. Before, it took them in the order it found them: the
    firing held one and waited for the other, which the deletion held while it waited for the first,
    and PostgreSQL aborted one of them as a deadlock. The second schedule's row is held a moment
    (as a change of it does) so that both wait for it, the firing first."""
    import threading
    from datetime import timedelta

    from django.db import connection, transaction
    from django.utils import timezone

    from tests.waiting import wait_for

    tenant = tenant_a[0]
    with tenant_context(tenant):
        services.workflow_put(name="nightly", spec=FLOW)
        first = schedules.schedule_create(name="first", workflow="nightly", cron="0 2 * * *")
        second = schedules.schedule_create(name="second", workflow="nightly", cron="0 3 * * *")
        now = timezone.now()  # the second is due earlier: the firing takes it first, the deletion found it last
        for schedule, ago in ((first, 1), (second, 2)):
            due = now - timedelta(seconds=ago)
            Schedule.objects.filter(pk=schedule.pk).update(wake_at=due, next_fire_at=due)
    held, release, results = threading.Event(), threading.Event(), {}

    def hold() -> str:
        with tenant_context(tenant), transaction.atomic():
            Schedule.objects.select_for_update().get(pk=second.pk)
            held.set()
            assert release.wait(30)
        return "released"

    def fire() -> str:
        with tenant_context(tenant):
            return f"fired {firing.fire_schedules(now=now)}"

    def waiting() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
            return int(cursor.fetchone()[0])

    holding = in_a_thread(results, "hold", hold)
    assert held.wait(15)
    firing_thread = in_a_thread(results, "fire", fire)
    until_another_waits_on_a_lock()  # the firing, waiting for the second schedule
    deleting = deletion_in_a_thread(tenant, "nightly", results)
    wait_for(lambda: waiting() >= 2, timeout=15, what="the deletion to wait on a schedule too")
    release.set()
    for thread in (holding, firing_thread, deleting):
        thread.join(30)

    assert results["fire"] == "fired 2"
    assert isinstance(results["delete"], Conflict), results["delete"]
    assert run_count(tenant) == 2


def test_a_workflow_whose_run_started_before_its_deletion_counted_them_is_kept_with_a_409(tenant_a):
    """A start that committed first is counted by the deletion, which locks the versions first."""
    with tenant_context(tenant_a[0]):
        services.workflow_put(name="kept", spec=FLOW)
        services.run_start(workflow="kept")
        with pytest.raises(Conflict, match="archive it instead"):
            services.workflow_delete(name="kept")
    assert run_count(tenant_a[0]) == 1


def test_a_deleted_workflow_leaves_its_tenant_s_webhooks_and_one_it_alone_covered_is_disabled(
    tenant_a, tenant_b
):
    """Kept, the name covered the next workflow given it, and a PUT of the endpoint as it read was
    refused. Another tenant's endpoint that names a workflow of that name is its own."""
    from workflows.models import WebhookEndpoint
    from workflows.triggers import webhooks

    url = "https://93.184.216.34/hook"
    for tenant in (tenant_a[0], tenant_b[0]):
        with tenant_context(tenant):
            services.workflow_put(name="gone", spec=FLOW)
            services.workflow_put(name="kept", spec=FLOW)
    with tenant_context(tenant_a[0]):
        both = webhooks.webhook_create(url=url, events=["run.failed"], workflows=["gone", "kept"]).endpoint
        alone = webhooks.webhook_create(url=url, events=["run.failed"], workflows=["gone"]).endpoint
    with tenant_context(tenant_b[0]):
        theirs = webhooks.webhook_create(url=url, events=["run.failed"], workflows=["gone"]).endpoint

    with tenant_context(tenant_a[0]):
        services.workflow_delete(name="gone")
        both, alone = WebhookEndpoint.objects.get(pk=both.pk), WebhookEndpoint.objects.get(pk=alone.pk)
    with tenant_context(tenant_b[0]):
        theirs = WebhookEndpoint.objects.get(pk=theirs.pk)

    assert (both.workflows, both.enabled) == (["kept"], True)
    assert (alone.workflows, alone.enabled) == ([], False)
    assert "'gone', was deleted" in alone.disabled_reason
    assert (theirs.workflows, theirs.enabled) == (["gone"], True)

    with tenant_context(tenant_a[0]):  # enabled as it is, it would cover every workflow: its workflows go with it
        with pytest.raises(Conflict, match="it would cover every workflow") as refused:
            webhooks.webhook_update(alone, {"enabled": True})
        assert list(refused.value.details) == ["enabled"]
        assert WebhookEndpoint.objects.get(pk=alone.pk).enabled is False
        kept = webhooks.webhook_update(alone, {"enabled": True, "workflows": ["kept"]})
        assert (kept.workflows, kept.enabled) == (["kept"], True)


@pytest.mark.parametrize("disabled_by", ["failures", "api"])
def test_an_endpoint_disabled_already_when_the_workflow_it_alone_covered_is_deleted_is_not_enabled_for_all(
    tenant_a, disabled_by
):
    """Disabled before the deletion (its failures, or the API), it kept its reason and lost its last
    workflow: enabled as it was, it covered every workflow of the tenant."""
    from workflows.models import WebhookEndpoint
    from workflows.triggers import webhooks

    with tenant_context(tenant_a[0]):
        services.workflow_put(name="gone", spec=FLOW)
        alone = webhooks.webhook_create(url="https://93.184.216.34/hook", events=["run.failed"],
                                        workflows=["gone"]).endpoint
        if disabled_by == "failures":
            webhooks.webhook_disable(alone.pk, "20 consecutive failed attempts; last: HTTP 500")
        else:
            webhooks.webhook_update(alone, {"enabled": False})
        services.workflow_delete(name="gone")
        assert "'gone', was deleted" in WebhookEndpoint.objects.get(pk=alone.pk).disabled_reason

        with pytest.raises(Conflict, match="it would cover every workflow"):
            webhooks.webhook_update(alone, {"enabled": True})
        assert WebhookEndpoint.objects.get(pk=alone.pk).enabled is False
