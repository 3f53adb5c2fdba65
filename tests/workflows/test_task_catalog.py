"""The task catalog (platform API, admin), what tenants see of it, task nodes in specs, celery connections.

The platform decides which of the team's Celery tasks tenants may call; a
tenant sees only what its plan or slug is allowed, and another tenant's entry
answers 404. A refused request changes nothing.
"""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from tenants import services
from tests.conftest import api_client, error_code
from workflows.models import TaskCatalogEntry, WorkflowDefinition

pytestmark = pytest.mark.django_db

SCHEMA = {"type": "object", "required": ["amount"], "additionalProperties": False,
          "properties": {"amount": {"type": "integer", "minimum": 1}, "currency": {"type": "string"}}}


@pytest.fixture
def platform() -> APIClient:
    _, raw = services.platform_key_create(name="ops")
    return api_client(raw)


def entry(platform: APIClient, **fields: Any) -> dict[str, Any]:
    response = platform.post("/api/v1/task-catalog", {"queue": "billing", **fields}, format="json")
    assert response.status_code == 201, response.content
    return dict(response.json())


def task_node(name: str, input: Any = None) -> dict[str, Any]:
    return {"id": "charge", "type": "task", "task": name, "input": {} if input is None else input}


def create_workflow(client: APIClient, *nodes: dict[str, Any]) -> Any:
    return client.post("/api/v1/workflows", {"name": "pay", "spec": {"nodes": list(nodes)}}, format="json")


# -- the platform's catalog ---------------------------------------------------------------------


def test_the_platform_creates_reads_changes_and_deletes_catalog_entries(platform):
    created = entry(platform, name="billing.tasks.charge", input_schema=SCHEMA, timeout_s=30, plans=["pro"])
    assert created["arguments"] == "kwargs"
    assert created["plans"] == ["pro"]
    assert platform.get("/api/v1/task-catalog").json()[0]["name"] == "billing.tasks.charge"
    changed = platform.patch("/api/v1/task-catalog/billing.tasks.charge", {"queue": "billing-eu", "plans": []},
                             format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["queue"] == "billing-eu"
    assert TaskCatalogEntry.objects.get().plans == []
    assert platform.delete("/api/v1/task-catalog/billing.tasks.charge").status_code == 204
    assert platform.get("/api/v1/task-catalog/billing.tasks.charge").status_code == 404


@pytest.mark.parametrize(("fields", "field", "says"), [
    ({"name": "ductor.execute_item"}, "name", "internal task"),
    ({"name": "celery.chord_unlock"}, "name", "internal task"),
    ({"name": "not a task"}, "name", "Celery task name"),
    ({"name": "a.b", "queue": "ductor.work"}, "queue", "Ductor's own queues"),
    ({"name": "a.b", "queue": "unacked"}, "queue", "keeps for itself"),
    ({"name": "a.b", "queue": "1:g:plans:version"}, "queue", "keeps for itself"),
    ({"name": "a.b", "input_schema": {"type": "no-such-type"}}, "input_schema", "not a valid JSON Schema"),
    ({"name": "a.b", "input_schema": {"$ref": "#/nope"}}, "input_schema", "does not resolve"),
    ({"name": "a.b", "input_schema": {"properties": {"x": {"$ref": "#/$defs/gone"}}}}, "input_schema", "#/$defs/gone"),
    ({"name": "a.b", "input_schema": {"$ref": "http://127.0.0.1:1/x.json"}}, "input_schema", "not fetched"),
    ({"name": "a.b", "input_schema": {"$schema": []}}, "input_schema", "must name one of the drafts"),
    ({"name": "a.b", "input_schema": {"$schema": 5}}, "input_schema", "must name one of the drafts"),
    ({"name": "a.b", "input_schema": {"$schema": "http://json-schema.org/draft-03/schema#", "extends": {"$ref": "x"}}},
     "input_schema", "must name one of the drafts"),
    ({"name": "a.b", "input_schema": {"$ref": "#/$defs/x", "$defs": {"x": {"$ref": "#/$defs/x"}}}}, "input_schema",
     "without end"),
    ({"name": "a.b", "input_schema": {"$anchor": "a", "$ref": "#a"}}, "input_schema", "without end"),
    ({"name": "a.b", "input_schema": {"$dynamicRef": "#nowhere"}}, "input_schema", "does not resolve"),
    ({"name": "a.b", "plans": ["platinum"]}, "plans", "unknown plan"),
    ({"name": "a.b", "tenants": ["nobody"]}, "tenants", "unknown tenant"),
    ({"name": "a.b", "timeout_s": 0}, "timeout_s", ""),
    ({"name": "a.b", "arguments": "both"}, "arguments", ""),
    ({"name": "a.b", "secret": 1}, "secret", ""),
    ({"name": "a.b", "tenants": ["system"]}, "tenants", "unknown tenant 'system'"),
])
def test_a_bad_catalog_entry_is_refused_naming_its_field_and_nothing_is_stored(platform, fields, field, says):
    response = platform.post("/api/v1/task-catalog", fields, format="json")
    assert response.status_code == 400, response.content
    assert field in str(response.json()["error"])
    assert says in str(response.json()["error"])
    assert not TaskCatalogEntry.objects.exists()


def test_the_summary_of_a_refusal_names_the_field_its_message_is_said_of(platform):
    response = platform.post("/api/v1/task-catalog", {"name": "a.b", "input_schema": {"$ref": "#/nope"}}, format="json")

    assert response.json()["error"]["message"].startswith(
        "Invalid field(s): input_schema. input_schema is not a usable JSON Schema: its $ref '#/nope'")


def test_a_second_entry_of_a_name_is_a_conflict(platform):
    entry(platform, name="billing.tasks.charge")
    response = platform.post("/api/v1/task-catalog", {"name": "billing.tasks.charge"}, format="json")
    assert response.status_code == 409
    assert TaskCatalogEntry.objects.count() == 1


def test_a_tenant_key_is_told_the_catalog_does_not_exist(platform, client_a):
    entry(platform, name="billing.tasks.charge")
    assert client_a.get("/api/v1/task-catalog").status_code == 404
    assert client_a.post("/api/v1/task-catalog", {"name": "x.y"}, format="json").status_code == 404
    assert client_a.delete("/api/v1/task-catalog/billing.tasks.charge").status_code == 404
    assert TaskCatalogEntry.objects.count() == 1


def test_the_admin_lists_and_checks_entries(platform):
    entry(platform, name="billing.tasks.charge")
    admin = APIClient()
    admin.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    assert b"billing.tasks.charge" in admin.get("/admin/workflows/taskcatalogentry/").content
    page = admin.post("/admin/workflows/taskcatalogentry/add/", {
        "name": "ductor.execute_item", "queue": "q", "arguments": "kwargs", "input_schema": "{}",
        "plans": "[]", "tenants": "[]", "enabled": "on"})
    assert page.status_code == 200  # the form again, with the error
    assert b"internal task" in page.content
    assert TaskCatalogEntry.objects.count() == 1


def test_an_entry_added_in_the_admin_with_its_lists_and_schema_left_empty_is_open_to_every_tenant(platform):
    """The help text says "empty: every plan"; a superuser who cleared the ``plans``, ``tenants`` and
    ``input_schema`` boxes got a 500 (the form read an empty box as null, which those columns refuse)."""
    admin = APIClient()
    admin.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))

    page = admin.post("/admin/workflows/taskcatalogentry/add/", {
        "name": "billing.tasks.charge", "queue": "billing", "arguments": "kwargs", "input_schema": "",
        "plans": "", "tenants": "", "timeout_s": "", "enabled": "on"})

    assert page.status_code == 302, page.content[:2000]
    added = TaskCatalogEntry.objects.get(name="billing.tasks.charge")
    assert (added.plans, added.tenants, added.input_schema, added.timeout_s) == ([], [], {}, None)
    changed = admin.post(f"/admin/workflows/taskcatalogentry/{added.pk}/change/", {
        "name": "billing.tasks.charge", "queue": "billing", "arguments": "kwargs", "input_schema": "",
        "plans": "", "tenants": "", "timeout_s": "", "enabled": "on"})
    assert changed.status_code == 302, changed.content[:2000]


# -- what a tenant sees -------------------------------------------------------------------------


def test_a_tenant_sees_only_the_tasks_its_plan_or_slug_may_call(platform, make_tenant):
    _, pro_key = make_tenant("pro-co", plan="pro")
    _, free_key = make_tenant("free-co", plan="free")
    entry(platform, name="shop.ship")  # every plan
    entry(platform, name="shop.charge", plans=["pro"])
    entry(platform, name="shop.refund", tenants=["free-co"])
    entry(platform, name="shop.old", enabled=False)
    pro, free = api_client(pro_key), api_client(free_key)
    assert [t["name"] for t in pro.get("/api/v1/tasks").json()] == ["shop.charge", "shop.ship"]
    assert [t["name"] for t in free.get("/api/v1/tasks").json()] == ["shop.refund", "shop.ship"]
    # Another tenant's entry, and a disabled one, do not exist for this tenant.
    assert pro.get("/api/v1/tasks/shop.refund").status_code == 404
    assert free.get("/api/v1/tasks/shop.charge").status_code == 404
    assert free.get("/api/v1/tasks/shop.old").status_code == 404
    assert free.get("/api/v1/tasks/shop.refund").json()["queue"] == "billing"
    assert "plans" not in free.get("/api/v1/tasks/shop.refund").json()  # who else may call it is not theirs


def test_a_tenant_being_deleted_is_given_no_task_and_nothing_is_stored(platform, make_tenant):
    """Its purge takes its slug out of every entry's ``tenants`` (a later tenant of that slug is another
    customer): an entry naming it while it is being deleted could be written after that and outlive it."""
    gone, _ = make_tenant("leaving")
    services.tenant_set_status(tenant=gone, status=gone.Status.SUSPENDED)
    assert platform.delete("/api/v1/tenants/leaving").status_code == 202
    response = platform.post("/api/v1/task-catalog", {"name": "shop.refund", "queue": "billing",
                                                      "tenants": ["leaving"]}, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["details"]) == ["tenants"]
    assert "being deleted" in str(response.json()["error"]["details"])
    assert not TaskCatalogEntry.objects.exists()
    entry(platform, name="shop.refund")
    response = platform.patch("/api/v1/task-catalog/shop.refund", {"tenants": ["leaving"]}, format="json")
    assert response.status_code == 400, response.content
    assert TaskCatalogEntry.objects.get().tenants == []


def test_the_api_sees_a_change_another_process_made_at_once_and_attempts_within_the_cache_s_life(
        platform, make_tenant):
    from workflows import catalog

    _, key = make_tenant("co-a")
    client = api_client(key)
    entry(platform, name="shop.ship")
    assert client.get("/api/v1/tasks/shop.ship").status_code == 200  # this process now holds the entry
    # Disabled by another process: no signal reaches this one's cache.
    TaskCatalogEntry.objects.filter(name="shop.ship").update(enabled=False)

    assert client.get("/api/v1/tasks/shop.ship").status_code == 404
    assert create_workflow(client, task_node("shop.ship")).status_code == 400
    assert not WorkflowDefinition.all_tenants.exists()
    # What an attempt's start reads was read again by those answers: it sees the change too.
    assert catalog.entry("shop.ship").enabled is False


def test_a_spec_calling_another_tenants_task_is_refused_and_stores_nothing(platform, make_tenant):
    _, a_key = make_tenant("co-a")
    _, b_key = make_tenant("co-b")
    entry(platform, name="shop.refund", tenants=["co-b"])
    response = create_workflow(api_client(a_key), task_node("shop.refund"))
    assert response.status_code == 400
    assert "nodes[0].task" in str(response.json()["error"])
    assert not WorkflowDefinition.all_tenants.exists()
    # In the words an unknown task gets: whether another tenant's task exists is not told.
    unknown = create_workflow(api_client(a_key), task_node("shop.refunx")).json()["error"]
    assert str(response.json()["error"]).replace("refund", "refunx") == str(unknown)
    assert create_workflow(api_client(b_key), task_node("shop.refund")).status_code == 201


@pytest.mark.usefixtures("redis_client")
def test_an_attempt_of_a_task_taken_away_from_the_tenant_tells_nothing_of_its_entry(platform, make_tenant):
    """A workflow saved while the tenant could call a task keeps its node when the platform gives the
    task to another tenant alone: its attempt fails with the words an unknown task gets, and its
    routing trace shows what it shows for a task that does not exist, not the entry's queue, timeout
    or way of taking its input, which are not this tenant's to see any more."""
    make_tenant("co-a")
    _, key = make_tenant("co-b")
    client = api_client(key)

    def attempt(name: str) -> dict[str, Any]:
        run = client.post("/api/v1/runs", {"workflow": name}, format="json")
        assert run.status_code == 201, run.content
        return dict(client.get(f"/api/v1/runs/{run.json()['id']}/steps").json()["results"][0])

    for name in ("shop.ship", "shop.gone"):
        entry(platform, name=name)
        spec = {"nodes": [task_node(name)]}
        assert client.post("/api/v1/workflows", {"name": name, "spec": spec}, format="json").status_code == 201
    changed = platform.patch("/api/v1/task-catalog/shop.ship", {
        "tenants": ["co-a"], "plans": ["free"], "queue": "co-a-private", "timeout_s": 123,
        "arguments": "single"}, format="json")
    assert changed.status_code == 200, changed.content
    assert platform.delete("/api/v1/task-catalog/shop.gone").status_code == 204

    taken, gone = attempt("shop.ship"), attempt("shop.gone")

    assert "co-a-private" not in json.dumps(taken)
    assert taken["routing"]["task"] == {**gone["routing"]["task"], "name": "shop.ship"}
    assert taken["error"] == {**gone["error"], "message": gone["error"]["message"].replace("shop.gone", "shop.ship")}


def test_a_literal_input_that_does_not_match_the_tasks_schema_is_refused_naming_the_field(platform, client_a):
    entry(platform, name="billing.tasks.charge", input_schema=SCHEMA)
    response = create_workflow(client_a, task_node("billing.tasks.charge", {"amount": 0}))
    assert response.status_code == 400
    assert error_code(response) == "invalid"
    errors = str(response.json()["error"])
    assert "nodes[0].input.amount" in errors
    assert "minimum" in errors
    assert create_workflow(client_a, task_node("billing.tasks.charge", {"amount": 5})).status_code == 201


def test_every_field_of_a_literal_input_that_does_not_match_is_named(platform, client_a):
    entry(platform, name="billing.tasks.charge", input_schema=SCHEMA)
    response = create_workflow(client_a, task_node("billing.tasks.charge", {"amount": 0, "currency": 5, "x": 1}))
    assert response.status_code == 400
    assert set(response.json()["error"]["details"]) == {"spec.nodes[0].input", "spec.nodes[0].input.amount",
                                                        "spec.nodes[0].input.currency"}


def test_what_an_inputs_templates_cannot_change_is_checked_at_save(platform, client_a):
    entry(platform, name="billing.tasks.charge", input_schema={**SCHEMA, "properties": {
        **SCHEMA["properties"], "lines": {"type": "array", "items": {"type": "integer"}}}})
    # Literal values beside templates, a key the schema does not allow, a required key absent: refused.
    response = create_workflow(client_a, task_node("billing.tasks.charge", {
        "currency": 5, "colour": "$input.colour", "lines": ["$input.first", "two"]}))
    assert response.status_code == 400, response.content
    details = response.json()["error"]["details"]
    assert set(details) == {"spec.nodes[0].input", "spec.nodes[0].input.amount", "spec.nodes[0].input.currency",
                            "spec.nodes[0].input.lines[1]"}
    assert "'amount' is a required property" in str(details["spec.nodes[0].input.amount"])
    assert "'colour' was unexpected" in str(details["spec.nodes[0].input"])
    # What a template fills is not known yet: checked when the step runs, not here.
    for given in ({"amount": "$input.amount", "currency": "eur-{{ $input.region }}", "lines": "$input.lines"},
                  {"amount": "$input.amount", "lines": [1, "$input.n"]},
                  "$input"):
        kept = create_workflow(client_a, task_node("billing.tasks.charge", given))
        assert kept.status_code == 201, (given, kept.content)
        assert client_a.delete("/api/v1/workflows/pay").status_code == 204


def test_an_interpolation_where_the_schema_wants_another_type_is_refused_at_save(platform, client_a):
    """``{{ … }}`` always renders a string: into an integer it could never pass; its text is unknown."""
    entry(platform, name="billing.tasks.charge", input_schema={**SCHEMA, "properties": {
        "amount": {"type": "integer"}, "currency": {"type": "string", "minLength": 50, "enum": ["x" * 50]}}})

    response = create_workflow(client_a, task_node("billing.tasks.charge", {"amount": "{{ $input.amount }}"}))
    assert response.status_code == 400
    assert response.json()["error"]["details"] == {"spec.nodes[0].input.amount": [
        "node 'charge': input.amount: must be of type \"integer\", but {{ … }} always renders a string: give "
        "the reference alone (\"$input.x\", not \"{{ $input.x }}\") to pass its value as it is"]}
    assert not WorkflowDefinition.all_tenants.exists()
    # The reference alone passes its value as it is; an interpolation into a string may hold any text.
    for fine in ({"amount": "$input.amount"}, {"amount": 5, "currency": "EUR {{ $input.c }}"}):
        assert create_workflow(client_a, task_node("billing.tasks.charge", fine)).status_code == 201, fine
        WorkflowDefinition.all_tenants.all().delete()


def test_an_integer_is_a_whole_number_without_a_fraction_and_the_values_named_are_json(platform, client_a):
    entry(platform, name="billing.tasks.charge", input_schema=SCHEMA)
    # JSON Schema's own integer admits 2.0, which the task would get as a float: not here.
    response = create_workflow(client_a, task_node("billing.tasks.charge", {"amount": 2.0, "currency": None}))
    assert response.status_code == 400
    details = response.json()["error"]["details"]
    assert details["spec.nodes[0].input.amount"] == ["node 'charge': input.amount: 2.0 is not of type 'integer'"]
    assert details["spec.nodes[0].input.currency"] == ["node 'charge': input.currency: null is not of type 'string'"]
    assert create_workflow(client_a, task_node("billing.tasks.charge", {"amount": 2})).status_code == 201
    assert create_workflow(client_a, task_node("billing.tasks.charge", {"amount": True})).status_code == 400


def test_references_within_the_schema_and_to_a_drafts_meta_schema_resolve(platform, client_a):
    entry(platform, name="billing.tasks.charge", input_schema={
        "$defs": {"amount": {"type": "integer", "minimum": 1}},
        "properties": {"amount": {"$ref": "#/$defs/amount"},
                       "nested": {"$id": "https://ductor.invalid/nested", "$defs": {"n": {"type": "string"}},
                                  "$ref": "#/$defs/n"},
                       "schema": {"$ref": "https://json-schema.org/draft/2020-12/schema"}}})
    refused = create_workflow(client_a, task_node("billing.tasks.charge", {"amount": 0, "nested": 1}))
    assert set(refused.json()["error"]["details"]) == {"spec.nodes[0].input.amount", "spec.nodes[0].input.nested"}
    kept = create_workflow(client_a, task_node("billing.tasks.charge", {"amount": 2, "nested": "n", "schema": {}}))
    assert kept.status_code == 201, kept.content


def test_an_input_that_runs_into_a_loop_of_references_is_refused_not_a_crash(platform, client_a):
    """A loop no plain probe reaches at the entry's creation (behind a property): the input that
    reaches it is refused, saying why."""
    entry(platform, name="billing.tasks.charge",
          input_schema={"properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"$ref": "#/$defs/x"}}})
    response = create_workflow(client_a, task_node("billing.tasks.charge", {"a": 1}))
    assert response.status_code == 400, response.content
    assert "without end" in str(response.json()["error"]["details"]["spec.nodes[0].input"])
    assert create_workflow(client_a, task_node("billing.tasks.charge", {"b": 1})).status_code == 201


def test_a_stored_schema_whose_reference_is_remote_is_never_fetched(platform, client_a):
    """An entry stored before references were checked: its inputs are refused with the reason, and
    nothing is fetched (a tenant's request must not make the server call out)."""
    fetched: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fetched.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"type": "object"}')

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        remote = f"http://127.0.0.1:{server.server_address[1]}/schema.json"
        TaskCatalogEntry.objects.create(name="billing.tasks.charge", queue="billing", input_schema={"$ref": remote})
        response = create_workflow(client_a, task_node("billing.tasks.charge", {"amount": 1}))
    finally:
        server.shutdown()
        server.server_close()
    assert response.status_code == 400, response.content
    assert "does not resolve" in str(response.json()["error"]["details"]["spec.nodes[0].input"])
    assert fetched == []


def test_a_templated_input_is_checked_when_its_attempt_starts_not_at_validation(platform, client_a):
    entry(platform, name="billing.tasks.charge", input_schema=SCHEMA)
    response = create_workflow(client_a, task_node("billing.tasks.charge", {"amount": "$input.amount"}))
    assert response.status_code == 201, response.content


def test_a_kwargs_task_needs_an_object_input(platform, client_a):
    entry(platform, name="billing.tasks.charge")
    response = create_workflow(client_a, task_node("billing.tasks.charge", [1, 2]))
    assert response.status_code == 400
    assert "keyword arguments" in str(response.json()["error"])


# -- celery connections -------------------------------------------------------------------------


@pytest.mark.parametrize(("config", "field"), [
    ({}, "config.queue"),
    ({"queue": "ductor.results"}, "config.queue"),
    ({"queue": "bad queue"}, "config.queue"),
    # Keys the broker's Redis keeps beside the queues: a message pushed there made them lists.
    ({"queue": "unacked"}, "config.queue"),
    ({"queue": "unacked_index"}, "config.queue"),
    ({"queue": "unacked_mutex"}, "config.queue"),
    ({"queue": "_kombu.binding.celery"}, "config.queue"),
    ({"queue": "celery-task-meta-0f2c"}, "config.queue"),
    ({"queue": "1:g:plans:version"}, "config.queue"),
    ({"queue": "1:t:00000000-0000-0000-0000-000000000001:stamp"}, "config.queue"),
    ({"queue": "shop", "broker": "elsewhere"}, "config.broker"),
    ({"queue": "shop", "url": "redis://x"}, "config.url"),
])
def test_a_celery_connection_names_a_team_queue_and_a_configured_broker(client_a, config, field):
    response = client_a.post("/api/v1/connections", {"name": "shop", "kind": "celery", "config": config},
                             format="json")
    assert response.status_code == 400, response.content
    assert field in str(response.json()["error"])


def test_a_refused_queue_name_leaves_no_connection(client_a):
    from scheduling.models import Connection

    response = client_a.post("/api/v1/connections", {"name": "shop", "kind": "celery",
                                                      "config": {"queue": "unacked"}}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["details"] == {"config.queue": [
        "names a key the broker keeps for itself or for Ductor (unacked*, _kombu.*, Celery's results, "
        "Ductor's cache), which no task may be sent to"]}
    assert not Connection.all_tenants.filter(name="shop").exists()


@pytest.mark.parametrize("queue", ["shop", "billing-eu", "eu:billing", "team:1:tasks", "celery", "Unacked"])
def test_a_queue_that_only_looks_like_a_reserved_key_is_taken(client_a, queue):
    response = client_a.post("/api/v1/connections", {"name": "shop", "kind": "celery",
                                                      "config": {"queue": queue}}, format="json")
    assert response.status_code == 201, response.content


def test_a_celery_connection_defaults_to_ductors_own_broker(client_a):
    response = client_a.post("/api/v1/connections", {"name": "shop", "kind": "celery",
                                                      "config": {"queue": "shop"}}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["config"] == {"queue": "shop", "broker": "default"}


def test_a_bad_queue_slots_setting_is_told_by_the_system_checks(settings):
    from scheduling.apps import check_task_settings

    for bad in ("many", "0", "-2"):  # no slot would hold every step of the queue for good
        settings.DUCTOR_TASK_QUEUE_SLOTS = {"shop": bad}
        [error] = check_task_settings()
        assert (error.id, error.msg) == ("ductor.E001", f"DUCTOR_TASK_QUEUE_SLOTS: shop={bad} is not a number of "
                                                        "slots (a whole number from 1)")
    settings.DUCTOR_TASK_QUEUE_SLOTS = {"shop": "4", "eu/billing": "2"}
    settings.DUCTOR_TASK_BROKERS = {"eu": "amqp://guest@rabbit//"}
    assert check_task_settings() == []


def test_queue_slots_of_a_broker_not_configured_are_told_by_the_system_checks(settings):
    """No connection can name a broker DUCTOR_TASK_BROKERS lacks: a share of its queue (a typo of
    the broker's name) would never bound a step, and nothing said so."""
    from scheduling.apps import check_task_settings

    settings.DUCTOR_TASK_BROKERS = {"eu": "amqp://guest@rabbit//"}
    settings.DUCTOR_TASK_QUEUE_SLOTS = {"default/shop": "4", "eu/billing": "2", "us/billing": "3"}
    [error] = check_task_settings()
    assert (error.id, error.msg) == ("ductor.E001", "DUCTOR_TASK_QUEUE_SLOTS: us/billing=3 names the broker 'us', "
                                                    "which is neither default nor one of DUCTOR_TASK_BROKERS (eu)")


@pytest.mark.parametrize(("url", "told"), [
    ("shop-redis:6379", "its URL has no scheme"), ("http://shop-redis:6379/0", "its scheme 'http' is not a broker's")])
def test_a_task_broker_without_a_brokers_url_is_told_by_the_system_checks(settings, url, told):
    from scheduling.apps import check_task_settings

    settings.DUCTOR_TASK_BROKERS = {"shop": url, "eu": "amqp://guest@rabbit//"}
    [error] = check_task_settings()
    assert (error.id, error.msg) == ("ductor.E002", f"DUCTOR_TASK_BROKERS: broker 'shop': {told} (redis://, "
                                                    "rediss://, sentinel://, amqp:// …)")
    settings.DUCTOR_TASK_BROKERS = {"shop": "redis://shop-redis:6379/0", "eu": "amqp://guest@rabbit//"}
    assert check_task_settings() == []


def test_an_action_module_that_does_not_import_is_told_by_the_system_checks(settings):
    from workflows.apps import check_action_modules

    settings.DUCTOR_ACTION_MODULES = ["workflows.actions", "no_such_package.actions"]
    [error] = check_action_modules()
    assert (error.id, error.msg) == (
        "ductor.E003", "DUCTOR_ACTION_MODULES: 'no_such_package.actions' does not import: ModuleNotFoundError: "
                       "No module named 'no_such_package'")
    settings.DUCTOR_ACTION_MODULES = ["workflows.actions"]
    assert check_action_modules() == []


def test_a_task_without_a_queue_needs_a_celery_connection_of_the_tenant_to_be_saved(platform, client_a):
    """Else every run of it would fail to publish: nowhere to send it."""
    entry(platform, name="shop.ship", queue="")
    refused = create_workflow(client_a, task_node("shop.ship"))
    assert refused.status_code == 400
    assert refused.json()["error"]["details"] == {"spec.nodes[0].task": [
        "node 'charge': task: task 'shop.ship' has no queue: its catalog entry names none, and this tenant has no "
        "celery connection for routing to send it to"]}
    assert not WorkflowDefinition.all_tenants.exists()

    made = client_a.post("/api/v1/connections", {"name": "shop", "kind": "celery", "config": {"queue": "shop"}},
                         format="json")
    assert made.status_code == 201, made.content
    assert create_workflow(client_a, task_node("shop.ship")).status_code == 201


@pytest.mark.django_db(transaction=True)
def test_a_change_and_a_deletion_of_an_entry_at_once_leave_it_deleted(platform, monkeypatch):
    """A change holds the entry's row until it commits; a deletion at the same moment waits for it, then
    deletes the entry. Before, the change read the entry unlocked: deleted before its write, the entry
    was inserted again by it."""
    from django.db import connection as db
    from django.db import connections

    from tests.waiting import another_waits_on_a_lock, wait_for
    from workflows.catalog_api import TaskCatalogEntrySerializer

    entry(platform, name="billing.tasks.charge")
    checked, results = TaskCatalogEntrySerializer.validate, {}

    def delete() -> None:
        try:
            results["delete"] = platform.delete("/api/v1/task-catalog/billing.tasks.charge").status_code
        finally:
            connections.close_all()

    def deletion_done_or_waiting() -> bool:
        with db.cursor() as cursor:  # the change's transaction: its view of the activity taken again
            cursor.execute("SELECT pg_stat_clear_snapshot()")
        return "delete" in results or another_waits_on_a_lock()

    def validate_while_deleted(self: Any, attrs: Any) -> Any:  # between the change's read and its write
        deleting = threading.Thread(target=delete)
        deleting.start()
        wait_for(deletion_done_or_waiting, timeout=15, what="the deletion")
        results["deleting"] = deleting
        return checked(self, attrs)

    monkeypatch.setattr(TaskCatalogEntrySerializer, "validate", validate_while_deleted)
    changed = platform.patch("/api/v1/task-catalog/billing.tasks.charge", {"description": "Charges."},
                             format="json")
    results["deleting"].join(30)

    assert (changed.status_code, results["delete"]) == (200, 204)
    assert not TaskCatalogEntry.objects.exists()


def test_a_task_broker_named_default_is_told_by_the_system_checks(settings):
    """``default`` is Ductor's own broker: a connection naming it publishes there, whatever URL the
    setting gives that name."""
    from scheduling.apps import check_task_settings

    settings.DUCTOR_TASK_BROKERS = {"default": "redis://shop-redis:6379/0"}
    [error] = check_task_settings()
    assert (error.id, error.msg) == ("ductor.E002", "DUCTOR_TASK_BROKERS: broker 'default': the name of Ductor's "
                                                    "own broker (CELERY_BROKER_URL); give this one another name")


def test_a_task_broker_url_redis_cannot_read_is_told_by_the_system_checks(settings):
    from scheduling.apps import check_task_settings

    settings.DUCTOR_TASK_BROKERS = {"shop": "redis://:secret@shop-redis:notaport/0"}
    [error] = check_task_settings()
    assert (error.id, error.msg) == ("ductor.E002", "DUCTOR_TASK_BROKERS: broker 'shop': Port could not be cast to "
                                                    "integer value as 'notaport' (in "
                                                    "'redis://:***@shop-redis:notaport/0')")
