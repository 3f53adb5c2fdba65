"""Fairness keys through the engine and the API: a run's key (given at its start, or a rule's
template for its steps) puts its work under that key of its tenant's, so one of a tenant's
customers flooding it does not hold up the others; a bad key is a 400 naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from ductor_project.core.context import tenant_context
from tenants.models import Tenant
from tests.workflows.inline import run_items
from workflows import services
from workflows.models import WorkflowRun

ONE = {"nodes": [{"id": "a", "type": "action", "action": "echo", "input": {"x": "{{ $input.customer }}"}}]}


@pytest.mark.django_db(transaction=True)
def test_a_run_of_another_key_goes_out_ahead_of_one_keys_flood(redis_client: Any, tenant_a: tuple[Tenant, str]):
    tenant = tenant_a[0]
    with tenant_context(tenant):
        services.workflow_put(name="one", spec=ONE)
        flood = services.run_start_many(runs=[{"workflow": "one", "fairness_key": "big-customer"} for _ in range(30)])
        vip, _ = services.run_start(workflow="one", input={"customer": "vip"}, fairness_key="small-customer")
    assert vip.fairness_key == "small-customer"

    ran = run_items(tenant)

    vip_done = max(n for n, (_, run_id) in enumerate(ran) if run_id == str(vip.pk))
    assert vip_done <= 3, ran  # its tick and step beside the flood's first ones, not after its 60 items
    with tenant_context(tenant):
        runs = WorkflowRun.objects.filter(pk__in=[vip.pk, *(run.pk for run, _ in flood)])
        assert set(runs.values_list("status", flat=True)) == {"succeeded"}
        assert set(runs.values_list("fairness_key", flat=True)) == {"big-customer", "small-customer"}


@pytest.mark.django_db(transaction=True)
def test_a_rule_sets_a_steps_fairness_key_from_a_template(redis_client: Any, client_a: APIClient):
    rule = client_a.post("/api/v1/rules", {"name": "per-customer", "priority": 1,
                                           "action": {"fairness_key": "cust-{{ $input.customer }}"}}, format="json")
    assert rule.status_code == 201, rule.content

    trace = client_a.post("/api/v1/routing/explain", {"workflow": "w", "action": "echo", "input": {"customer": 42}},
                          format="json").json()

    assert trace["fairness_key"] == "cust-42"
    assert trace["partition_key"] is None


@pytest.mark.django_db
@pytest.mark.parametrize("action", [{"fairness_key": ""}, {"fairness_key": 5}, {"fairness_key": "{{ $nope.x }}"}])
def test_a_bad_fairness_key_template_is_a_400_naming_it(client_a: APIClient, action: dict[str, Any]):
    response = client_a.post("/api/v1/rules", {"name": "bad", "priority": 1, "action": action}, format="json")

    assert response.status_code == 400, response.content
    assert "action.fairness_key" in response.json()["error"]["details"]
    assert client_a.get("/api/v1/rules").json()["results"] == []


@pytest.mark.django_db(transaction=True)
def test_a_runs_fairness_key_is_checked_shown_and_kept_by_a_rerun(redis_client: Any, client_a: APIClient):
    assert client_a.post("/api/v1/workflows", {"name": "one", "spec": ONE}, format="json").status_code == 201

    too_long = client_a.post("/api/v1/runs", {"workflow": "one", "fairness_key": "k" * 129}, format="json")
    bad_item = {"workflow": "one", "fairness_key": "k" * 129}
    bulk_bad = client_a.post("/api/v1/runs/bulk", {"runs": [{"workflow": "one"}, bad_item]}, format="json")
    started = client_a.post("/api/v1/runs", {"workflow": "one", "fairness_key": "acme"}, format="json")

    assert too_long.status_code == 400
    assert "fairness_key" in too_long.json()["error"]["details"]
    assert bulk_bad.status_code == 400
    assert "runs[1].fairness_key" in bulk_bad.json()["error"]["message"], bulk_bad.json()
    assert client_a.get("/api/v1/runs").json()["results"][0]["id"] == started.json()["id"]  # nothing else started
    assert started.status_code == 201
    assert started.json()["fairness_key"] == "acme"
    rerun = client_a.post(f"/api/v1/runs/{started.json()['id']}/rerun", {}, format="json")
    assert rerun.status_code == 201, rerun.content
    assert rerun.json()["fairness_key"] == "acme"


@pytest.mark.django_db
def test_a_runs_fairness_key_is_kept_as_sent_as_a_key_s_weight_is(redis_client: Any, client_a: APIClient):
    """A weight is given for the key as runs carry it, spaces too; the start trimmed " acme " to "acme",
    so the runs were never under the key the weight was given for."""
    assert client_a.post("/api/v1/workflows", {"name": "one", "spec": ONE}, format="json").status_code == 201
    weighted = client_a.post("/api/v1/fairness-keys", {"key": " acme ", "weight": 5}, format="json")
    one = client_a.post("/api/v1/runs", {"workflow": "one", "fairness_key": " acme "}, format="json")
    many = client_a.post("/api/v1/runs/bulk", {"runs": [{"workflow": "one", "fairness_key": " acme "}]}, format="json")

    assert (weighted.status_code, weighted.json()["key"]) == (201, " acme ")
    assert (one.status_code, one.json()["fairness_key"]) == (201, " acme ")
    assert many.status_code == 201
    found = client_a.get("/api/v1/runs?fairness_key=%20acme%20").json()["results"]
    assert {run["id"] for run in found} == {one.json()["id"], many.json()["runs"][0]["id"]}
    assert {run["fairness_key"] for run in found} == {" acme "}
    assert client_a.get("/api/v1/runs?fairness_key=acme").json()["results"] == []
