"""The schema types what the server really takes and answers, as a generated client reads it.

A client generated from the schema (openapi-python-client) tries the alternatives of a ``oneOf`` in
order and takes the first whose required properties are there; it reads ``{}`` as any value, null
too. So a response field the server fills with a fixed shape declares it, a request field the
server refuses null for declares a type without null, and the first alternative a value parses as
is the one it is. The schema is the one served (``GET /api/schema/?format=json``); real answers of
the API are checked against it with ``jsonschema`` (OpenAPI 3.0's ``nullable`` read as JSON
Schema's ``null``, as ``tests/test_openapi.py`` reads it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from ductor_project.core.context import tenant_context
from scheduling.dispatch.handlers import ItemContext
from scheduling.models import Connection, Pool
from tenants import services as tenant_services
from tenants.models import ApiKey, Tenant, Tier
from tests.conftest import api_client
from tests.tenants.helpers import assert_error
from tests.test_openapi import validator
from workflows.catalog import TASK_NAME
from workflows.engine import items, steps
from workflows.engine import tick as engine_tick
from workflows.models import Schedule, StepRun, WorkflowRun
from workflows.serializers import RUN_EVENT_TYPES
from workflows.spec import NODE_TYPES
from workflows.triggers import arming, firing, webhooks
from workflows.triggers.webhook_delivery import Attempt

ROOT = Path(__file__).resolve().parent.parent
FLOW = {"nodes": [{"id": "a", "type": "action", "action": "noop"}]}
pytestmark = pytest.mark.usefixtures("redis_client")


@pytest.fixture(scope="module")
def schema(django_db_setup: None, django_db_blocker: Any) -> dict[str, Any]:
    with django_db_blocker.unblock():
        response = api_client().get("/api/schema/?format=json")
    assert response.status_code == 200, response.content[:300]
    return dict(json.loads(response.content))


def component(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(schema["components"]["schemas"][name])


def resolved(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its ``$ref`` (or its one ``allOf`` ``$ref``) followed."""
    refs = [node] if "$ref" in node else node.get("allOf", [])
    if len(refs) == 1 and "$ref" in refs[0]:
        return resolved(schema, component(schema, refs[0]["$ref"].rsplit("/", 1)[1]))
    return node


def enum_of(schema: dict[str, Any], name: str, field: str) -> list[Any]:
    return list(resolved(schema, component(schema, name)["properties"][field])["enum"])


def first_alternative(schema: dict[str, Any], name: str, value: dict[str, Any]) -> str:
    """The alternative of the ``oneOf`` component ``name`` a generated client reads ``value`` as: the
    first whose required properties ``value`` has."""
    for option in component(schema, name)["oneOf"]:
        option_name = option["$ref"].rsplit("/", 1)[1]
        if set(component(schema, option_name).get("required", [])) <= set(value):
            return str(option_name)
    raise AssertionError(f"no alternative of {name} reads {value}")


def put_flow(client: APIClient, name: str, spec: dict[str, Any] = FLOW) -> None:
    response = client.post("/api/v1/workflows", {"name": name, "spec": spec}, format="json")
    assert response.status_code == 201, response.content[:300]


def start(client: APIClient, workflow: str) -> dict[str, Any]:
    response = client.post("/api/v1/runs", {"workflow": workflow}, format="json")
    assert response.status_code == 201, response.content[:300]
    return dict(response.json())


# --- routing rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(("action", "read_as"), [
    ({"deny": "frozen"}, "RuleDeny"),
    ({"pool": "main"}, "RuleRoute"),
    ({"tier": "batch", "partition_key": "c-{{ $input.customer }}"}, "RuleRoute"),
    ({"fairness_key": "{{ $input.customer }}"}, "RuleRoute"),
])
def test_a_rule_action_is_read_as_the_alternative_it_is_and_a_deny_never_as_an_empty_route(
    schema: dict[str, Any], action: dict[str, Any], read_as: str
) -> None:
    assert first_alternative(schema, "RuleAction", action) == read_as
    for name in ("RuleDeny", "RuleRoute"):
        assert validator(schema, name).is_valid(action) is (name == read_as), name
    route = component(schema, "RuleRoute")
    assert (route["minProperties"], route["additionalProperties"]) == (1, False)
    assert set(route["properties"]) == {"pool", "tier", "partition_key", "fairness_key"}


# --- response shapes -------------------------------------------------------------------------


def test_an_events_runs_are_typed_as_run_ids_and_its_answer_validates(
    schema: dict[str, Any], client_a: APIClient
) -> None:
    assert component(schema, "Event")["properties"]["runs"]["items"] == {"type": "string", "format": "uuid"}
    put_flow(client_a, "on-paid")
    trigger = client_a.post("/api/v1/triggers", {"workflow": "on-paid", "event": "order.paid"}, format="json")
    assert trigger.status_code == 201, trigger.content[:300]

    sent = client_a.post("/api/v1/events", {"name": "order.paid", "payload": {"x": 1}}, format="json")

    assert sent.status_code == 201, sent.content[:300]
    assert len(sent.json()["runs"]) == 1
    validator(schema, "Event").validate(sent.json())


def test_a_signals_delivered_to_is_the_wait_it_resumed_or_null(schema: dict[str, Any], client_a: APIClient) -> None:
    delivery = component(schema, "SignalDelivery")
    assert set(delivery["required"]) == {"step_id", "node_id", "attempt"}
    put_flow(client_a, "approval", {"nodes": [{"id": "wait", "type": "wait_for_event", "event": "approved"}]})
    run = start(client_a, "approval")

    kept = client_a.post(f"/api/v1/runs/{run['id']}/signal", {"name": "other"}, format="json")
    delivered = client_a.post(f"/api/v1/runs/{run['id']}/signal", {"name": "approved"}, format="json")

    assert delivered.json()["delivered_to"]["node_id"] == "wait", delivered.content[:300]
    assert kept.json()["delivered_to"] is None, kept.content[:300]
    for answer in (delivered, kept):
        validator(schema, "Signal").validate(answer.json())
    assert not validator(schema, "Signal").is_valid({**delivered.json(), "delivered_to": {"node_id": "wait"}})


def _execute(tenant: Tenant, run_id: str, connection_id: str) -> None:
    """Run the run's queued step as a worker does once admission chose ``connection_id``."""
    with tenant_context(tenant):
        step = StepRun.objects.get(run_id=run_id, status="queued")
        ctx = ItemContext(tenant_id=str(tenant.pk), item_id=items.step_item_id(step.pk), tier="standard",
                          partition=f"step:{step.pk}", delivery=1, waited_ms=0, connection_id=connection_id,
                          admitted="round robin")
        steps.execute_step(ctx, {"step_id": str(step.pk)})


def test_a_steps_routing_trace_and_node_type_validate_against_their_schemas(
    schema: dict[str, Any], client_a: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    assert enum_of(schema, "StepRun", "node_type") == list(NODE_TYPES)
    routing = resolved(schema, component(schema, "StepRun")["properties"]["routing"])
    assert routing["type"] == "object"
    assert {"allowed", "reason", "rule", "tier", "pool", "candidates", "connection"} <= set(routing["required"])
    connection = client_a.post("/api/v1/connections", {"name": "api", "kind": "http",
                                                       "config": {"base_url": "https://example.com"}}, format="json")
    assert connection.status_code == 201, connection.content[:300]
    pool = client_a.post("/api/v1/pools", {"name": "main", "members": [{"connection": "api"}]}, format="json")
    assert pool.status_code == 201, pool.content[:300]
    for name, priority, action in (("route", 1, {"pool": "main", "fairness_key": "k"}), ("deny", 2, {"deny": "no"})):
        rule = client_a.post("/api/v1/rules", {"name": name, "priority": priority, "match": {"workflow": name},
                                               "action": action}, format="json")
        assert rule.status_code == 201, rule.content[:300]
    for name in ("route", "deny", "plain"):
        put_flow(client_a, name)
    routed, denied, plain = start(client_a, "route"), start(client_a, "deny"), start(client_a, "plain")
    _execute(tenant_a[0], routed["id"], connection.json()["id"])

    traces = {}
    for run in (routed, denied, plain):
        [step] = client_a.get(f"/api/v1/runs/{run['id']}/steps").json()["results"]
        validator(schema, "StepRun").validate(step)
        traces[run["workflow_name"]] = step["routing"]
    assert traces["route"]["rule"]["name"] == "route"
    assert traces["route"]["connection"] == {"id": connection.json()["id"], "name": "api"}
    assert traces["deny"]["allowed"] is False
    assert traces["plain"]["rule"] == "default"
    assert not validator(schema, "StepRouting").is_valid({**traces["plain"], "rule": "other"})


def test_every_event_type_the_engine_records_is_in_the_run_event_type_enum(
    schema: dict[str, Any], client_a: APIClient
) -> None:
    assert enum_of(schema, "RunEvent", "type") == list(RUN_EVENT_TYPES)
    source = "\n".join(path.read_text() for path in (ROOT / "workflows").rglob("*.py"))
    recorded = set(re.findall(r"record_event\(\w+, \"(\w+)\"", source))
    recorded |= set(re.findall(r"RunEvent\([^)]*type=\"(\w+)\"", source))
    assert len(recorded) >= 15, recorded
    assert recorded <= set(RUN_EVENT_TYPES), recorded - set(RUN_EVENT_TYPES)
    # f"step_{status}": the end of an attempt, with its outcome's status
    assert re.findall(r"record_event\(\w+, f\"(\w+)\{", source) == ["step_", "step_"]
    assert {f"step_{status}" for status in ("succeeded", "failed")} <= set(RUN_EVENT_TYPES)
    put_flow(client_a, "flow")
    run = start(client_a, "flow")

    events = client_a.get(f"/api/v1/runs/{run['id']}/events").json()

    assert [event["type"] for event in events][:3] == ["created", "started", "step_queued"]
    for event in events:
        validator(schema, "RunEvent").validate(event)
    assert not validator(schema, "RunEvent").is_valid({**events[0], "type": "no_such_event"})


def test_why_types_the_runs_status_and_each_waiting_steps_status_as_the_values_it_answers(
    schema: dict[str, Any], client_a: APIClient
) -> None:
    """A run's status, a step's, or ``pending`` (a node not started) and ``tick`` (the run's own tick):
    enums, as a run's and a step's status are elsewhere, not any string."""
    assert enum_of(schema, "RunWhy", "status") == list(WorkflowRun.Status.values)
    assert enum_of(schema, "Waiting", "status") == [*StepRun.Status.values, "pending", "tick"]
    put_flow(client_a, "nap", {"nodes": [{"id": "nap", "type": "sleep", "duration_s": 3600}]})
    run = start(client_a, "nap")

    why = client_a.get(f"/api/v1/runs/{run['id']}/why")

    assert why.status_code == 200, why.content[:300]
    validator(schema, "RunWhy").validate(why.json())
    assert why.json()["waiting"], why.json()
    assert not validator(schema, "RunWhy").is_valid({**why.json(), "status": "asleep"})


@pytest.mark.parametrize(("filter_", "valid"), [
    ({"path": "event.payload.amount", "op": "gt", "value": 10}, True),
    ({"path": "event.key", "op": "exists"}, True),
    ({"all": [{"path": "event.name", "op": "prefix", "value": "order."},
              {"path": "event.payload.customer.tier", "op": "in", "value": ["gold"]}]}, True),
    ({"any": [{"path": "event.key", "op": "eq", "value": "k"}]}, True),
    ({"path": "payload.amount", "op": "gt", "value": 10}, False),
    ({"path": "event.other", "op": "eq", "value": 1}, False),
    ({"path": "event.key", "op": "like", "value": "k"}, False),
    ({"all": []}, False),
    ({"path": "event.key", "op": "eq", "value": 1, "colour": "red"}, False),
])
def test_a_trigger_filter_the_server_takes_is_its_schema_and_one_it_refuses_is_not(
    schema: dict[str, Any], client_a: APIClient, filter_: dict[str, Any], valid: bool
) -> None:
    put_flow(client_a, "on-paid")

    created = client_a.post("/api/v1/triggers", {"workflow": "on-paid", "event": "order.paid", "filter": filter_},
                            format="json")

    assert created.status_code == (201 if valid else 400), created.content[:300]
    assert validator(schema, "EventFilter").is_valid(filter_) is valid
    if valid:
        validator(schema, "Trigger").validate(created.json())
        validator(schema, "Trigger").validate(client_a.get(f"/api/v1/triggers/{created.json()['id']}").json())
    write = component(schema, "TriggerWriteRequest")["properties"]["filter"]
    assert resolved(schema, write) == component(schema, "EventFilter")
    assert write["nullable"] is True


def test_a_schedules_last_error_is_the_refused_fire_or_null(
    schema: dict[str, Any], client_a: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    put_flow(client_a, "nightly")
    created = client_a.post("/api/v1/schedules", {"name": "s", "workflow": "nightly", "interval_s": 60},
                            format="json")
    assert created.status_code == 201, created.content[:300]
    validator(schema, "ScheduleDetail").validate(created.json())
    now = timezone.now()
    with tenant_context(tenant_a[0]):
        schedule = Schedule.objects.get(pk=created.json()["id"])
        Schedule.objects.filter(pk=schedule.pk).update(workflow="deleted-since", next_fire_at=now,
                                                       wake_at=arming.due_at(schedule, now))
        firing.fire_schedules(now=now + timedelta(seconds=1))

    refused = client_a.get(f"/api/v1/schedules/{schedule.pk}").json()

    assert refused["last_error"]["code"] == "invalid", refused
    validator(schema, "ScheduleDetail").validate(refused)
    assert not validator(schema, "ScheduleError").is_valid({**refused["last_error"], "code": "no_such_code"})


def test_an_api_keys_state_is_one_of_active_revoked_and_expired(
    schema: dict[str, Any], client_a: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    assert enum_of(schema, "ApiKey", "state") == ["active", "revoked", "expired"]
    revoked = client_a.post("/api/v1/api-keys", {"name": "revoked"}, format="json").json()
    expired = client_a.post("/api/v1/api-keys", {"name": "expired"}, format="json").json()
    client_a.post(f"/api/v1/api-keys/{revoked['id']}/revoke", format="json")
    with tenant_context(tenant_a[0]):
        ApiKey.objects.filter(pk=expired["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))

    keys = client_a.get("/api/v1/api-keys").json()["results"]

    assert {key["state"] for key in keys} == {"active", "revoked", "expired"}
    for key in keys:
        validator(schema, "ApiKey").validate(key)


def test_the_dry_runs_tier_is_the_tier_enum_or_null(schema: dict[str, Any]) -> None:
    tier = component(schema, "ExplainRequest")["properties"]["tier"]
    assert resolved(schema, tier)["enum"] == list(Tier.values)
    assert tier["nullable"] is True


# --- request bodies --------------------------------------------------------------------------


@pytest.fixture
def platform(db: None) -> APIClient:
    _, raw = tenant_services.platform_key_create(name="ops")
    return api_client(raw)


def _bodies(slug: str) -> Iterator[tuple[str, str, str, dict[str, Any], str, list[Any]]]:
    """(component, field, path, a body the server takes, the client, values the server refuses)."""
    yield ("ExplainRequest", "input", "/api/v1/routing/explain", {"workflow": "w", "action": "a", "input": [1]},
           "tenant", [None])
    yield ("ConnectionWriteRequest", "config", "/api/v1/connections",
           {"name": "api", "kind": "http", "config": {"base_url": "https://example.com"}}, "tenant", [None, [], "x"])
    yield ("ApiKeyCreateRequest", "scopes", "/api/v1/api-keys", {"name": "k", "scopes": ["read"]}, "tenant", [[]])
    yield ("OverrideSetRequest", "value", f"/api/v1/tenants/{slug}/overrides/max_pools", {"value": 5}, "platform",
           [None, [], "5"])


@pytest.mark.parametrize("case", ["ExplainRequest", "ConnectionWriteRequest", "ApiKeyCreateRequest",
                                  "OverrideSetRequest"])
def test_a_request_field_declares_no_value_the_server_refuses_as_such(
    schema: dict[str, Any], client_a: APIClient, platform: APIClient, tenant_a: tuple[Tenant, str], case: str
) -> None:
    [(name, field, path, body, who, refused)] = [found for found in _bodies(tenant_a[0].slug) if found[0] == case]
    client = platform if who == "platform" else client_a
    send = client.put if who == "platform" else client.post
    body_schema = validator(schema, name)
    assert body_schema.is_valid(body)
    for value in refused:
        answer = send(path, {**body, field: value}, format="json")
        assert_error(answer, 400, "invalid")
        assert field in answer.json()["error"]["details"], answer.content[:300]
        assert not body_schema.is_valid({**body, field: value}), value
    taken = send(path, body, format="json")
    assert taken.status_code in (200, 201), taken.content[:300]


def test_an_override_takes_a_list_of_tiers_for_allowed_tiers(
    schema: dict[str, Any], platform: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    path = f"/api/v1/tenants/{tenant_a[0].slug}/overrides/allowed_tiers"
    taken = platform.put(path, {"value": ["batch"]}, format="json")
    assert taken.status_code == 200, taken.content[:300]
    assert validator(schema, "OverrideSetRequest").is_valid({"value": ["batch"]})
    assert not validator(schema, "OverrideSetRequest").is_valid({"value": ["gold"]})
    assert_error(platform.put(path, {"value": ["gold"]}, format="json"), 400, "invalid")


def test_a_query_parameter_the_server_refuses_blank_is_declared_with_a_minimum_length_and_only_then(
    schema: dict[str, Any], client_a: APIClient, platform: APIClient
) -> None:
    """``?cursor=`` or ``?name=`` on a list is ``400``: a parameter declared as any string would have a
    generated client, or schemathesis, send it blank and take the refusal for a fault of the server."""
    checked = []
    for path, item in schema["paths"].items():
        operation = item.get("get")
        if operation is None or "{" in path:
            continue
        client = platform if operation["tags"][0].startswith("platform") else client_a
        for parameter in operation.get("parameters", []):
            declared = parameter["schema"]
            if parameter["in"] != "query" or declared.get("type") != "string" or "format" in declared:
                continue
            answer = client.get(f"{path}?{parameter['name']}=")
            checked.append((path, parameter["name"]))
            refused = answer.status_code == 400 and parameter["name"] in answer.json()["error"]["details"]
            assert refused == (declared.get("minLength", 0) >= 1), (path, parameter, answer.content[:300])
    assert ("/api/v1/events/", "name") in checked
    assert len(checked) >= 12, checked


# --- the schema's endpoint -------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(("query", "headers", "status", "code"), [
    ("?format=xml", {}, 404, "not_found"),
    ("", {"Accept": "application/xml"}, 406, "not_acceptable"),
    ("?format=json", {"Authorization": "Bearer dct_nope_nope"}, 401, "invalid_api_key"),
])
def test_the_schema_endpoint_answers_its_errors_in_the_json_error_shape(
    query: str, headers: dict[str, str], status: int, code: str
) -> None:
    response = APIClient().get(f"/api/schema/{query}", headers=headers)

    assert response["Content-Type"] == "application/json", response["Content-Type"]
    assert_error(response, status, code)


@pytest.mark.django_db
def test_the_schema_endpoint_still_answers_yaml_by_default_and_json_when_asked() -> None:
    default, as_json = APIClient().get("/api/schema/"), APIClient().get("/api/schema/?format=json")

    assert (default.status_code, default["Content-Type"]) == (200, "application/vnd.oai.openapi; charset=utf-8")
    assert default.content.startswith(b"openapi: ")
    assert (as_json.status_code, json.loads(as_json.content)["openapi"][:2]) == (200, "3.")


def test_a_lineage_is_a_tree_of_typed_runs(schema: dict[str, Any], client_a: APIClient, tenant_a: Any) -> None:
    put_flow(client_a, "leaf")
    put_flow(client_a, "parent", {"nodes": [{"id": "kid", "type": "subworkflow", "workflow": "leaf"}]})
    run = start(client_a, "parent")
    with tenant_context(tenant_a[0]):
        engine_tick.tick(run["id"])  # starts the child

    lineage = client_a.get(f"/api/v1/runs/{run['id']}/lineage")

    assert lineage.status_code == 200, lineage.content[:300]
    validator(schema, "Lineage").validate(lineage.json())
    [root] = lineage.json()["tree"]
    [child] = root["children"]
    assert (root["id"], child["parent_run_id"], child["successor"]) == (run["id"], run["id"], None)
    assert not validator(schema, "LineageNode").is_valid({**child, "status": "sleeping"})


def test_a_lineage_deeper_or_larger_than_it_answers_is_its_first_runs_marked_truncated(
    schema: dict[str, Any], client_a: APIClient, tenant_a: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ContinueAsNew loop's chain nests each successor a level deeper: at about a thousand, the
    answer failed to encode (a 500). It keeps its first levels and runs, and says it left some out."""
    from tenants.scoping import insert_rows
    from workflows import selectors
    from workflows.models import WorkflowRun

    put_flow(client_a, "loop")
    first = start(client_a, "loop")
    with tenant_context(tenant_a[0]):
        root = WorkflowRun.objects.get(pk=first["id"])
        chain, before = [], root
        for n in range(1, 1100):  # each continued from the one before, as a loop's successors are
            before = WorkflowRun(workflow_id=root.workflow_id, workflow_name="loop", root_run_id=root.pk,
                                 continued_from=before, status="continued", input={},
                                 created_at=root.created_at + timedelta(milliseconds=n))
            chain.append(before)
        insert_rows(chain)

    lineage = client_a.get(f"/api/v1/runs/{chain[-1].pk}/lineage")

    assert lineage.status_code == 200, lineage.content[:300]
    body = lineage.json()
    validator(schema, "Lineage").validate(body)
    assert (body["runs"], body["truncated"]) == (1100, True)
    levels, node = 0, body["tree"][0]
    while node is not None:
        levels, node = levels + 1, node["successor"]
    assert levels == selectors.MAX_LINEAGE_DEPTH

    monkeypatch.setattr(selectors, "MAX_LINEAGE_RUNS", 20)  # now the count bounds it
    body = client_a.get(f"/api/v1/runs/{root.pk}/lineage").json()
    levels, node = 0, body["tree"][0]
    while node is not None:
        levels, node = levels + 1, node["successor"]
    assert (levels, body["runs"], body["truncated"]) == (selectors.MAX_LINEAGE_RUNS, 1100, True)


def test_a_lineage_within_its_bounds_is_whole(client_a: APIClient) -> None:
    put_flow(client_a, "single")
    run = start(client_a, "single")
    body = client_a.get(f"/api/v1/runs/{run['id']}/lineage").json()
    assert (body["runs"], body["truncated"], [node["id"] for node in body["tree"]]) == (1, False, [run["id"]])


def test_a_deliverys_log_entries_are_attempts_or_notes_as_they_are_kept(schema: dict[str, Any]) -> None:
    now = timezone.now()
    attempt = Attempt(at=now, status_code=None, error="timed out after 10 s", duration_ms=10002.3).as_json()
    answered = Attempt(at=now, status_code=500, error="HTTP 500", duration_ms=41.7, response="oops").as_json()
    note = webhooks.delivery_note(now, webhooks.REDELIVER_NOTE)
    entry = validator(schema, "WebhookDeliveryLogEntry")
    for value, kind in ((attempt, "WebhookAttempt"), (answered, "WebhookAttempt"), (note, "WebhookNote")):
        entry.validate(value)
        assert first_alternative(schema, "WebhookDeliveryLogEntry", value) == kind
    assert not entry.is_valid({"at": note["at"]})
    assert resolved(schema, component(schema, "WebhookDelivery")["properties"]["attempts"]["items"]) == component(
        schema, "WebhookDeliveryLogEntry")


def test_a_webhooks_events_and_a_deliverys_type_are_the_event_types_and_a_body_takes_one_or_more(
    schema: dict[str, Any], client_a: APIClient
) -> None:
    """A generated client types them as the enum (not any string), and the body's schema refuses what the
    server refuses: no event type, or one it does not know."""
    for name in ("Webhook", "WebhookRevealed", "WebhookWriteRequest", "PatchedWebhookWriteRequest"):
        events = component(schema, name)["properties"]["events"]
        assert resolved(schema, events["items"])["enum"] == list(webhooks.EVENT_TYPES), name
    assert enum_of(schema, "WebhookDelivery", "type") == list(webhooks.EVENT_TYPES)
    body_schema = validator(schema, "WebhookWriteRequest")
    body = {"url": "https://93.184.216.34/hook", "events": ["run.failed"]}
    assert body_schema.is_valid(body)
    for events in ([], ["run.exploded"]):
        assert not body_schema.is_valid({**body, "events": events}), events
        refused = client_a.post("/api/v1/webhooks", {**body, "events": events}, format="json")
        assert list(assert_error(refused, 400, "invalid")["details"]) == ["events"]
    made = client_a.post("/api/v1/webhooks", body, format="json")
    assert made.status_code == 201, made.content[:300]
    validator(schema, "WebhookRevealed").validate(made.json())


def test_a_catalog_entrys_name_declares_the_pattern_the_server_checks(schema: dict[str, Any], platform: APIClient):
    name = component(schema, "TaskCatalogEntryRequest")["properties"]["name"]
    assert (name["pattern"], name["maxLength"]) == (TASK_NAME.pattern, 200)
    for bad in ("not a task", "billing..charge", "9tasks.x"):
        assert re.fullmatch(name["pattern"], bad) is None
        refused = platform.post("/api/v1/task-catalog", {"name": bad}, format="json")
        assert list(assert_error(refused, 400, "invalid")["details"]) == ["name"]


@pytest.mark.parametrize("utc", ["Z", "z"])
def test_a_date_time_in_the_rfc_3339_form_the_schema_declares_is_taken_with_its_utc_letter_in_either_case(
    schema: dict[str, Any], client_a: APIClient, utc: str
) -> None:
    """The schema's ``date-time`` is RFC 3339's, whose ``Z`` may be lower case (section 5.6): a client
    that sends ``2030-01-01T00:00:00z`` sends a valid value, which Python's and Django's parsers refuse."""
    later = f"2030-01-01T00:00:00{utc}"
    answers = {
        "query": client_a.get("/api/v1/runs", {"created_after": later}),
        "body": client_a.post("/api/v1/api-keys", {"name": f"k{utc}", "expires_at": later}, format="json"),
        "many": client_a.post("/api/v1/runs/cancel", {"created_after": later}, format="json"),
        "spec": client_a.post("/api/v1/workflows", {"name": f"nap-{utc}", "spec": {"nodes": [
            {"id": "nap", "type": "sleep", "until": later}]}}, format="json"),
    }
    for where, answer in answers.items():
        assert answer.status_code in (200, 201), (where, answer.content[:300])
    assert answers["body"].json()["expires_at"] == "2030-01-01T00:00:00Z"
    assert answers["spec"].json()["spec"]["nodes"][0]["until"].startswith("2030-01-01T00:00:00")


def test_a_connections_config_is_described_for_every_kind_the_server_takes(
    schema: dict[str, Any], client_a: APIClient
) -> None:
    """The config is any object in the schema (what it takes depends on ``kind``): its description is
    all a client is told, so it names each kind and the keys it requires."""
    description = component(schema, "ConnectionWriteRequest")["properties"]["config"]["description"]
    for kind in Connection.Kind.values:
        assert f"{kind}: " in description, (kind, description)
    assert "queue (required)" in description
    made = client_a.post("/api/v1/connections", {"name": "team", "kind": "celery", "config": {"queue": "billing"}},
                         format="json")
    assert made.status_code == 201, made.content[:300]
    refused = client_a.post("/api/v1/connections", {"name": "team-2", "kind": "celery", "config": {}}, format="json")
    assert list(assert_error(refused, 400, "invalid")["details"]) == ["config.queue"]


def test_a_traces_pool_strategy_is_the_pools_strategy_enum(schema: dict[str, Any], client_a: APIClient) -> None:
    strategy = component(schema, "TracePool")["properties"]["strategy"]
    assert resolved(schema, strategy) == resolved(schema, component(schema, "Pool")["properties"]["strategy"])
    assert resolved(schema, strategy)["enum"] == list(Pool.Strategy.values)
    made = client_a.post("/api/v1/pools", {"name": "main", "strategy": "failover"}, format="json")
    assert made.status_code == 201, made.content[:300]
    trace = client_a.post("/api/v1/routing/explain", {"workflow": "w", "action": "noop", "pool": "main"}, format="json")
    assert trace.status_code == 200, trace.content[:300]
    validator(schema, "DecisionTrace").validate(trace.json())
    assert not validator(schema, "TracePool").is_valid({**trace.json()["pool"], "strategy": "random"})


def test_the_dry_runs_trace_types_its_rule_pool_and_connection_as_a_steps_routing_does(
    schema: dict[str, Any], client_a: APIClient
) -> None:
    pool = client_a.post("/api/v1/pools", {"name": "main"}, format="json")
    assert pool.status_code == 201, pool.content[:300]
    rule = client_a.post("/api/v1/rules", {"name": "to-main", "priority": 1, "match": {"workflow": "w"},
                                           "action": {"pool": "main"}}, format="json")
    assert rule.status_code == 201, rule.content[:300]
    traces = [client_a.post("/api/v1/routing/explain", {"workflow": workflow, "action": "noop"}, format="json")
              for workflow in ("w", "other")]

    trace = validator(schema, "DecisionTrace")
    for response in traces:
        assert response.status_code == 200, response.content[:300]
        trace.validate(response.json())
    matched, fallback = (response.json() for response in traces)
    assert (matched["rule"]["name"], matched["pool"]["name"], fallback["rule"]) == ("to-main", "main", "default")
    assert not trace.is_valid({**matched, "rule": "other"})
    assert not trace.is_valid({**matched, "pool": {"name": "main"}})
    dry_run, step = (component(schema, name)["properties"] for name in ("DecisionTrace", "StepRouting"))
    for part in ("rule", "pool", "connection"):  # one shape, one component, for both traces
        assert resolved(schema, dry_run[part]) == resolved(schema, step[part])


def _inline_array_items(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """``(where, property)`` for every array property whose items are declared inline with bounds
    (which a generator makes a model of), not by ``$ref``."""
    if isinstance(node, dict):
        for name, prop in (node.get("properties") or {}).items():
            items = prop.get("items") if isinstance(prop, dict) else None
            if (isinstance(items, dict) and prop.get("type") == "array" and "$ref" not in items
                    and {"minLength", "maxLength", "pattern", "enum"} & set(items)):
                yield f"{path}.{name}", name
        for key, value in node.items():
            yield from _inline_array_items(value, f"{path}.{key}")
    elif isinstance(node, list):
        for position, value in enumerate(node):
            yield from _inline_array_items(value, f"{path}[{position}]")


def test_no_inline_array_item_takes_the_name_of_a_component(schema: dict[str, Any]) -> None:
    """A generator (datamodel-code-generator) names an array's inline items after the property,
    singular: the task catalog's ``plans`` made a model ``Plan`` of its slugs, and the plan itself
    became ``Plan1``, so a generated client read a plan with the wrong model (and a webhook's
    ``workflows`` took ``Workflow``). Items whose singular name is a component's are components of
    their own (``PlanSlug``, ``TenantSlug``, ``WorkflowName``)."""
    names = {name.lower() for name in schema["components"]["schemas"]}
    clashes = sorted(where for where, prop in _inline_array_items(schema)
                     if prop.lower().removesuffix("s") in names)
    assert clashes == []
    for name in ("TaskCatalogEntry", "TaskCatalogEntryRequest"):
        plans, tenants = (component(schema, name)["properties"][field]["items"] for field in ("plans", "tenants"))
        assert resolved(schema, plans) == {"type": "string", "minLength": 1, "maxLength": 50}
        assert resolved(schema, tenants) == {"type": "string", "minLength": 1, "maxLength": 63}
