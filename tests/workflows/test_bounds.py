"""Bounded payloads and responses: the plan's payload limit on every rendered input, step output
and run output, and a run detail whose steps fit a byte budget, with the full list a page away.

The engine runs in this process (ticks and steps called directly) against the real PostgreSQL
and Redis; the API tests read what it wrote.
"""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.test import override_settings

from ductor_project.core.context import tenant_context
from ductor_project.core.payloads import json_size
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.conftest import api_client
from tests.workflows.test_engine_inline import by_node, echo, execute, put, queued, start, tick
from workflows.actions import ActionCall, action
from workflows.models import StepRun, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 1_000  # the tenant's max_payload_bytes in these tests


@action("test.blob")
def blob(call: ActionCall) -> Any:
    """Returns ``input.bytes`` bytes of text, or a list nested ``input.depth`` levels deep."""
    if "depth" in call.input:
        value: Any = []
        for _ in range(int(call.input["depth"])):
            value = [value]
        return value
    return {"blob": "x" * int(call.input["bytes"])}


@action("test.moments")
def moments(call: ActionCall) -> Any:
    """Returns values JSON has no type for: an aware and a naive datetime, a date, a UUID, a Decimal."""
    return {"aware": datetime(2026, 12, 5, 7, 59, 19, 438558, tzinfo=UTC), "naive": datetime(2026, 12, 5, 8, 1),
            "day": date(2026, 12, 5), "id": uuid.UUID(int=7), "amount": Decimal("1.50")}


@action("test.unkeepable")
def unkeepable_output(call: ActionCall) -> Any:
    """Returns what no payload keeps: a NUL character, or bytes (``input.kind``)."""
    return {"bytes": b"raw"} if call.input.get("kind") == "bytes" else {"text": "a\x00b"}


@action("test.nul_error")
def nul_error(call: ActionCall) -> Any:
    raise RuntimeError("bad\x00byte")


@pytest.fixture
def tenant(redis_client: Any, make_tenant: Any) -> Tenant:
    tenant, _ = make_tenant("bounded")
    tenant_services.override_set(tenant=tenant, field="max_payload_bytes", value=LIMIT)
    return tenant


def run_step(tenant: Tenant, run: WorkflowRun, node_id: str) -> WorkflowRun:
    """Run the queued step ``node_id`` as a worker would, and read the run again."""
    execute(tenant, by_node(tenant, run)[node_id])
    with tenant_context(tenant):
        return WorkflowRun.objects.get(pk=run.pk)


def test_a_rendered_input_over_the_plan_fails_the_step_for_good_and_is_not_kept(tenant):
    put(tenant, "twice", {"nodes": [echo("a", {"one": "$input.text", "two": "$input.text"})]})
    run = tick(tenant, start(tenant, "twice", {"text": "y" * 600}))  # 600 bytes in, 1,200 rendered

    step = by_node(tenant, run)["a"]
    assert step.status == "failed"
    assert step.input is None
    assert step.error["code"] == "payload_too_large"
    assert step.error["field"] == "input"
    assert not step.error["retryable"]
    assert f"over the plan's max_payload_bytes ({LIMIT})" in step.error["message"]
    assert run.status == "failed"
    assert run.error["node"] == "a"
    assert queued(tenant) == set()  # nothing was sent to a worker


def test_a_sub_workflow_or_successor_input_over_the_plan_starts_no_run(tenant):
    put(tenant, "leaf", {"nodes": [echo("say", {})]})
    big = {"one": "$input.text", "two": "$input.text"}
    put(tenant, "parent", {"nodes": [{"id": "kid", "type": "subworkflow", "workflow": "leaf", "input": big}]})
    put(tenant, "again", {"nodes": [{"id": "next", "type": "continue_as_new", "input": big}]})

    for name, node_id in (("parent", "kid"), ("again", "next")):
        run = tick(tenant, start(tenant, name, {"text": "y" * 600}))
        step = by_node(tenant, run)[node_id]
        assert (run.status, step.status, step.error["code"]) == ("failed", "failed", "payload_too_large"), name
        with tenant_context(tenant):
            assert not WorkflowRun.objects.filter(parent_run=run).exists()
            assert not WorkflowRun.objects.filter(continued_from=run).exists()


def test_an_output_s_dates_are_kept_in_iso_8601_and_other_objects_as_their_text(tenant):
    put(tenant, "moments", {"nodes": [{"id": "m", "type": "action", "action": "test.moments"}]})
    run = tick(tenant, start(tenant, "moments"))

    run = run_step(tenant, run, "m")

    assert by_node(tenant, run)["m"].output == {
        "aware": "2026-12-05T07:59:19.438558+00:00", "naive": "2026-12-05T08:01:00", "day": "2026-12-05",
        "id": "00000000-0000-0000-0000-000000000007", "amount": "1.50"}


def test_an_output_over_the_plan_fails_the_step_and_is_not_retried(tenant):
    node = {"id": "big", "type": "action", "action": "test.blob", "input": {"bytes": 2 * LIMIT},
            "retry": {"max_attempts": 3, "backoff_s": 0.01}}
    put(tenant, "blob", {"nodes": [node]})
    run = tick(tenant, start(tenant, "blob"))

    run = run_step(tenant, run, "big")

    step = by_node(tenant, run)["big"]
    assert (step.status, step.output, step.error["code"], step.error["field"]) == (
        "failed", None, "payload_too_large", "output")
    assert run.status == "failed"
    with tenant_context(tenant):
        assert StepRun.objects.filter(run=run).count() == 1  # no second attempt


def test_an_output_nested_past_the_depth_limit_is_refused_not_crashed(tenant):
    put(tenant, "deep", {"nodes": [{"id": "deep", "type": "action", "action": "test.blob",
                                    "input": {"depth": 5_000}}]})
    run = run_step(tenant, tick(tenant, start(tenant, "deep")), "deep")

    step = by_node(tenant, run)["deep"]
    assert step.error["code"] == "payload_too_large"
    assert "levels deep" in step.error["message"]


def test_a_run_output_over_the_plan_fails_the_run_with_the_field_named(tenant):
    put(tenant, "pair", {"nodes": [echo("a", {"t": "$input.text"}), echo("b", {"t": "$input.text"})],
                         "output": {"a": "$nodes.a.output", "b": "$nodes.b.output"}})
    run = tick(tenant, start(tenant, "pair", {"text": "z" * 495}))  # ~500 bytes a step, ~1,020 in all
    run = run_step(tenant, run_step(tenant, run, "a"), "b")

    assert {s.status for s in by_node(tenant, run).values()} == {"succeeded"}  # each within the plan
    assert run.status == "failed"
    assert run.output is None
    assert run.error["node"] is None
    assert (run.error["error"]["code"], run.error["error"]["field"]) == ("payload_too_large", "output")


# -- the run detail and its steps ---------------------------------------------------------------


def fan_out(tenant: Tenant, width: int, text: str = "") -> WorkflowRun:
    """A started and ticked run of ``width`` parallel echo steps, each with ``text`` as its input."""
    put(tenant, "fan", {"nodes": [echo(f"n{i:03}", {"t": text}) for i in range(width)]})
    return tick(tenant, start(tenant, "fan"))


def pages(client: Any, url: str, **params: Any) -> list[list[dict[str, Any]]]:
    found = []
    while url:
        response = client.get(url, params)
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["previous"] is None  # forward only
        found.append(body["results"])
        url, params = body["next"], {}
    return found


@override_settings(DUCTOR_RUN_DETAIL_MAX_STEPS=3)
def test_the_run_detail_shows_its_first_steps_and_links_to_every_one(make_tenant, redis_client):
    tenant, key = make_tenant("many")
    client = api_client(key)
    run = fan_out(tenant, 7)

    detail = client.get(f"/api/v1/runs/{run.pk}").json()

    assert [s["node_id"] for s in detail["steps"]] == ["n000", "n001", "n002"]
    assert (detail["steps_total"], detail["steps_truncated"]) == (7, True)
    assert detail["steps_url"].endswith(f"/api/v1/runs/{run.pk}/steps")
    listed = pages(client, detail["steps_url"], page_size=2)
    assert [len(page) for page in listed] == [2, 2, 2, 1]
    assert [s["node_id"] for page in listed for s in page] == [f"n{i:03}" for i in range(7)]


def assert_bounded_to_4_000_bytes(client: Any, run: Any) -> dict[str, Any]:
    """The six steps of ``run`` within ``DUCTOR_STEPS_MAX_BYTES`` of 4,000: the detail shows some, every page
    at most that much and at least one, and the pages all six. The detail."""
    detail: dict[str, Any] = client.get(f"/api/v1/runs/{run.pk}").json()
    assert 1 <= len(detail["steps"]) < 6
    assert json_size(detail["steps"]) <= 4_000
    assert detail["steps_truncated"] is True
    listed = pages(client, detail["steps_url"], page_size=100)
    assert all(json_size(page) <= 4_000 for page in listed)
    assert sorted(s["node_id"] for page in listed for s in page) == [f"n{i:03}" for i in range(6)]
    return detail


@override_settings(DUCTOR_STEPS_MAX_BYTES=4_000)
def test_steps_are_bounded_in_bytes_in_the_detail_and_in_every_page_which_holds_at_least_one(make_tenant,
                                                                                                redis_client):
    tenant, key = make_tenant("heavy")
    client = api_client(key)
    run = fan_out(tenant, 6, text="w" * 1_500)  # each step ~1.5 KB of input, some 2 KB with its trace

    detail = assert_bounded_to_4_000_bytes(client, run)

    with override_settings(DUCTOR_STEPS_MAX_BYTES=10):  # smaller than any step: one a page
        assert [len(page) for page in pages(client, detail["steps_url"])] == [1] * 6
        assert client.get(f"/api/v1/runs/{run.pk}").json()["steps"] == []


@override_settings(DUCTOR_STEPS_MAX_BYTES=4_000)
def test_the_progress_its_heartbeats_reported_counts_in_a_steps_bytes(make_tenant, redis_client):
    """A task node's step carries the last details of its heartbeats (up to the plan's payload limit
    each), which the byte budget of the detail and of every page counts as it counts an input."""
    tenant, key = make_tenant("beating")
    client = api_client(key)
    run = fan_out(tenant, 6)
    with tenant_context(tenant):
        StepRun.objects.filter(run=run).update(heartbeat_details={"chunks": "h" * 1_500})

    assert_bounded_to_4_000_bytes(client, run)


def test_a_short_run_shows_every_step_untruncated(make_tenant, redis_client):
    tenant, key = make_tenant("short")
    run = fan_out(tenant, 2)
    detail = api_client(key).get(f"/api/v1/runs/{run.pk}").json()
    assert (len(detail["steps"]), detail["steps_total"], detail["steps_truncated"]) == (2, 2, False)


def test_the_steps_list_checks_its_parameters_and_answers_404_for_another_tenants_run(make_tenant,
                                                                                      redis_client):
    tenant, key = make_tenant("owner")
    _, other_key = make_tenant("other")
    run = fan_out(tenant, 1)
    client = api_client(key)

    assert api_client(other_key).get(f"/api/v1/runs/{run.pk}/steps").status_code == 404
    for params, field in (({"page_size": "abc"}, "page_size"), ({"page_size": 101}, "page_size"),
                          ({"cursor": "bogus"}, "cursor"), ({"cursor": "cj0x"}, "cursor")):  # r=1: reversed
        response = client.get(f"/api/v1/runs/{run.pk}/steps", params)
        assert response.status_code == 400, (params, response.content)
        assert field in response.json()["error"]["details"]


@pytest.mark.parametrize(("kind", "field"), [("nul", "output.text"), ("bytes", "output.bytes")])
def test_an_output_no_payload_keeps_fails_the_step_for_good_naming_where(tenant, kind, field):
    """Before, the outcome's commit failed on the NUL (and bytes were kept as Python's ``b'raw'``)."""
    node = {"id": "odd", "type": "action", "action": "test.unkeepable", "input": {"kind": kind},
            "retry": {"max_attempts": 3, "backoff_s": 0.01}}
    put(tenant, "odd", {"nodes": [node]})
    run = run_step(tenant, tick(tenant, start(tenant, "odd")), "odd")

    step = by_node(tenant, run)["odd"]
    assert (step.status, step.output, step.error["code"], step.error["field"], step.error["retryable"]) == (
        "failed", None, "invalid_payload", field, False)
    assert run.status == "failed"


def test_an_action_error_quoting_a_nul_is_kept_with_it_replaced(tenant):
    put(tenant, "crash", {"nodes": [{"id": "c", "type": "action", "action": "test.nul_error"}]})
    run = run_step(tenant, tick(tenant, start(tenant, "crash")), "c")

    step = by_node(tenant, run)["c"]
    assert (step.status, step.error["code"], step.error["message"]) == ("failed", "action_crashed", "bad\ufffdbyte")


@pytest.mark.parametrize("template", [
    {f"k{index}": "$input.text" for index in range(5)},  # shared: its JSON is never encoded
    {"one": "{{ $input.text }}" * 5},  # built: stopped at the limit
])
def test_an_input_that_repeats_a_value_past_the_plan_is_refused_without_building_it(tenant, template):
    """A small spec may repeat a reference thousands of times, and so render gigabytes from an input
    within the plan (500 kB, 26,000 times, fits in a 512 kB spec): the step is refused as any
    input over the plan is, and what its references would make is never made."""
    put(tenant, "many", {"nodes": [echo("a", template)]})
    run = tick(tenant, start(tenant, "many", {"text": "y" * 900}))  # 4,500 bytes in 5 references

    step = by_node(tenant, run)["a"]
    assert (step.status, step.input, step.error["code"], step.error["field"]) == (
        "failed", None, "payload_too_large", "input")
    assert step.error["message"].startswith("the input is more than ")
    assert f"over the plan's max_payload_bytes ({LIMIT})" in step.error["message"]
    assert run.status == "failed"
