"""Workflow spec validation, the parsed DAG, and retry backoff.

Pure tests: no database, no Redis (the ``settings`` fixture only overrides limits).
"""

from __future__ import annotations

import copy
import itertools
import json
import random
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from workflows.spec import (
    CycleError,
    Retry,
    Spec,
    SpecError,
    backoff_delay,
    topological_order,
    validate_spec,
)

BIG = 1_000_000

EXAMPLE: dict[str, Any] = {
    "nodes": [
        {"id": "fetch", "type": "action", "action": "http.request",
         "input": {"path": "/users/{{ $input.user_id }}", "method": "GET"},
         "depends_on": [], "when": {"path": "input.enabled", "op": "eq", "value": True},
         "retry": {"max_attempts": 3, "backoff_s": 1.0, "max_backoff_s": 60, "jitter": True},
         "timeout_s": 30, "tags": ["crm"], "pool": "main"},
        {"id": "pause", "type": "sleep", "depends_on": ["fetch"], "duration_s": 10},
        {"id": "until", "type": "sleep", "until": "2027-01-01T00:00:00Z"},
        {"id": "child", "type": "subworkflow", "depends_on": ["fetch"], "workflow": "enrich", "version": 2,
         "input": {"user": "$nodes.fetch.output.body"}, "wait": True},
        {"id": "again", "type": "continue_as_new", "depends_on": ["child"],
         "input": {"cursor": "$nodes.child.output.next"}},
    ],
    "output": {"user": "$nodes.fetch.output.body", "done": True},
}


def act(node_id: str, *deps: str, **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "action", "action": "noop", "depends_on": list(deps), **extra}


def spec_of(*nodes: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"nodes": list(nodes), **top}


def errors_of(spec: Any, max_bytes: int = BIG) -> dict[str, list[str]]:
    with pytest.raises(SpecError) as caught:
        validate_spec(spec, max_bytes=max_bytes)
    return caught.value.errors


# -- the example and normalization --------------------------------------------------------------


def test_example_spec_validates_with_defaults_filled() -> None:
    spec = validate_spec(EXAMPLE, max_bytes=BIG)
    assert spec.ids == ("fetch", "pause", "until", "child", "again")
    assert spec.sinks == ("pause", "until", "again")
    assert spec.continue_as_new == "again"
    assert spec.size_bytes == len(json.dumps(EXAMPLE, separators=(",", ":")).encode())
    fetch = spec.node("fetch")
    assert fetch.retry == Retry(max_attempts=3, backoff_s=1.0, max_backoff_s=60.0, jitter=True)
    assert fetch.timeout_s == 30.0
    assert fetch.tags == ("crm",)
    assert fetch.pool == "main"
    assert fetch.action == "http.request"
    assert fetch.when == {"path": "input.enabled", "op": "eq", "value": True}
    assert fetch.dependents == ("pause", "child")
    pause = spec.node("pause")
    assert pause.duration_s == 10.0
    assert pause.input is None
    assert pause.retry == Retry()
    assert spec.node("until").until == datetime(2027, 1, 1, tzinfo=UTC)
    child = spec.node("child")
    assert (child.workflow, child.version, child.wait) == ("enrich", 2, True)
    assert spec.node("again").upstream == frozenset({"child", "fetch"})
    assert spec.output == EXAMPLE["output"]


def test_defaults_for_a_minimal_node() -> None:
    node = validate_spec(spec_of({"id": "a", "type": "action", "action": "noop"}), max_bytes=BIG).node("a")
    assert node.depends_on == ()
    assert node.input == {}
    assert node.when is None
    assert node.retry == Retry(max_attempts=1, backoff_s=1.0, max_backoff_s=300.0, jitter=True)
    assert node.timeout_s is None
    assert node.tags == ()
    assert node.pool is None
    sub = validate_spec(spec_of({"id": "s", "type": "subworkflow", "workflow": "w"}), max_bytes=BIG).node("s")
    assert (sub.version, sub.wait, sub.input) == (None, True, {})


def test_max_backoff_defaults_to_at_least_backoff() -> None:
    spec = validate_spec(spec_of(act("a", retry={"backoff_s": 600})), max_bytes=BIG)
    assert spec.node("a").retry.max_backoff_s == 600.0


def test_validation_does_not_modify_the_submitted_spec() -> None:
    submitted = copy.deepcopy(EXAMPLE)
    validate_spec(submitted, max_bytes=BIG)
    assert submitted == EXAMPLE


def test_to_dict_round_trips_to_an_equal_spec() -> None:
    spec = validate_spec(EXAMPLE, max_bytes=BIG)
    again = validate_spec(json.loads(json.dumps(spec.to_dict())), max_bytes=BIG)
    assert again == spec


def test_spec_is_frozen() -> None:
    spec = validate_spec(EXAMPLE, max_bytes=BIG)
    with pytest.raises(AttributeError):
        spec.nodes = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        spec.nodes[0].id = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.by_id["x"] = spec.nodes[0]  # type: ignore[index]


# -- the DAG helpers ----------------------------------------------------------------------------


def diamond() -> Spec:
    return validate_spec(spec_of(act("d", "b", "c"), act("b", "a"), act("c", "a"), act("a")), max_bytes=BIG)


def test_diamond_order_upstream_and_downstream() -> None:
    spec = diamond()
    assert spec.ids == ("a", "b", "c", "d")
    assert spec.node("d").upstream == frozenset("abc")
    assert spec.node("b").upstream == frozenset("a")
    assert spec.node("a").dependents == ("b", "c")
    assert spec.sinks == ("d",)
    assert spec.downstream("a") == ("b", "c", "d")
    assert spec.downstream("b") == ("d",)
    assert spec.downstream("d") == ()
    with pytest.raises(KeyError):
        spec.downstream("zz")


def test_diamond_ready_nodes_progression() -> None:
    spec = diamond()
    assert spec.ready_nodes({}) == ["a"]
    assert spec.ready_nodes({"a": "running"}) == []
    assert spec.ready_nodes({"a": "succeeded"}) == ["b", "c"]
    assert spec.ready_nodes({"a": "succeeded", "b": "pending"}) == ["b", "c"]
    assert spec.ready_nodes({"a": "succeeded", "b": "succeeded", "c": "running"}) == []
    assert spec.ready_nodes({"a": "succeeded", "b": "succeeded", "c": "skipped"}) == ["d"]
    done = {"a": "succeeded", "b": "succeeded", "c": "succeeded", "d": "succeeded"}
    assert spec.ready_nodes(done) == []
    assert spec.is_finished(done)
    assert not spec.is_finished({**done, "d": "running"})


def test_a_failed_dependency_blocks_its_dependents() -> None:
    spec = diamond()
    assert spec.ready_nodes({"a": "succeeded", "b": "failed", "c": "succeeded"}) == []


def test_skip_propagates_through_skip_cause() -> None:
    spec = diamond()
    statuses = {"a": "succeeded", "b": "skipped", "c": "succeeded"}
    assert spec.ready_nodes(statuses) == ["d"]
    assert spec.skip_cause("d", statuses) == "b"
    assert spec.skip_cause("d", {"b": "succeeded", "c": "succeeded"}) is None
    assert spec.skip_cause("a", {}) is None


def test_fan_out_of_50_and_fan_in() -> None:
    workers = [act(f"w{i}", "start", input={"i": i, "x": "$nodes.start.output"}) for i in range(50)]
    join = act("join", *[f"w{i}" for i in range(50)], input={"all": [f"$nodes.w{i}.output" for i in range(50)]})
    spec = validate_spec(spec_of(act("start"), *workers, join), max_bytes=BIG)
    assert spec.ids[0] == "start"
    assert spec.ids[-1] == "join"
    assert spec.ready_nodes({"start": "succeeded"}) == [f"w{i}" for i in range(50)]
    statuses = {"start": "succeeded", **{f"w{i}": "succeeded" for i in range(49)}}
    assert spec.ready_nodes(statuses) == ["w49"]
    statuses["w49"] = "skipped"
    assert spec.ready_nodes(statuses) == ["join"]
    assert spec.node("join").upstream == frozenset({"start", *(f"w{i}" for i in range(50))})
    assert len(spec.downstream("start")) == 51
    assert spec.sinks == ("join",)


def test_topological_order_is_stable_and_respects_edges() -> None:
    # Among ready nodes, the earliest in the mapping goes first.
    assert topological_order({"c": [], "b": ["c"], "a": []}) == ["c", "b", "a"]
    assert topological_order({"b": ["a"], "c": [], "a": []}) == ["c", "a", "b"]
    assert topological_order({"x": ["unknown"]}) == ["x"]
    with pytest.raises(CycleError) as caught:
        topological_order({"a": ["b"], "b": ["a"]})
    assert caught.value.cycle == ["a", "b", "a"]


# -- rejections ---------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [None, [], "nodes", 3, True])
def test_spec_must_be_an_object(spec: Any) -> None:
    assert list(errors_of(spec)) == ["spec"]


@pytest.mark.parametrize("spec", [{}, {"nodes": []}, {"nodes": {}}, {"nodes": "a"}, {"output": 1}])
def test_nodes_are_required(spec: Any) -> None:
    assert "nodes" in errors_of(spec)


def test_unknown_top_level_field() -> None:
    errors = errors_of(spec_of(act("a"), extra=1))
    assert errors == {"extra": ["extra: unknown field; use nodes, output, input_schema and timeout_s"]}


def test_not_json_is_rejected() -> None:
    assert list(errors_of(spec_of(act("a", input={"x": float("nan")})))) == ["spec"]
    assert list(errors_of(spec_of(act("a", input={"x": {1, 2}})))) == ["spec"]


@pytest.mark.parametrize(
    ("node", "key", "needle"),
    [
        ("x", "nodes[0]", "must be an object"),
        ({"type": "action", "action": "noop"}, "nodes[0].id", "is required"),
        (act("Bad"), "nodes[0].id", "must be: a slug"),  # given, but not one: not "required"
        (act("1a"), "nodes[0].id", "slug"),
        (act("a" * 64), "nodes[0].id", "slug"),
        ({"id": "a", "type": "cron"}, "nodes[0].type", "unknown type 'cron'"),
        ({"id": "a"}, "nodes[0].type", "unknown type missing"),
        (act("a", colour="red"), "nodes[0].colour", "unknown field"),
        ({"id": "a", "type": "action"}, "nodes[0].action", "is required"),
        ({"id": "a", "type": "action", "action": 5}, "nodes[0].action", "must be: the name of a registered action"),
        ({"id": "a", "type": "action", "action": "nope"}, "nodes[0].action", "unknown action 'nope'"),
        (act("a", depends_on="b"), "nodes[0].depends_on", "must be a list"),
        (act("a", depends_on=[1]), "nodes[0].depends_on", "must be a list"),
        (act("a", retry=3), "nodes[0].retry", "must be an object"),
        (act("a", retry={"tries": 3}), "nodes[0].retry.tries", "unknown field"),
        (act("a", retry={"max_attempts": 0}), "nodes[0].retry.max_attempts", "1 to 100"),
        (act("a", retry={"max_attempts": 101}), "nodes[0].retry.max_attempts", "1 to 100"),
        (act("a", retry={"max_attempts": 2.5}), "nodes[0].retry.max_attempts", "1 to 100"),
        (act("a", retry={"max_attempts": True}), "nodes[0].retry.max_attempts", "1 to 100"),
        (act("a", retry={"backoff_s": 0}), "nodes[0].retry.backoff_s", "0 < x"),
        (act("a", retry={"backoff_s": -1}), "nodes[0].retry.backoff_s", "0 < x"),
        (act("a", retry={"backoff_s": "1"}), "nodes[0].retry.backoff_s", "0 < x"),
        (act("a", retry={"backoff_s": 10, "max_backoff_s": 5}), "nodes[0].retry.max_backoff_s", "backoff_s ≤ x"),
        (act("a", retry={"jitter": "yes"}), "nodes[0].retry.jitter", "true or false"),
        (act("a", timeout_s=0), "nodes[0].timeout_s", "0 < x ≤ 86400"),
        (act("a", timeout_s=86_401), "nodes[0].timeout_s", "0 < x ≤ 86400"),
        (act("a", timeout_s="30"), "nodes[0].timeout_s", "0 < x ≤ 86400"),
        (act("a", tags="crm"), "nodes[0].tags", "list of non-empty strings"),
        (act("a", tags=[""]), "nodes[0].tags", "list of non-empty strings"),
        (act("a", pool=""), "nodes[0].pool", "non-empty name"),
        (act("a", pool=5), "nodes[0].pool", "non-empty name"),
        (act("a", duration_s=5), "nodes[0].duration_s", "not allowed on a 'action' node"),
        ({"id": "s", "type": "sleep"}, "nodes[0].duration_s", "needs duration_s"),
        ({"id": "s", "type": "sleep", "duration_s": 1, "until": "2027-01-01T00:00:00Z"}, "nodes[0].until",
         "not both"),
        ({"id": "s", "type": "sleep", "duration_s": 0}, "nodes[0].duration_s", "0 < x"),
        ({"id": "s", "type": "sleep", "duration_s": 366 * 86_400 + 1}, "nodes[0].duration_s", "0 < x"),
        ({"id": "s", "type": "sleep", "duration_s": True}, "nodes[0].duration_s", "0 < x"),
        ({"id": "s", "type": "sleep", "until": "2027-01-01T00:00:00"}, "nodes[0].until", "timezone"),
        ({"id": "s", "type": "sleep", "until": "tomorrow"}, "nodes[0].until", "ISO 8601"),
        ({"id": "s", "type": "sleep", "until": 1_800_000_000}, "nodes[0].until", "ISO 8601"),
        # Out of what a datetime holds once in UTC: stored, a run's steps could not be read back.
        ({"id": "s", "type": "sleep", "until": "9999-12-31T23:59:59-14:00"}, "nodes[0].until", "years 1 to 9999"),
        ({"id": "s", "type": "sleep", "until": "0001-01-01T00:00:00+14:00"}, "nodes[0].until", "years 1 to 9999"),
        ({"id": "s", "type": "sleep", "duration_s": 1, "input": {}}, "nodes[0].input", "not allowed on a 'sleep'"),
        ({"id": "s", "type": "subworkflow"}, "nodes[0].workflow", "non-empty name"),
        ({"id": "s", "type": "subworkflow", "workflow": " "}, "nodes[0].workflow", "non-empty name"),
        ({"id": "s", "type": "subworkflow", "workflow": "w", "version": 0}, "nodes[0].version", "integer ≥ 1"),
        ({"id": "s", "type": "subworkflow", "workflow": "w", "version": "2"}, "nodes[0].version", "integer ≥ 1"),
        ({"id": "s", "type": "subworkflow", "workflow": "w", "wait": "no"}, "nodes[0].wait", "true or false"),
        ({"id": "s", "type": "continue_as_new", "action": "noop"}, "nodes[0].action", "not allowed"),
        (act("a", when={"path": "input.x", "op": "nope", "value": 1}), "nodes[0].when.op", "unknown operator"),
        (act("a", when={"all": [{"path": "input.x", "op": "eq"}]}), "nodes[0].when.all[0].value", "required"),
        (act("a", input={"path": "$secret.x"}), "nodes[0].input.path", "unknown reference root"),
        (act("a", input={"q": ["ok", "{{ $input.a..b }}"]}), "nodes[0].input.q[1]", "malformed reference"),
        (act("a", depends_on=["a"]), "nodes[0].depends_on", "cannot depend on itself"),
        (act("a", depends_on=["x"]), "nodes[0].depends_on", "unknown node 'x'"),
    ],
)
def test_bad_node_field_is_rejected_naming_node_and_field(node: Any, key: str, needle: str) -> None:
    errors = errors_of(spec_of(node))
    assert key in errors, errors
    assert any(needle in message for message in errors[key]), errors[key]


@pytest.mark.parametrize(("spec", "key", "bound"), [
    (spec_of({"id": "s", "type": "sleep", "duration_s": 366 * 86_400 + 1}), "nodes[0].duration_s", "31622400"),
    (spec_of({"id": "w", "type": "wait_for_event", "event": "paid", "timeout_s": 366 * 86_400 + 1}),
     "nodes[0].timeout_s", "31622400"),
    (spec_of({"id": "w", "type": "wait_for_event", "event": "paid", "lookback_s": 31 * 86_400}),
     "nodes[0].lookback_s", "2592000"),
    (spec_of(act("a"), timeout_s=366 * 86_400 + 1), "timeout_s", "31622400"),
])
def test_a_bound_of_seconds_is_written_in_whole_digits(spec: dict[str, Any], key: str, bound: str) -> None:
    """As the docs write it (31622400, 366 days), not in scientific notation (3.16224e+07)."""
    [message] = errors_of(spec)[key]
    assert f"≤ {bound}" in message, message
    assert "e+" not in message, message


def test_message_names_the_node_and_field() -> None:
    errors = errors_of(spec_of(act("a"), act("b", "x")))
    assert errors == {"nodes[1].depends_on": ["node 'b': depends_on: unknown node 'x'"]}
    with pytest.raises(SpecError, match=r"^node 'b': depends_on: unknown node 'x'$"):
        validate_spec(spec_of(act("a"), act("b", "x")), max_bytes=BIG)


def test_duplicate_ids() -> None:
    errors = errors_of(spec_of(act("a"), act("b"), act("a")))
    assert errors == {"nodes[2].id": ["node 'a': id: duplicate id (also nodes[0])"]}


def test_duplicate_dependency() -> None:
    errors = errors_of(spec_of(act("a"), act("b", "a", "a")))
    assert errors == {"nodes[1].depends_on": ["node 'b': depends_on: lists 'a' more than once"]}


def test_unknown_action_lists_registered_ones() -> None:
    message = errors_of(spec_of({"id": "a", "type": "action", "action": "nope"}))["nodes[0].action"][0]
    assert "echo" in message
    assert "noop" in message


def test_template_reference_must_be_upstream() -> None:
    errors = errors_of(spec_of(act("a"), act("b"), act("c", "a", input={"x": "$nodes.b.output"})))
    assert list(errors) == ["nodes[2].input.x"]
    assert "not upstream" in errors["nodes[2].input.x"][0]


def test_transitive_upstream_reference_is_allowed() -> None:
    spec = spec_of(act("a"), act("b", "a"), act("c", "b", input={"x": "{{ $nodes.a.output.y }}"},
                                                  when={"path": "nodes.a.status", "op": "eq", "value": "succeeded"}))
    assert validate_spec(spec, max_bytes=BIG).node("c").upstream == frozenset("ab")


def test_template_reference_to_unknown_node() -> None:
    errors = errors_of(spec_of(act("a", input={"x": "$nodes.ghost.output"})))
    assert errors == {"nodes[0].input.x": ["node 'a': input.x: '$nodes.ghost.output' names unknown node 'ghost'"]}


def test_when_reference_must_be_upstream() -> None:
    errors = errors_of(spec_of(act("a"), act("b", when={"path": "nodes.a.output.ok", "op": "exists"})))
    assert list(errors) == ["nodes[1].when.path"]


def test_output_may_name_any_node_but_not_an_unknown_one() -> None:
    spec = validate_spec(spec_of(act("a"), act("b"), output={"a": "$nodes.a.output", "b": "{{ $nodes.b.status }}"}),
                         max_bytes=BIG)
    assert spec.output == {"a": "$nodes.a.output", "b": "{{ $nodes.b.status }}"}
    errors = errors_of(spec_of(act("a"), output={"x": ["$nodes.zz.output"], "y": "$bad"}))
    assert list(errors) == ["output.x[0]", "output.y"]
    assert errors["output.x[0]"] == ["output.x[0]: '$nodes.zz.output' names unknown node 'zz'"]


def test_continue_as_new_must_be_a_sink() -> None:
    errors = errors_of(spec_of({"id": "again", "type": "continue_as_new"}, act("after", "again")))
    assert errors == {
        "nodes[1].depends_on": ["node 'after': depends_on: 'again' is a continue_as_new node, which must be a sink"]
    }


def test_at_most_one_continue_as_new() -> None:
    errors = errors_of(spec_of({"id": "a", "type": "continue_as_new"}, {"id": "b", "type": "continue_as_new"}))
    assert list(errors) == ["nodes[1].type"]
    assert "at most one continue_as_new" in errors["nodes[1].type"][0]


def test_all_per_node_errors_are_collected() -> None:
    errors = errors_of(spec_of(
        act("a", retry={"max_attempts": 0}, timeout_s=-1),
        {"id": "b", "type": "sleep"},
        {"id": "c", "type": "action", "action": "nope", "input": {"x": "$oops"}},
        act("d", "zz"),
        act("e", "e"),
        extra=True,
    ))
    assert set(errors) == {
        "nodes[0].retry.max_attempts", "nodes[0].timeout_s", "nodes[1].duration_s", "nodes[2].action",
        "nodes[2].input.x", "nodes[3].depends_on", "nodes[4].depends_on", "extra",
    }


def test_field_errors_and_a_cycle_are_reported_together() -> None:
    errors = errors_of(spec_of(act("a", "b", timeout_s=0), act("b", "a")))
    assert set(errors) == {"nodes[0].timeout_s", "nodes[0].depends_on"}
    assert errors["nodes[0].depends_on"] == ["node 'a': depends_on: cycle: a → b → a"]


# -- cycles -------------------------------------------------------------------------------------


def test_cycle_is_named_in_execution_order() -> None:
    errors = errors_of(spec_of(act("a", "c"), act("b", "a"), act("c", "b")))
    assert errors == {"nodes[0].depends_on": ["node 'a': depends_on: cycle: a → b → c → a"]}


def test_cycle_behind_an_acyclic_prefix_names_only_the_cycle() -> None:
    errors = errors_of(spec_of(act("root"), act("x", "root", "z"), act("y", "x"), act("z", "y"), act("tail", "z")))
    assert errors == {"nodes[1].depends_on": ["node 'x': depends_on: cycle: x → y → z → x"]}


def test_self_dependency_is_not_reported_as_a_cycle() -> None:
    errors = errors_of(spec_of(act("a", "a")))
    assert errors == {"nodes[0].depends_on": ["node 'a': depends_on: a node cannot depend on itself"]}


# -- limits -------------------------------------------------------------------------------------


def test_size_limit_is_compact_utf8_json(settings: Any) -> None:
    spec = spec_of(act("a", input={"text": "é" * 10}))
    size = len(json.dumps(spec, separators=(",", ":"), ensure_ascii=False).encode())
    assert validate_spec(spec, max_bytes=size).size_bytes == size
    errors = errors_of(spec, max_bytes=size - 1)
    assert errors == {"spec": [f"spec: is {size} bytes; the limit is {size - 1}"]}


def test_node_count_limit(settings: Any) -> None:
    settings.DUCTOR_MAX_SPEC_NODES = 3
    validate_spec(spec_of(act("a"), act("b"), act("c")), max_bytes=BIG)
    errors = errors_of(spec_of(act("a"), act("b"), act("c"), act("d")))
    assert errors == {"nodes": ["nodes: has 4 nodes; the limit is 3"]}


def test_default_node_limit_allows_500(settings: Any) -> None:
    assert settings.DUCTOR_MAX_SPEC_NODES == 500
    chain = [act("n0")] + [act(f"n{i}", f"n{i - 1}") for i in range(1, 500)]
    spec = validate_spec(spec_of(*chain), max_bytes=BIG)
    assert spec.ids[-1] == "n499"
    assert "n0" in spec.node("n499").upstream
    assert list(errors_of(spec_of(*chain, act("extra")))) == ["nodes"]


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"k": value}
    return value


def test_depth_limit(settings: Any) -> None:
    settings.DUCTOR_MAX_SPEC_DEPTH = 8
    # spec(1) → nodes(2) → node(3) → input and 4 levels inside it (4..8)
    validate_spec(spec_of(act("a", input=nested(5))), max_bytes=BIG)
    errors = errors_of(spec_of(act("a", input=nested(6))))
    assert errors == {"spec": ["spec: is nested 9 levels deep; the limit is 8"]}


def test_hostile_depth_is_rejected_without_recursion_error() -> None:
    assert list(errors_of(spec_of(act("a", input=nested(50_000))))) == ["spec"]


# -- backoff ------------------------------------------------------------------------------------


def test_backoff_without_jitter_doubles_up_to_the_cap() -> None:
    retry = Retry(max_attempts=10, backoff_s=1.5, max_backoff_s=10, jitter=False)
    assert [backoff_delay(retry, n) for n in range(1, 6)] == [1.5, 3.0, 6.0, 10.0, 10.0]
    assert backoff_delay(retry, 100) == 10.0


def test_backoff_accepts_a_mapping() -> None:
    assert backoff_delay({"backoff_s": 2, "max_backoff_s": 100, "jitter": False}, 3) == 8.0


def test_backoff_jitter_stays_within_half_and_full_delay() -> None:
    retry = Retry(max_attempts=10, backoff_s=1.0, max_backoff_s=60.0, jitter=True)
    rng = random.Random(1234)
    for attempt in range(1, 12):
        full = min(2.0 ** (attempt - 1), 60.0)
        draws = [backoff_delay(retry, attempt, rng=rng) for _ in range(200)]
        assert all(full / 2 <= d <= full for d in draws)
        assert max(draws) - min(draws) > full / 4  # actually spread, not constant


def test_backoff_jitter_is_reproducible_with_a_seed() -> None:
    retry = Retry(backoff_s=1.0, max_backoff_s=300.0)
    first = [backoff_delay(retry, n, rng=random.Random(7)) for n in range(1, 8)]
    again = [backoff_delay(retry, n, rng=random.Random(7)) for n in range(1, 8)]
    assert first == again


# -- properties ---------------------------------------------------------------------------------


@st.composite
def dags(draw: st.DrawFn) -> tuple[list[str], dict[str, list[str]]]:
    """A random DAG: node i may depend only on nodes before it in a hidden order, submitted shuffled."""
    count = draw(st.integers(min_value=1, max_value=25))
    ids = [f"n{i}" for i in range(count)]
    deps = {
        ids[i]: draw(st.lists(st.sampled_from(ids[:i]), unique=True, max_size=4)) if i else []
        for i in range(count)
    }
    submitted = draw(st.permutations(ids))
    return list(submitted), deps


@hsettings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_random_dags_validate_in_an_order_respecting_every_edge(dag: tuple[list[str], dict[str, list[str]]]) -> None:
    order, deps = dag
    nodes = [act(n, *deps[n], input={"up": [f"$nodes.{d}.output" for d in deps[n]]}) for n in order]
    spec = validate_spec(spec_of(*nodes), max_bytes=BIG)
    position = {node_id: i for i, node_id in enumerate(spec.ids)}
    assert sorted(spec.ids) == sorted(order)
    for node_id, ds in deps.items():
        for dep in ds:
            assert position[dep] < position[node_id]
            assert dep in spec.node(node_id).upstream
            assert node_id in spec.downstream(dep)
    assert set(spec.sinks) == {n for n in order if not any(n in ds for ds in deps.values())}
    # Walking ready nodes to completion visits every node exactly once.
    statuses: dict[str, str] = {}
    while ready := spec.ready_nodes(statuses):
        statuses.update(dict.fromkeys(ready, "succeeded"))
    assert spec.is_finished(statuses)


@hsettings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), st.data())
def test_random_graphs_with_a_back_edge_are_rejected_naming_a_real_cycle(
    dag: tuple[list[str], dict[str, list[str]]], data: st.DataObject
) -> None:
    order, deps = dag
    with_edges = [n for n, ds in deps.items() if ds]
    if not with_edges:
        return
    # n depends on d; making d depend on n (or on anything downstream of n) closes a cycle.
    node_id = data.draw(st.sampled_from(with_edges))
    target = data.draw(st.sampled_from(deps[node_id]))
    deps = {**deps, target: [*deps[target], node_id]}
    nodes = [act(n, *deps[n]) for n in order]
    errors = errors_of(spec_of(*nodes))
    assert len(errors) == 1
    [(key, [message])] = errors.items()
    assert key.endswith(".depends_on")
    cycle = message.split("cycle: ", 1)[1].split(" → ")
    assert cycle[0] == cycle[-1]
    assert len(set(cycle[:-1])) == len(cycle) - 1
    for before, after in itertools.pairwise(cycle):
        assert before in deps[after]  # each arrow is a real edge: dependency → dependent
    assert key == f"nodes[{order.index(cycle[0])}].depends_on"
