"""Workflows as code: the builder compiles to the documented spec, applies idempotently, and the
server refuses a compiled spec exactly as it refuses the same spec written by hand."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ductor_sdk import BadRequest, Client, Input, Retry, RunId, StepRef, Workflow, all_of, any_of
from ductor_sdk.spec import normalized, same_spec

from workflows import spec as server_spec


def documented_example() -> dict[str, Any]:
    """The example spec of the server's ``workflows/spec.py`` docstring."""
    doc = server_spec.__doc__ or ""
    start = doc.index("{", doc.index("A spec is a JSON object::"))
    return dict(json.loads(doc[start:doc.index("Top level:")]))


def documented_example_as_code(timeout_s: float = 30) -> Workflow:
    wf = Workflow("users", description="the example of workflows/spec.py")
    fetch = wf.action(
        "fetch", "http.request", input={"path": f"/users/{Input['user_id'].interpolated}", "method": "GET"},
        when=Input["enabled"].eq(True), retry=Retry(max_attempts=3, backoff_s=1.0, max_backoff_s=60),
        timeout_s=timeout_s, tags=["crm"], pool="main",
    )
    wf.sleep("pause", depends_on=[fetch], duration_s=10)
    wf.sleep("until", until="2027-01-01T00:00:00Z")
    child = wf.subworkflow("child", depends_on=[fetch], workflow="enrich", version=2,
                           input={"user": fetch.output["body"]})
    wf.wait_for_event("paid", depends_on=[fetch], event="order.paid", key=Input["order_id"], timeout_s=86400,
                      default={"paid": False})
    wf.continue_as_new("again", depends_on=[child], input={"cursor": child.output["next"]})
    wf.output(user=fetch.output["body"], done=True)
    return wf


# --- compiling -------------------------------------------------------------------------------


def test_the_builder_compiles_the_documented_example_to_the_documented_spec() -> None:
    expected = documented_example()
    expected["nodes"][2]["depends_on"] = []  # the builder writes depends_on on every node

    assert documented_example_as_code().to_spec() == expected


def test_references_and_conditions_are_the_template_language_s_strings() -> None:
    wf = Workflow("refs")
    fetch = wf.action("fetch", "echo")

    assert str(Input["a"]["b"]) == "$input.a.b"
    assert str(wf.input["x"]) == "$input.x"
    assert str(fetch.output["items"][0]["name"]) == "$nodes.fetch.output.items.0.name"
    assert str(fetch.status) == "$nodes.fetch.status"
    assert RunId.interpolated == "{{ $run.id }}"
    assert fetch.output["code"].gt(199) == {"path": "nodes.fetch.output.code", "op": "gt", "value": 199}
    assert any_of(Input["force"].eq(True), all_of(Input["tier"].in_(["a", "b"]))) == {"any": [
        {"path": "input.force", "op": "eq", "value": True},
        {"all": [{"path": "input.tier", "op": "in", "value": ["a", "b"]}]},
    ]}
    with pytest.raises(ValueError, match="segments are letters"):
        Input["a.b"]
    wf.action("use", "echo", input={"v": fetch})
    with pytest.raises(TypeError, match="output"):
        wf.to_spec()


def test_a_reference_in_an_input_adds_no_dependency() -> None:
    wf = Workflow("explicit")
    fetch = wf.action("fetch", "echo")
    wf.action("use", "echo", input={"v": fetch.output})
    wf.action("after", "echo", depends_on=[fetch, "use"])

    nodes = {node["id"]: node for node in wf.to_spec()["nodes"]}

    assert nodes["use"]["depends_on"] == []
    assert nodes["use"]["input"] == {"v": "$nodes.fetch.output"}
    assert nodes["after"]["depends_on"] == ["fetch", "use"]


def test_a_task_node_compiles_to_the_task_node_shape() -> None:
    wf = Workflow("billing")
    charge = wf.task("charge", task="billing.tasks.charge", input={"order": Input["order_id"]},
                     retry=Retry(max_attempts=5), timeout_s=120, tags=["billing"], pool="team-workers")
    wf.action("notify", "echo", depends_on=[charge], when=charge.output["ok"].eq(True))

    assert wf.to_spec()["nodes"][0] == {
        "id": "charge", "type": "task", "task": "billing.tasks.charge", "input": {"order": "$input.order_id"},
        "depends_on": [], "retry": {"max_attempts": 5, "backoff_s": 1.0, "jitter": True}, "timeout_s": 120,
        "tags": ["billing"], "pool": "team-workers",
    }


def test_a_task_node_with_heartbeat_s_compiles_with_it() -> None:
    wf = Workflow("media")
    wf.task("transcode", task="media.tasks.transcode", heartbeat_s=30, timeout_s=7200)

    node = wf.to_spec()["nodes"][0]
    assert (node["heartbeat_s"], node["timeout_s"]) == (30, 7200)


def test_a_retry_policy_s_non_retryable_compiles_and_normalizes_as_the_server_keeps_it() -> None:
    wf = Workflow("billing")
    wf.action("charge", "noop", retry=Retry(max_attempts=3, non_retryable=["CardDeclined", "timeout", "CardDeclined"]))
    spec = wf.to_spec()

    assert spec["nodes"][0]["retry"]["non_retryable"] == ["CardDeclined", "timeout", "CardDeclined"]
    stored = server_spec.validate_spec(spec, max_bytes=1_000_000).to_dict()
    assert stored["nodes"][0]["retry"]["non_retryable"] == ["CardDeclined", "timeout"]
    assert normalized(spec) == normalized(stored)


def test_an_option_given_as_none_is_left_to_the_server_s_default_not_sent_as_null() -> None:
    wf = Workflow("billing")
    wf.task("charge", task="billing.tasks.charge", retry=None, timeout_s=None, pool=None, when=None, tags=None,
            depends_on=None)

    assert wf.to_spec()["nodes"][0] == {"id": "charge", "type": "task", "task": "billing.tasks.charge",
                                        "input": {}, "depends_on": []}


@pytest.mark.parametrize(("call", "message"), [
    (lambda wf: wf.task("x", task="t", timeout=5), "node 'x': unknown option 'timeout' (did you mean 'timeout_s'?)"),
    (lambda wf: wf.action("x", "noop", depends=["a"]), "unknown option 'depends' (did you mean 'depends_on'?)"),
    (lambda wf: wf.sleep("s", duraton_s=3), "unknown option 'duraton_s' (did you mean 'duration_s'?)"),
    (lambda wf: wf.task("x", task="t", zzz=1), "unknown option 'zzz' (every node takes depends_on, when,"),
])
def test_an_unknown_option_is_refused_at_once_not_dropped(call: Any, message: str) -> None:
    # Untyped code gets no type checker's warning: a dropped `timeout` ran under the catalog's timeout.
    wf = Workflow("billing")
    with pytest.raises(TypeError) as refused:
        call(wf)
    assert message in str(refused.value)
    assert wf.to_spec()["nodes"] == []


def test_depends_on_given_one_id_as_a_string_is_refused_not_split_into_letters() -> None:
    # A str is a Sequence[str] to a type checker: "charge" compiled to ["c", "h", "a", "r", "g", "e"].
    wf = Workflow("billing")
    charge = wf.task("charge", task="billing.tasks.charge")

    with pytest.raises(TypeError) as refused:
        wf.action("confirm", "noop", depends_on="charge")

    assert "node 'confirm': depends_on is a list of ids or steps: depends_on=['charge']" in str(refused.value)
    assert wf.to_spec()["nodes"] == [{"id": "charge", "type": "task", "task": "billing.tasks.charge", "input": {},
                                      "depends_on": []}]
    assert charge.id == "charge"


def test_a_retry_s_non_retryable_given_one_name_as_a_string_is_refused_not_split_into_letters() -> None:
    # "CardDeclined" compiled to ["C", "a", "r", …], names the server takes: the decline was retried.
    with pytest.raises(TypeError) as refused:
        Retry(max_attempts=3, non_retryable="CardDeclined")

    assert "non_retryable is a list of names: non_retryable=['CardDeclined']" in str(refused.value)


def test_the_sdk_normalizes_a_spec_as_the_server_stores_it() -> None:
    specs = [documented_example(), documented_example_as_code().to_spec(), {"nodes": [
        {"id": "b", "type": "action", "action": "noop", "depends_on": ["a"], "retry": {"backoff_s": 500}},
        {"id": "a", "type": "sleep", "until": "2027-01-01T01:00:00+01:00"},
        {"id": "c", "type": "subworkflow", "workflow": "x", "when": {"path": "input.x", "op": "exists"}},
    ]}]

    for spec in specs:
        stored = server_spec.validate_spec(spec, max_bytes=1_000_000).to_dict()
        assert normalized(spec) == normalized(stored)
        assert [node["id"] for node in normalized(spec)["nodes"]] == [node["id"] for node in stored["nodes"]]
    assert not same_spec(specs[1], documented_example_as_code(timeout_s=31).to_spec())
    for spec in specs:  # and as the server stores it, it compares the same, by the JSON rule too
        assert same_spec(spec, server_spec.validate_spec(spec, max_bytes=1_000_000).to_dict())


@pytest.mark.parametrize(("before", "after", "same"), [
    (1, 1.0, True),  # one number
    (1, True, False),  # JSON's true is not 1, though Python's True == 1
    (0, False, False),
    ([1, {"a": True}], [1.0, {"a": True}], True),
    ([1, {"a": True}], [1, {"a": 1}], False),
    ({"a": 1}, {"a": 1, "b": None}, False),
])
def test_a_change_of_a_literal_is_a_change_as_json_has_it(before: Any, after: Any, same: bool) -> None:
    def spec(value: Any) -> dict[str, Any]:
        return {"nodes": [{"id": "a", "type": "action", "action": "echo", "input": {"v": value}}]}

    assert same_spec(spec(before), spec(after)) is same


# --- on the server ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_apply_creates_the_workflow_then_changes_nothing_then_adds_a_version_when_the_spec_changes(
    sdk: Client,
) -> None:
    created = sdk.workflows.apply(documented_example_as_code())
    again = sdk.workflows.apply(documented_example_as_code())
    changed = sdk.workflows.apply(documented_example_as_code(timeout_s=31))

    assert (created.outcome, created.version) == ("created", 1)
    assert created.workflow.description == "the example of workflows/spec.py"
    assert (again.outcome, again.version) == ("unchanged", 1)
    assert (changed.outcome, changed.version) == ("updated", 2)
    assert [v.number for v in sdk.workflows.versions("users")] == [2, 1]
    assert sdk.workflows.get("users").spec == sdk.workflows.versions("users")[0].spec


@pytest.mark.django_db(transaction=True)
def test_concurrent_applies_of_one_workflow_add_one_version_each_change(server_url: str, make_tenant: Any) -> None:
    """A service's replicas apply their workflows as they start, at once: each create or new version
    names the version it read (``if_version``), and the applies that lose read the workflow again."""
    import asyncio

    from ductor_sdk import AsyncClient

    _, key = make_tenant("sdk-replicas")

    async def replicas(wf: Workflow, count: int) -> list[str]:
        async with AsyncClient(server_url, key, timeout=20.0) as client:
            applied = await asyncio.gather(*(client.workflows.apply(wf) for _ in range(count)))
            return sorted(a.outcome for a in applied)

    assert asyncio.run(replicas(documented_example_as_code(), 8)) == ["created"] + ["unchanged"] * 7
    assert asyncio.run(replicas(documented_example_as_code(timeout_s=31), 8)) == ["unchanged"] * 7 + ["updated"]
    with Client(server_url, key) as client:
        assert [v.number for v in client.workflows.versions("users")] == [2, 1]


@pytest.mark.django_db(transaction=True)
def test_apply_changes_a_description_alone_without_a_version(sdk: Client) -> None:
    sdk.workflows.apply(documented_example_as_code())
    renamed = documented_example_as_code()
    renamed.description = "users, synced"
    described = sdk.workflows.apply(renamed)
    again = sdk.workflows.apply(renamed)
    blank = documented_example_as_code()
    blank.description = ""

    assert (described.outcome, described.version, described.workflow.description) == ("described", 1, "users, synced")
    assert again.outcome == "unchanged"
    assert sdk.workflows.apply(blank).outcome == "unchanged"  # an empty description changes nothing
    assert sdk.workflows.archive("users").archived_at is not None
    assert sdk.workflows.describe("users", "retired").description == "retired"  # archived or not
    assert [v.number for v in sdk.workflows.versions("users")] == [1]


@pytest.mark.django_db(transaction=True)
def test_a_workflow_s_input_schema_is_applied_compared_and_refuses_a_start_naming_the_field(sdk: Client) -> None:
    schema = {"type": "object", "required": ["qty"], "properties": {"qty": {"type": "integer", "minimum": 1}}}

    def order(minimum: int = 1) -> Workflow:
        wf = Workflow("order", input_schema={**schema, "properties": {"qty": {"type": "integer", "minimum": minimum}}})
        wf.action("a", "noop")
        return wf

    outcomes = [sdk.workflows.apply(order()).outcome, sdk.workflows.apply(order()).outcome,
                sdk.workflows.apply(order(minimum=2)).outcome]
    with pytest.raises(BadRequest) as refused:
        sdk.runs.start("order", {"qty": 1})

    assert outcomes == ["created", "unchanged", "updated"]
    assert (refused.value.field, refused.value.code) == ("input.qty", "invalid")
    assert "1 is less than the minimum of 2" in refused.value.message + str(refused.value.details)
    assert sdk.runs.start("order", {"qty": 2}).created is True


@pytest.mark.django_db(transaction=True)
def test_a_compiled_spec_is_refused_like_the_same_spec_written_by_hand(sdk: Client) -> None:
    wf = Workflow("broken")
    wf.action("a", "echo", depends_on=["c"])
    wf.action("b", "echo", depends_on=["a"])
    wf.action("c", "nope", depends_on=["b"])
    wf.action("d", "echo", input={"v": wf.input["x"], "w": StepRef("zz").output})
    by_hand = {"nodes": [
        {"id": "a", "type": "action", "action": "echo", "depends_on": ["c"]},
        {"id": "b", "type": "action", "action": "echo", "depends_on": ["a"]},
        {"id": "c", "type": "action", "action": "nope", "depends_on": ["b"]},
        {"id": "d", "type": "action", "action": "echo", "input": {"v": "$input.x", "w": "$nodes.zz.output"}},
    ]}

    with pytest.raises(BadRequest) as compiled:
        sdk.workflows.apply(wf)
    with pytest.raises(BadRequest) as written:
        sdk.workflows.create("broken", by_hand)

    assert (compiled.value.code, compiled.value.message, compiled.value.details) == (
        written.value.code, written.value.message, written.value.details)
    details = compiled.value.details
    assert details["spec.nodes[2].action"][0].startswith("node 'c': action: unknown action 'nope'")
    assert "cycle: a → b → c → a" in details["spec.nodes[0].depends_on"][0]
    assert details["spec.nodes[3].input.w"] == ["node 'd': input.w: '$nodes.zz.output' names unknown node 'zz'"]
    assert compiled.value.field in compiled.value.fields
    assert "spec.nodes[2].action" in compiled.value.fields
