"""``POST /api/v1/runs/{id}/retry`` and ``/rerun`` on the real PostgreSQL and Redis, the engine driven in
this process (each step item's handler called as a worker calls it).

A retry resumes the same failed run where it failed: new attempts of the nodes that failed or that
the failure cancelled, then the nodes that never ran; what succeeded keeps its attempt and output. A
rerun starts a new run of the same version, its lineage recorded.
"""

from __future__ import annotations

from typing import Any

import pytest

from ductor_project.core.context import tenant_context
from scheduling.dispatch.handlers import ItemContext
from tenants import services as tenant_services
from tenants.models import Tenant
from tenants.usage import runs_this_month
from tests.conftest import api_client, error_code
from workflows import services
from workflows.engine import items, steps
from workflows.engine import tick as engine_tick
from workflows.models import RunEvent, StepRun, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


def node(node_id: str, action: str, *deps: str, **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "action", "action": action, "depends_on": list(deps), **extra}


# a → (b, c) → d; b fails at its first attempt, for good (no retry policy), and succeeds at its second.
DIAMOND = {"nodes": [node("a", "noop"), node("b", "fail", "a", input={"succeed_on_attempt": 2}),
                     node("c", "echo", "a", input={"said": "c"}), node("d", "noop", "b", "c")]}


@pytest.fixture
def tenant(redis_client: Any, tenant_a: tuple[Tenant, str]) -> Tenant:
    return tenant_a[0]


def put(tenant: Tenant, spec: dict[str, Any], name: str = "diamond") -> None:
    with tenant_context(tenant):
        services.workflow_put(name=name, spec=spec)


def start(tenant: Tenant, name: str = "diamond", input: Any = None) -> WorkflowRun:
    with tenant_context(tenant):
        run, _ = services.run_start(workflow=name, input=input or {"order": 1})
    return run


def attempts(tenant: Tenant, run: WorkflowRun) -> dict[str, list[tuple[int, str]]]:
    """node -> [(attempt, status)], in attempt order."""
    found: dict[str, list[tuple[int, str]]] = {}
    with tenant_context(tenant):
        for step in StepRun.objects.filter(run_id=run.pk).order_by("node_id", "attempt"):
            found.setdefault(step.node_id, []).append((step.attempt, step.status))
    return found


def run_step(tenant: Tenant, run: WorkflowRun, node_id: str) -> None:
    """Run the latest attempt of ``node_id`` as a worker does once its item is dispatched."""
    with tenant_context(tenant):
        step = StepRun.objects.filter(run_id=run.pk, node_id=node_id).order_by("-attempt").first()
        assert step is not None, node_id
        assert step.status == "queued", (node_id, step.status)
        ctx = ItemContext(tenant_id=str(tenant.pk), item_id=items.step_item_id(step.pk), tier="standard",
                          partition=f"step:{step.pk}", delivery=1, waited_ms=0)
        steps.execute_step(ctx, {"step_id": str(step.pk)})


def status(tenant: Tenant, run: WorkflowRun) -> str:
    with tenant_context(tenant):
        return WorkflowRun.objects.get(pk=run.pk).status


def failed_diamond(tenant: Tenant, *, c_first: bool = True) -> WorkflowRun:
    put(tenant, DIAMOND)
    run = start(tenant)
    run_step(tenant, run, "a")
    if c_first:
        run_step(tenant, run, "c")
    run_step(tenant, run, "b")
    assert status(tenant, run) == "failed"
    return run


# --- retry ------------------------------------------------------------------------------------


def test_retry_resumes_a_failed_diamond_without_running_the_succeeded_branch_again(tenant, client_a):
    run = failed_diamond(tenant)
    with tenant_context(tenant):
        c_output = StepRun.objects.get(run_id=run.pk, node_id="c").output

    response = client_a.post(f"/api/v1/runs/{run.pk}/retry")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["status"], body["error"], body["finished_at"]) == (str(run.pk), "running", None, None)
    assert attempts(tenant, run) == {"a": [(1, "succeeded")], "b": [(1, "failed"), (2, "queued")],
                                     "c": [(1, "succeeded")]}
    run_step(tenant, run, "b")
    run_step(tenant, run, "d")
    assert status(tenant, run) == "succeeded"
    assert attempts(tenant, run) == {"a": [(1, "succeeded")], "b": [(1, "failed"), (2, "succeeded")],
                                     "c": [(1, "succeeded")], "d": [(1, "succeeded")]}
    with tenant_context(tenant):
        assert StepRun.objects.get(run_id=run.pk, node_id="c").output == c_output
        retried = RunEvent.objects.get(run_id=run.pk, type="retried")
        assert retried.data == {"nodes": ["b"]}
        assert list(RunEvent.objects.filter(run_id=run.pk, type__in=["failed", "retried", "succeeded"])
                    .order_by("seq").values_list("type", flat=True)) == ["failed", "retried", "succeeded"]


def test_retry_starts_again_what_the_failure_cancelled(tenant, client_a):
    run = failed_diamond(tenant, c_first=False)  # c was still queued when b failed: cancelled with the run
    assert attempts(tenant, run)["c"] == [(1, "cancelled")]

    assert client_a.post(f"/api/v1/runs/{run.pk}/retry").status_code == 200

    assert attempts(tenant, run) == {"a": [(1, "succeeded")], "b": [(1, "failed"), (2, "queued")],
                                     "c": [(1, "cancelled"), (2, "queued")]}
    for node_id in ("b", "c", "d"):
        run_step(tenant, run, node_id)
    assert status(tenant, run) == "succeeded"


def test_a_retry_whose_first_tick_fails_changes_nothing_and_can_be_made_again(tenant, monkeypatch):
    """Its nodes are started again by that tick alone: a tick through the queue would find the failed
    attempts and fail the run again with them, after a retry that answered it running."""
    run = failed_diamond(tenant)
    with tenant_context(tenant):
        error = WorkflowRun.objects.get(pk=run.pk).error

    def broken(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("a bug in the tick")

    monkeypatch.setattr(engine_tick, "_start_ready", broken)
    with tenant_context(tenant), pytest.raises(RuntimeError):
        services.run_retry(run=run)
    monkeypatch.undo()

    with tenant_context(tenant):
        engine_tick.tick(run.pk)  # a tick that comes meanwhile
        kept = WorkflowRun.objects.get(pk=run.pk)
        assert (kept.status, kept.error) == ("failed", error)
        assert not RunEvent.objects.filter(run_id=run.pk, type="retried").exists()
        services.run_retry(run=run)
    assert attempts(tenant, run)["b"] == [(1, "failed"), (2, "queued")]
    run_step(tenant, run, "b")
    run_step(tenant, run, "d")
    assert status(tenant, run) == "succeeded"


def test_only_a_failed_root_run_can_be_retried_and_once(tenant, client_a):
    run = failed_diamond(tenant)
    assert client_a.post(f"/api/v1/runs/{run.pk}/retry").status_code == 200
    again = client_a.post(f"/api/v1/runs/{run.pk}/retry")
    assert (again.status_code, error_code(again)) == (409, "conflict")
    assert again.json()["error"]["details"] == {"status": ["Is running, not failed."]}
    assert attempts(tenant, run)["b"] == [(1, "failed"), (2, "queued")]  # retried once

    put(tenant, {"nodes": [node("b", "fail")]}, name="leaf")
    put(tenant, {"nodes": [{"id": "kid", "type": "subworkflow", "workflow": "leaf"}]}, name="parent")
    parent = start(tenant, "parent")
    with tenant_context(tenant):
        child = WorkflowRun.objects.get(parent_run_id=parent.pk)
    child_refused = client_a.post(f"/api/v1/runs/{child.pk}/retry")
    assert (child_refused.status_code, error_code(child_refused)) == (409, "conflict")
    assert "parent_run_id" in child_refused.json()["error"]["details"]


# --- rerun ------------------------------------------------------------------------------------


def test_a_retry_of_a_run_in_a_tier_its_plan_has_lost_since_goes_on_in_the_plans_default_tier(tenant, client_a):
    put(tenant, {"nodes": [node("b", "fail", input={"succeed_on_attempt": 2})]}, name="flaky")
    with tenant_context(tenant):
        run, _ = services.run_start(workflow="flaky", input={}, tier="interactive")
    tenant_services.override_set(tenant=tenant, field="allowed_tiers", value=["standard", "batch"])  # a downgrade
    run_step(tenant, run, "b")
    assert status(tenant, run) == "failed"

    response = client_a.post(f"/api/v1/runs/{run.pk}/retry")

    assert response.status_code == 200, response.content
    assert (response.json()["tier"], response.json()["status"]) == ("standard", "running")
    assert attempts(tenant, run) == {"b": [(1, "failed"), (2, "queued")]}  # routed, not refused
    run_step(tenant, run, "b")
    assert status(tenant, run) == "succeeded"


def test_rerun_starts_a_new_run_of_the_same_version_with_its_lineage(tenant, client_a):
    put(tenant, {"nodes": [node("say", "echo", input={"to": "$input.name"})]}, name="greet")
    first = start(tenant, "greet", {"name": "Ada"})
    put(tenant, {"nodes": [node("other", "noop")]}, name="greet")  # version 2: reruns keep version 1

    same = client_a.post(f"/api/v1/runs/{first.pk}/rerun", {}, format="json")
    new_input = client_a.post(f"/api/v1/runs/{first.pk}/rerun", {"input": {"name": "Bo"}}, format="json")

    assert (same.status_code, new_input.status_code) == (201, 201)
    for response, expected in ((same, {"name": "Ada"}), (new_input, {"name": "Bo"})):
        body = response.json()
        assert (body["rerun_of"], body["version"], body["input"]) == (str(first.pk), 1, expected)
        assert body["id"] != str(first.pk)
        with tenant_context(tenant):
            created = RunEvent.objects.get(run_id=body["id"], type="created")
            assert created.data == {"version": 1, "rerun_of": str(first.pk)}
            assert [s.node_id for s in StepRun.objects.filter(run_id=body["id"])] == ["say"]
    with tenant_context(tenant):
        assert runs_this_month() == 3


def test_a_rerun_of_a_run_in_a_tier_its_plan_has_lost_since_starts_in_the_plans_default_tier(tenant, client_a):
    put(tenant, {"nodes": [node("say", "echo", input={"said": "hi"})]}, name="greet")
    with tenant_context(tenant):
        first, _ = services.run_start(workflow="greet", input={}, tier="interactive")
    tenant_services.override_set(tenant=tenant, field="allowed_tiers", value=["standard", "batch"])  # a downgrade

    response = client_a.post(f"/api/v1/runs/{first.pk}/rerun", {}, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["tier"], body["status"]) == ("standard", "running")  # not failed: its step was routed
    assert attempts(tenant, WorkflowRun(pk=body["id"])) == {"say": [(1, "queued")]}


def test_a_rerun_is_idempotent_with_a_key_and_charged_to_the_quota(tenant, client_a):
    put(tenant, {"nodes": [node("n", "noop")]})
    first = start(tenant)
    keyed = {"idempotency_key": "rerun-1"}
    created = client_a.post(f"/api/v1/runs/{first.pk}/rerun", keyed, format="json")
    again = client_a.post(f"/api/v1/runs/{first.pk}/rerun", keyed, format="json")
    assert (created.status_code, again.status_code) == (201, 200)
    assert created.json()["id"] == again.json()["id"]
    # The key again, with another input, or for a rerun of another run: a client's bug, refused.
    other_input = client_a.post(f"/api/v1/runs/{first.pk}/rerun", {**keyed, "input": {"n": 2}}, format="json")
    other_run = client_a.post(f"/api/v1/runs/{created.json()['id']}/rerun", keyed, format="json")
    for refused, differs in [(other_input, "input"), (other_run, "rerun_of")]:
        assert (refused.status_code, error_code(refused)) == (409, "idempotency_key_reused")
        assert f"another {differs}" in refused.json()["error"]["details"]["idempotency_key"][0]

    tenant_services.override_set(tenant=tenant, field="monthly_run_quota", value=2)
    refused = client_a.post(f"/api/v1/runs/{first.pk}/rerun", {}, format="json")
    assert (refused.status_code, error_code(refused)) == (429, "quota_exceeded")
    with tenant_context(tenant):
        assert WorkflowRun.objects.count() == 2  # the refused rerun left nothing


def test_a_start_under_a_reruns_key_is_refused_not_answered_with_the_rerun(tenant, client_a):
    put(tenant, {"nodes": [node("n", "noop")]})
    first = start(tenant)
    rerun = client_a.post(f"/api/v1/runs/{first.pk}/rerun", {"idempotency_key": "rerun-1"}, format="json")
    assert rerun.status_code == 201
    start_again = {"workflow": "diamond", "input": {"order": 1}, "idempotency_key": "rerun-1"}
    one = client_a.post("/api/v1/runs", start_again, format="json")
    many = client_a.post("/api/v1/runs/bulk", {"runs": [start_again]}, format="json")
    for refused, field in [(one, "idempotency_key"), (many, "runs[0].idempotency_key")]:
        assert (refused.status_code, error_code(refused)) == (409, "idempotency_key_reused"), refused.content
        assert "another rerun_of" in refused.json()["error"]["details"][field][0]
    with tenant_context(tenant):
        assert WorkflowRun.objects.count() == 2


def test_a_rerun_with_bad_input_is_refused_naming_the_field(tenant, client_a):
    put(tenant, {"nodes": [node("n", "noop")]})
    first = start(tenant)
    unknown = client_a.post(f"/api/v1/runs/{first.pk}/rerun", {"colour": "red"}, format="json")
    assert (unknown.status_code, error_code(unknown)) == (400, "unknown_field")
    assert "colour" in unknown.json()["error"]["details"]
    tenant_services.override_set(tenant=tenant, field="max_payload_bytes", value=64)
    big = client_a.post(f"/api/v1/runs/{first.pk}/rerun", {"input": {"x": "y" * 100}}, format="json")
    assert (big.status_code, error_code(big)) == (413, "payload_too_large")
    with tenant_context(tenant):
        assert WorkflowRun.objects.count() == 1


def test_another_tenants_run_cannot_be_retried_or_rerun(tenant, tenant_b, client_a):
    run = failed_diamond(tenant)
    theirs = api_client(tenant_b[1])
    for verb in ("retry", "rerun"):
        response = theirs.post(f"/api/v1/runs/{run.pk}/{verb}", {}, format="json")
        assert (response.status_code, error_code(response)) == (404, "not_found")
    assert status(tenant, run) == "failed"
    with tenant_context(tenant):
        assert WorkflowRun.objects.count() == 1


def test_a_failed_child_started_without_wait_is_retried_by_its_own_id(tenant, client_a):
    """A ``"wait": false`` child runs on by itself: its parent succeeded and cannot start it again, so
    the child is retried as a root run is; a child its parent waits for is still refused."""
    put(tenant, {"nodes": [node("b", "fail", input={"succeed_on_attempt": 2})]}, name="leaf")
    put(tenant, {"nodes": [{"id": "kid", "type": "subworkflow", "workflow": "leaf", "wait": False}]}, name="parent")
    parent = start(tenant, "parent")
    assert status(tenant, parent) == "succeeded"
    with tenant_context(tenant):
        child = WorkflowRun.objects.get(parent_run_id=parent.pk)
        engine_tick.tick(child.pk)  # its first tick, which the queue delivers
    run_step(tenant, child, "b")
    assert status(tenant, child) == "failed"

    response = client_a.post(f"/api/v1/runs/{child.pk}/retry")

    assert response.status_code == 200, response.content
    assert attempts(tenant, child) == {"b": [(1, "failed"), (2, "queued")]}
    run_step(tenant, child, "b")
    assert (status(tenant, child), status(tenant, parent)) == ("succeeded", "succeeded")
