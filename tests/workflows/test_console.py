"""The run console in the admin: the run list, the run page (every attempt, routing in one line,
why-waiting, lineage), cancelling a run, and the tenant page; each scoped to the tenant.

Runs and attempts are written as rows in their tenant's context, with the times a test sets, so
durations are exact; no worker runs. Tests run in a transaction: a cancel's tick is never pushed.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ductor_project.core.context import tenant_context
from ductor_project.stack import free_port
from tenants import entitlements
from tenants import services as tenant_services
from tenants.models import Tenant, TenantMembership
from tests.conftest import flush_redis
from tests.tenants.helpers import grant, make_user
from workflows import console, services
from workflows.models import RunEvent, StepRun, WorkflowRun, WorkflowVersion

pytestmark = pytest.mark.usefixtures("redis_client")

RUN_PERMS = ("workflows.view_workflowrun", "workflows.change_workflowrun")
MS_TIME = re.compile(r"\b\d\d:\d\d:\d\d\.\d{3}\b")
TRACE = {
    "allowed": True,
    "reason": "pool 'payments' (rule); a connection is chosen when a slot is free",
    "rule": {"id": "d5c661ce-d87d-4490-a7b2-84ffd2e651ec", "name": "eu payments", "priority": 10},
    "tier": "standard",
    "partition_key": "customer-42",
    "pool": {"id": "74cb19da-6840-4979-9eb1-3153e954773b", "name": "payments", "strategy": "failover"},
    "candidates": [{"connection_id": "987ed9a0-7bed-449a-9af3-8870351d1a1d", "name": "stripe-eu-1"},
                   {"connection_id": "5facf8e2-c59e-48b0-8823-4bf6106800a0", "name": "stripe-eu-2"}],
    "connection": {"id": "5facf8e2-c59e-48b0-8823-4bf6106800a0", "name": "stripe-eu-2"},
    "admitted": "failover: first available by priority (1)",
}
ONE_LINE = ("rule eu payments → pool payments → connection stripe-eu-2, "
            "because failover: first available by priority (1)")


def run_url(run: Any, action: str = "change") -> str:
    return reverse(f"admin:workflows_workflowrun_{action}", args=[run.pk])


def tenant_url(tenant: Tenant) -> str:
    return reverse("admin:workflows_tenant_console", args=[tenant.pk])


def version(name: str) -> WorkflowVersion:
    """A stored version of the workflow ``name`` (the tenant in context), through the service."""
    spec = {"nodes": [{"id": "charge", "type": "action", "action": "echo"},
                      {"id": "ship", "type": "subworkflow", "workflow": "shipping", "depends_on": ["charge"]}]}
    return services.workflow_put(name=name, spec=spec)[0]


def make_run(workflow: WorkflowVersion, status: str, created: datetime, **fields: Any) -> WorkflowRun:
    """A run row (the tenant in context) created at ``created``."""
    run_id = fields.pop("id", uuid.uuid4())
    root = fields.pop("root_run_id", run_id)
    run = WorkflowRun.objects.create(id=run_id, root_run_id=root, workflow=workflow, status=status,
                                     workflow_name=workflow.definition.name, **fields)
    WorkflowRun.objects.filter(pk=run.pk).update(created_at=created)
    run.refresh_from_db()
    return run


def make_step(run: WorkflowRun, node_id: str, attempt: int, status: str, created: datetime,
              started: datetime | None = None, finished: datetime | None = None, **fields: Any) -> StepRun:
    """An attempt row (the tenant in context) with the times given."""
    node_type = fields.pop("node_type", "subworkflow" if node_id == "ship" else "action")
    step = StepRun.objects.create(run=run, node_id=node_id, node_type=node_type, attempt=attempt, status=status,
                                  started_at=started, finished_at=finished, **fields)
    StepRun.objects.filter(pk=step.pk).update(created_at=created)
    return step


def staff_client(username: str, tenant: Tenant, *perms: str, role: str = "owner") -> Client:
    user = make_user(username, tenant=tenant, role=role, is_staff=True)
    grant(user, *perms)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def world(tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str]) -> SimpleNamespace:
    """Tenant A: a running run whose ``charge`` failed once and then succeeded, and whose ``ship``
    waits for a child run; a run of ten days ago that continued as new, and its successor. Tenant B:
    one run."""
    a, b = tenant_a[0], tenant_b[0]
    t0 = timezone.now() - timedelta(seconds=30)
    ms = timedelta(milliseconds=1)
    with tenant_context(a):
        orders, shipping = version("orders"), version("shipping")
        run = make_run(orders, "running", t0, started_at=t0 + ms, idempotency_key="order-42", input={"order": 42})
        failed = make_step(run, "charge", 1, "failed", t0 + 2 * ms, t0 + 5 * ms, t0 + 17.4 * ms, routing=TRACE,
                           input={"amount": 10}, error={"code": "action_failed", "message": "card declined"})
        retried = make_step(run, "charge", 2, "succeeded", t0 + 20 * ms, t0 + 1000 * ms, t0 + 2203 * ms,
                            routing=TRACE, input={"amount": 10}, output={"charged": True})
        child = make_run(shipping, "running", t0 + 2250 * ms, started_at=t0 + 2260 * ms, parent_run=run,
                         parent_node_id="ship", root_run_id=run.pk, nesting_depth=1)
        make_step(run, "ship", 1, "waiting", t0 + 2210 * ms, t0 + 2220 * ms, child_run=child)
        old = make_run(orders, "continued", t0 - timedelta(days=10), started_at=t0 + ms, finished_at=t0 + 9 * ms)
        new = make_run(orders, "running", t0 + 10 * ms, started_at=t0 + 11 * ms, continued_from=old,
                       root_run_id=old.pk)
    with tenant_context(b):
        other = make_run(version("orders-b"), "running", t0, started_at=t0 + ms)
        make_step(other, "charge", 1, "running", t0 + ms, t0 + 2 * ms)
    return SimpleNamespace(a=a, b=b, run=run, failed=failed, retried=retried, child=child, old=old, new=new,
                           other=other)


@pytest.fixture
def superuser(world: SimpleNamespace) -> Client:
    client = Client()
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def staff_a(world: SimpleNamespace) -> Client:
    return staff_client("staff-a", world.a, *RUN_PERMS, "tenants.view_tenant")


@pytest.fixture
def staff_b(world: SimpleNamespace) -> Client:
    return staff_client("staff-b", world.b, *RUN_PERMS, "tenants.view_tenant")


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


# --- formats ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0004, "0.4 ms"), (0.0124, "12.4 ms"), (0.9999, "999.9 ms"), (1.2034, "1.203 s"), (59.5, "59.500 s"),
    (182, "3 min 2 s"), (7500, "2 h 5 min"), (3 * 86400 + 4 * 3600, "3 d 4 h"), (-1.0, "0.0 ms"),
])
def test_durations_are_shown_in_the_unit_that_fits_them(seconds: float, text: str) -> None:
    assert console.duration_text(seconds) == text


def test_times_are_shown_to_the_millisecond_with_their_time_zone() -> None:
    moment = datetime(2025, 12, 1, 17, 20, 1, 123456, tzinfo=UTC)
    assert console.clock(moment) == "17:20:01.123"
    assert console.moment(moment) == "2025-12-01 17:20:01.123 UTC"
    with timezone.override("Europe/Paris"):
        assert console.moment(moment) == "2025-12-01 18:20:01.123 CET"
    assert console.clock(None) == "—"


@pytest.mark.parametrize(("trace", "line"), [
    (TRACE, ONE_LINE),
    ({"allowed": True, "reason": "no pool: the step runs without a connection", "rule": "default", "pool": None,
      "connection": None},
     "default rule → no pool → no connection, because no pool: the step runs without a connection"),
    ({**TRACE, "connection": None, "admitted": None},
     "rule eu payments → pool payments → connection not chosen yet, because pool 'payments' (rule); "
     "a connection is chosen when a slot is free"),
    ({"allowed": False, "reason": "denied by rule 'freeze': billing is frozen",
      "rule": {"id": "x", "name": "freeze", "priority": 1}, "pool": None, "connection": None},
     "rule freeze → refused, because denied by rule 'freeze': billing is frozen"),
    (None, "not routed: the engine runs this step itself"),
])
def test_a_routing_trace_reads_as_one_line(trace: dict[str, Any] | None, line: str) -> None:
    assert console.routing_line(trace) == line


# --- the run list -----------------------------------------------------------------------------


def test_superusers_see_every_tenants_runs_with_a_tenant_column(world: SimpleNamespace, superuser: Client) -> None:
    response = superuser.get(reverse("admin:workflows_workflowrun_changelist"))
    assert response.status_code == 200
    changelist = response.context["cl"]
    assert changelist.list_display[:4] == ["action_checkbox", "short_id", "tenant", "workflow_column"]
    assert {run.pk for run in changelist.result_list} >= {world.run.pk, world.other.pk}
    html = response.content.decode()
    assert "tenant-a" in html
    assert "tenant-b" in html
    assert "tenant__id__exact" in html  # the tenant filter


def test_staff_see_only_their_tenants_runs_and_no_tenant_column(world: SimpleNamespace, staff_a: Client) -> None:
    response = staff_a.get(reverse("admin:workflows_workflowrun_changelist"))
    assert response.status_code == 200
    changelist = response.context["cl"]
    assert "tenant" not in changelist.list_display
    assert {run.pk for run in changelist.result_list} == {world.run.pk, world.child.pk, world.old.pk, world.new.pk}
    html = response.content.decode()
    assert "tenant-b" not in html
    assert tenant_url(world.a) in html  # the link to the tenant page


def test_the_run_list_shows_coloured_status_badges_and_durations(world: SimpleNamespace, superuser: Client) -> None:
    html = page(superuser, reverse("admin:workflows_workflowrun_changelist"))
    assert re.search(r'<span class="ductor-badge" style="background-color: #[0-9a-f]{6}; [^"]*">running</span>', html)
    assert "running for" in html
    assert console.duration_text(0.008) in html  # the continued run: finished - started


def test_the_run_list_filters_by_status_created_date_and_finds_a_run_by_id_or_idempotency_key(
    world: SimpleNamespace, staff_a: Client,
) -> None:
    changelist = reverse("admin:workflows_workflowrun_changelist")

    def found(query: str) -> set[Any]:
        response = staff_a.get(changelist + query)
        assert response.status_code == 200
        return {run.pk for run in response.context["cl"].result_list}

    assert found("?status__exact=continued") == {world.old.pk}
    assert found("?workflow_name=shipping") == {world.child.pk}
    assert found("?q=order-42") == {world.run.pk}
    assert found(f"?q={world.new.pk}") == {world.new.pk}
    now = timezone.now()  # the old run was created ten days ago, the others half a minute ago
    recent = urlencode({"created_at__gte": (now - timedelta(days=1)).isoformat(), "created_at__lt": now.isoformat()})
    assert found(f"?{recent}") == {world.run.pk, world.child.pk, world.new.pk}


def test_a_search_of_the_run_list_looks_whole_values_up_and_reads_no_run_by_a_pattern(
    world: SimpleNamespace, staff_a: Client,
) -> None:
    """Django's search matched a part of a run's id, key or workflow name: a pattern no index serves,
    so each search read every run of the tenant, for the page and again for its count."""
    changelist = reverse("admin:workflows_workflowrun_changelist")

    def searched(term: str) -> tuple[set[Any], list[str]]:
        with CaptureQueriesContext(connection) as queries:
            response = staff_a.get(changelist + "?" + urlencode({"q": term}))
        assert response.status_code == 200
        reads = [q["sql"] for q in queries.captured_queries if 'FROM "workflows_workflowrun"' in q["sql"]]
        return {run.pk for run in response.context["cl"].result_list}, reads

    for term, expected in (("order-42", {world.run.pk}), (str(world.new.pk), {world.new.pk}),
                           ("shipping", {world.child.pk}), ("order-4", set())):
        found, reads = searched(term)
        assert found == expected, term
        assert reads, term
        assert not [sql for sql in reads if "LIKE" in sql], term


def test_runs_cannot_be_deleted_not_even_in_bulk(world: SimpleNamespace, superuser: Client) -> None:
    response = superuser.get(reverse("admin:workflows_workflowrun_changelist"))
    assert "delete_selected" not in response.content.decode()
    actions = [name for name, _ in response.context["action_form"].fields["action"].choices if name]
    assert actions == ["cancel_selected", "retry_selected"]  # nothing deletes

    bulk = superuser.post(reverse("admin:workflows_workflowrun_changelist"),
                          {"action": "delete_selected", "_selected_action": [world.old.pk], "post": "yes"})
    assert bulk.status_code in (200, 302)
    assert superuser.post(run_url(world.old, "delete"), {"post": "yes"}).status_code == 403
    assert WorkflowRun.all_tenants.filter(pk=world.old.pk).exists()


# --- the run page -----------------------------------------------------------------------------


def test_the_run_page_shows_every_attempt_of_every_step_with_millisecond_durations(
    world: SimpleNamespace, staff_a: Client,
) -> None:
    response = staff_a.get(run_url(world.run))
    assert response.status_code == 200
    attempts = response.context["timeline"].attempts
    assert [(a.step.node_id, a.step.attempt) for a in attempts] == [("charge", 1), ("charge", 2), ("ship", 1)]
    assert [a.ran for a in attempts[:2]] == ["12.4 ms", "1.203 s"]
    assert attempts[2].ran.startswith("running for")
    html = response.content.decode()
    assert html.count('class="ductor-attempt ductor-retry"') == 1
    assert "#2" in html
    assert "12.4 ms" in html
    assert "1.203 s" in html
    assert len(MS_TIME.findall(html)) >= 8
    assert "<svg" in html  # the DAG is still drawn


def test_the_run_page_opens_inputs_outputs_and_errors(world: SimpleNamespace, staff_a: Client) -> None:
    html = page(staff_a, run_url(world.run))
    assert "<details" in html
    assert "<summary>error</summary>" in html
    assert "card declined" in html
    assert "&quot;charged&quot;: true" in html
    assert "&quot;order&quot;: 42" in html  # the run's own input


def test_each_attempts_routing_trace_is_one_line_with_the_full_trace_under_it(
    world: SimpleNamespace, staff_a: Client,
) -> None:
    html = page(staff_a, run_url(world.run))
    assert f"<summary>{ONE_LINE}</summary>" in html
    assert html.count(f"<summary>{ONE_LINE}</summary>") == 2  # both attempts of charge
    assert "stripe-eu-1" in html  # the full trace: every candidate


def test_the_run_page_has_a_why_waiting_section(world: SimpleNamespace, staff_a: Client) -> None:
    assert '<h2>Why is it waiting?</h2>' in page(staff_a, run_url(world.run))
    finished = page(staff_a, run_url(world.old))
    assert '<h2>Why is it waiting?</h2>' in finished
    assert "Nothing is waiting: the run has finished." in finished


def test_the_run_page_links_parent_child_predecessor_and_successor(world: SimpleNamespace, staff_a: Client) -> None:
    parent = page(staff_a, run_url(world.run))
    assert f'href="{run_url(world.child)}"' in parent
    assert "child (node ship)" in parent
    assert f'href="{run_url(world.run)}"' in page(staff_a, run_url(world.child))
    assert f'href="{run_url(world.new)}"' in page(staff_a, run_url(world.old))
    assert f'href="{run_url(world.old)}"' in page(staff_a, run_url(world.new))
    assert "continued from" in page(staff_a, run_url(world.new))


def test_staff_of_another_tenant_get_404_for_the_run_page(world: SimpleNamespace, staff_b: Client) -> None:
    for run in (world.run, world.child):
        assert staff_b.get(run_url(run)).status_code == 404
    assert staff_b.get(run_url(world.other)).status_code == 200


def test_superusers_open_any_tenants_run_page(world: SimpleNamespace, superuser: Client) -> None:
    assert "tenant-b" in page(superuser, run_url(world.other))
    assert "charge" in page(superuser, run_url(world.run))


# --- cancel -------------------------------------------------------------------------------------


def test_staff_cancel_a_run_of_their_tenant_from_its_page(world: SimpleNamespace, staff_a: Client) -> None:
    assert 'class="ductor-action">Cancel run</button>' in page(staff_a, run_url(world.run))

    response = staff_a.post(run_url(world.run, "cancel"))

    assert response.status_code == 302
    assert response["Location"] == run_url(world.run)
    assert WorkflowRun.all_tenants.get(pk=world.run.pk).cancel_requested
    assert RunEvent.all_tenants.filter(run_id=world.run.pk, type="cancel_requested").count() == 1
    followed = page(staff_a, run_url(world.run))
    assert "Cancellation of run" in followed
    assert "Cancel run</button>" not in followed  # asked once: no button that would do nothing


def test_a_finished_run_has_no_cancel_button_and_cancelling_it_changes_nothing(
    world: SimpleNamespace, staff_a: Client,
) -> None:
    assert "Cancel run</button>" not in page(staff_a, run_url(world.old))
    response = staff_a.post(run_url(world.old, "cancel"), follow=True)
    assert "nothing to do" in response.content.decode()
    assert not WorkflowRun.all_tenants.get(pk=world.old.pk).cancel_requested


def test_staff_of_another_tenant_get_404_for_the_cancel_post(world: SimpleNamespace, staff_b: Client) -> None:
    assert staff_b.post(run_url(world.run, "cancel")).status_code == 404
    assert staff_b.post(run_url(world.child, "cancel")).status_code == 404
    assert not WorkflowRun.all_tenants.filter(pk__in=[world.run.pk, world.child.pk], cancel_requested=True).exists()


def test_a_viewer_or_staff_without_the_change_permission_cannot_cancel(world: SimpleNamespace) -> None:
    viewer = staff_client("viewer-a", world.a, *RUN_PERMS, role=TenantMembership.Role.VIEWER)
    reader = staff_client("reader-a", world.a, "workflows.view_workflowrun")
    for client in (viewer, reader):
        assert "Cancel run</button>" not in page(client, run_url(world.run))
        assert client.post(run_url(world.run, "cancel")).status_code == 403
    assert not WorkflowRun.all_tenants.get(pk=world.run.pk).cancel_requested


def test_the_run_and_workflow_lists_offer_their_writing_actions_to_those_who_may_write(world: SimpleNamespace) -> None:
    workflow_perms = ("workflows.view_workflowdefinition", "workflows.change_workflowdefinition")
    viewer = staff_client("viewer-l", world.a, *RUN_PERMS, *workflow_perms, role=TenantMembership.Role.VIEWER)
    reader = staff_client("reader-l", world.a, "workflows.view_workflowrun", "workflows.view_workflowdefinition")
    owner = staff_client("owner-l", world.a, *RUN_PERMS, *workflow_perms)

    def offered(client: Client, model: str) -> set[str]:
        response = client.get(reverse(f"admin:workflows_{model}_changelist"))
        assert response.status_code == 200
        form = response.context["action_form"]
        return {name for name, _label in form.fields["action"].choices if name} if form else set()

    for client in (viewer, reader):
        assert offered(client, "workflowrun") == set()
        assert offered(client, "workflowdefinition") & {"archive", "unarchive"} == set()
    assert offered(owner, "workflowrun") == {"cancel_selected", "retry_selected"}
    assert {"archive", "unarchive"} <= offered(owner, "workflowdefinition")


def test_superusers_cancel_any_tenants_run(world: SimpleNamespace, superuser: Client) -> None:
    assert superuser.post(run_url(world.other, "cancel")).status_code == 302
    assert WorkflowRun.all_tenants.get(pk=world.other.pk).cancel_requested


def test_cancel_is_a_post_with_its_csrf_token(world: SimpleNamespace) -> None:
    user = make_user("csrf-a", tenant=world.a, is_staff=True)
    grant(user, *RUN_PERMS)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.get(run_url(world.run, "cancel")).status_code == 405
    assert client.post(run_url(world.run, "cancel")).status_code == 403  # no token
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page(client, run_url(world.run)))
    assert token is not None
    assert client.post(run_url(world.run, "cancel"), {"csrfmiddlewaretoken": token[1]}).status_code == 302
    assert WorkflowRun.all_tenants.get(pk=world.run.pk).cancel_requested


# --- the tenant page ------------------------------------------------------------------------------


def test_staff_see_their_tenants_usage_queue_and_fairness_share(world: SimpleNamespace, staff_a: Client) -> None:
    response = staff_a.get(tenant_url(world.a))
    assert response.status_code == 200
    usage = {row.label: (row.used, row.limit) for row in response.context["usage"]}
    assert set(usage) == {"runs this month", "steps in flight", "workflows", "pools", "connections", "rules",
                          "schedules", "fairness keys"}
    assert usage["workflows"][0] == 2
    assert [row.tier for row in response.context["queue"]][-1] == "total"
    fairness = response.context["fairness"]
    assert (fairness.own.tenant, fairness.own.starts) == (world.a, 3)  # charge twice, ship once
    assert (fairness.total_starts, fairness.tenants) == (4, 2)
    assert fairness.own.fair_share == pytest.approx(0.5)  # two tenants of the same plan
    assert fairness.everyone == []
    html = response.content.decode()
    assert "runs this month" in html
    assert "Queue now" in html
    assert "75.0%" in html
    assert "tenant-b" not in html


def test_the_run_and_tenant_pages_answer_503_while_the_queue_redis_is_out_of_reach(
    world: SimpleNamespace, staff_a: Client, settings: Any
) -> None:
    """As the API does: a cause to retry, not a server error. Both pages read the queue's state in Redis."""
    settings.DUCTOR_QUEUE_REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    for url in (run_url(world.run), tenant_url(world.a)):
        response = staff_a.get(url)
        assert (response.status_code, response.json()["error"]["code"], response["Retry-After"]) == (
            503, "service_unavailable", "5"), url


def test_staff_of_another_tenant_get_404_for_the_tenant_page(world: SimpleNamespace, staff_b: Client) -> None:
    assert staff_b.get(tenant_url(world.a)).status_code == 404
    assert staff_b.get(tenant_url(world.b)).status_code == 200


def test_staff_without_a_membership_get_404_for_any_tenant_page(world: SimpleNamespace) -> None:
    user = make_user("stranger", is_staff=True)
    grant(user, *RUN_PERMS)
    client = Client()
    client.force_login(user)
    assert client.get(tenant_url(world.a)).status_code == 404


def test_superusers_see_every_tenants_share_on_any_tenant_page(world: SimpleNamespace, superuser: Client) -> None:
    response = superuser.get(tenant_url(world.b))
    assert response.status_code == 200
    fairness = response.context["fairness"]
    assert (fairness.own.tenant, fairness.own.starts) == (world.b, 1)
    assert [(share.tenant, share.starts) for share in fairness.everyone] == [(world.a, 3), (world.b, 1)]
    assert tenant_url(world.a) in response.content.decode()


def test_a_superusers_tenant_page_reads_the_weights_of_the_tenants_it_ranks_together(
    world: SimpleNamespace, superuser: Client, make_tenant: Any,
) -> None:
    """Each tenant that started steps in the window had its limits read on its own (its cached copy's
    round trips, or two queries): a page ranking hundreds of tenants paid for each."""

    def busy(count: int) -> None:
        for _ in range(count):
            tenant, _ = make_tenant()
            with tenant_context(tenant):
                run = make_run(version("orders"), "running", timezone.now())
                make_step(run, "charge", 1, "running", timezone.now(), timezone.now())

    def statements() -> int:
        flush_redis()  # no tenant's limits kept anywhere: each read is a read
        entitlements._copies.forget()
        with CaptureQueriesContext(connection) as queries:
            assert superuser.get(tenant_url(world.b)).status_code == 200
        return len(queries.captured_queries)

    busy(1)
    few = statements()
    busy(3)
    assert statements() == few


def test_the_tenant_admin_links_to_the_tenant_page(world: SimpleNamespace, staff_a: Client) -> None:
    html = page(staff_a, reverse("admin:tenants_tenant_change", args=[world.a.pk]))
    assert tenant_url(world.a) in html


# --- retry and rerun ------------------------------------------------------------------------------


@pytest.fixture
def failed_run(world: SimpleNamespace) -> WorkflowRun:
    """A run of tenant A whose ``charge`` failed for good, which failed the run."""
    now = timezone.now()
    with tenant_context(world.a):
        run = make_run(WorkflowVersion.objects.get(definition__name="orders"), "failed", now, started_at=now,
                       finished_at=now, error={"node": "charge", "attempt": 1}, input={"order": 7})
        make_step(run, "charge", 1, "failed", now, now, now, error={"code": "action_failed", "message": "no"})
    return run


def test_staff_retry_a_failed_run_from_its_page(world: SimpleNamespace, failed_run: WorkflowRun,
                                                staff_a: Client) -> None:
    assert 'class="ductor-action">Retry run</button>' in page(staff_a, run_url(failed_run))
    assert "Retry run</button>" not in page(staff_a, run_url(world.run))  # running: nothing to retry

    response = staff_a.post(run_url(failed_run, "retry"))

    assert (response.status_code, response["Location"]) == (302, run_url(failed_run))
    retried = WorkflowRun.all_tenants.get(pk=failed_run.pk)
    assert (retried.status, retried.error, retried.finished_at) == ("running", None, None)
    assert list(StepRun.all_tenants.filter(run_id=failed_run.pk, node_id="charge")
                .order_by("attempt").values_list("attempt", "status")) == [(1, "failed"), (2, "queued")]
    assert "resumes" in page(staff_a, run_url(failed_run))
    again = staff_a.post(run_url(failed_run, "retry"), follow=True)
    assert "only a failed run can be retried" in again.content.decode()


def test_staff_rerun_a_run_and_land_on_the_new_runs_page(world: SimpleNamespace, failed_run: WorkflowRun,
                                                         staff_a: Client) -> None:
    response = staff_a.post(run_url(failed_run, "rerun"))

    new = WorkflowRun.all_tenants.get(rerun_of_id=failed_run.pk)
    assert (response.status_code, response["Location"]) == (302, run_url(new))
    assert (new.input, new.workflow_id, new.tenant_id) == ({"order": 7}, failed_run.workflow_id, world.a.pk)
    new_page = page(staff_a, run_url(new))
    assert f"a rerun of run {failed_run.pk}" in new_page
    assert f'<li>rerun of: <a href="{run_url(failed_run)}">orders {failed_run.pk}</a>' in new_page
    assert f'<li>rerun: <a href="{run_url(new)}">orders {new.pk}</a>' in page(staff_a, run_url(failed_run))


def test_staff_of_another_tenant_get_404_for_retry_and_rerun(world: SimpleNamespace, failed_run: WorkflowRun,
                                                             staff_b: Client) -> None:
    for action in ("retry", "rerun"):
        assert staff_b.post(run_url(failed_run, action)).status_code == 404
    assert WorkflowRun.all_tenants.get(pk=failed_run.pk).status == "failed"
    assert not WorkflowRun.all_tenants.filter(rerun_of_id=failed_run.pk).exists()


def test_a_viewer_cannot_retry_or_rerun(world: SimpleNamespace, failed_run: WorkflowRun) -> None:
    viewer = staff_client("viewer-r", world.a, *RUN_PERMS, role=TenantMembership.Role.VIEWER)
    assert "Retry run</button>" not in page(viewer, run_url(failed_run))
    for action in ("retry", "rerun"):
        assert viewer.post(run_url(failed_run, action)).status_code == 403
    assert not WorkflowRun.all_tenants.filter(rerun_of_id=failed_run.pk).exists()


def test_staff_of_a_suspended_tenant_cannot_cancel_retry_or_rerun(world: SimpleNamespace,
                                                                  failed_run: WorkflowRun) -> None:
    staff = staff_client("staff-suspended", world.a, *RUN_PERMS)
    tenant_services.tenant_set_status(tenant=world.a, status=Tenant.Status.SUSPENDED)

    assert "Retry run</button>" not in page(staff, run_url(failed_run))
    for action in ("retry", "rerun", "cancel"):
        assert staff.post(run_url(failed_run, action)).status_code == 403
    assert WorkflowRun.all_tenants.get(pk=failed_run.pk).status == "failed"
    assert not WorkflowRun.all_tenants.filter(rerun_of_id=failed_run.pk).exists()
