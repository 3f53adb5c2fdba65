"""The one template and condition language: the reference grammar, rendering of every reference kind,
validation, conditions, the routing language and the deprecated forms it still reads.

Pure tests: no database, no Redis.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduling.rules import Step, matches, render_partition_key, validate_match, validate_partition_key
from scheduling.templates import (
    ROUTING,
    FieldError,
    evaluate_when,
    parse_reference,
    render,
    template_errors,
    validate_template,
    when_errors,
)

CONTEXT: dict[str, Any] = {
    "input": {"user_id": 42, "a": {"b": [10, {"c": "deep"}]}, "flag": True, "none": None, "name": "Ada"},
    "nodes": {
        "fetch": {"output": {"body": {"id": 7, "tags": ["x", "y"]}, "code": 200}, "status": "succeeded"},
        "maybe": {"output": None, "status": "skipped"},
    },
    "run": {"id": "run-1", "root_id": "run-0"},
}


# -- whole-value references ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("$input", CONTEXT["input"]),
        ("$input.user_id", 42),
        ("$input.a.b", [10, {"c": "deep"}]),
        ("$input.a.b.1.c", "deep"),
        ("$input.flag", True),
        ("$input.none", None),
        ("$nodes.fetch.output", CONTEXT["nodes"]["fetch"]["output"]),
        ("$nodes.fetch.output.body.tags.0", "x"),
        ("$nodes.fetch.status", "succeeded"),
        ("$nodes.maybe.status", "skipped"),
        ("$run.id", "run-1"),
        ("$run.root_id", "run-0"),
    ],
)
def test_whole_value_reference_renders_the_json_value(template: str, expected: Any) -> None:
    assert render(template, CONTEXT) == expected


@pytest.mark.parametrize(
    "template",
    ["$input.missing", "$input.a.b.5", "$input.a.b.x", "$input.user_id.deeper", "$nodes.ghost.output",
     "$nodes.maybe.output.body"],
)
def test_missing_path_renders_null_as_whole_value(template: str) -> None:
    assert render(template, CONTEXT) is None


def test_a_key_whose_whole_value_refers_to_a_missing_path_is_left_out_elsewhere_null() -> None:
    # An optional field stays absent, as a JSON Schema's optional property wants it; a value that
    # exists, null included, is kept; a list keeps its positions.
    template = {"id": "$input.user_id", "cursor": "$input.missing", "none": "$input.none",
                "deep": {"x": "$nodes.maybe.output.body", "y": "$$5"}, "list": ["$input.missing", 1],
                "text": "[{{ $input.missing }}]"}
    assert render(template, CONTEXT) == {"id": 42, "none": None, "deep": {"y": "$5"}, "list": [None, 1],
                                         "text": "[]"}


def test_render_walks_nested_objects_and_lists_and_keeps_other_values() -> None:
    template = {"user": "$nodes.fetch.output.body", "list": [1, "$input.user_id", {"k": "$run.id"}],
                "n": 3.5, "b": False, "z": None, "$input": "keys are not templates"}
    assert render(template, CONTEXT) == {
        "user": {"id": 7, "tags": ["x", "y"]}, "list": [1, 42, {"k": "run-1"}],
        "n": 3.5, "b": False, "z": None, "$input": "keys are not templates",
    }


def test_render_does_not_modify_the_template() -> None:
    template = {"a": ["$input.user_id"]}
    render(template, CONTEXT)
    assert template == {"a": ["$input.user_id"]}


# -- interpolation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("/users/{{ $input.user_id }}", "/users/42"),
        ("/users/{{$input.user_id}}/x", "/users/42/x"),
        ("hi {{ $input.name }}!", "hi Ada!"),
        ("{{ $input.a.b.1.c }}-{{ $run.id }}-{{ $run.root_id }}", "deep-run-1-run-0"),
        ("body={{ $nodes.fetch.output.body }}", 'body={"id":7,"tags":["x","y"]}'),
        ("tags={{ $nodes.fetch.output.body.tags }}", 'tags=["x","y"]'),
        ("flag={{ $input.flag }} none={{ $input.none }}", "flag=true none=null"),
        ("status: {{ $nodes.fetch.status }}", "status: succeeded"),
        ("float {{ $nodes.fetch.output.code }}", "float 200"),
        ("[{{ $input.missing }}]", "[]"),
        ("[{{ $nodes.ghost.output.x }}]", "[]"),
        ("no references at all", "no references at all"),
        ("a lone {{ brace", "a lone {{ brace"),
        ("", ""),
    ],
)
def test_interpolation_renders_text(template: str, expected: str) -> None:
    assert render(template, CONTEXT) == expected


def test_interpolated_string_values_are_not_rendered_again() -> None:
    context = {"input": {"evil": "{{ $run.id }}", "dollar": "$run.id"}, "nodes": {}, "run": {"id": "r"}}
    assert render("x {{ $input.evil }}", context) == "x {{ $run.id }}"
    assert render("$input.dollar", context) == "$run.id"


# -- escapes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("$$5.00", "$5.00"),
        ("$$input", "$input"),
        ("$$", "$"),
        ("$$$", "$$"),
        ("$$ {{ $input.name }}", "$ Ada"),
        ("price: $5", "price: $5"),
    ],
)
def test_double_dollar_escapes_a_literal_dollar(template: str, expected: str) -> None:
    assert render(template, CONTEXT) == expected
    assert validate_template(template, field="input", upstream=set()) == []


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    ["$input", "$input.a.0.b-c", "$nodes.up.output", "$nodes.up.output.a.0.b", "$nodes.up.status", "$run.id",
     "$run.root_id", "x {{ $nodes.up.output.y }} {{ $input }}", {"k": ["$input.z", 1, None, True]}, 5, None],
)
def test_valid_templates_have_no_errors(template: Any) -> None:
    assert validate_template(template, field="input", upstream={"up"}) == []


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ("$foo", "unknown reference root '$foo'"),
        ("$env.HOME", "unknown reference root '$env'"),
        ("$input.", "malformed reference"),
        ("$input..a", "malformed reference"),
        ("$input a", "malformed reference"),
        ("$", "malformed reference"),
        ("$5.00", "malformed reference"),
        ("$nodes", "$nodes.<id>.output"),
        ("$nodes.up", "$nodes.<id>.output"),
        ("$nodes.up.input", "$nodes.<id>.output"),
        ("$nodes.up.status.x", "$nodes.<id>.output"),
        ("$nodes.Up.output", "$nodes.<id>.output"),
        ("$run", "$run.id or $run.root_id"),
        ("$run.attempt", "$run.id or $run.root_id"),
        ("$run.id.x", "$run.id or $run.root_id"),
        ("a {{ input.x }} b", "malformed reference"),
        ("a {{ $bogus }} b", "unknown reference root"),
        ("a {{ }} b", "malformed reference"),
        ("a {{ __import__('os') }} b", "malformed reference"),
    ],
)
def test_bad_references_are_rejected(template: str, needle: str) -> None:
    errors = validate_template(template, field="input", upstream={"up"})
    assert len(errors) == 1
    assert errors[0].startswith("input: ")
    assert needle in errors[0]


def test_errors_name_the_nested_field_path() -> None:
    template = {"path": "/u/{{ $nope }}", "items": [1, {"x": "$nodes.far.output"}], "ok": "$input"}
    assert [path for path, _ in template_errors(template, field="input", upstream={"up"})] == [
        "input.path", "input.items[1].x",
    ]


def test_node_reference_must_be_upstream_or_known() -> None:
    assert validate_template("$nodes.b.output", field="input", upstream={"a"}) == [
        "input: '$nodes.b.output' names node 'b', which is not upstream (add it to depends_on)"
    ]
    assert template_errors("{{ $nodes.zz.status }}", field="output", upstream=None, known={"a"}) == [
        ("output", "'$nodes.zz.status' names unknown node 'zz'")
    ]
    assert validate_template("$nodes.anything.output", field="output", upstream=None) == []


# -- when ---------------------------------------------------------------------------------------


def test_when_single_all_and_any() -> None:
    ctx = CONTEXT
    eq = {"path": "input.user_id", "op": "eq", "value": 42}
    ne = {"path": "input.user_id", "op": "eq", "value": 1}
    assert evaluate_when(None, ctx) is True
    assert evaluate_when(eq, ctx) is True
    assert evaluate_when(ne, ctx) is False
    assert evaluate_when({"all": [eq, eq]}, ctx) is True
    assert evaluate_when({"all": [eq, ne]}, ctx) is False
    assert evaluate_when({"any": [ne, eq]}, ctx) is True
    assert evaluate_when({"any": [ne, ne]}, ctx) is False


def test_all_and_any_do_not_nest_and_say_so_naming_the_item() -> None:
    eq = {"path": "input.user_id", "op": "eq", "value": 42}
    clean, errors = when_errors({"all": [eq, {"any": [eq]}]}, field="filter", upstream=None)
    assert clean is None
    assert errors == [("filter.all[1]", "'any' does not nest: all takes conditions of path, op and value")]


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        ({"path": "nodes.fetch.output.code", "op": "gt", "value": 199}, True),
        ({"path": "nodes.fetch.output.code", "op": "lt", "value": 200}, False),
        ({"path": "nodes.fetch.status", "op": "eq", "value": "succeeded"}, True),
        ({"path": "nodes.fetch.output.body.tags", "op": "exists"}, True),
        ({"path": "nodes.fetch.output.body.nope", "op": "exists", "value": False}, True),
        ({"path": "input.name", "op": "prefix", "value": "A"}, True),
        ({"path": "input.name", "op": "in", "value": ["Bob", "Ada"]}, True),
        ({"path": "input.missing", "op": "ne", "value": 1}, True),
        ({"path": "input.missing", "op": "eq", "value": None}, False),
    ],
)
def test_when_paths_reach_input_and_node_outputs(cond: dict[str, Any], expected: bool) -> None:
    clean, errors = when_errors(cond, field="when", upstream={"fetch"})
    assert errors == []
    assert evaluate_when(clean, CONTEXT) is expected


@pytest.mark.parametrize(
    ("value", "op", "expected", "holds"),
    [
        (True, "eq", 1, False),
        (False, "eq", 0, False),
        (1, "eq", True, False),
        (0, "ne", False, True),
        (True, "in", [1, "yes"], False),
        (1, "in", [True], False),
        ({"ok": True}, "eq", {"ok": 1}, False),
        ([0, 1], "eq", [False, True], False),
        (True, "eq", True, True),
        (1, "eq", 1.0, True),
        ({"ok": [1, True]}, "eq", {"ok": [1.0, True]}, True),
        (False, "in", [0, False], True),
    ],
)
def test_when_compares_as_json_so_a_boolean_is_not_a_number(value: Any, op: str, expected: Any, holds: bool) -> None:
    clean, errors = when_errors({"path": "input.v", "op": op, "value": expected}, field="when")
    assert errors == []
    assert evaluate_when(clean, {"input": {"v": value}, "nodes": {}, "run": {}}) is holds


@pytest.mark.parametrize(
    ("when", "key", "needle"),
    [
        ("yes", "when", "must be an object"),
        ({"path": "input.x", "op": "eq"}, "when.value", "is required"),
        ({"path": "input.x", "op": "like", "value": 1}, "when.op", "unknown operator"),
        ({"path": "input.x", "op": "eq", "value": 1, "extra": 1}, "when.extra", "unknown field"),
        ({"path": "env.HOME", "op": "eq", "value": 1}, "when.path",
         "must start with 'input.', 'nodes.<id>.' or 'run.'"),
        ({"path": "run.attempt", "op": "eq", "value": 1}, "when.path",
         "path 'run.attempt' reads nothing here: use run.id or run.root_id"),
        ({"path": "$input.x", "op": "exists"}, "when.path", "a path is written without its $: 'input.x'"),
        ({"path": ".".join(["input"] * 12), "op": "exists"}, "when.path",
         "must be a dotted path of at most 11 names (letters, digits, _ or -), such as 'input.customer.id'"),
        ({"path": "nodes.up", "op": "exists"}, "when.path", "nodes.<id>.output"),
        ({"path": "nodes.up.input", "op": "exists"}, "when.path", "nodes.<id>.output"),
        ({"path": "nodes.far.output", "op": "exists"}, "when.path", "not upstream"),
        ({"path": "nodes.ghost.status", "op": "exists"}, "when.path", "unknown node 'ghost'"),
        ({"all": []}, "when.all", "must be a list of 1 to 20 conditions"),
        ({"any": "x"}, "when.any", "must be a list"),
        ({"any": [{"path": "input.x", "op": "exists"}, {"path": "bad path", "op": "exists"}]},
         "when.any[1].path", "dotted path"),
        ({"all": [{"all": [{"path": "input.x", "op": "exists"}]}]}, "when.all[0]", "does not nest"),
    ],
)
def test_bad_when_is_rejected_naming_the_field(when: Any, key: str, needle: str) -> None:
    clean, errors = when_errors(when, field="when", upstream={"up"}, known={"up", "far"})
    assert clean is None
    assert len(errors) == 1
    assert errors[0][0] == key
    assert needle in errors[0][1]


def test_when_exists_defaults_to_true() -> None:
    clean, errors = when_errors({"path": "input.x", "op": "exists"}, field="when", upstream=set())
    assert errors == []
    assert clean == {"path": "input.x", "op": "exists", "value": True}


def test_evaluate_when_accepts_the_submitted_form() -> None:
    assert evaluate_when({"path": "input.name", "op": "exists"}, CONTEXT) is True
    assert evaluate_when({"any": [{"path": "input.nope", "op": "exists"}]}, CONTEXT) is False


# -- properties ---------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet="abc {}$._", max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text("ab", max_size=3), children, max_size=3),
    max_leaves=15,
)


@given(_json)
def test_a_template_with_no_errors_always_renders(template: Any) -> None:
    if not validate_template(template, field="t", upstream=set()):
        render(template, CONTEXT)


@given(st.text(alphabet=st.characters(blacklist_characters="$"), max_size=30).filter(lambda s: "{{" not in s))
def test_strings_without_dollar_or_braces_render_unchanged(text: str) -> None:
    assert validate_template(text, field="t", upstream=set()) == []
    assert render(text, CONTEXT) == text


@given(st.lists(st.from_regex(r"[a-z0-9_]{1,5}", fullmatch=True), min_size=0, max_size=5))
def test_parse_reference_round_trips_input_paths(parts: list[str]) -> None:
    text = "$" + ".".join(["input", *parts])
    assert parse_reference(text) == ("input", *parts)


# -- the routing language, and the deprecated forms ----------------------------------------------

STEP = Step(workflow="billing.invoice", action="http.request", input={"customer": {"id": 7, "tier": "gold"}})


@pytest.mark.parametrize(
    ("template", "key"),
    [
        ("c-{{ $input.customer.id }}", "c-7"),
        ("{{ $workflow }}/{{ $action }}", "billing.invoice/http.request"),
        ("$input.customer.tier", "gold"),
        ("$input.customer", '{"id":7,"tier":"gold"}'),
        ("[{{ $input.missing }}]", "[]"),
        # The deprecated single-brace placeholders read the same:
        ("c-{input.customer.id}", "c-7"),
        ("{workflow}/{action}", "billing.invoice/http.request"),
    ],
)
def test_a_partition_key_renders_from_the_step_in_the_routing_language(template: str, key: str) -> None:
    assert render_partition_key(validate_partition_key(template), STEP) == key


def test_deprecated_partition_keys_are_stored_in_the_current_form() -> None:
    assert validate_partition_key("c-{input.customer.id}-{workflow}") == "c-{{ $input.customer.id }}-{{ $workflow }}"
    assert validate_partition_key("c-{{ $input.customer.id }}") == "c-{{ $input.customer.id }}"


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ("{{ $nodes.a.output }}", "unknown reference root '$nodes'"),
        ("{{ $run.id }}", "unknown reference root '$run'"),
        ("{{ $workflow.name }}", "use $workflow"),
        ("{tenant}", "unknown placeholder '{tenant}'"),
        ("{input.a-b}", "unknown placeholder"),
    ],
)
def test_partition_keys_refuse_what_the_routing_language_does_not_have(template: str, needle: str) -> None:
    with pytest.raises(FieldError) as caught:
        validate_partition_key(template)
    assert caught.value.field == "action.partition_key"
    assert needle in caught.value.message


def test_rule_conditions_read_the_step_through_the_same_roots_and_the_deprecated_path_still_works() -> None:
    current = validate_match({"conditions": [{"path": "input.customer.tier", "op": "eq", "value": "gold"},
                                             {"path": "workflow", "op": "prefix", "value": "billing."}]})
    legacy = validate_match({"conditions": [{"path": "customer.tier", "op": "eq", "value": "gold"}]})
    assert legacy == {"conditions": [{"path": "input.customer.tier", "op": "eq", "value": "gold"}]}
    assert matches(current, STEP)
    assert matches(legacy, STEP)
    assert not matches(current, Step(workflow="shipping.label", action="x", input=STEP.input))


def test_the_two_languages_share_one_grammar_with_their_own_roots() -> None:
    assert parse_reference("$input.a-b.0", ROUTING) == ("input", "a-b", "0")
    assert parse_reference("$workflow", ROUTING) == ("workflow",)
    assert template_errors("$workflow", field="input") == [
        ("input", "unknown reference root '$workflow'; use $input…, $nodes.<id>.output…, $nodes.<id>.status or "
                  "$run.id or $run.root_id")]


@given(st.text(alphabet="{}\n ab$.", max_size=60))
def test_the_interpolations_are_where_the_regular_expression_finds_them(text: str) -> None:
    import re

    from scheduling.templates import _interpolations

    expected = [(found.start(), found.end() - 2) for found in re.finditer(r"\{\{(.*?)\}\}", text)]
    assert _interpolations(text) == expected


def test_a_string_of_openings_is_read_in_one_pass() -> None:
    # The regular expression tried each "{{" to the end of the text: a spec of 220 KB of "{{" held a web
    # worker past its timeout. Counted, not timed: the characters the scan reads, against the text's.
    from scheduling import templates

    read = [0]

    class Counted(str):
        def find(self, sub: str, start: Any = None, end: Any = None) -> int:
            found = str.find(self, sub, start, end)
            read[0] += (found if found >= 0 else len(self) if end is None else end) - (start or 0)
            return found

    for text, expected in (("{{" * 50_000, []), ("{{" * 50_000 + "}}", [(0, 100_000)]),
                           ("\n{{" * 50_000 + "}}", [(149_998, 150_000)]),
                           ("{{ $input.a }}" * 10_000, [(14 * i, 14 * i + 12) for i in range(10_000)])):
        read[0] = 0
        assert templates._interpolations(Counted(text)) == expected
        assert read[0] <= 3 * len(text), (text[:10], read[0])


# -- amplification ------------------------------------------------------------------------------


def test_interpolations_past_max_chars_are_refused_before_their_text_is_built() -> None:
    """A template of a few kilobytes may interpolate one large value thousands of times: 200 times
    a megabyte here, 200 MB of text. With ``max_chars`` the render stops at the first interpolation
    past it, having built less than that; without, it builds the whole text (as before)."""
    import tracemalloc

    from scheduling.templates import TemplateTooLarge

    context = {"input": {"big": "x" * 1_000_000}}
    template = {"one": "{{ $input.big }}" * 100, "many": [f"{{{{ $input.big }}}}{index}" for index in range(100)]}
    tracemalloc.start()
    try:
        with pytest.raises(TemplateTooLarge, match="more than 2000000 characters"):
            render(template, context, max_chars=2_000_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20_000_000
    assert render({"a": "{{ $input.big }}!"}, context, max_chars=1_000_001) == {"a": "x" * 1_000_000 + "!"}
    with pytest.raises(TemplateTooLarge):
        render({"a": "{{ $input.big }}!", "b": "{{ $input.big }}"}, context, max_chars=1_999_999)


def test_whole_value_references_share_their_value_and_cost_no_budget() -> None:
    context = {"input": {"big": "x" * 1_000_000}}
    rendered = render({f"k{index}": "$input.big" for index in range(1_000)}, context, max_chars=10)
    assert all(value is context["input"]["big"] for value in rendered.values())


def test_a_payload_that_shares_a_large_value_many_times_is_refused_unencoded() -> None:
    """A rendered input whose references share one large value: its JSON would take 1,000 times the
    value (a gigabyte here). ``payload_excess`` tells it is over from the sizes of its parts,
    and never encodes it."""
    import tracemalloc

    from ductor_project.core.payloads import json_depth, json_size, json_size_floor, payload_excess

    big = "x" * 1_000_000
    shared = {f"k{index}": big for index in range(1_000)}
    tracemalloc.start()
    try:
        excess = payload_excess(shared, max_bytes=512 * 1024, max_depth=64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert excess == "more than 1048576 bytes, over the plan's max_payload_bytes (524288)"
    assert peak < 10_000_000
    # Below twice the limit the size is exact, as before; the floor never passes the real size.
    small = {"a": "y" * 700, "b": ["é", 1, None, True, {"c": 2.5}]}
    assert payload_excess(small, max_bytes=500, max_depth=64) == (
        f"{json_size(small)} bytes, over the plan's max_payload_bytes (500)")
    floor, deepest = json_size_floor(small, stop_above=10**9)
    assert (floor <= json_size(small), deepest) == (True, json_depth(small))
