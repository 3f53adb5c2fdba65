"""``POST /api/v1/runs/bulk``: many runs in one call, all or none, idempotent per item."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from ductor_project.core.context import tenant_context
from scheduling import fair_queue
from tenants import services as tenant_services
from tenants.models import Tenant
from tenants.usage import runs_this_month
from tests.conftest import api_client, error_code
from tests.workflows.test_api import assert_invalid, runs, tick
from workflows.models import RunEvent, WorkflowRun
from workflows.services import MAX_BULK_RUNS

pytestmark = pytest.mark.usefixtures("redis_client")

ONE_STEP = {"nodes": [{"id": "a", "type": "action", "action": "echo"}]}


def create(client: APIClient, name: str) -> None:
    response = client.post("/api/v1/workflows", {"name": name, "spec": ONE_STEP}, format="json")
    assert response.status_code == 201, response.content


def bulk(client: APIClient, items: list[dict[str, Any]], code: int = 201) -> dict[str, Any]:
    response = client.post("/api/v1/runs/bulk", {"runs": items}, format="json")
    assert response.status_code == code, response.content
    return dict(response.json())


def test_bulk_start_creates_every_run_in_order_with_its_created_event(client_a, tenant_a):
    create(client_a, "w")
    body = bulk(client_a, [{"workflow": "w", "input": {"n": i}, "idempotency_key": f"k{i}", "tags": ["t"]}
                           for i in range(3)])
    assert body["created"] == 3
    assert [item["idempotency_key"] for item in body["runs"]] == ["k0", "k1", "k2"]
    assert all(item["created"] and item["status"] == "pending" for item in body["runs"])
    with tenant_context(tenant_a[0]):
        rows = {str(r.id): r for r in WorkflowRun.objects.all()}
        assert [rows[item["id"]].input for item in body["runs"]] == [{"n": 0}, {"n": 1}, {"n": 2}]
        assert all(r.root_run_id == r.id and r.tags == ["t"] and r.tier == "standard" for r in rows.values())
        events = list(RunEvent.objects.values_list("run_id", "seq", "type", "data"))
        assert sorted(str(e[0]) for e in events) == sorted(rows)
        assert all(e[1:] == (1, "created", {"version": 1}) for e in events)
        assert runs_this_month() == 3
    tick(tenant_a[0], body["runs"][0]["id"])  # a bulk-started run advances like any other
    with tenant_context(tenant_a[0]):
        assert WorkflowRun.objects.get(pk=body["runs"][0]["id"]).status == "running"


def test_each_run_a_bulk_start_creates_logs_its_created_event_as_one_start_does(client_a, tenant_a, logged):
    """Every event of a run's history is logged as ``run_<type>``: the ``created`` of the runs of a
    bulk start (and so of an event's runs and a schedule's fires) too, with its run and tenant."""
    create(client_a, "w")
    single = client_a.post("/api/v1/runs", {"workflow": "w"}, format="json").json()["id"]
    body = bulk(client_a, [{"workflow": "w", "idempotency_key": "old"}, {"workflow": "w"}, {"workflow": "w"}])
    again = bulk(client_a, [{"workflow": "w", "idempotency_key": "old"}], code=200)

    created = [line for line in logged.json() if line["event"] == "run_created"]
    assert sorted(line["run_id"] for line in created) == sorted([single, *(item["id"] for item in body["runs"])])
    assert all(line["tenant_id"] == str(tenant_a[0].pk) for line in created)
    assert again["runs"][0]["id"] == body["runs"][0]["id"]  # an existing run is not created again


def test_bulk_start_returns_the_existing_run_for_a_used_key_and_dedupes_inside_the_batch(client_a, tenant_a):
    create(client_a, "w")
    first = bulk(client_a, [{"workflow": "w", "idempotency_key": "old"}])["runs"][0]
    body = bulk(client_a, [{"workflow": "w", "idempotency_key": "old"}, {"workflow": "w", "idempotency_key": "new"},
                           {"workflow": "w", "idempotency_key": "new"}, {"workflow": "w"}])
    assert body["created"] == 2
    old, new, again, keyless = body["runs"]
    assert (old["id"], old["created"]) == (first["id"], False)
    assert (again["id"], again["created"]) == (new["id"], False)
    assert new["created"]
    assert keyless["created"]
    assert runs(tenant_a[0]) == 3
    only_old = bulk(client_a, [{"workflow": "w", "idempotency_key": "old"}], code=200)
    assert only_old["created"] == 0


def test_a_key_reused_within_a_batch_with_another_input_cites_the_batch_s_item_and_starts_nothing(
    client_a, tenant_a
):
    """The refusal rolls the whole batch back: it names the item that first used the key, not the id
    of a run that was never kept."""
    create(client_a, "w")
    refused = client_a.post("/api/v1/runs/bulk", {"runs": [
        {"workflow": "w", "idempotency_key": "dup", "input": {"x": 1}},
        {"workflow": "w", "idempotency_key": "dup", "input": {"x": 2}}]}, format="json")
    assert (refused.status_code, error_code(refused)) == (409, "idempotency_key_reused")
    error = refused.json()["error"]
    assert "first used for runs[0]" in error["message"]
    assert list(error["details"]) == ["runs[1].idempotency_key"]
    assert runs(tenant_a[0]) == 0


def test_a_bad_item_is_a_400_naming_it_and_starts_nothing(make_tenant):
    tenant, key = make_tenant("freebie", plan="free")
    client = api_client(key)
    create(client, "w")
    response = client.post("/api/v1/runs/bulk", {"runs": [{"workflow": "w"}, {"workflow": "ghost"}]}, format="json")
    assert_invalid(response, "runs[1].workflow", "ghost")
    response = client.post("/api/v1/runs/bulk", {"runs": [{"workflow": "w", "tier": "interactive"}]}, format="json")
    assert_invalid(response, "runs[0].tier", "free")
    response = client.post("/api/v1/runs/bulk", {"runs": [{"workflow": "w", "colour": 1}]}, format="json")
    assert error_code(response) == "unknown_field"
    assert response.json()["error"]["details"] == {"runs[0].colour": ["Unknown field."]}
    # What the item's own fields refuse is named by the item's index too, one flat path per field.
    response = client.post("/api/v1/runs/bulk", {"runs": [{"workflow": "w"}, {"workflow": "w", "tier": "turbo"},
                                                          {"workflow": "w", "tags": ["a", 5]}, {"colour": 1}]},
                           format="json")
    assert_invalid(response, "runs[1].tier", "turbo")
    assert sorted(response.json()["error"]["details"]) == ["runs[1].tier", "runs[2].tags[1]", "runs[3].colour"]
    assert "runs[1].tier" in response.json()["error"]["message"]
    big = {"workflow": "w", "input": {"blob": "x" * 70_000}}
    response = client.post("/api/v1/runs/bulk", {"runs": [{"workflow": "w"}, big]}, format="json")
    assert_invalid(response, "runs[1].input", code="payload_too_large", status=413)
    assert runs(tenant) == 0


def test_an_item_of_no_such_version_names_its_version_as_a_start_of_one_does(client_a, tenant_a):
    create(client_a, "w")
    response = client_a.post("/api/v1/runs/bulk", {"runs": [{"workflow": "w"}, {"workflow": "w", "version": 9},
                                                            {"workflow": "ghost", "version": 1}]}, format="json")
    assert_invalid(response, "runs[1].version", "version 9 not found")
    assert sorted(response.json()["error"]["details"]) == ["runs[1].version", "runs[2].workflow"]
    one = client_a.post("/api/v1/runs", {"workflow": "w", "version": 9}, format="json")
    assert list(one.json()["error"]["details"]) == ["version"]
    assert runs(tenant_a[0]) == 0


def test_empty_and_oversized_batches_are_refused(client_a, tenant_a):
    create(client_a, "w")
    assert_invalid(client_a.post("/api/v1/runs/bulk", {"runs": []}, format="json"), "runs")
    too_many = [{"workflow": "w"}] * (MAX_BULK_RUNS + 1)
    assert_invalid(client_a.post("/api/v1/runs/bulk", {"runs": too_many}, format="json"), "runs")
    assert runs(tenant_a[0]) == 0


def test_a_batch_over_the_quota_is_a_429_and_starts_nothing(client_a, tenant_a):
    tenant_services.override_set(tenant=tenant_a[0], field="monthly_run_quota", value=3)
    create(client_a, "w")
    bulk(client_a, [{"workflow": "w"}])
    response = client_a.post("/api/v1/runs/bulk", {"runs": [{"workflow": "w"}] * 3}, format="json")
    assert response.status_code == 429, response.content
    assert error_code(response) == "quota_exceeded"
    assert runs(tenant_a[0]) == 1
    assert bulk(client_a, [{"workflow": "w"}] * 2)["created"] == 2  # what fits is still allowed
    with tenant_context(tenant_a[0]):
        assert runs_this_month() == 3


def test_idor_bulk_start_cannot_start_another_tenants_workflow(client_a, client_b, tenant_a, tenant_b):
    create(client_a, "private")
    response = client_b.post("/api/v1/runs/bulk", {"runs": [{"workflow": "private"}]}, format="json")
    assert_invalid(response, "runs[0].workflow", "not found")
    assert runs(tenant_a[0]) == 0
    assert runs(tenant_b[0]) == 0


@pytest.mark.django_db(transaction=True)
def test_bulk_started_runs_wait_in_the_fair_queue_one_partition_each(make_tenant):
    tenant, key = make_tenant("bulk-queue")
    client = api_client(key)
    create(client, "w")
    bulk(client, [{"workflow": "w"} for _ in range(5)])
    with tenant_context(Tenant.objects.get(pk=tenant.pk)):
        stats = fair_queue.stats()
    assert (stats.backlog, stats.due) == (5, 5)


def test_a_batch_whose_keys_concurrent_starts_take_again_and_again_looks_again_each_time(tenant_a, monkeypatch):
    """A concurrent start that takes one of the batch's keys fails the batch's insert, and the batch looks
    again, finding that start's run. Other starts may take its other keys before it looks again, each
    failing that pass too: it looks again as long as each pass finds one more of its keys taken (at most
    one pass a key). Before, a second collision was a 500. (Two real concurrent writers taking the keys one
    after the other: ``test_events``, whose event sends look again the same way.)"""
    from django.db import IntegrityError

    from workflows import services

    tenant = tenant_a[0]
    with tenant_context(tenant):
        services.workflow_put(name="w", spec=ONE_STEP)
    items = [{"workflow": "w", "idempotency_key": key, "tier": "standard"} for key in ("k1", "k2")]
    real, passes = services._start_many, []

    def taken_meanwhile(runs: Any, *args: Any) -> Any:
        passes.append(len(passes))
        if len(passes) <= len(runs):  # before each of the first passes, a concurrent start takes a key
            with tenant_context(tenant):
                real([runs[len(passes) - 1]], *args)
            raise IntegrityError('duplicate key value violates unique constraint "run_unique_idempotency_key"')
        return real(runs, *args)

    monkeypatch.setattr(services, "_start_many", taken_meanwhile)
    with tenant_context(tenant):
        started = services.run_start_many(runs=items, same_keys=True)
        theirs = dict(WorkflowRun.objects.values_list("idempotency_key", "id"))

    assert len(passes) == 3
    assert [(run.pk, created) for run, created in started] == [(theirs["k1"], False), (theirs["k2"], False)]


@pytest.mark.django_db(transaction=True)
def test_a_start_and_a_bulk_start_of_one_key_at_once_give_one_run_and_no_deadlock(tenant_a, monkeypatch):
    """A start in a transaction of its own writes its run, then charges the month's row with its commit; a
    bulk start writes its runs, then charges the month, in that order too. Before, the bulk start charged
    the month first: at once with a start of one of its keys, the start held the key and waited for the
    month's row, the bulk start held that row and waited for the key, and PostgreSQL aborted one of them
    as a deadlock (a 500)."""
    import threading

    from tests.waiting import in_a_thread, until_another_waits_on_a_lock
    from workflows import services

    tenant = tenant_a[0]
    with tenant_context(tenant):
        services.workflow_put(name="w", spec=ONE_STEP)
    reached, consume = threading.Event(), services.quota_consume

    def consume_once_another_waits(**kwargs: Any) -> int:
        total = consume(**kwargs)
        reached.set()
        until_another_waits_on_a_lock()  # the start, waiting for what the bulk start holds
        return total

    monkeypatch.setattr(services, "quota_consume", consume_once_another_waits)
    results: dict[str, Any] = {}

    def start_many() -> Any:
        with tenant_context(tenant):
            return services.run_start_many(runs=[{"workflow": "w", "idempotency_key": "k1"}])

    bulk_start = in_a_thread(results, "bulk", start_many)
    assert reached.wait(15)
    try:
        with tenant_context(tenant):
            run, _ = services.run_start(workflow="w", idempotency_key="k1")
    finally:
        bulk_start.join(30)

    assert not isinstance(results["bulk"], Exception), results["bulk"]
    [(theirs, _)] = results["bulk"]
    assert run.pk == theirs.pk
    with tenant_context(tenant):
        assert WorkflowRun.objects.count() == 1
        assert runs_this_month() == 1
