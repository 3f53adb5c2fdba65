"""A workflow's ``input_schema``: every run's input must match it, however the run starts. A start,
a rerun or a bulk item that does not is 400 naming each field, and starts nothing; a sub-workflow
step or a ContinueAsNew whose input does not fails with ``invalid_input`` and starts no run; an
event trigger whose workflow refuses the event starts nothing for it, and the event stands.
Real PostgreSQL and Redis, no workers (``test_engine_inline``'s helpers tick runs)."""

from __future__ import annotations

from typing import Any

import pytest

from ductor_project.core.context import tenant_context
from tests.workflows.test_api import assert_invalid
from tests.workflows.test_engine_inline import by_node, put, start, tick
from workflows.models import WorkflowRun

pytestmark = pytest.mark.usefixtures("redis_client")

ORDER = {"type": "object", "required": ["sku", "qty"], "additionalProperties": False,
         "properties": {"sku": {"type": "string", "minLength": 1}, "qty": {"type": "integer", "minimum": 1}}}
NOOP = [{"id": "n", "type": "action", "action": "noop"}]


def order_workflow(client: Any, name: str = "order") -> None:
    response = client.post("/api/v1/workflows", {"name": name, "spec": {"nodes": NOOP, "input_schema": ORDER}},
                           format="json")
    assert response.status_code == 201, response.content


def run_count(tenant: Any) -> int:
    with tenant_context(tenant):
        return WorkflowRun.objects.count()


def test_a_start_whose_input_the_schema_refuses_is_400_naming_each_field_and_starts_nothing(client_a, tenant_a):
    order_workflow(client_a)

    wrong = client_a.post("/api/v1/runs", {"workflow": "order", "input": {"sku": "", "qty": 1.5}}, format="json")
    missing = client_a.post("/api/v1/runs", {"workflow": "order"}, format="json")
    good = client_a.post("/api/v1/runs", {"workflow": "order", "input": {"sku": "A-1", "qty": 2}}, format="json")

    assert_invalid(wrong, "input.qty", "1.5 is not of type 'integer'")
    assert set(wrong.json()["error"]["details"]) == {"input.sku", "input.qty"}
    assert_invalid(missing, "input.sku", "'sku' is a required property")
    assert set(missing.json()["error"]["details"]) == {"input.sku", "input.qty"}  # every one it lacks
    assert good.status_code == 201, good.content
    assert run_count(tenant_a[0]) == 1


def test_the_schema_is_part_of_the_spec_and_a_bad_one_is_refused_naming_it(client_a):
    order_workflow(client_a)
    bad = client_a.post("/api/v1/workflows", {"name": "bad", "spec": {
        "nodes": NOOP, "input_schema": {"type": "object", "properties": {"x": {"$ref": "https://example.com/s"}}}}},
        format="json")
    not_a_schema = client_a.post("/api/v1/workflows", {"name": "bad", "spec": {"nodes": NOOP, "input_schema": 5}},
                                 format="json")

    assert client_a.get("/api/v1/workflows/order").json()["spec"]["input_schema"] == ORDER
    assert_invalid(bad, "spec.input_schema", "does not resolve within it")
    assert_invalid(not_a_schema, "spec.input_schema", "must be a JSON Schema object")
    assert client_a.get("/api/v1/workflows/bad").status_code == 404


def test_a_bulk_item_or_a_rerun_whose_input_is_refused_names_it_and_starts_nothing(client_a, tenant_a):
    order_workflow(client_a)
    first = client_a.post("/api/v1/runs", {"workflow": "order", "input": {"sku": "A-1", "qty": 2}}, format="json")

    bulk = client_a.post("/api/v1/runs/bulk", {"runs": [
        {"workflow": "order", "input": {"sku": "B", "qty": 1}},
        {"workflow": "order", "input": {"sku": "C", "qty": 0, "colour": "red"}},
    ]}, format="json")
    rerun = client_a.post(f"/api/v1/runs/{first.json()['id']}/rerun", {"input": {"sku": "A-1"}}, format="json")
    rerun_as_it_was = client_a.post(f"/api/v1/runs/{first.json()['id']}/rerun", {}, format="json")

    assert_invalid(bulk, "runs[1].input.qty", "0 is less than the minimum of 1")
    assert "runs[1].input" in bulk.json()["error"]["details"]  # the field it does not know, at the root
    assert_invalid(rerun, "input.qty", "'qty' is a required property")
    assert rerun_as_it_was.status_code == 201, rerun_as_it_was.content
    assert run_count(tenant_a[0]) == 2


def test_a_sub_workflow_or_a_successor_whose_input_is_refused_fails_its_step_and_starts_no_run(
        client_a, tenant_a):
    tenant = tenant_a[0]
    order_workflow(client_a)
    put(tenant, "parent", {"nodes": [{"id": "child", "type": "subworkflow", "workflow": "order",
                                      "input": {"sku": "$input.sku", "qty": "$input.qty"}}]})
    put(tenant, "looping", {"nodes": [{"id": "again", "type": "continue_as_new", "input": {"sku": "x", "qty": 0}}],
                            "input_schema": ORDER})

    parent = tick(tenant, start(tenant, "parent", {"sku": "A", "qty": "two"}))
    looping = tick(tenant, start(tenant, "looping", {"sku": "A", "qty": 1}))

    child = by_node(tenant, parent)["child"]
    again = by_node(tenant, looping)["again"]
    assert (child.status, child.error["code"], child.error["field"]) == ("failed", "invalid_input", "input.qty")
    assert '"two" is not of type' in child.error["message"]
    assert (again.status, again.error["code"], again.error["field"]) == ("failed", "invalid_input", "input.qty")
    assert (parent.status, looping.status) == ("failed", "failed")
    with tenant_context(tenant):
        assert set(WorkflowRun.objects.values_list("workflow_name", flat=True)) == {"parent", "looping"}


def test_an_event_the_workflow_refuses_starts_nothing_for_that_trigger_and_stands(client_a, tenant_a):
    order_workflow(client_a)  # takes {sku, qty}: not an event
    put(tenant_a[0], "audit", {"nodes": NOOP})
    for workflow in ("order", "audit"):
        response = client_a.post("/api/v1/triggers", {"workflow": workflow, "event": "order.paid"}, format="json")
        assert response.status_code == 201, response.content

    sent = client_a.post("/api/v1/events", {"name": "order.paid", "payload": {"amount": 5}}, format="json")

    assert sent.status_code == 201, sent.content
    assert len(sent.json()["runs"]) == 1
    [refused] = sent.json()["refused"]
    # Not an order (its fields unknown to the schema, at the root), and sku and qty, required, missing.
    assert (refused["workflow"], sorted(refused["details"])) == ("order", ["input", "input.qty", "input.sku"])
    assert "'sku' is a required property" in refused["details"]["input.sku"]
    assert client_a.get(f"/api/v1/events/{sent.json()['id']}").json()["refused"] == [refused]
    with tenant_context(tenant_a[0]):
        assert list(WorkflowRun.objects.values_list("workflow_name", flat=True)) == ["audit"]


def test_a_schedule_whose_input_the_schema_refuses_is_400_naming_the_field(client_a, tenant_a):
    order_workflow(client_a)
    body = {"name": "nightly", "workflow": "order", "interval_s": 3600, "input": {"sku": "A", "qty": "many"}}

    refused = client_a.post("/api/v1/schedules", body, format="json")
    taken = client_a.post("/api/v1/schedules", {**body, "input": {"sku": "A", "qty": 3}}, format="json")

    assert_invalid(refused, "input.qty", '"many" is not of type')
    assert taken.status_code == 201, taken.content
    stricter = {**ORDER, "properties": {**ORDER["properties"], "qty": {"type": "integer", "minimum": 5}}}
    client_a.put("/api/v1/workflows/order", {"spec": {"nodes": NOOP, "input_schema": stricter}}, format="json")
    schedule = taken.json()["id"]
    assert client_a.post(f"/api/v1/schedules/{schedule}/pause").status_code == 200  # not its input's change
    assert_invalid(client_a.patch(f"/api/v1/schedules/{schedule}", {"input": {"sku": "A", "qty": 4}}, format="json"),
                   "input.qty", "4 is less than the minimum of 5")


def test_a_schema_s_regexes_run_in_linear_time_and_one_that_needs_backtracking_is_refused(client_a):
    """``^(a+)+$`` against thirty ``a`` and a ``!`` backtracks for minutes in Python's ``re``; RE2
    answers at once (the test would hang without it). A backreference needs backtracking: refused."""
    def create(name: str, schema: dict[str, Any]) -> Any:
        return client_a.post("/api/v1/workflows", {"name": name, "spec": {"nodes": NOOP, "input_schema": schema}},
                             format="json")

    assert create("evil", {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}},
                           "patternProperties": {"^(x+)+$": {"type": "integer"}}, "additionalProperties": False}
                  ).status_code == 201
    refused = client_a.post("/api/v1/runs", {"workflow": "evil", "input": {"s": "a" * 5000 + "!",
                                                                           "x" * 5000 + "!": 1}}, format="json")
    assert_invalid(refused, "input.s", "does not match")
    assert_invalid(refused, "input", "does not match any of the regexes")
    assert_invalid(create("backref", {"type": "string", "pattern": "(a)\\1"}), "spec.input_schema",
                   "cannot be matched in linear time")
    assert_invalid(create("lookahead", {"properties": {"s": {"pattern": "^(?=a)"}}}), "spec.input_schema",
                   "lookarounds are not supported")
    assert_invalid(create("unevaluated", {"patternProperties": {"^x": {}}, "unevaluatedProperties": False}),
                   "spec.input_schema", "unevaluatedProperties beside patternProperties")


def test_a_field_inside_a_list_is_named_with_its_index(client_a):
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {
        "type": "object", "properties": {"qty": {"type": "integer"}}}}}}
    response = client_a.post("/api/v1/workflows", {"name": "lines", "spec": {"nodes": NOOP, "input_schema": schema}},
                             format="json")
    assert response.status_code == 201, response.content
    response = client_a.post("/api/v1/workflows", {"name": "list", "spec": {"nodes": NOOP, "input_schema": {
        "type": "array", "items": {"type": "integer"}}}}, format="json")
    assert response.status_code == 201, response.content

    assert_invalid(client_a.post("/api/v1/runs", {"workflow": "lines", "input": {"items": [{"qty": 1}, {"qty": "x"}]}},
                                 format="json"), "input.items[1].qty")
    assert_invalid(client_a.post("/api/v1/runs", {"workflow": "list", "input": [1, "x"]}, format="json"), "input[1]")


def test_a_multiple_of_a_fraction_is_checked_exactly_for_an_integer_past_a_float_s_range(client_a, tenant_a):
    """``2**1100 / 0.1`` overflows a float: jsonschema's check raised, and the start answered 500."""
    schema = {"type": "object", "properties": {"x": {"multipleOf": 0.1}, "y": {"multipleOf": 2 ** 1100}}}
    response = client_a.post("/api/v1/workflows", {"name": "tenths", "spec": {"nodes": NOOP, "input_schema": schema}},
                             format="json")
    assert response.status_code == 201, response.content

    assert_invalid(client_a.post("/api/v1/runs", {"workflow": "tenths", "input": {"x": 2 ** 1100}}, format="json"),
                   "input.x", "is not a multiple of 0.1")
    assert_invalid(client_a.post("/api/v1/runs", {"workflow": "tenths", "input": {"y": 0.5}}, format="json"),
                   "input.y", "is not a multiple of")
    assert run_count(tenant_a[0]) == 0
    started = client_a.post("/api/v1/runs", {"workflow": "tenths", "input": {"x": 2.5, "y": 2 ** 1101}}, format="json")
    assert started.status_code == 201, started.content
