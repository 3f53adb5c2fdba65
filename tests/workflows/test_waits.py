"""``wait_for_event`` nodes and signals on the real PostgreSQL and Redis, the engine driven in this
process (a queued tick is run as a worker runs it; a timeout's wake-up is called as the coordinator
calls it).

A wait resumes on an event of its name and correlation key only, of its own tenant; an event that
came while the wait was being written is not lost (the wait's arming finds it, ordered by the
advisory lock against the events' transaction); a timeout fails the node or gives its default;
a signal reaches its run only, and is kept until the run waits for it.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from ductor_project.core.context import tenant_context
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.conftest import error_code
from workflows import services
from workflows.engine import waits
from workflows.engine.reconcile import reconcile_runs
from workflows.engine.tick import tick
from workflows.models import EventWait, RunSignal, StepRun, WorkflowRun
from workflows.triggers.events import events_send

pytestmark = pytest.mark.django_db(transaction=True)


def wait_node(**fields: Any) -> dict[str, Any]:
    return {"id": "paid", "type": "wait_for_event", "event": "order.paid", **fields}


# Waits for the order's payment, then passes its amount on.
PAID = {"nodes": [wait_node(key="$input.order_id"),
                  {"id": "after", "type": "action", "action": "echo", "depends_on": ["paid"],
                   "input": {"amount": "$nodes.paid.output.amount"}}],
        "output": "$nodes.paid.output"}


@pytest.fixture
def tenant(redis_client: Any, tenant_a: tuple[Tenant, str]) -> Tenant:
    return tenant_a[0]


def put(tenant: Tenant, spec: dict[str, Any], name: str = "order") -> None:
    with tenant_context(tenant):
        services.workflow_put(name=name, spec=spec)


def start(tenant: Tenant, order_id: Any = "o-1", name: str = "order") -> WorkflowRun:
    with tenant_context(tenant):
        run, _ = services.run_start(workflow=name, input={"order_id": order_id})
    return run


def send(tenant: Tenant, key: str = "o-1", payload: Any = None, name: str = "order.paid") -> None:
    with tenant_context(tenant):
        events_send([{"name": name, "key": key, "payload": payload if payload is not None else {"amount": 5}}])


def step_of(tenant: Tenant, run: WorkflowRun, node_id: str = "paid") -> StepRun:
    with tenant_context(tenant):
        return StepRun.objects.filter(run_id=run.pk, node_id=node_id).order_by("-attempt").get()


def advance(tenant: Tenant, run: WorkflowRun) -> WorkflowRun:
    """Run the run's tick, as a worker does once the item the resume enqueued is dispatched."""
    with tenant_context(tenant):
        tick(run.pk)
        return WorkflowRun.objects.get(pk=run.pk)


def open_waits(tenant: Tenant) -> int:
    with tenant_context(tenant):
        return EventWait.objects.filter(matched_at__isnull=True).count()


# --- events -----------------------------------------------------------------------------------------


def test_a_wait_resumes_on_an_event_of_its_key_only_with_the_event_payload_as_output(tenant):
    put(tenant, PAID)
    first, second = start(tenant, "o-1"), start(tenant, "o-2")
    assert step_of(tenant, first).status == step_of(tenant, second).status == "waiting"

    send(tenant, "o-1", {"amount": 42})
    advance(tenant, first), advance(tenant, second)

    paid = step_of(tenant, first)
    assert (paid.status, paid.output) == ("succeeded", {"amount": 42})
    assert step_of(tenant, first, "after").input == {"amount": 42}
    assert step_of(tenant, second).status == "waiting"
    assert open_waits(tenant) == 1


def test_a_numeric_key_matches_its_text_and_a_wait_without_key_takes_any_key(tenant):
    put(tenant, PAID)
    put(tenant, {"nodes": [wait_node()]}, name="any")
    numbered, anything = start(tenant, 7), start(tenant, name="any")

    send(tenant, "7")
    assert advance(tenant, anything).status == "succeeded"
    advance(tenant, numbered)
    assert step_of(tenant, numbered).status == "succeeded"


def test_an_event_sent_through_the_api_keeps_its_key_as_sent_so_a_key_with_spaces_still_matches(tenant, client_a):
    """A correlation key is matched as it is: the API took " o-1 " as "o-1", so the wait for " o-1 "
    never resumed."""
    put(tenant, PAID)
    spaced = start(tenant, " o-1 ")

    sent = client_a.post("/api/v1/events", {"name": "order.paid", "key": " o-1 ", "payload": {"amount": 3}},
                         format="json")
    assert (sent.status_code, sent.json()["key"]) == (201, " o-1 ")
    advance(tenant, spaced)
    assert step_of(tenant, spaced).status == "succeeded"


def test_another_tenants_event_of_the_same_name_and_key_resumes_nothing(tenant, tenant_b):
    put(tenant, PAID)
    run = start(tenant, "o-1")
    send(tenant_b[0], "o-1")
    advance(tenant, run)
    assert step_of(tenant, run).status == "waiting"


def test_an_event_recorded_before_the_wait_counts_only_within_its_lookback(tenant):
    send(tenant, "o-1", {"amount": 1})
    put(tenant, PAID)
    late = start(tenant, "o-1")
    advance(tenant, late)
    assert step_of(tenant, late).status == "waiting"

    put(tenant, {"nodes": [wait_node(key="$input.order_id", lookback_s=60)]}, name="looking")
    looking = start(tenant, "o-1", name="looking")
    assert advance(tenant, looking).status == "succeeded"
    assert step_of(tenant, looking).output == {"amount": 1}


def test_an_event_whose_transaction_missed_the_wait_being_written_is_found_by_the_wait_s_arming(tenant):
    """The tick writing the wait has not committed when the event's transaction looks for waits; the
    event is recorded after the wait started. The arming, once the tick commits, resumes the wait."""
    put(tenant, PAID)
    written, recorded = threading.Event(), threading.Event()
    runs: list[WorkflowRun] = []

    def start_and_hold() -> None:
        try:
            with transaction.atomic():
                runs.append(start(tenant, "o-1"))
                written.set()
                assert recorded.wait(10)
        finally:
            connection.close()

    starter = threading.Thread(target=start_and_hold)
    starter.start()
    assert written.wait(10)
    send(tenant, "o-1", {"amount": 9})  # commits, without seeing the uncommitted wait
    recorded.set()
    starter.join(10)

    [run] = runs
    advance(tenant, run)
    assert (step_of(tenant, run).status, step_of(tenant, run).output) == ("succeeded", {"amount": 9})


def test_an_arming_waits_for_the_events_transaction_that_holds_the_lock_and_then_sees_its_event(tenant):
    """The other order: the event's transaction looked for waits before the wait committed, and
    commits after the wait's arming started. The arming waits on the advisory lock, then sees it."""
    put(tenant, PAID)
    written, looked = threading.Event(), threading.Event()
    runs: list[WorkflowRun] = []

    def start_and_arm() -> None:
        try:
            with transaction.atomic():
                runs.append(start(tenant, "o-1"))
                written.set()
                assert looked.wait(10)
            # committed: the arming runs now, and waits for the event's transaction
        finally:
            connection.close()

    starter = threading.Thread(target=start_and_arm)
    starter.start()
    assert written.wait(10)
    with transaction.atomic():
        send(tenant, "o-1", {"amount": 3})
        looked.set()
        _until_a_lock_is_awaited()
    starter.join(10)

    [run] = runs
    advance(tenant, run)
    assert (step_of(tenant, run).status, step_of(tenant, run).output) == ("succeeded", {"amount": 3})


def _until_a_lock_is_awaited() -> None:
    """Return once another session waits for an advisory lock (the arming, on the event's)."""
    deadline = timezone.now() + timedelta(seconds=10)
    with connection.cursor() as cursor:
        while timezone.now() < deadline:
            cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                           "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
            if cursor.fetchone()[0]:
                return
            threading.Event().wait(0.01)
    raise AssertionError("the arming never waited for the lock")


# --- timeouts -----------------------------------------------------------------------------------------


def _expire(tenant: Tenant, run: WorkflowRun) -> None:
    """The wait's timeout falls due: its wake-up, as the coordinator runs it."""
    with tenant_context(tenant):
        wait = EventWait.objects.get(run_id=run.pk)
        EventWait.objects.filter(pk=wait.pk).update(expires_at=timezone.now())
        waits.wait_timeout(str(wait.pk), {})


def test_a_timeout_without_default_fails_the_node_and_the_run(tenant):
    put(tenant, {"nodes": [wait_node(key="$input.order_id", timeout_s=3600)]})
    run = start(tenant)
    _expire(tenant, run)
    assert advance(tenant, run).status == "failed"
    assert step_of(tenant, run).error["code"] == "wait_timed_out"
    assert open_waits(tenant) == 0


def test_a_timeout_with_a_default_gives_the_rendered_default_as_output(tenant):
    put(tenant, {"nodes": [wait_node(key="$input.order_id", timeout_s=3600,
                                     default={"paid": False, "order": "$input.order_id"})],
                 "output": "$nodes.paid.output"})
    run = start(tenant, "o-5")
    _expire(tenant, run)
    finished = advance(tenant, run)
    assert (finished.status, finished.output) == ("succeeded", {"paid": False, "order": "o-5"})


def test_an_event_that_won_makes_the_late_timeout_change_nothing_and_an_early_one_waits(tenant):
    put(tenant, {"nodes": [wait_node(key="$input.order_id", timeout_s=3600)], "output": "$nodes.paid.output"})
    run = start(tenant)
    with tenant_context(tenant):
        wait = EventWait.objects.get(run_id=run.pk)
    with tenant_context(tenant):
        waits.wait_timeout(str(wait.pk), {})  # early: scheduled again for the rest, nothing else
    assert advance(tenant, run).status == "running"
    assert open_waits(tenant) == 1

    send(tenant, "o-1", {"amount": 8})
    _expire_quietly(tenant, wait)
    finished = advance(tenant, run)
    assert (finished.status, finished.output) == ("succeeded", {"amount": 8})


def _expire_quietly(tenant: Tenant, wait: EventWait) -> None:
    with tenant_context(tenant):
        EventWait.objects.filter(pk=wait.pk).update(expires_at=timezone.now())
        waits.wait_timeout(str(wait.pk), {})


# --- signals -----------------------------------------------------------------------------------------


SIGNALLED = {"nodes": [{"id": "approval", "type": "wait_for_event", "event": "approved", "key": "$input.order_id"}],
             "output": "$nodes.approval.output"}


def test_a_signal_resumes_its_run_s_wait_whatever_the_key_and_only_that_run(tenant, client_a):
    put(tenant, SIGNALLED)
    run, other = start(tenant, "o-1"), start(tenant, "o-1")

    response = client_a.post(f"/api/v1/runs/{run.pk}/signal", {"name": "approved", "payload": {"by": "ann"}},
                             format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["delivered_to"]["node_id"] == "approval"
    finished = advance(tenant, run)
    assert (finished.status, finished.output) == ("succeeded", {"by": "ann"})
    assert advance(tenant, other).status == "running"


def test_a_signal_sent_before_the_wait_is_kept_and_resumes_it_when_it_starts(tenant, client_a):
    put(tenant, {"nodes": [{"id": "first", "type": "action", "action": "noop"},
                           {"id": "approval", "type": "wait_for_event", "event": "approved",
                            "depends_on": ["first"]}],
                 "output": "$nodes.approval.output"})
    run = start(tenant)
    kept = client_a.post(f"/api/v1/runs/{run.pk}/signal", {"name": "approved", "payload": {"ok": 1}}, format="json")
    assert kept.status_code == 201
    assert kept.json()["delivered_to"] is None

    from tests.workflows.test_retry_rerun import run_step

    run_step(tenant, run, "first")

    with tenant_context(tenant):
        finished = WorkflowRun.objects.get(pk=run.pk)
        assert RunSignal.objects.get().delivered_to_id is not None
    assert (finished.status, finished.output) == ("succeeded", {"ok": 1})


def test_a_signal_is_idempotent_with_its_key_and_refused_for_an_ended_run(tenant, client_a):
    put(tenant, SIGNALLED)
    run = start(tenant)
    body = {"name": "approved", "idempotency_key": "approve-1"}
    first = client_a.post(f"/api/v1/runs/{run.pk}/signal", body, format="json")
    again = client_a.post(f"/api/v1/runs/{run.pk}/signal", body, format="json")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    other = client_a.post(f"/api/v1/runs/{run.pk}/signal", {**body, "payload": {"by": "someone else"}}, format="json")
    assert (other.status_code, error_code(other)) == (409, "idempotency_key_reused")
    assert "another payload" in other.json()["error"]["details"]["idempotency_key"][0]
    advance(tenant, run)

    ended = client_a.post(f"/api/v1/runs/{run.pk}/signal", {"name": "approved"}, format="json")
    assert (ended.status_code, error_code(ended)) == (409, "conflict")
    with tenant_context(tenant):
        assert RunSignal.objects.count() == 1


def test_a_signal_to_a_run_asked_to_cancel_is_refused_and_resumes_nothing(tenant, client_a):
    put(tenant, SIGNALLED)
    run = start(tenant)
    with tenant_context(tenant):
        cancelling = services.run_cancel(run=run)
    assert (cancelling.status, cancelling.cancel_requested) == ("running", True)

    response = client_a.post(f"/api/v1/runs/{run.pk}/signal", {"name": "approved"}, format="json")

    assert (response.status_code, error_code(response)) == (409, "conflict")
    assert "cancel_requested" in response.json()["error"]["details"]
    with tenant_context(tenant):
        assert RunSignal.objects.count() == 0
        assert EventWait.objects.get(run=run).matched_at is None


def test_another_tenants_run_cannot_be_signalled(tenant, client_b):
    put(tenant, SIGNALLED)
    run = start(tenant)
    response = client_b.post(f"/api/v1/runs/{run.pk}/signal", {"name": "approved"}, format="json")
    assert (response.status_code, error_code(response)) == (404, "not_found")
    with tenant_context(tenant):
        assert RunSignal.objects.count() == 0


@pytest.mark.parametrize(("body", "field", "status"), [
    ({"name": "bad name"}, "name", 400),
    ({}, "name", 400),
    ({"name": "ok", "colour": "red"}, "colour", 400),
    ({"name": "ok", "payload": "over the plan's max_payload_bytes"}, "payload", 413),
])
def test_a_bad_signal_is_refused_naming_its_field_and_kept_nowhere(tenant, client_a, body, field, status):
    put(tenant, SIGNALLED)
    run = start(tenant)
    if status == 413:
        tenant_services.override_set(tenant=tenant, field="max_payload_bytes", value=64)
        body = {**body, "payload": {"blob": "x" * 64}}
    response = client_a.post(f"/api/v1/runs/{run.pk}/signal", body, format="json")
    assert response.status_code == status, response.content
    assert field in response.json()["error"]["details"]
    with tenant_context(tenant):
        assert RunSignal.objects.count() == 0


# --- the rest of a wait's life --------------------------------------------------------------------------


def test_a_cancelled_run_s_wait_leaves_the_index(tenant):
    put(tenant, PAID)
    run = start(tenant)
    with tenant_context(tenant):
        services.run_cancel(run=WorkflowRun.objects.get(pk=run.pk))
    assert advance(tenant, run).status == "cancelled"
    assert open_waits(tenant) == 0
    send(tenant, "o-1")  # finds nothing to resume


def test_a_key_that_renders_no_text_fails_the_node_naming_it(tenant):
    put(tenant, PAID)
    run = start(tenant, {"not": "a key"})
    step = step_of(tenant, run)
    assert (step.status, step.error["code"], step.error["field"]) == ("failed", "invalid_input", "key")
    assert advance(tenant, run).status == "failed"


@pytest.mark.parametrize(("key", "shown"), [(None, "renders null:"), (True, "renders true:"),
                                             ({"a": "b"}, 'renders {"a":"b"}:')])
def test_a_key_that_renders_no_text_is_named_as_json_in_the_error(tenant, key, shown):
    put(tenant, PAID)
    assert shown in step_of(tenant, start(tenant, key)).error["message"]


def test_a_large_value_rendered_as_a_key_is_quoted_shortened_in_the_error(tenant):
    put(tenant, PAID)
    message = step_of(tenant, start(tenant, {"text": "x" * 50_000})).error["message"]
    assert len(message) < 300, len(message)
    assert message.startswith('key: renders {"text":"xxx')


def test_the_reconciler_arms_a_wait_whose_arming_was_lost(tenant):
    put(tenant, PAID)
    send(tenant, "o-1", {"amount": 2})
    put(tenant, {"nodes": [wait_node(key="$input.order_id", lookback_s=600)], "output": "$nodes.paid.output"},
        name="looking")
    with tenant_context(tenant), transaction.atomic():
        run = start(tenant, "o-1", name="looking")
        # The arming's on-commit callback is lost with this process: drop it.
        connection.run_on_commit = []
    with tenant_context(tenant):
        assert EventWait.objects.get(run_id=run.pk).armed_at is None
        WorkflowRun.objects.filter(pk=run.pk).update(updated_at=timezone.now() - timedelta(minutes=5))

    reconcile_runs()

    finished = advance(tenant, run)
    assert (finished.status, finished.output) == ("succeeded", {"amount": 2})


def test_why_names_the_event_and_key_a_wait_waits_for_and_its_timeout(tenant, client_a):
    put(tenant, {"nodes": [wait_node(key="$input.order_id", timeout_s=600)]})
    run = start(tenant, "o-9")

    response = client_a.get(f"/api/v1/runs/{run.pk}/why")

    assert response.status_code == 200
    [waiting] = [w for w in response.json()["waiting"] if w["node_id"] == "paid"]
    assert waiting["cause"] == "event"
    assert waiting["details"] == {"event": "order.paid", "key": "o-9"}
    assert "'order.paid' with key 'o-9'" in waiting["message"]
    assert waiting["until"]

    send(tenant, "o-9")
    [resumed] = [w for w in client_a.get(f"/api/v1/runs/{run.pk}/why").json()["waiting"] if w["node_id"] == "paid"]
    assert resumed["cause"] == "in_line"


def test_a_run_keeps_so_many_signals_and_refuses_more_naming_them(tenant, client_a, settings):
    settings.DUCTOR_MAX_SIGNALS_PER_RUN = 2
    put(tenant, SIGNALLED)
    run = start(tenant)
    sent = [client_a.post(f"/api/v1/runs/{run.pk}/signal", {"name": "other", "idempotency_key": f"k-{n}"},
                          format="json") for n in range(2)]
    assert [response.status_code for response in sent] == [201, 201]

    more = client_a.post(f"/api/v1/runs/{run.pk}/signal", {"name": "approved"}, format="json")
    assert (more.status_code, error_code(more)) == (409, "conflict")
    assert more.json()["error"]["details"] == {"signals": ["At most 2 per run."]}
    again = client_a.post(f"/api/v1/runs/{run.pk}/signal", {"name": "other", "idempotency_key": "k-1"}, format="json")
    assert (again.status_code, again.json()["id"]) == (200, sent[1].json()["id"])  # a known one still answers
    with tenant_context(tenant):
        assert RunSignal.objects.count() == 2
