"""The workflow and run API, and the admin run page: real PostgreSQL and Redis, no workers.

Tests run inside a transaction, so the fair-queue pushes that wait for a commit
never happen: a started run stays ``pending`` unless a test ticks it itself.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from ductor_project.core.bounds import MAX_SOURCE_TAG_CHARS
from ductor_project.core.context import tenant_context
from tenants import services as tenant_services
from tenants import usage
from tenants.models import Tenant
from tenants.usage import runs_this_month
from tests.conftest import api_client, error_code
from workflows.engine import tick as engine_tick
from workflows.models import RunEvent, Schedule, WorkflowDefinition, WorkflowRun, WorkflowVersion
from workflows.triggers.firing import fire_schedules

pytestmark = pytest.mark.usefixtures("redis_client")


def spec(*nodes: dict[str, Any], output: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"nodes": list(nodes) or [node("a")]}
    if output is not None:
        body["output"] = output
    return body


def node(node_id: str, *deps: str, action: str = "echo", **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "action", "action": action, "depends_on": list(deps), **extra}


def create(client: APIClient, name: str, body: dict[str, Any] | None = None, code: int = 201) -> dict[str, Any]:
    response = client.post("/api/v1/workflows", {"name": name, "spec": body or spec()}, format="json")
    assert response.status_code == code, response.content
    return dict(response.json())


def start(client: APIClient, code: int = 201, **body: Any) -> dict[str, Any]:
    response = client.post("/api/v1/runs", body, format="json")
    assert response.status_code == code, response.content
    return dict(response.json())


def assert_invalid(response: Any, field: str, *words: str, code: str = "invalid", status: int = 400) -> None:
    assert response.status_code == status, response.content
    assert error_code(response) == code, response.content
    details = response.json()["error"]["details"]
    assert field in details, details
    assert all(word in " ".join(details[field]) for word in words), details[field]


def runs(tenant: Tenant) -> int:
    with tenant_context(tenant):
        return WorkflowRun.objects.count()


def tick(tenant: Tenant, run_id: Any) -> None:
    with tenant_context(tenant):
        engine_tick.tick(run_id)


# --- definitions -----------------------------------------------------------------------------


def test_every_put_of_a_workflow_adds_a_version_and_runs_keep_theirs(client_a, tenant_a):
    first = create(client_a, "billing", spec(node("a", input={"v": 1})))
    assert (first["name"], first["latest_version"]) == ("billing", 1)
    run_v1 = start(client_a, workflow="billing")
    assert run_v1["version"] == 1

    again = create(client_a, "billing", spec(node("a", input={"v": 2})), code=200)  # POST of a known name
    assert again["latest_version"] == 2
    assert again["id"] == first["id"]
    put = client_a.put("/api/v1/workflows/billing", {"spec": spec(node("b", input={"v": 3})),
                                                     "description": "third"}, format="json")
    assert put.status_code == 200, put.content
    assert put.json()["latest_version"] == 3
    assert put.json()["description"] == "third"
    assert [n["id"] for n in put.json()["spec"]["nodes"]] == ["b"]

    versions = client_a.get("/api/v1/workflows/billing/versions").json()
    assert [v["number"] for v in versions] == [3, 2, 1]
    assert [v["spec"]["nodes"][0]["input"] for v in versions] == [{"v": 3}, {"v": 2}, {"v": 1}]
    assert client_a.get(f"/api/v1/runs/{run_v1['id']}").json()["version"] == 1  # kept its version
    assert start(client_a, workflow="billing")["version"] == 3
    pinned = start(client_a, workflow="billing", version=2)
    assert pinned["version"] == 2
    with tenant_context(tenant_a[0]):
        assert WorkflowRun.objects.get(pk=pinned["id"]).workflow.spec["nodes"][0]["input"] == {"v": 2}
        assert WorkflowDefinition.objects.count() == 1
        assert WorkflowVersion.objects.count() == 3


def test_versions_are_immutable_rows(tenant_a):
    with tenant_context(tenant_a[0]):
        from workflows.services import workflow_put

        version, created = workflow_put(name="w", spec=spec())
        assert created
        version.spec = {"nodes": []}
        with pytest.raises(ValueError, match="immutable"):
            version.save()


@pytest.mark.parametrize(("url", "body", "field", "words"), [
    ("/api/v1/workflows", {"name": "has space/slash", "spec": spec()}, "name", "Allowed: Letters, digits, '_', '.'"),
    ("/api/v1/workflows", {"name": "w" * 101, "spec": spec()}, "name", "no more than 100 characters"),
    ("/api/v1/events", {"name": "-starts-badly"}, "name", "Allowed: Letters, digits and '_.:/-'"),
    ("/api/v1/schedules", {"name": "a b", "workflow": "w", "interval_s": 60}, "name", "Allowed: Letters"),
])
def test_a_name_that_does_not_fit_is_refused_saying_what_a_name_may_hold(client_a, url, body, field, words):
    assert_invalid(client_a.post(url, body, format="json"), field, words)


def test_list_and_detail_show_the_latest_spec(client_a):
    for name in ("zeta", "alpha", "mid"):
        create(client_a, name)
    listed = client_a.get("/api/v1/workflows").json()["results"]
    assert [w["name"] for w in listed] == ["alpha", "mid", "zeta"]
    detail = client_a.get("/api/v1/workflows/mid").json()
    assert detail["latest_version"] == 1
    assert detail["spec"]["nodes"][0]["id"] == "a"
    assert client_a.get("/api/v1/workflows/nope").status_code == 404


def test_a_bad_spec_is_a_400_naming_the_node_and_the_field_and_stores_nothing(client_a, tenant_a):
    cycle = spec(node("a", "c"), node("b", "a"), node("c", "b"))
    assert_invalid(client_a.post("/api/v1/workflows", {"name": "w", "spec": cycle}, format="json"),
                   "spec.nodes[0].depends_on", "node 'a'", "cycle: a → b → c → a")
    bad = spec(node("a", action="nope"), node("b", "x"), node("a"))
    response = client_a.post("/api/v1/workflows", {"name": "w", "spec": bad}, format="json")
    assert_invalid(response, "spec.nodes[0].action", "node 'a'", "unknown action 'nope'")
    assert_invalid(response, "spec.nodes[1].depends_on", "node 'b'", "unknown node 'x'")
    assert_invalid(response, "spec.nodes[2].id", "duplicate id")
    assert_invalid(client_a.post("/api/v1/workflows", {"name": "w", "spec": spec(node("a", input="$nope"))},
                                 format="json"), "spec.nodes[0].input", "node 'a'", "unknown reference root")
    assert_invalid(client_a.post("/api/v1/workflows", {"name": "w", "spec": {"nodes": []}}, format="json"),
                   "spec.nodes")
    with tenant_context(tenant_a[0]):
        assert WorkflowDefinition.objects.count() == 0
    create(client_a, "w")
    update = client_a.put("/api/v1/workflows/w", {"spec": cycle}, format="json")
    assert_invalid(update, "spec.nodes[0].depends_on", "cycle")
    assert client_a.get("/api/v1/workflows/w").json()["latest_version"] == 1


def test_unknown_fields_are_refused_in_the_body_and_in_the_spec(client_a):
    response = client_a.post("/api/v1/workflows", {"name": "w", "spec": spec(), "colour": "red"}, format="json")
    assert_invalid(response, "colour", code="unknown_field")
    response = client_a.post("/api/v1/workflows", {"name": "w", "spec": spec(node("a", colour=1))}, format="json")
    assert_invalid(response, "spec.nodes[0].colour", "node 'a'", "unknown field")
    create(client_a, "w")
    assert_invalid(client_a.put("/api/v1/workflows/w", {"spec": spec(), "name": "x"}, format="json"), "name",
                   code="unknown_field")
    assert_invalid(client_a.post("/api/v1/runs", {"workflow": "w", "priority": 1}, format="json"), "priority",
                   code="unknown_field")


def test_an_oversized_spec_or_run_input_is_a_413_and_changes_nothing(make_tenant):
    tenant, key = make_tenant("small", plan="free")  # 64 KiB payloads
    client = api_client(key)
    big = spec(node("a", input={"blob": "x" * 70_000}))
    response = client.post("/api/v1/workflows", {"name": "w", "spec": big}, format="json")
    assert_invalid(response, "spec", "max_payload_bytes", code="payload_too_large", status=413)
    create(client, "w")
    response = client.post("/api/v1/runs", {"workflow": "w", "input": {"blob": "y" * 70_000}}, format="json")
    assert_invalid(response, "input", "max_payload_bytes", code="payload_too_large", status=413)
    assert runs(tenant) == 0
    with tenant_context(tenant):
        assert runs_this_month() == 0
        assert WorkflowVersion.objects.count() == 1


def test_a_put_naming_the_version_it_read_is_taken_only_while_that_is_the_latest(client_a, tenant_a):
    """``if_version``: 0 for a workflow that must not exist yet, else the latest version read. A put that
    lost to another is a 409 naming it, and adds nothing."""
    body = {"name": "billing", "spec": spec(node("a")), "if_version": 0}
    assert client_a.post("/api/v1/workflows", body, format="json").status_code == 201
    lost_create = client_a.post("/api/v1/workflows", body, format="json")
    assert_invalid(lost_create, "if_version", "is at version 1, not 0", code="conflict", status=409)

    changed = {"spec": spec(node("b")), "if_version": 1}
    assert client_a.put("/api/v1/workflows/billing", changed, format="json").json()["latest_version"] == 2
    lost_put = client_a.put("/api/v1/workflows/billing", changed, format="json")
    assert_invalid(lost_put, "if_version", "is at version 2, not 1", code="conflict", status=409)
    stale_post = client_a.post("/api/v1/workflows", {**body, "if_version": 5}, format="json")
    assert_invalid(stale_post, "if_version", "not 5", code="conflict", status=409)
    assert_invalid(client_a.put("/api/v1/workflows/billing", {**changed, "if_version": -1}, format="json"),
                   "if_version")
    assert [v["number"] for v in client_a.get("/api/v1/workflows/billing/versions").json()] == [2, 1]
    absent = client_a.post("/api/v1/workflows", {"name": "other", "spec": spec(node("a")), "if_version": 1},
                           format="json")
    assert_invalid(absent, "if_version", "does not exist", code="conflict", status=409)
    assert client_a.get("/api/v1/workflows/other").status_code == 404


def test_max_workflows_ceiling_is_a_403_but_new_versions_are_still_allowed(client_a, tenant_a):
    tenant_services.override_set(tenant=tenant_a[0], field="max_workflows", value=1)
    create(client_a, "only")
    response = client_a.post("/api/v1/workflows", {"name": "second", "spec": spec()}, format="json")
    assert response.status_code == 403, response.content
    assert error_code(response) == "plan_limit_reached"
    assert response.json()["error"]["details"]["limit"] == "max_workflows"
    assert client_a.put("/api/v1/workflows/only", {"spec": spec()}, format="json").status_code == 200
    with tenant_context(tenant_a[0]):
        assert list(WorkflowDefinition.objects.values_list("name", "latest_version")) == [("only", 2)]


# --- starting runs ---------------------------------------------------------------------------


def test_starting_an_unknown_workflow_or_version_is_a_404(client_a, tenant_a):
    assert error_code(client_a.post("/api/v1/runs", {"workflow": "ghost"}, format="json")) == "not_found"
    create(client_a, "real")
    response = client_a.post("/api/v1/runs", {"workflow": "real", "version": 2}, format="json")
    assert response.status_code == 404
    assert runs(tenant_a[0]) == 0


def test_a_tier_outside_the_plan_is_a_400_naming_tier(make_tenant):
    tenant, key = make_tenant("freebie", plan="free")
    client = api_client(key)
    create(client, "w")
    response = client.post("/api/v1/runs", {"workflow": "w", "tier": "interactive"}, format="json")
    assert_invalid(response, "tier", "free")
    assert_invalid(client.post("/api/v1/runs", {"workflow": "w", "tier": "gold"}, format="json"), "tier")
    assert runs(tenant) == 0
    assert start(client, workflow="w", tier="batch")["tier"] == "batch"


def test_a_run_given_no_tier_starts_in_one_the_plan_allows_by_api_event_and_schedule(make_tenant):
    """``standard`` when the plan allows it, else the lowest tier it allows: an event's and a
    schedule's runs, which name no tier, were refused (``runs[0].tier``, a field of neither)."""
    tenant, key = make_tenant("batcher", plan="free")
    tenant_services.override_set(tenant=tenant, field="allowed_tiers", value=["interactive", "batch"])
    client = api_client(key)
    create(client, "w")
    assert client.post("/api/v1/triggers", {"workflow": "w", "event": "e"}, format="json").status_code == 201
    schedule = client.post("/api/v1/schedules", {"name": "s", "workflow": "w", "interval_s": 60},
                           format="json").json()

    assert start(client, workflow="w")["tier"] == "batch"
    event = client.post("/api/v1/events", {"name": "e"}, format="json")
    assert event.status_code == 201, event.content
    with tenant_context(tenant):
        assert WorkflowRun.objects.get(pk=event.json()["runs"][0]).tier == "batch"
        fire_schedules(now=timezone.now() + timedelta(seconds=61))
        fired = Schedule.objects.get(pk=schedule["id"])
        assert (fired.fired_count, fired.failed_count) == (1, 0), fired.last_error
        assert WorkflowRun.objects.get(pk=fired.last_run_id).tier == "batch"
    assert_invalid(client.post("/api/v1/runs", {"workflow": "w", "tier": "standard"}, format="json"), "tier")
    tenant_services.override_set(tenant=tenant, field="allowed_tiers", value=["interactive"])
    assert start(client, workflow="w")["tier"] == "interactive"


def test_an_exhausted_quota_is_a_429_and_creates_no_run(client_a, tenant_a):
    tenant_services.override_set(tenant=tenant_a[0], field="monthly_run_quota", value=2)
    create(client_a, "w")
    start(client_a, workflow="w")
    start(client_a, workflow="w", idempotency_key="k")
    response = client_a.post("/api/v1/runs", {"workflow": "w"}, format="json")
    assert response.status_code == 429, response.content
    assert error_code(response) == "quota_exceeded"
    assert "Retry-After" in response
    # A duplicate of a run that exists is no new start: it is answered, not refused.
    assert start(client_a, code=200, workflow="w", idempotency_key="k")["idempotency_key"] == "k"
    assert runs(tenant_a[0]) == 2
    with tenant_context(tenant_a[0]):
        assert runs_this_month() == 2


@pytest.mark.django_db(transaction=True)
def test_a_start_refused_at_its_commit_is_the_same_429_and_creates_no_run(client_a, tenant_a, monkeypatch):
    # Each request is its own transaction here: the charge goes with the COMMIT, and the month's
    # row refuses the second run there, after the run's writes were sent.
    tenant_services.override_set(tenant=tenant_a[0], field="monthly_run_quota", value=1)
    create(client_a, "w")
    start(client_a, workflow="w")
    refusals: list[object] = []
    judge = usage.Charge.refusal
    monkeypatch.setattr(usage.Charge, "refusal", lambda charge, exc: refusals.append(exc) or judge(charge, exc))

    for _ in range(2):  # refused at the commit, then from the flag that refusal left
        response = client_a.post("/api/v1/runs", {"workflow": "w"}, format="json")
        assert response.status_code == 429, response.content
        assert error_code(response) == "quota_exceeded"
        assert response.json()["error"]["details"]["quota"] == 1
        assert int(response["Retry-After"]) >= 1

    assert len(refusals) == 1  # the first refusal came from the commit
    assert runs(tenant_a[0]) == 1
    with tenant_context(tenant_a[0]):
        assert runs_this_month() == 1


def test_run_input_tags_and_idempotency_key_are_stored(client_a):
    create(client_a, "w")
    run = start(client_a, workflow="w", input={"x": [1, {"y": None}]}, tags=["t1"], idempotency_key="abc",
                tier="interactive")
    assert (run["input"], run["tags"], run["idempotency_key"], run["tier"], run["status"]) == (
        {"x": [1, {"y": None}]}, ["t1"], "abc", "interactive", "running")  # its first tick ran in the start
    assert run["root_run_id"] == run["id"]
    assert run["nesting_depth"] == 0
    assert run["parent_run"] is None
    same = start(client_a, code=200, workflow="w", idempotency_key="abc", input={"x": [1, {"y": None}]})
    assert same["id"] == run["id"]


def test_a_used_idempotency_key_sent_with_another_start_is_409_naming_it_and_starts_nothing(
        client_a, client_b, tenant_a):
    create(client_a, "w")
    create(client_a, "other")
    run = start(client_a, workflow="w", input={"n": 1}, idempotency_key="k")
    for body, differs in [({"workflow": "other", "input": {"n": 1}}, "workflow"),
                          ({"workflow": "w", "input": {"n": 2}}, "input"),
                          ({"workflow": "w"}, "input"),  # no input is {}, not the first one's
                          ({"workflow": "w", "input": {"n": 1}, "version": 2}, "version"),
                          ({"workflow": "w", "input": {"n": True}}, "input")]:  # as JSON, true is not 1
        reused = client_a.post("/api/v1/runs", {**body, "idempotency_key": "k"}, format="json")
        assert_invalid(reused, "idempotency_key", f"run {run['id']}", f"another {differs}",
                       code="idempotency_key_reused", status=409)
    assert start(client_a, code=200, workflow="w", input={"n": 1}, version=1, idempotency_key="k")["id"] == run["id"]
    assert start(client_a, code=200, workflow="w", input={"n": 1.0}, idempotency_key="k")["id"] == run["id"]

    # A batch: a used key, or one an earlier item of the batch uses, with another start: all or none.
    for items, field in [([{"workflow": "other", "idempotency_key": "k"}], "runs[0].idempotency_key"),
                         ([{"workflow": "w", "idempotency_key": "j"}, {"workflow": "other", "idempotency_key": "j"}],
                          "runs[1].idempotency_key")]:
        reused = client_a.post("/api/v1/runs/bulk", {"runs": items}, format="json")
        assert_invalid(reused, field, "another workflow", code="idempotency_key_reused", status=409)
    with tenant_context(tenant_a[0]):
        assert WorkflowRun.objects.count() == 1

    # Each tenant's keys are its own: another tenant's start under the same key is a new run of its own.
    create(client_b, "other")
    theirs = start(client_b, workflow="other", idempotency_key="k")
    assert theirs["id"] != run["id"]


# --- reading runs ----------------------------------------------------------------------------


def test_run_list_filters_by_status_workflow_created_range_and_root(client_a, tenant_a):
    tenant = tenant_a[0]
    create(client_a, "one")
    create(client_a, "two")
    a = start(client_a, workflow="one")
    b = start(client_a, workflow="two")
    c = start(client_a, workflow="two")
    now = timezone.now()
    with tenant_context(tenant):
        WorkflowRun.objects.filter(pk=a["id"]).update(created_at=now - timedelta(days=3))
        WorkflowRun.objects.filter(pk=b["id"]).update(status="succeeded", created_at=now - timedelta(days=1))
        WorkflowRun.objects.filter(pk=c["id"]).update(root_run_id=a["id"])

    def ids(**query: Any) -> set[str]:
        response = client_a.get("/api/v1/runs", query)
        assert response.status_code == 200, response.content
        return {r["id"] for r in response.json()["results"]}

    assert ids() == {a["id"], b["id"], c["id"]}
    assert ids(status="succeeded") == {b["id"]}
    assert ids(status="running") == {a["id"], c["id"]}  # started: their first tick ran in the start
    assert ids(workflow="two") == {b["id"], c["id"]}
    assert ids(workflow="two", status="running") == {c["id"]}
    assert ids(created_after=(now - timedelta(days=2)).isoformat()) == {b["id"], c["id"]}
    assert ids(created_before=(now - timedelta(days=2)).isoformat()) == {a["id"]}
    assert ids(created_after=(now - timedelta(days=2)).isoformat(),
               created_before=(now - timedelta(hours=1)).isoformat()) == {b["id"]}
    assert ids(root_run_id=a["id"]) == {a["id"], c["id"]}
    assert_invalid(client_a.get("/api/v1/runs", {"status": "sleeping"}), "status")
    assert_invalid(client_a.get("/api/v1/runs", {"root_run_id": "nope"}), "root_run_id")
    assert_invalid(client_a.get("/api/v1/runs", {"created_after": "yesterday"}), "created_after")


def test_run_list_filters_by_every_tag_given_and_by_fairness_key_within_the_tenant(client_a, client_b):
    create(client_a, "w")
    create(client_b, "w")
    a = start(client_a, workflow="w", tags=["nightly", "eu"], fairness_key="acme")
    b = start(client_a, workflow="w", tags=["nightly"])
    start(client_a, workflow="w", fairness_key="globex")
    untagged = start(client_a, workflow="w")
    theirs = start(client_b, workflow="w", tags=["nightly", "eu"], fairness_key="acme")

    def ids(client: APIClient, query: str) -> set[str]:
        response = client.get(f"/api/v1/runs?{query}")
        assert response.status_code == 200, response.content
        return {r["id"] for r in response.json()["results"]}

    assert ids(client_a, "tag=nightly") == {a["id"], b["id"]}
    assert ids(client_a, "tag=nightly&tag=eu") == {a["id"]}  # every tag given
    assert ids(client_a, "tag=eu&tag=eu") == {a["id"]}
    assert ids(client_a, "tag=none-has-it") == set()
    assert ids(client_a, "fairness_key=acme") == {a["id"]}
    assert ids(client_a, "fairness_key=acme&tag=eu&status=running") == {a["id"]}
    assert untagged["id"] not in ids(client_a, "tag=nightly")
    assert ids(client_b, "tag=nightly&fairness_key=acme") == {theirs["id"]}  # another tenant's are not seen
    assert_invalid(client_a.get("/api/v1/runs", {"tag": "x" * (MAX_SOURCE_TAG_CHARS + 1)}), "tag[0]")
    assert_invalid(client_a.get("/api/v1/runs", {"fairness_key": "x" * 129}), "fairness_key")
    assert_invalid(client_a.get("/api/v1/runs?" + "&".join(f"tag=t{i}" for i in range(11))), "tag")


def test_run_detail_includes_steps_with_their_routing_and_events_are_ordered(client_a, tenant_a):
    create(client_a, "w", spec(node("a", input={"v": "$input.v"}), node("b", "a")))
    run = start(client_a, workflow="w", input={"v": 5})
    tick(tenant_a[0], run["id"])

    detail = client_a.get(f"/api/v1/runs/{run['id']}").json()
    assert detail["status"] == "running"
    (step,) = detail["steps"]
    assert (step["node_id"], step["attempt"], step["status"], step["input"]) == ("a", 1, "queued", {"v": 5})
    assert step["routing"]["allowed"] is True
    assert "rule" in step["routing"]
    events = client_a.get(f"/api/v1/runs/{run['id']}/events").json()
    assert [(e["seq"], e["type"], e["node_id"]) for e in events] == [
        (1, "created", ""), (2, "started", ""), (3, "step_queued", "a")]
    lineage = client_a.get(f"/api/v1/runs/{run['id']}/lineage").json()
    assert lineage["runs"] == 1
    assert lineage["tree"][0]["children"] == []
    assert client_a.get("/api/v1/runs/not-a-uuid").status_code == 404


def test_a_lineage_hangs_each_run_under_its_parent_or_predecessor_whatever_their_creation_times(client_a, tenant_a):
    """A child is written by a worker, its parent by the API: on two hosts, whose clocks may differ."""
    create(client_a, "leaf", spec(node("a")))
    create(client_a, "parent", spec({"id": "kid", "type": "subworkflow", "workflow": "leaf"}))
    run = start(client_a, workflow="parent")
    tick(tenant_a[0], run["id"])
    with tenant_context(tenant_a[0]):
        child = WorkflowRun.objects.get(parent_run_id=run["id"])
        WorkflowRun.objects.filter(pk=child.pk).update(created_at=timezone.now() - timedelta(seconds=5))

    lineage = client_a.get(f"/api/v1/runs/{child.pk}/lineage").json()

    assert (lineage["runs"], lineage["truncated"]) == (2, False)
    [root] = lineage["tree"]
    assert (root["id"], [kid["id"] for kid in root["children"]]) == (run["id"], [str(child.pk)])


def test_a_history_is_read_a_bounded_answer_at_a_time_on_from_its_last_event(client_a, tenant_a):
    create(client_a, "w", spec(node("a"), node("b", "a")))
    run = start(client_a, workflow="w")
    tick(tenant_a[0], run["id"])
    url = f"/api/v1/runs/{run['id']}/events"

    def seqs(**query: Any) -> list[int]:
        response = client_a.get(url, query)
        assert response.status_code == 200, response.content
        return [event["seq"] for event in response.json()]

    assert seqs(limit=2) == [1, 2]
    assert seqs(after=2, limit=2) == [3]  # fewer than asked: the history ends there, for now
    assert seqs(after=3) == []
    assert seqs() == [1, 2, 3]
    assert_invalid(client_a.get(url, {"limit": 1001}), "limit")
    assert_invalid(client_a.get(url, {"limit": 0}), "limit")
    assert_invalid(client_a.get(url, {"after": -1}), "after")
    assert_invalid(client_a.get(url, {"after": "x"}), "after")


def test_cancel_is_idempotent_and_a_finished_run_stays_as_it_was(client_a, tenant_a):
    create(client_a, "w")
    run = start(client_a, workflow="w")
    for _ in range(2):
        response = client_a.post(f"/api/v1/runs/{run['id']}/cancel")
        assert response.status_code == 200, response.content
        assert response.json()["cancel_requested"] is True
    with tenant_context(tenant_a[0]):
        assert RunEvent.objects.filter(run_id=run["id"], type="cancel_requested").count() == 1
    tick(tenant_a[0], run["id"])
    assert client_a.post(f"/api/v1/runs/{run['id']}/cancel").json()["status"] == "cancelled"

    done = start(client_a, workflow="w")
    with tenant_context(tenant_a[0]):
        WorkflowRun.objects.filter(pk=done["id"]).update(status="succeeded")
    response = client_a.post(f"/api/v1/runs/{done['id']}/cancel")
    assert response.status_code == 200
    assert (response.json()["status"], response.json()["cancel_requested"]) == ("succeeded", False)


def test_idor_run_and_workflow_endpoints_answer_404_to_another_tenant(client_a, client_b, tenant_a):
    create(client_a, "secret")
    run = start(client_a, workflow="secret")
    for response in (
        client_b.get(f"/api/v1/runs/{run['id']}"),
        client_b.post(f"/api/v1/runs/{run['id']}/cancel"),
        client_b.get(f"/api/v1/runs/{run['id']}/events"),
        client_b.get(f"/api/v1/runs/{run['id']}/lineage"),
        client_b.get("/api/v1/workflows/secret"),
        client_b.get("/api/v1/workflows/secret/versions"),
        client_b.put("/api/v1/workflows/secret", {"spec": spec()}, format="json"),
        client_b.patch("/api/v1/workflows/secret", {"description": "mine"}, format="json"),
        client_b.patch("/api/v1/workflows/secret", {"bogus": 1}, format="json"),
        client_b.post("/api/v1/workflows/secret/archive", {"bogus": 1}, format="json"),
        client_b.post(f"/api/v1/runs/{run['id']}/retry", {"bogus": 1}, format="json"),
        client_b.post("/api/v1/runs", {"workflow": "secret"}, format="json"),
    ):
        assert response.status_code == 404, response.content
        assert error_code(response) == "not_found"
    assert client_b.get("/api/v1/runs", {"root_run_id": run["id"]}).json()["results"] == []
    # B may use the same name for its own workflow: names are per tenant.
    assert create(client_b, "secret")["latest_version"] == 1
    assert client_a.get("/api/v1/workflows/secret").json()["latest_version"] == 1
    assert client_a.get("/api/v1/workflows/secret").json()["description"] == ""


# --- admin -----------------------------------------------------------------------------------


def test_the_admin_run_page_renders_the_dag_as_svg(client_a, tenant_a):
    create(client_a, "outer", spec(node("first"), node("second", "first"),
                                   {"id": "kid", "type": "subworkflow", "workflow": "outer", "depends_on": ["first"]}))
    run = start(client_a, workflow="outer")
    tick(tenant_a[0], run["id"])
    admin = Client()
    admin.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))

    page = admin.get(f"/admin/workflows/workflowrun/{run['id']}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "<svg" in html
    assert "first" in html
    assert "second" in html
    assert admin.get("/admin/workflows/workflowrun/").status_code == 200
    assert admin.get(f"/admin/workflows/workflowrun/?q={run['id']}").status_code == 200


def test_the_workflow_list_reads_the_latest_specs_in_its_one_query(client_a, django_assert_max_num_queries):
    for name in ("one", "two", "three", "four"):
        create(client_a, name)
    client_a.put("/api/v1/workflows/two", {"spec": spec(node("b"))}, format="json")
    with django_assert_max_num_queries(3):  # the page and its count at most: not one more per workflow
        listed = client_a.get("/api/v1/workflows").json()["results"]
    assert {w["name"]: w["spec"]["nodes"][0]["id"] for w in listed} == {"four": "a", "one": "a", "three": "a",
                                                                         "two": "b"}


def test_the_run_list_reads_its_runs_versions_together_not_one_query_per_run(client_a):
    create(client_a, "one")
    first = [start(client_a, workflow="one")["id"] for _ in range(3)]
    client_a.put("/api/v1/workflows/one", {"spec": spec(node("b"))}, format="json")
    second = [start(client_a, workflow="one")["id"] for _ in range(3)]

    def listed(size: int) -> tuple[dict[str, int], int]:
        with CaptureQueriesContext(connection) as captured:
            page = client_a.get(f"/api/v1/runs?page_size={size}").json()["results"]
        return {run["id"]: run["version"] for run in page}, len(captured.captured_queries)

    two, few = listed(2)
    every, many = listed(6)
    assert len(two) == 2
    assert every == {**dict.fromkeys(first, 1), **dict.fromkeys(second, 2)}
    assert many == few


def test_a_null_input_or_payload_is_taken_as_none_given(client_a):
    create(client_a, "w")

    run = start(client_a, workflow="w", input=None)
    event = client_a.post("/api/v1/events", {"name": "e", "payload": None}, format="json")

    assert run["input"] == {}
    assert (event.status_code, event.json()["payload"]) == (201, {})
    for value in ([], 0, False, ""):  # any other JSON is kept as it is
        assert start(client_a, workflow="w", input=value)["input"] == value
        sent = client_a.post("/api/v1/events", {"name": "e", "payload": value}, format="json")
        assert (sent.status_code, sent.json()["payload"]) == (201, value)


def test_a_description_changes_alone_and_a_patch_takes_nothing_else(client_a):
    create(client_a, "described")
    changed = client_a.patch("/api/v1/workflows/described", {"description": "nightly sync"}, format="json")
    assert changed.status_code == 200, changed.content
    assert (changed.json()["description"], changed.json()["latest_version"]) == ("nightly sync", 1)
    for body, field in (({"spec": spec()}, "spec"), ({"description": "x" * 501}, "description"),
                        ({"description": 5}, "description")):
        refused = client_a.patch("/api/v1/workflows/described", body, format="json")
        assert refused.status_code == 400, (body, refused.content)
        assert field in refused.json()["error"]["details"], (body, refused.json())
    assert client_a.get("/api/v1/workflows/described").json()["description"] == "nightly sync"


def test_a_patch_of_no_field_changes_nothing_as_its_schema_says(client_a):
    """``PatchedWorkflowDescribeRequest`` requires no field, as every PATCH body: a field left out keeps
    its value, so ``{}`` (or no body) is a PATCH that changes nothing, as on the other endpoints."""
    create(client_a, "described")
    client_a.patch("/api/v1/workflows/described", {"description": "nightly sync"}, format="json")
    schema = client_a.get("/api/schema/?format=json").json()["components"]["schemas"]
    assert "required" not in schema["PatchedWorkflowDescribeRequest"]
    for body in ({}, None):
        unchanged = client_a.patch("/api/v1/workflows/described", body, format="json")
        assert unchanged.status_code == 200, unchanged.content
        assert (unchanged.json()["description"], unchanged.json()["latest_version"]) == ("nightly sync", 1)


def test_a_start_of_no_such_workflow_or_version_is_404_naming_the_field(client_a):
    """A 404 of a body's reference, not of the path: the answer names the field that names nothing."""
    create(client_a, "exists")
    for body, field in (({"workflow": "nope"}, "workflow"), ({"workflow": "exists", "version": 2}, "version")):
        response = client_a.post("/api/v1/runs", body, format="json")
        assert (response.status_code, error_code(response)) == (404, "not_found"), response.content
        assert list(response.json()["error"]["details"]) == [field], response.json()
    assert client_a.get("/api/v1/runs").json()["results"] == []
