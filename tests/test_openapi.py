"""The OpenAPI schema: generated without a warning, valid OpenAPI 3, typed where the server knows
the shape (the workflow spec, routing rules, the one error shape), one tag per operation that
tells the tenant API from the platform API, and Markdown descriptions. Every operation the
Markdown files name (``POST /api/v1/runs``, a curl command) is one it declares.

The JSON Schemas are checked with ``jsonschema``'s Draft 4 validator: OpenAPI 3.0's schema
objects are Draft 4's keywords (``exclusiveMinimum`` a boolean), plus annotations it ignores.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from django.core.management import call_command
from django.urls import resolve
from drf_spectacular.generators import SchemaGenerator
from rest_framework import exceptions
from rest_framework.test import APIClient

from ductor_project.core.errors import ErrorCode, StepErrorCode, error_body, exception_handler
from ductor_project.core.openapi import collection_of, render_descriptions, rst_to_markdown, summary_for, tag_for
from scheduling import rules
from scheduling.action_errors import RetryableActionError
from tenants.entitlements import LIMIT_FIELDS
from tenants.models import Tier
from tenants.permissions import IsPlatformAdmin
from tests.conftest import ROOT
from workflows import spec as spec_module
from workflows.models import WorkflowRun
from workflows.spec import COMMON_FIELDS, NODE_TYPES, TYPE_FIELDS, validate_spec
from workflows.spec_schema import NODE_SCHEMAS

METHODS = ("get", "post", "put", "patch", "delete")
TASK_NODE = {"id": "charge", "type": "task", "task": "billing.tasks.charge", "depends_on": ["fetch"],
             "input": {"user": "$nodes.fetch.output.body"}, "retry": {"max_attempts": 2}, "pool": "main"}


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    generated = SchemaGenerator().get_schema(request=None, public=True)
    # As served: plain JSON types (lazy strings, tuples and the like rendered).
    return json.loads(json.dumps(generated, default=str))


def operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in schema["paths"].items():
        for method in METHODS:
            if method in item:
                yield path, method, item[method]


def validator(schema: dict[str, Any], component: str) -> jsonschema.Draft4Validator:
    """A validator for the component ``component`` of ``schema``, its ``$ref`` resolved in the schema
    (OpenAPI 3.0's ``nullable`` read as JSON Schema's ``null`` type)."""
    root = {"$ref": f"#/components/schemas/{component}", "components": _nullable(schema["components"])}
    return jsonschema.Draft4Validator(root)


def _nullable(node: Any) -> Any:
    """``nullable`` beside a ``type`` adds ``null`` to it; beside no type (a nullable ``allOf`` of a
    component), the schema takes null or what it says."""
    if isinstance(node, list):
        return [_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _nullable(value) for key, value in node.items() if key != "nullable"}
    if not node.get("nullable"):
        return out
    if isinstance(node.get("type"), str):
        out["type"] = [node["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        return out
    return {"anyOf": [{"type": "null"}, out]}


def docstring_example() -> dict[str, Any]:
    """The example spec of ``workflows/spec.py``'s docstring: the parser's own documentation."""
    doc = spec_module.__doc__ or ""
    start = doc.index("A spec is a JSON object::") + len("A spec is a JSON object::")
    return json.loads(doc[start:doc.index("\nTop level:")])


# --- generation ------------------------------------------------------------------------------


def test_every_request_body_declares_that_it_takes_no_other_field(schema: dict[str, Any]) -> None:
    """The API refuses a field a body does not declare (``400 unknown_field``): its schema says so, and a
    client generated from it offers no free-form extra properties."""
    components = schema["components"]["schemas"]
    bodies = {ref["$ref"].rsplit("/", 1)[1] for _, _, operation in operations(schema)
              for media in operation.get("requestBody", {}).get("content", {}).values()
              if "$ref" in (ref := media["schema"])}
    assert len(bodies) >= 20, bodies
    assert [name for name in sorted(bodies) if components[name].get("additionalProperties") is not False] == []


def test_the_schema_generates_without_a_warning_and_validates_against_the_openapi_3_meta_schema(
    tmp_path: Path,
) -> None:
    target = tmp_path / "schema.json"
    call_command("spectacular", "--fail-on-warn", "--validate", "--format", "openapi-json", "--file", str(target))
    assert json.loads(target.read_text())["openapi"].startswith("3.0")


# --- the workflow spec -----------------------------------------------------------------------


def test_a_node_of_each_type_of_the_docstring_example_validates_against_the_spec_schema(
    schema: dict[str, Any],
) -> None:
    example = docstring_example()
    example["nodes"].append(TASK_NODE)
    assert {node["type"] for node in example["nodes"]} == set(NODE_TYPES)
    spec_validator = validator(schema, "WorkflowSpec")
    spec_validator.validate(example)
    for node in example["nodes"]:
        spec_validator.validate({"nodes": [node]})
        validator(schema, NODE_SCHEMAS[node["type"]]).validate(node)


def test_the_normalized_spec_the_api_stores_and_returns_validates_against_the_spec_schema(
    schema: dict[str, Any],
) -> None:
    stored = validate_spec(docstring_example(), max_bytes=1_000_000).to_dict()
    validator(schema, "WorkflowSpec").validate(stored)


def _without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {name: value for name, value in data.items() if name != key}


INVALID_NODES = {
    "an unknown field": {"id": "a", "type": "action", "action": "echo", "colour": "red"},
    "another type's field": {"id": "a", "type": "action", "action": "echo", "duration_s": 1},
    "an id with a capital": {"id": "Fetch", "type": "action", "action": "echo"},
    "an id starting with a digit": {"id": "1a", "type": "action", "action": "echo"},
    "an id with a dash": {"id": "a-b", "type": "action", "action": "echo"},
    "both duration_s and until": {"id": "a", "type": "sleep", "duration_s": 5, "until": "2027-01-01T00:00:00Z"},
    "neither duration_s nor until": {"id": "a", "type": "sleep"},
    "a sleep with an input": {"id": "a", "type": "sleep", "duration_s": 5, "input": {}},
    "an unknown type": {"id": "a", "type": "shell", "command": "true"},
    "no type": {"id": "a", "action": "echo"},
    "an action node without its action": {"id": "a", "type": "action"},
    "too many attempts": {"id": "a", "type": "action", "action": "echo",
                          "retry": {"max_attempts": spec_module.MAX_ATTEMPTS + 1}},
    "an unknown retry field": {"id": "a", "type": "action", "action": "echo", "retry": {"tries": 2}},
    "a zero timeout": {"id": "a", "type": "action", "action": "echo", "timeout_s": 0},
    "a timeout past the bound": {"id": "a", "type": "action", "action": "echo",
                                 "timeout_s": spec_module.MAX_TIMEOUT_S + 1},
    "a sleep past the bound": {"id": "a", "type": "sleep", "duration_s": spec_module.MAX_SLEEP_S + 1},
    "a repeated dependency": {"id": "b", "type": "action", "action": "echo", "depends_on": ["a", "a"]},
    "an empty tag": {"id": "a", "type": "action", "action": "echo", "tags": [""]},
    "a when with an unknown operator": {"id": "a", "type": "action", "action": "echo",
                                        "when": {"path": "input.x", "op": "like", "value": 1}},
    "a when on an unknown root": {"id": "a", "type": "action", "action": "echo",
                                  "when": {"path": "env.x", "op": "eq", "value": 1}},
    "a when with an empty all": {"id": "a", "type": "action", "action": "echo", "when": {"all": []}},
    "a subworkflow version 0": {"id": "a", "type": "subworkflow", "workflow": "w", "version": 0},
    "a task that is no task name": {"id": "a", "type": "task", "task": "not a task!"},
}


@pytest.mark.parametrize("case", INVALID_NODES)
def test_an_invalid_node_fails_the_spec_schema_and_the_parser_alike(schema: dict[str, Any], case: str) -> None:
    spec = {"nodes": [INVALID_NODES[case]]}
    assert not validator(schema, "WorkflowSpec").is_valid(spec), case
    with pytest.raises(spec_module.SpecError):
        validate_spec(spec, max_bytes=1_000_000)


@pytest.mark.parametrize("spec", [
    {"nodes": [{"id": "a", "type": "action", "action": "echo"}], "colour": "red"},
    {"nodes": []},
    {"output": 1},
])
def test_an_invalid_spec_fails_the_spec_schema_and_the_parser_alike(schema: dict[str, Any], spec: Any) -> None:
    assert not validator(schema, "WorkflowSpec").is_valid(spec)
    with pytest.raises(spec_module.SpecError):
        validate_spec(spec, max_bytes=1_000_000)


def test_every_node_type_has_a_schema_with_exactly_the_fields_the_parser_allows(schema: dict[str, Any]) -> None:
    assert tuple(NODE_SCHEMAS) == NODE_TYPES
    components = schema["components"]["schemas"]
    node = components["WorkflowNode"]
    assert node["discriminator"]["propertyName"] == "type"
    assert node["discriminator"]["mapping"] == {
        kind: f"#/components/schemas/{name}" for kind, name in NODE_SCHEMAS.items()
    }
    for kind, name in NODE_SCHEMAS.items():
        assert set(components[name]["properties"]) == set(COMMON_FIELDS) | set(TYPE_FIELDS[kind]), kind
        assert components[name]["additionalProperties"] is False


def test_the_workflow_serializers_show_the_spec_schema(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    ref = "#/components/schemas/WorkflowSpec"
    for name in ("WorkflowCreateRequest", "WorkflowUpdateRequest", "Workflow", "WorkflowVersion"):
        spec = components[name]["properties"]["spec"]
        assert ref in (spec.get("$ref"), *(part.get("$ref") for part in spec.get("allOf", []))), name
    assert components["Workflow"]["properties"]["spec"]["nullable"] is True


@pytest.mark.django_db
def test_a_workflow_the_api_returns_validates_against_its_response_schema(
    client_a: APIClient, redis_client: Any, schema: dict[str, Any]
) -> None:
    created = client_a.post("/api/v1/workflows", {"name": "doc", "spec": docstring_example()}, format="json")
    assert created.status_code == 201, created.content[:300]
    validator(schema, "Workflow").validate(created.json())
    for version in client_a.get("/api/v1/workflows/doc/versions").json():
        validator(schema, "WorkflowVersion").validate(version)


@pytest.mark.django_db
def test_a_failed_run_and_its_steps_validate_against_their_typed_error_schemas(
    client_a: APIClient, redis_client: Any, schema: dict[str, Any]
) -> None:
    # A sub-workflow of no workflow: refused by the engine as the run starts, which fails it at once.
    created = client_a.post("/api/v1/workflows", {"name": "orphan", "spec": {"nodes": [
        {"id": "kid", "type": "subworkflow", "workflow": "later"}]}}, format="json")
    assert created.status_code == 201, created.content[:300]
    run = client_a.post("/api/v1/runs", {"workflow": "orphan"}, format="json").json()
    detail = client_a.get(f"/api/v1/runs/{run['id']}").json()

    assert (detail["status"], detail["error"]["node"], detail["error"]["error"]["code"]) == (
        "failed", "kid", "unknown_workflow")
    validator(schema, "RunDetail").validate(detail)
    for step in client_a.get(f"/api/v1/runs/{run['id']}/steps").json()["results"]:
        validator(schema, "StepRun").validate(step)
    errors = schema["components"]["schemas"]
    assert errors["StepError"]["properties"]["code"] == {"$ref": "#/components/schemas/StepErrorCode"}
    assert set(errors["StepErrorCode"]["enum"]) == {code.value for code in StepErrorCode}
    assert not validator(schema, "StepError").is_valid({"code": "no_such_code", "message": "", "retryable": False})
    failed_task = {"code": "task_failed", "message": "KeyError: 'sku'", "retryable": True,
                   "exception": {"type": "KeyError", "module": "builtins"}}
    validator(schema, "StepError").validate(failed_task)
    validator(schema, "StepError").validate(
        RetryableActionError("busy", code=StepErrorCode.RATE_LIMITED, status=429, retry_after_s=2).describe())


# --- routing rules ---------------------------------------------------------------------------


def test_a_rules_normalized_match_and_action_validate_against_their_schemas(schema: dict[str, Any]) -> None:
    match = rules.validate_match({
        "workflow": "billing.*", "action": "http.*", "tags": ["b", "a", "a"],
        "conditions": [{"path": "customer.tier", "op": "eq", "value": "gold"},  # the deprecated root-less path
                       {"path": "input.amount", "op": "gt", "value": 10}, {"path": "workflow", "op": "exists"}],
    })
    validator(schema, "RuleMatch").validate(match)
    validator(schema, "RuleMatch").validate({})
    tiers = tuple(Tier.values)
    for action in ({"pool": "main", "tier": "batch", "partition_key": "c-{input.customer}"}, {"deny": " no "}):
        validator(schema, "RuleAction").validate(rules.validate_action(action, allowed_tiers=tiers))


@pytest.mark.parametrize("path", ["a" * 194, ".".join("a" * 10)])
def test_a_root_less_condition_path_within_the_bounds_with_its_root_is_stored_as_the_schema_says(
    schema: dict[str, Any], path: str
) -> None:
    match = rules.validate_match({"conditions": [{"path": path, "op": "eq", "value": 1}]})
    assert match["conditions"][0]["path"] == f"input.{path}"
    validator(schema, "RuleMatch").validate(match)
    assert rules.validate_match(match) == match  # what a rule answers can be sent back


@pytest.mark.parametrize(("path", "why"), [("a" * 195, "201 characters"), (".".join("a" * 11), "12 names")])
def test_a_root_less_condition_path_past_the_bounds_with_its_root_is_refused_naming_it(path: str, why: str) -> None:
    with pytest.raises(rules.FieldError) as caught:
        rules.validate_match({"conditions": [{"path": path, "op": "eq", "value": 1}]})
    assert caught.value.field == "match.conditions[0].path"
    assert why in caught.value.message


@pytest.mark.parametrize(("names", "taken"), [(11, True), (12, False)])
def test_a_rule_condition_path_is_declared_with_the_names_the_server_takes(
    schema: dict[str, Any], names: int, taken: bool
) -> None:
    path = ".".join(["input", *"a" * (names - 1)])
    pattern = schema["components"]["schemas"]["RuleCondition"]["properties"]["path"]["pattern"]
    assert bool(re.match(pattern, path)) is taken
    match = {"conditions": [{"path": path, "op": "eq", "value": 1}]}
    if taken:
        assert rules.validate_match(match) == match
    else:
        with pytest.raises(rules.FieldError):
            rules.validate_match(match)


@pytest.mark.parametrize("component", ["ConnectionWriteRequest", "PatchedConnectionWriteRequest", "PoolWriteRequest",
                                       "PatchedPoolWriteRequest"])
def test_a_rate_is_declared_with_the_bounds_the_server_takes(schema: dict[str, Any], component: str) -> None:
    from scheduling.serializers import PoolWriteSerializer

    rate = schema["components"]["schemas"][component]["properties"]["rate_per_s"]
    assert (rate["minimum"], rate["maximum"]) == (0.001, 1e6)
    for value, taken in [(0.001, True), (1e6, True), (0.0009, False), (1e6 + 1, False)]:
        body = {"name": "p", "members": [], "rate_per_s": value}
        assert PoolWriteSerializer(data=body).is_valid() is taken, value
        assert jsonschema.Draft4Validator(rate).is_valid(value) is taken, value


@pytest.mark.parametrize("field", rules.KEY_TEMPLATES)
def test_a_key_of_deprecated_placeholders_is_bounded_as_it_is_stored(schema: dict[str, Any], field: str) -> None:
    within = rules.validate_action({field: "{input.a}" * 14}, allowed_tiers=tuple(Tier.values))  # 196 stored
    validator(schema, "RuleAction").validate(within)
    assert rules.validate_action(within, allowed_tiers=tuple(Tier.values)) == within
    with pytest.raises(rules.FieldError) as caught:
        rules.validate_action({field: "{input.a}" * 22}, allowed_tiers=tuple(Tier.values))  # 198 sent, 308 stored
    assert caught.value.field == f"action.{field}"
    assert "not 308" in caught.value.message


@pytest.mark.parametrize(("component", "value"), [
    ("RuleMatch", {"workflow": "a", "colour": "red"}),
    ("RuleMatch", {"conditions": [{"path": "input.x", "op": "like", "value": 1}]}),
    ("RuleAction", {}),
    ("RuleAction", {"deny": "no", "pool": "main"}),
    ("RuleAction", {"tier": "platinum"}),
])
def test_an_invalid_rule_fails_its_schema(schema: dict[str, Any], component: str, value: Any) -> None:
    assert not validator(schema, component).is_valid(value)


# --- errors ----------------------------------------------------------------------------------


def _anonymous_objects(node: Any, where: str) -> Iterator[str]:
    """Where an object with properties is declared inline, below a component's own top level."""
    if isinstance(node, list):
        for index, item in enumerate(node):
            yield from _anonymous_objects(item, f"{where}[{index}]")
    elif isinstance(node, dict):
        if node.get("properties") and "." in where:
            yield where
        for key, value in node.items():
            yield from _anonymous_objects(value, f"{where}.{key}")


def test_no_component_declares_an_object_inline_so_each_shape_has_one_name(schema: dict[str, Any]) -> None:
    # A generator names an inline object after where it sits: the dry run's and a step's routing
    # trace got one class each for the same pool, and a step error's "exception" a class named
    # Exception; the trace's pool and a task's took the names of the Pool and Task components.
    inline = [where for name, component in schema["components"]["schemas"].items()
              for where in _anonymous_objects(component.get("properties", {}), name)]
    assert inline == []
    components = schema["components"]["schemas"]
    for trace in ("DecisionTrace", "StepRouting"):
        properties = components[trace]["properties"]
        assert [ref["$ref"] for ref in properties["pool"]["allOf"]] == ["#/components/schemas/TracePool"]
        assert [ref["$ref"] for ref in properties["connection"]["allOf"]] == ["#/components/schemas/TraceConnection"]
        assert "#/components/schemas/TraceRule" in json.dumps(properties["rule"])


def test_every_operation_declares_its_error_responses_in_the_one_error_shape(schema: dict[str, Any]) -> None:
    for path, method, operation in operations(schema):
        # 400: a malformed request (a Host header the server does not serve), besides an invalid body,
        # query or path choice.
        expected = {"400", "401", "403", "404", "406", "429", "503"}
        if "requestBody" in operation or method in ("post", "put", "patch"):  # an action taking none too
            expected |= {"413", "415"}
        if method != "get":
            expected.add("409")
        responses = operation["responses"]
        assert expected <= set(responses), (method, path, expected - set(responses))
        for status in expected:
            content = responses[status]["content"]["application/json"]["schema"]
            assert content == {"$ref": "#/components/schemas/Error"}, (method, path, status)
        assert "Retry-After" in responses["429"]["headers"]
        assert "WWW-Authenticate" in responses["401"]["headers"]
        # A request line too long for the web server: its own page, before the API sees it.
        assert list(responses["414"]["content"]) == ["text/html"], (method, path)
        assert list(responses["431"]["content"]) == ["text/html"], (method, path)


def test_an_action_that_takes_no_body_answers_what_it_declares_for_one(
    schema: dict[str, Any], client_a: Any, settings: Any
) -> None:
    """``cancel`` takes no body: a field of one is 400, a body too large 413, one not JSON 415."""
    declared = schema["paths"]["/api/v1/runs/{id}/cancel/"]["post"]
    assert "requestBody" not in declared
    assert {"400", "413", "415"} <= set(declared["responses"])
    client_a.post("/api/v1/workflows", {"name": "flow", "spec": {"nodes": [{"id": "a", "type": "action",
                                                                            "action": "noop"}]}}, format="json")
    run = client_a.post("/api/v1/runs", {"workflow": "flow"}, format="json").json()
    url = f"/api/v1/runs/{run['id']}/cancel"
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    for response, status, code in (
        (client_a.post(url, {"reason": "x"}, format="json"), 400, "unknown_field"),
        (client_a.post(url, {"note": "x" * 2048}, format="json"), 413, "payload_too_large"),
        (client_a.post(url, "stop", content_type="text/plain"), 415, "unsupported_media_type"),
    ):
        assert (response.status_code, response.json()["error"]["code"]) == (status, code), response.content[:200]
    assert client_a.get(f"/api/v1/runs/{run['id']}").json()["status"] != "cancelled"


def _enum(schema: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """The values of the enum ``node`` is or refers to (itself, or in its one ``allOf``)."""
    ref = node.get("$ref") or next((part["$ref"] for part in node.get("allOf", []) if "$ref" in part), None)
    return list(schema["components"]["schemas"][ref.rsplit("/", 1)[1]]["enum"] if ref else node["enum"])


def _ref(node: dict[str, Any]) -> str:
    return str(node.get("$ref") or node["allOf"][0]["$ref"])


def test_one_set_of_enum_values_is_one_enum_component_wherever_it_is_declared(schema: dict[str, Any]) -> None:
    # Else a generated client has a class for each place: RunsListStatus beside RunStatusEnum for
    # the run list's filter, LineageNodeStatusEnum for a lineage's runs, AllowedTiersEnum beside
    # TierEnum, and TenantsOverridesUpdateField and TenantsOverridesDestroyField for one limit name.
    components = schema["components"]["schemas"]
    enums = [frozenset(component["enum"]) for component in components.values() if "enum" in component]
    assert len(enums) == len(set(enums))
    inline = [where for name, component in components.items() if "enum" not in component
              for where in _inline_enums(component, name)]
    inline += list(_inline_enums(schema["paths"], "paths"))
    assert inline == []
    status = {p["name"]: p["schema"] for p in schema["paths"]["/api/v1/runs/"]["get"]["parameters"]}["status"]
    assert _ref(status) == _ref(components["LineageNode"]["properties"]["status"]) == _ref(
        components["Run"]["properties"]["status"]) == "#/components/schemas/RunStatusEnum"
    overrides = schema["paths"]["/api/v1/tenants/{slug}/overrides/{field}/"]
    limits = [_ref(p["schema"]) for method in ("put", "delete") for p in overrides[method]["parameters"]
              if p["name"] == "field"]
    assert limits == [_ref(components["Override"]["properties"]["field"])] * 2
    assert _ref(components["Override"]["properties"]["value"]) == "#/components/schemas/LimitValue"


def test_the_dry_runs_trace_and_a_steps_routing_type_each_part_they_share_alike(schema: dict[str, Any]) -> None:
    # The dry run's tier was any string, a step's a TierEnum: the same trace, read as two types.
    components = schema["components"]["schemas"]
    dry_run, step = (components[name]["properties"] for name in ("DecisionTrace", "StepRouting"))
    for part in ("rule", "tier", "pool", "connection"):
        assert _ref(dry_run[part]) == _ref(step[part]), part
    assert _ref(dry_run["tier"]) == "#/components/schemas/TierEnum"


def test_a_partial_updates_body_declares_no_default_for_a_field_it_leaves_as_it_is(schema: dict[str, Any]) -> None:
    # A generated client sends each field's declared default unless told not to: a PATCH of a
    # schedule's jitter_s alone also sent paused false, timezone UTC and overlap skip, resuming a
    # paused schedule and moving it to UTC; a PATCH of a rule or a webhook enabled it again.
    components = schema["components"]["schemas"]
    bodies = {path: _ref(operation["requestBody"]["content"]["application/json"]["schema"]).rsplit("/", 1)[1]
              for path, method, operation in operations(schema) if method == "patch"}
    assert bodies["/api/v1/schedules/{id}/"] == "PatchedScheduleWriteRequest"
    defaults = {name: sorted(field for field, declared in components[name]["properties"].items()
                             if "default" in declared) for name in bodies.values()}
    assert defaults == {name: [] for name in bodies.values()}
    creates = components["ScheduleWriteRequest"]["properties"]  # a create's defaults are what it takes
    assert (creates["paused"]["default"], creates["timezone"]["default"]) == (False, "UTC")


def test_every_id_in_a_path_is_declared_a_uuid(schema: dict[str, Any]) -> None:
    # The views take any segment, to answer an id in another form 404 in the error shape; the
    # schema declared that segment's pattern, so a generated client typed /runs/{id} as any string.
    ids = {(path, method): parameter["schema"] for path, method, operation in operations(schema)
           for parameter in operation.get("parameters", []) if parameter["in"] == "path"
           and parameter["name"] in ("id", "delivery_id")}
    assert ("/api/v1/runs/{id}/steps/", "get") in ids
    assert ("/api/v1/webhooks/{id}/rotate/", "post") in ids
    assert {where: declared for where, declared in ids.items() if declared.get("format") != "uuid"} == {}


def _inline_enums(node: Any, where: str) -> Iterator[str]:
    """Where an enum of more than one value is declared inline."""
    if isinstance(node, list):
        for index, item in enumerate(node):
            yield from _inline_enums(item, f"{where}[{index}]")
    elif isinstance(node, dict):
        if len(node.get("enum") or ()) > 1:
            yield where
        for key, value in node.items():
            yield from _inline_enums(value, f"{where}.{key}")


def test_an_override_s_limit_is_one_of_the_plans_limits_and_each_method_documents_its_own_answers(
        schema: dict[str, Any]) -> None:
    operations = schema["paths"]["/api/v1/tenants/{slug}/overrides/{field}/"]
    for method in ("put", "delete"):
        [limit] = [p for p in operations[method]["parameters"] if p["name"] == "field"]
        assert sorted(_enum(schema, limit["schema"])) == sorted(LIMIT_FIELDS)
        assert "400" in operations[method]["responses"]  # another name is refused, naming it
    assert {"200", "204"} & set(operations["put"]["responses"]) == {"200"}
    assert {"200", "204"} & set(operations["delete"]["responses"]) == {"204"}
    assert "requestBody" not in operations["delete"]


def test_the_run_list_declares_each_filter_with_the_type_it_is_validated_as(schema: dict[str, Any]) -> None:
    parameters = {p["name"]: p["schema"] for p in schema["paths"]["/api/v1/runs/"]["get"]["parameters"]}
    assert set(_enum(schema, parameters["status"])) == set(WorkflowRun.Status.values)
    assert parameters["created_after"]["format"] == parameters["created_before"]["format"] == "date-time"
    assert parameters["root_run_id"]["format"] == "uuid"
    assert (parameters["page_size"]["minimum"], parameters["page_size"]["maximum"]) == (1, 500)


def test_every_lists_page_size_declares_the_bounds_the_server_takes(schema: dict[str, Any]) -> None:
    bounds = {path: next(p["schema"] for p in operation["get"]["parameters"] if p["name"] == "page_size")
              for path, operation in schema["paths"].items()
              if any(p["name"] == "page_size" for p in operation.get("get", {}).get("parameters", []))}
    assert len(bounds) >= 10
    assert {(b["minimum"], b["maximum"]) for b in bounds.values()} == {(1, 500), (1, 100)}
    assert bounds["/api/v1/runs/{id}/steps/"]["maximum"] == 100


def _answer(exc: Exception) -> Any:
    return exception_handler(exc, {})


@pytest.mark.parametrize("exc", [
    exceptions.ValidationError({"spec": {"nodes": [{"id": ["Bad id."]}]}, "name": ["Required."]}),
    exceptions.ValidationError(["Not an object."]),
    exceptions.ParseError("Expecting value"),
    exceptions.NotAuthenticated(),
    exceptions.AuthenticationFailed("Invalid API key."),
    exceptions.PermissionDenied(),
    exceptions.NotFound(),
    exceptions.UnsupportedMediaType("text/plain"),
    exceptions.NotAcceptable(),
    exceptions.Throttled(wait=3),
], ids=lambda exc: type(exc).__name__)
def test_what_the_exception_handler_answers_validates_against_the_error_schema(
    schema: dict[str, Any], exc: Exception
) -> None:
    response = _answer(exc)
    validator(schema, "Error").validate(json.loads(json.dumps(response.data)))
    declared = schema["paths"]["/api/v1/runs/"]["post"]["responses"][str(response.status_code)]
    assert set(declared.get("headers", {})) <= set(response.headers), response.status_code


def test_every_error_code_is_in_the_error_schema(schema: dict[str, Any]) -> None:
    error = validator(schema, "Error")
    for code in ErrorCode:
        error.validate(error_body(code, "message", {"field": ["problem"]}))
    assert not error.is_valid(error_body("no_such_code", "message"))


# --- tags ------------------------------------------------------------------------------------


def _view_of(path: str) -> Any:
    """The callback Django routes the schema path to (its parameters filled with a dummy value)."""
    return resolve(re.sub(r"\{[^}]+\}", "x", path)).func


def test_every_operation_has_exactly_one_tag_and_platform_operations_a_platform_tag(schema: dict[str, Any]) -> None:
    described = [tag["name"] for tag in schema["tags"]]
    used: set[str] = set()
    for path, method, operation in operations(schema):
        assert len(operation["tags"]) == 1, (method, path, operation["tags"])
        tag = operation["tags"][0]
        used.add(tag)
        callback = _view_of(path)
        classes = callback.initkwargs.get("permission_classes", callback.cls.permission_classes)
        platform = any(issubclass(permission, IsPlatformAdmin) for permission in classes)
        assert tag.startswith("platform: ") is platform, (method, path, tag)
        assert tag in described, (method, path, tag)
    assert set(described) == used
    assert all(tag.get("description") for tag in schema["tags"])
    groups = {group["name"]: group["tags"] for group in schema["x-tagGroups"]}
    assert groups["Platform API"] == [tag for tag in described if tag.startswith("platform: ")]
    assert groups["Tenant API"] == [tag for tag in described if not tag.startswith("platform: ")]


@pytest.mark.parametrize(("path", "platform", "tag"), [
    ("/api/v1/runs/{id}/events/", False, "runs"),
    ("/api/v1/routing/explain/", False, "routing"),
    ("/api/v1/pools/", False, "routing"),
    ("/api/v1/api-keys/{id}/revoke/", False, "tenant"),
    ("/api/v1/tasks/", False, "tasks"),
    ("/api/v1/tenants/{slug}/plan/", True, "platform: tenants"),
    ("/api/v1/task-catalog/{name}/", True, "platform: task catalog"),
    ("/api/v1/platform/queue/", True, "platform: queue"),
])
def test_a_tag_follows_from_the_path_and_whether_the_view_is_a_platform_one(
    path: str, platform: bool, tag: str
) -> None:
    assert tag_for(path, platform=platform) == tag


def test_the_api_s_prefix_is_one_for_its_schema_and_its_query_checks() -> None:
    from ductor_project import parsers
    from ductor_project.core import openapi

    assert parsers.API_PREFIX == openapi.API_PREFIX


def test_the_collection_of_a_path_skips_the_platform_segment() -> None:
    assert collection_of("/api/v1/platform/queue/") == "queue"
    assert collection_of("/api/v1/platform/") == "platform"
    assert collection_of("/admin/") == ""


# --- summaries and operation ids ------------------------------------------------------------


def test_every_operation_has_a_summary_of_its_own_and_an_id_without_the_version(schema: dict[str, Any]) -> None:
    """A generated client names its methods by the ids and documents them by the summaries: each
    says what its one operation does (a list, an action), and none repeats the version prefix."""
    summaries: dict[str, tuple[str, str]] = {}
    for path, method, operation in operations(schema):
        summary = operation.get("summary")
        assert summary, (method, path)
        assert summary not in summaries, (method, path, summary, summaries.get(summary))
        summaries[summary] = (method, path)
        assert not operation["operationId"].startswith("v1_"), (method, path, operation["operationId"])
    assert summaries["List routing rules"] == ("get", "/api/v1/rules/")
    assert summaries["Delete an API key"] == ("delete", "/api/v1/api-keys/{id}/")
    assert summaries["Start a run"] == ("post", "/api/v1/runs/")  # the view's own, over the standard one


@pytest.mark.parametrize(("action", "path", "summary"), [
    ("list", "/api/v1/pools/", "List pools"),
    ("create", "/api/v1/api-keys/", "Create an API key"),
    ("retrieve", "/api/v1/task-catalog/{name}/", "Get a catalog entry"),
    ("update", "/api/v1/fairness-keys/{id}/", "Replace a fairness key"),
    ("partial_update", "/api/v1/webhooks/{id}/", "Update a webhook endpoint"),
    ("destroy", "/api/v1/triggers/{id}/", "Delete an event trigger"),
    ("cancel", "/api/v1/runs/{id}/cancel/", None),  # an action of its own says its summary itself
    ("list", "/admin/", None),
])
def test_a_standard_action_is_summarized_from_its_collection(action: str, path: str, summary: str | None) -> None:
    assert summary_for(action, path) == summary


# --- descriptions ----------------------------------------------------------------------------


def _descriptions(node: Any) -> Iterator[str]:
    if isinstance(node, list):
        for item in node:
            yield from _descriptions(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                yield value
            else:
                yield from _descriptions(value)


def test_no_description_in_the_schema_is_restructured_text(schema: dict[str, Any]) -> None:
    for description in _descriptions(schema):
        assert "``" not in description, description
        assert not re.search(r":[a-z]+:`", description), description
        assert not description.rstrip().endswith("::"), description
    assert "description" not in schema["components"]["schemas"]["ApiKey"]  # no base class's docstring


@pytest.mark.parametrize(("rst", "markdown"), [
    ("Reads show ``has_secret``.", "Reads show `has_secret`."),
    ("``a`` and ``b``", "`a` and `b`"),
    ("A ``x`b`` literal", "A `` x`b `` literal"),
    ("See :class:`~workflows.spec.Spec` and :func:`validate_spec`.", "See `Spec` and `validate_spec`."),
    ("The :py:meth:`Spec.to_dict` form", "The `Spec.to_dict` form"),
    ("See :ref:`the API <api>`.", "See `the API`."),
    ("Read `the docs <https://example.com/a>`_ first.", "Read [the docs](https://example.com/a) first."),
    ("Already `Markdown` and **bold**.", "Already `Markdown` and **bold**."),
    ("A spec::\n\n    {\"nodes\": []}\n\nThen more.", "A spec:\n\n```\n{\"nodes\": []}\n```\n\nThen more."),
    ("A spec ::\n\n    x = 1\n    y = 2", "A spec\n\n```\nx = 1\ny = 2\n```"),
    ("Text.\n\n::\n\n    x = ``1``\n\nEnd.", "Text.\n\n```\nx = ``1``\n```\n\nEnd."),
    (".. code-block:: json\n\n    {\"a\": 1}", "```json\n{\"a\": 1}\n```"),
    ("Keep\n```\n``x``\n```", "Keep\n```\n``x``\n```"),
    ("Ends with a colon::", "Ends with a colon:"),
    ("C++ like a::b stays", "C++ like a::b stays"),
])
def test_restructured_text_becomes_markdown(rst: str, markdown: str) -> None:
    assert rst_to_markdown(rst) == markdown


def test_markdown_passes_through_unchanged() -> None:
    text = "- a `list`\n- of [links](https://example.com)\n\n```json\n{\"a\": 1}\n```"
    assert rst_to_markdown(text) == text
    assert rst_to_markdown(rst_to_markdown("Use ``x``::\n\n    y")) == rst_to_markdown("Use ``x``::\n\n    y")


def test_the_descriptions_hook_leaves_examples_and_defaults_as_they_are() -> None:
    result = {"components": {"schemas": {"A": {"description": "``x``", "example": {"description": "``y``"},
                                               "default": {"description": "``z``"}}}}}
    rendered = render_descriptions(copy.deepcopy(result), generator=None)
    schema = rendered["components"]["schemas"]["A"]
    assert schema["description"] == "`x`"
    assert schema["example"] == {"description": "``y``"}
    assert schema["default"] == {"description": "``z``"}


DOC_OPERATION = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE) (/api/v1/[^\s`?)|,;]*)")
DOC_CURL = re.compile(r"curl\b(?:[^\n\\]|\\\n|\\)*")
CURL_URL = re.compile(r"(?:localhost|127\.0\.0\.1)(?::\d+)?(/api/v1/[^\s\"'?]*)")


def named_operations(text: str) -> Iterator[tuple[str, str]]:
    """Each operation a document names, as ``GET /api/v1/runs/{id}`` or as a curl command's method
    (``-X``, else ``POST`` with a body, else ``GET``) and path."""
    yield from DOC_OPERATION.findall(text)
    for command in DOC_CURL.findall(text):
        method = re.search(r"-X\s+([A-Z]+)", command)
        verb = method.group(1) if method else "POST" if re.search(r"\s-d\s", command) else "GET"
        yield from ((verb, path) for path in CURL_URL.findall(command))


def test_every_operation_the_docs_name_is_one_the_schema_declares(schema: dict[str, Any]) -> None:
    """A reader who calls what a document names finds it served: a path of the schema, a ``{…}``
    part or a value standing for each of its parameters (``{id}``, ``$RUN``, ``acme``), with that
    method."""
    declared = [(method.upper(), re.compile(re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(path.rstrip("/")))))
                for path, method, _ in operations(schema)]
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    unknown = []
    for name in listed.stdout.split():
        for method, path in named_operations((ROOT / name).read_text()):
            path = path.rstrip("/.:")
            if not any(verb == method and pattern.fullmatch(path) for verb, pattern in declared):
                unknown.append(f"{name}: {method} {path}")
    assert unknown == []
