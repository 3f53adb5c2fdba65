"""The workflows admin on real runs: its pages open for a superuser and for a tenant's staff."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from structlog.testing import capture_logs

from ductor_project.core.context import tenant_context
from tenants.models import Tenant
from tests.tenants.helpers import grant, make_user
from workflows import services
from workflows.admin import EventInline, VersionInline
from workflows.models import (
    EventWait,
    RunEvent,
    Schedule,
    StepRun,
    WebhookDelivery,
    WebhookEndpoint,
    WorkflowDefinition,
    WorkflowRun,
    WorkflowVersion,
)
from workflows.triggers import services as trigger_services
from workflows.triggers import webhook_delivery, webhooks

pytestmark = pytest.mark.django_db(transaction=True)

PUBLIC = "https://93.184.216.34/hooks/ductor"  # a public address literal: no DNS needed
WAITS_FOR_PAYMENT = {"nodes": [{"id": "paid", "type": "wait_for_event", "event": "order.paid"}]}


@pytest.fixture
def tenant(redis_client: Any, tenant_a: tuple[Tenant, str]) -> Tenant:
    return tenant_a[0]


@pytest.fixture
def superuser() -> Client:
    client = Client()
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


def test_a_superuser_lists_the_open_waits_each_with_its_run(tenant: Tenant, superuser: Client) -> None:
    with tenant_context(tenant):
        services.workflow_put(name="order", spec=WAITS_FOR_PAYMENT)
        run, _ = services.run_start(workflow="order")
    assert EventWait.all_tenants.filter(run=run).exists()

    with CaptureQueriesContext(connection) as queries:
        response = superuser.get(reverse("admin:workflows_eventwait_changelist"))

    assert response.status_code == 200
    assert [wait.run_id for wait in response.context["cl"].result_list] == [run.pk]
    rows = next(query["sql"] for query in queries.captured_queries
                if query["sql"].startswith('SELECT "workflows_eventwait"."tenant_id", "workflows_eventwait"."id"')
                or query["sql"].startswith('SELECT "workflows_eventwait"."id"'))
    assert "workflows_steprun" not in rows
    assert "workflows_workflowversion" not in rows


@pytest.mark.parametrize("how", ["page", "action"])
def test_a_webhook_endpoint_deleted_here_is_forgotten_by_the_process_that_sends_deliveries(
    tenant: Tenant, superuser: Client, how: str
) -> None:
    with tenant_context(tenant):
        endpoint = webhooks.webhook_create(url=PUBLIC, events=["run.failed"]).endpoint
        assert [row.pk for row in webhooks.enabled_endpoints()] == [endpoint.pk]  # this process's copy

    if how == "page":
        response = superuser.post(reverse("admin:workflows_webhookendpoint_delete", args=[endpoint.pk]),
                                  {"post": "yes"})
    else:
        response = superuser.post(reverse("admin:workflows_webhookendpoint_changelist"),
                                  {"action": "delete_selected", "_selected_action": [endpoint.pk], "post": "yes"})

    assert response.status_code == 302
    assert not WebhookEndpoint.all_tenants.filter(pk=endpoint.pk, deleted_at__isnull=True).exists()
    with tenant_context(tenant):
        assert webhooks.enabled_endpoints() == ()
    listed = superuser.get(reverse("admin:workflows_webhookendpoint_changelist"))
    assert [row.pk for row in listed.context["cl"].result_list] == []


def delete_confirmation(superuser: Client, model: str, pk: Any, how: str) -> tuple[str, dict[str, Any], Any, list[str]]:
    """The confirmation of deleting the ``model`` object ``pk`` from its page or by the list's
    action (``how``): the URL and form to confirm it with, the answer, and the SQL it took."""
    if how == "page":
        url, form = reverse(f"admin:workflows_{model}_delete", args=[pk]), {}
    else:
        url = reverse(f"admin:workflows_{model}_changelist")
        form = {"action": "delete_selected", "_selected_action": [pk]}
    with CaptureQueriesContext(connection) as queries:
        response = superuser.post(url, form) if form else superuser.get(url)
    return url, form, response, [query["sql"] for query in queries.captured_queries]


@pytest.mark.parametrize("how", ["page", "action"])
def test_a_webhook_endpoint_with_deliveries_is_deleted_here_with_them_counted_not_read_and_purged_later(
    tenant: Tenant, superuser: Client, how: str
) -> None:
    """The delivery log goes with the endpoint (the purge after ``webhook_delete``), and is never
    deleted here on its own: the confirmation counts the deliveries, and asks for no permission to
    delete them. Django's walked every delivery, whole, and refused the deletion for want of that
    permission."""
    with tenant_context(tenant):
        endpoint = webhooks.webhook_create(url=PUBLIC, events=["run.failed"]).endpoint
        for _ in range(3):
            WebhookDelivery.objects.create(endpoint=endpoint, type="run.failed", body={}, status="delivered")
    url, form, response, statements = delete_confirmation(superuser, "webhookendpoint", endpoint.pk, how)

    assert response.status_code == 200
    assert (response.context["perms_lacking"], response.context["protected"]) == (set(), [])
    assert dict(response.context["model_count"])[str(WebhookDelivery._meta.verbose_name_plural)] == 3
    assert not [sql for sql in statements if '"workflows_webhookdelivery"."body"' in sql]  # no delivery read whole
    assert superuser.post(url, {**form, "post": "yes"}).status_code == 302
    # Gone at once for the tenant; its log is left to the purge, not deleted in the request.
    assert not WebhookEndpoint.all_tenants.filter(pk=endpoint.pk, deleted_at__isnull=True).exists()
    assert WebhookDelivery.all_tenants.filter(endpoint_id=endpoint.pk).count() == 3
    webhook_delivery.purge_deleted_endpoints(budget_s=0, rest=0)
    assert not WebhookEndpoint.all_tenants.filter(pk=endpoint.pk).exists()
    assert not WebhookDelivery.all_tenants.filter(endpoint_id=endpoint.pk).exists()


def test_a_workflow_is_not_added_nor_renamed_here_and_its_description_changes(
    tenant: Tenant, superuser: Client
) -> None:
    with tenant_context(tenant):
        services.workflow_put(name="order", spec=WAITS_FOR_PAYMENT)
    definition = WorkflowDefinition.all_tenants.get(tenant=tenant, name="order")

    assert superuser.get(reverse("admin:workflows_workflowdefinition_add")).status_code == 403
    response = superuser.post(reverse("admin:workflows_workflowdefinition_change", args=[definition.pk]),
                              {"name": "renamed", "description": "Takes the payment.",
                               "versions-TOTAL_FORMS": "1", "versions-INITIAL_FORMS": "1"})

    assert response.status_code == 302
    definition = WorkflowDefinition.all_tenants.get(pk=definition.pk)
    assert (definition.name, definition.description, definition.latest_version) == ("order", "Takes the payment.", 1)


def test_a_workflow_s_page_shows_its_latest_versions_without_reading_their_specs(
    tenant: Tenant, superuser: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Versions are never deleted (each change adds one) and a spec may be a megabyte: the page
    showed every version, and read each one's spec, which it does not show."""
    monkeypatch.setattr(VersionInline, "shown", 2, raising=False)
    with tenant_context(tenant):
        for n in range(3):
            services.workflow_put(name="order", spec={"nodes": [{**WAITS_FOR_PAYMENT["nodes"][0], "id": f"p{n}"}]})
    definition = WorkflowDefinition.all_tenants.get(tenant=tenant, name="order")

    with CaptureQueriesContext(connection) as queries:
        response = superuser.get(reverse("admin:workflows_workflowdefinition_change", args=[definition.pk]))

    assert response.status_code == 200
    [versions] = [formset for formset in response.context["inline_admin_formsets"]
                  if formset.formset.model is WorkflowVersion]
    assert [form.instance.number for form in versions.formset.forms] == [3, 2]
    assert not [query["sql"] for query in queries.captured_queries
                if '"workflows_workflowversion"."spec"' in query["sql"]]  # no spec read


def test_a_workflow_deleted_here_takes_its_schedules_with_it(tenant: Tenant, superuser: Client) -> None:
    with tenant_context(tenant):
        services.workflow_put(name="order", spec=WAITS_FOR_PAYMENT)
        trigger_services.schedule_create(name="hourly", workflow="order", interval_s=3600)
    definition = WorkflowDefinition.all_tenants.get(tenant=tenant, name="order")

    response = superuser.post(reverse("admin:workflows_workflowdefinition_delete", args=[definition.pk]),
                              {"post": "yes"})

    assert response.status_code == 302
    assert not WorkflowDefinition.all_tenants.filter(pk=definition.pk).exists()
    assert not Schedule.all_tenants.filter(tenant=tenant).exists()


@pytest.mark.parametrize("how", ["page", "action"])
def test_a_workflow_with_runs_is_refused_here_without_its_runs_read_one_by_one(
    tenant: Tenant, superuser: Client, how: str
) -> None:
    """Its delete page says it has runs (``workflow_delete`` refuses it: archive it instead) without
    reading them: Django's confirmation walks every run of it, whole, to list each one, which for a
    workflow with a long history was a million rows read into the page."""
    with tenant_context(tenant):
        services.workflow_put(name="order", spec=WAITS_FOR_PAYMENT)
        for _ in range(3):
            services.run_start(workflow="order")
    definition = WorkflowDefinition.all_tenants.get(tenant=tenant, name="order")
    url, form, response, statements = delete_confirmation(superuser, "workflowdefinition", definition.pk, how)

    assert response.status_code == 200
    [refusal] = response.context["protected"]
    assert refusal.startswith("Workflow 'order' has runs in its history and cannot be deleted: archive it instead")
    assert not [sql for sql in statements if '"workflows_workflowrun"."input"' in sql]  # no run read whole
    superuser.post(url, {**form, "post": "yes"})
    assert WorkflowDefinition.all_tenants.filter(pk=definition.pk).exists()
    assert WorkflowRun.all_tenants.filter(workflow__definition=definition).count() == 3


BIG_TABLES = ["workflowrun", "steprun", "runevent", "event", "webhookdelivery", "runsignal", "eventwait"]


@pytest.mark.parametrize("who", ["superuser", "staff"])
def test_the_lists_of_the_big_tables_count_a_bounded_number_of_rows_and_read_no_distinct_values_of_them(
    tenant: Tenant, superuser: Client, who: str
) -> None:
    with tenant_context(tenant):
        services.workflow_put(name="order", spec=WAITS_FOR_PAYMENT)
        services.run_start(workflow="order")
    if who == "staff":
        user = make_user("staff-a", tenant=tenant, is_staff=True)
        grant(user, *(f"workflows.view_{model}" for model in BIG_TABLES))
        client = Client()
        client.force_login(user)
    else:
        client = superuser

    for model in BIG_TABLES:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(reverse(f"admin:workflows_{model}_changelist") + "?_facets=True")
        assert response.status_code == 200, model
        table = f'"workflows_{model}"'
        reads = [query["sql"] for query in queries.captured_queries if f"FROM {table}" in query["sql"]]
        assert not [sql for sql in reads if "DISTINCT" in sql], model
        assert all("LIMIT" in sql for sql in reads if "COUNT(" in sql), model


def test_the_step_and_event_lists_filter_by_a_node_type_and_an_event_type(tenant: Tenant, superuser: Client) -> None:
    with tenant_context(tenant):
        services.workflow_put(name="order", spec=WAITS_FOR_PAYMENT)
        run, _ = services.run_start(workflow="order")

    steps = superuser.get(reverse("admin:workflows_steprun_changelist") + "?node_type=wait_for_event")
    none = superuser.get(reverse("admin:workflows_steprun_changelist") + "?node_type=sleep")
    events = superuser.get(reverse("admin:workflows_runevent_changelist") + "?type=created")

    assert [step.pk for step in steps.context["cl"].result_list] == list(
        StepRun.all_tenants.filter(run=run).values_list("pk", flat=True))
    assert list(none.context["cl"].result_list) == []
    assert [event.pk for event in events.context["cl"].result_list] == list(
        RunEvent.all_tenants.filter(run=run, type="created").values_list("pk", flat=True))


@pytest.mark.parametrize("model", ["steprun", "runevent", "eventwait", "workflowversion"])
def test_a_superuser_deletes_no_row_the_engine_goes_on_from(tenant: Tenant, superuser: Client, model: str) -> None:
    with tenant_context(tenant):
        services.workflow_put(name="order", spec=WAITS_FOR_PAYMENT)
        run, _ = services.run_start(workflow="order")
    row = {"steprun": StepRun.all_tenants.filter(run=run), "runevent": RunEvent.all_tenants.filter(run=run),
           "eventwait": EventWait.all_tenants.filter(run=run),
           "workflowversion": WorkflowVersion.all_tenants.filter(runs=run)}[model].first()
    assert row is not None

    page = superuser.post(reverse(f"admin:workflows_{model}_delete", args=[row.pk]), {"post": "yes"})
    listed = superuser.get(reverse(f"admin:workflows_{model}_changelist"))

    assert page.status_code == 403
    assert "delete_selected" not in dict(listed.context["cl"].model_admin.get_action_choices(listed.wsgi_request))
    assert type(row).all_tenants.filter(pk=row.pk).exists()


def test_a_run_s_page_shows_its_latest_events_and_links_to_its_whole_history(
    tenant: Tenant, superuser: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(EventInline, "shown", 2, raising=False)
    with tenant_context(tenant):
        services.workflow_put(name="order", spec=WAITS_FOR_PAYMENT)
        run, _ = services.run_start(workflow="order")
    seqs = list(RunEvent.all_tenants.filter(run=run).order_by("-seq").values_list("seq", flat=True))
    assert len(seqs) > 2

    page = superuser.get(reverse("admin:workflows_workflowrun_change", args=[run.pk]))
    history = reverse("admin:workflows_runevent_changelist") + f"?run__id__exact={run.pk}"
    listed = superuser.get(history)

    assert page.status_code == 200
    events = next(formset for formset in page.context["inline_admin_formsets"] if formset.formset.model is RunEvent)
    assert [form.instance.seq for form in events.formset.forms] == seqs[:2]
    assert history in page.content.decode()
    assert sorted(event.seq for event in listed.context["cl"].result_list) == sorted(seqs)


def test_the_lists_write_times_in_iso_order_with_their_zone(tenant: Tenant, superuser: Client) -> None:
    with tenant_context(tenant):
        services.workflow_put(name="order", spec=WAITS_FOR_PAYMENT)
    version = WorkflowVersion.all_tenants.get(tenant=tenant, definition__name="order")

    response = superuser.get(reverse("admin:workflows_workflowversion_changelist"))

    assert response.status_code == 200
    assert version.created_at.strftime("%Y-%m-%d %H:%M:%S UTC") in response.content.decode()


def test_a_schedule_deleted_here_is_deleted_by_its_service(tenant: Tenant, superuser: Client) -> None:
    with tenant_context(tenant):
        services.workflow_put(name="order", spec=WAITS_FOR_PAYMENT)
        schedule = trigger_services.schedule_create(name="hourly", workflow="order", interval_s=3600)

    with capture_logs() as logs:
        response = superuser.post(reverse("admin:workflows_schedule_delete", args=[schedule.pk]), {"post": "yes"})

    assert response.status_code == 302
    assert not Schedule.all_tenants.filter(pk=schedule.pk).exists()
    assert [line["schedule_id"] for line in logs if line["event"] == "schedule_deleted"] == [str(schedule.pk)]


def test_a_superusers_run_list_offers_the_workflows_of_the_tenant_chosen_and_reads_no_others(
    tenant: Tenant, tenant_b: tuple[Tenant, str], superuser: Client
) -> None:
    """Its workflow filter offered the names of every tenant's workflows, all read on each page."""
    for owner, name in ((tenant, "order"), (tenant_b[0], "invoice")):
        with tenant_context(owner):
            services.workflow_put(name=name, spec=WAITS_FOR_PAYMENT)
    runs = reverse("admin:workflows_workflowrun_changelist")

    def workflows_offered(query: str) -> tuple[list[str], list[str]]:
        with CaptureQueriesContext(connection) as queries:
            response = superuser.get(runs + query)
        assert response.status_code == 200
        offered = [spec.lookup_choices for spec in response.context["cl"].filter_specs
                   if getattr(spec, "parameter_name", "") == "workflow_name"]
        reads = [q["sql"] for q in queries.captured_queries if 'FROM "workflows_workflowdefinition"' in q["sql"]]
        return [name for name, _ in offered[0]] if offered else [], reads

    assert workflows_offered("") == ([], [])
    assert workflows_offered(f"?tenant__id__exact={tenant.pk}")[0] == ["order"]


def test_the_admin_names_each_model_in_the_plural_as_english_spells_it(superuser: Client) -> None:
    """Django adds an ``s`` to a model's name unless told its plural: "Webhook deliverys"."""
    page = superuser.get(reverse("admin:index")).content.decode()
    names = re.findall(r'<a href="/admin/\w+/\w+/">([^<]+)</a>', page)
    assert "Webhook deliveries" in names
    assert [name for name in names if re.search(r"[^aeiou]ys$", name)] == []
