"""A schedule's fires asked for by hand (``POST /schedules/{id}/backfill`` and ``/trigger``), through the
API on real PostgreSQL and Redis: each fire's run under its key, once, for the tenant's own schedules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from ductor_project.core.context import tenant_context
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.conftest import api_client, error_code
from workflows import retention
from workflows import services as workflow_services
from workflows.models import Schedule, WorkflowRun
from workflows.triggers import arming, firing
from workflows.triggers import backfill as backfill_module
from workflows.triggers import services as schedules
from workflows.triggers.timing import fire_key

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_client")]

FLOW = {"nodes": [{"id": "a", "type": "action", "action": "noop"}]}
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def scheduled(tenant: Tenant, **fields: Any) -> Schedule:
    """A schedule of ``tenant`` every minute (paused: only what is asked for here starts)."""
    with tenant_context(tenant):
        workflow_services.workflow_put(name="nightly", spec=FLOW)
        return schedules.schedule_create(**{"name": "s", "workflow": "nightly", "interval_s": 60, "paused": True,
                                            **fields})


def backfill(client: APIClient, schedule: Schedule, body: Any) -> Any:
    return client.post(f"/api/v1/schedules/{schedule.pk}/backfill", body, format="json")


def runs_of(tenant: Tenant) -> list[WorkflowRun]:
    with tenant_context(tenant):
        return list(WorkflowRun.objects.order_by("idempotency_key"))


def test_a_backfill_starts_each_fire_of_its_span_once_under_its_key(tenant_a: tuple[Tenant, str]) -> None:
    schedule = scheduled(tenant_a[0])
    client = api_client(tenant_a[1])
    span = {"start": T0.isoformat(), "end": (T0 + timedelta(minutes=4)).isoformat()}

    first = backfill(client, schedule, span)
    assert first.status_code == 200, first.content
    body = first.json()
    fires = [T0 + timedelta(minutes=n) for n in range(5)]
    assert [item["fire_at"] for item in body["fires"]] == [f.isoformat().replace("+00:00", "Z") for f in fires]
    assert (body["started"], body["existing"], body["refused"]) == (5, 0, 0)
    runs = runs_of(tenant_a[0])
    assert [run.idempotency_key for run in runs] == [fire_key(str(schedule.pk), f) for f in fires]
    assert all(run.tags == ["schedule:s"] for run in runs)

    again = backfill(client, schedule, {"start": (T0 + timedelta(minutes=3)).isoformat(),
                                        "end": (T0 + timedelta(minutes=5, seconds=30)).isoformat()}).json()
    assert (again["started"], again["existing"], again["refused"]) == (1, 2, 0)
    assert [item["created"] for item in again["fires"]] == [False, False, True]
    assert len(runs_of(tenant_a[0])) == 6
    with tenant_context(tenant_a[0]):
        assert Schedule.objects.get(pk=schedule.pk).fired_count == 0  # its own fires' count


def test_a_fire_whose_run_history_retention_deleted_is_started_again_by_a_backfill(
    tenant_a: tuple[Tenant, str]
) -> None:
    """A fire's key stands while its run is kept: once history retention deleted the run, the key is
    free, and a backfill over that fire starts it again (docs/triggers.md says so)."""
    tenant = tenant_a[0]
    tenant_services.override_set(tenant=tenant, field="history_retention_days", value=1)
    schedule = scheduled(tenant)
    client = api_client(tenant_a[1])
    span = {"start": T0.isoformat(), "end": (T0 + timedelta(minutes=1)).isoformat()}
    assert backfill(client, schedule, span).json()["started"] == 2
    with tenant_context(tenant):
        WorkflowRun.objects.update(status="succeeded", finished_at=timezone.now() - timedelta(days=2))
    retention._tenants.after = None
    retention._root_cursor.clear()
    assert retention.expire_runs() == 2

    again = backfill(client, schedule, span).json()

    assert (again["started"], again["existing"]) == (2, 0)


@pytest.mark.parametrize(("span", "field"), [
    ({"start": "2025-01-01T00:10:00Z", "end": "2025-01-01T00:00:00Z"}, "start"),
    ({"start": "2025-01-01T00:00:00Z", "end": "2999-01-01T00:00:00Z"}, "end"),
    ({"start": "2025-01-01T00:00:00Z", "end": "2025-01-02T00:00:00Z"}, "end"),  # 1,441 fires
    ({"start": "yesterday", "end": "2025-01-01T00:00:00Z"}, "start"),
    ({"end": "2025-01-01T00:00:00Z"}, "start"),
    ({"start": "0001-01-01T00:00:00Z", "end": "0001-01-01T00:10:00Z"}, "start"),  # before the first datetime
])
def test_a_bad_span_is_refused_naming_the_field_and_starts_nothing(tenant_a: tuple[Tenant, str], span: Any,
                                                                   field: str) -> None:
    schedule = scheduled(tenant_a[0])
    response = backfill(api_client(tenant_a[1]), schedule, span)
    assert response.status_code == 400
    assert error_code(response) == "invalid"
    assert field in response.json()["error"]["details"]
    assert runs_of(tenant_a[0]) == []


@pytest.mark.parametrize("start", ["0001-01-01T00:00:00Z", "0001-01-01T03:00:00Z"])
def test_a_span_from_the_first_days_of_the_calendar_is_refused_naming_start(tenant_a: tuple[Tenant, str],
                                                                            start: str) -> None:
    """Fire times there cannot be computed (in the schedule's time zone, a day before the first
    ``datetime``): the span is refused, not a server error."""
    schedule = scheduled(tenant_a[0], interval_s=None, cron="0 * * * *", timezone="America/New_York")
    response = backfill(api_client(tenant_a[1]), schedule, {"start": start, "end": "0001-01-02T00:00:00Z"})
    assert response.status_code == 400, response.content
    assert error_code(response) == "invalid"
    assert "start" in response.json()["error"]["details"]
    assert runs_of(tenant_a[0]) == []


def test_an_unknown_field_is_refused(tenant_a: tuple[Tenant, str]) -> None:
    schedule = scheduled(tenant_a[0])
    response = backfill(api_client(tenant_a[1]), schedule, {"start": T0.isoformat(), "end": T0.isoformat(),
                                                           "overlap": "skip"})
    assert response.status_code == 400
    assert error_code(response) == "unknown_field"


def test_a_trigger_starts_a_run_now_under_the_fire_of_this_second(tenant_a: tuple[Tenant, str]) -> None:
    schedule = scheduled(tenant_a[0])
    before = timezone.now().replace(microsecond=0)
    response = api_client(tenant_a[1]).post(f"/api/v1/schedules/{schedule.pk}/trigger")
    assert response.status_code == 201, response.content
    (run,) = runs_of(tenant_a[0])
    assert str(run.pk) == response.json()["id"]
    assert run.tags == ["schedule:s"]
    assert run.idempotency_key in {fire_key(str(schedule.pk), before + timedelta(seconds=n)) for n in range(5)}
    refused = api_client(tenant_a[1]).post(f"/api/v1/schedules/{schedule.pk}/trigger", {"now": True}, format="json")
    assert error_code(refused) == "unknown_field"


def test_a_trigger_in_the_second_of_a_fire_that_started_answers_its_run_after_a_change_of_input(
        tenant_a: tuple[Tenant, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The fire of a second owns its key, as a fire that finds its key used does: a trigger in that
    second answers its run (200), even if the schedule's input or name changed since. Before, it was
    compared with the run as a repeated start of the API is, and refused as 409
    idempotency_key_reused."""
    schedule = scheduled(tenant_a[0], input={"n": 1})
    client = api_client(tenant_a[1])
    started = backfill(client, schedule, {"start": T0.isoformat(), "end": T0.isoformat()})
    assert started.json()["started"] == 1, started.content
    changed = client.patch(f"/api/v1/schedules/{schedule.pk}", {"input": {"n": 2}, "name": "renamed"}, format="json")
    assert changed.status_code == 200, changed.content
    monkeypatch.setattr(backfill_module, "timezone", SimpleNamespace(now=lambda: T0 + timedelta(seconds=0.4)))

    response = client.post(f"/api/v1/schedules/{schedule.pk}/trigger")

    assert response.status_code == 200, response.content
    assert response.json()["id"] == started.json()["fires"][0]["run_id"]
    assert [run.input for run in runs_of(tenant_a[0])] == [{"n": 1}]


def test_a_trigger_in_the_second_of_a_fire_not_started_yet_takes_that_fire_s_place(
        tenant_a: tuple[Tenant, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A trigger is the fire of its second: the fire of that second, still waiting for its jitter,
    finds its key used and starts no second run (the docs say so)."""
    tenant = tenant_a[0]
    schedule = scheduled(tenant, paused=False, jitter_s=30, overlap="allow_all")
    with tenant_context(tenant):
        Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=T0, wake_at=arming.due_at(schedule, T0))
    monkeypatch.setattr(backfill_module, "timezone", SimpleNamespace(now=lambda: T0 + timedelta(seconds=0.4)))
    triggered = api_client(tenant_a[1]).post(f"/api/v1/schedules/{schedule.pk}/trigger")
    assert triggered.status_code == 201, triggered.content

    with tenant_context(tenant):
        firing.fire_schedules(now=T0 + timedelta(seconds=31))
        fired = Schedule.objects.get(pk=schedule.pk)

    assert [run.idempotency_key for run in runs_of(tenant)] == [fire_key(str(schedule.pk), T0)]
    assert (str(fired.last_run_id), fired.last_fire_at, fired.fired_count) == (triggered.json()["id"], T0, 0)
    assert fired.next_fire_at == T0 + timedelta(seconds=60)


def test_the_overlap_policy_of_a_schedule_does_not_look_at_the_runs_of_its_triggers_and_backfills(
        tenant_a: tuple[Tenant, str], monkeypatch: pytest.MonkeyPatch) -> None:
    tenant = tenant_a[0]
    schedule = scheduled(tenant, paused=False, overlap="skip")
    with tenant_context(tenant):
        Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=T0 + timedelta(seconds=60),
                                                       wake_at=T0 + timedelta(seconds=60))
    monkeypatch.setattr(backfill_module, "timezone", SimpleNamespace(now=lambda: T0 + timedelta(seconds=10)))
    assert api_client(tenant_a[1]).post(f"/api/v1/schedules/{schedule.pk}/trigger").status_code == 201

    with tenant_context(tenant):
        firing.fire_schedules(now=T0 + timedelta(seconds=60.5))  # the triggered run is still active
        fired = Schedule.objects.get(pk=schedule.pk)

    assert (fired.fired_count, fired.skipped_count) == (1, 0)
    assert len(runs_of(tenant)) == 2


def test_another_tenant_s_schedule_answers_404_and_starts_nothing(
        tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str]) -> None:
    schedule = scheduled(tenant_a[0])
    intruder = api_client(tenant_b[1])
    missing = intruder.post("/api/v1/schedules/00000000-0000-0000-0000-000000000009/backfill",
                            {"start": T0.isoformat(), "end": T0.isoformat()}, format="json")
    for response in (backfill(intruder, schedule, {"start": T0.isoformat(), "end": T0.isoformat()}),
                     intruder.post(f"/api/v1/schedules/{schedule.pk}/trigger")):
        assert response.status_code == 404
        assert response.json() == missing.json()
    assert runs_of(tenant_a[0]) == []
    assert runs_of(tenant_b[0]) == []
