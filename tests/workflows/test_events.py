"""Events and event triggers, through the API on the real PostgreSQL and Redis: an event starts exactly
the subscribed workflows of its own tenant whose filters it meets, in the transaction that records it;
a refused start records nothing; bad input names its field; another tenant's objects are not found."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from ductor_project.core.context import tenant_context
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.conftest import api_client, error_code
from tests.waiting import another_waits_on_a_lock
from workflows import services
from workflows.models import Event, EventTrigger, WorkflowRun
from workflows.triggers import events as services_events

pytestmark = pytest.mark.django_db(transaction=True)

NOOP = {"nodes": [{"id": "n", "type": "action", "action": "noop"}]}


@pytest.fixture
def tenant(redis_client: Any, tenant_a: tuple[Tenant, str]) -> Tenant:
    return tenant_a[0]


def put(tenant: Tenant, name: str) -> None:
    with tenant_context(tenant):
        services.workflow_put(name=name, spec=NOOP)


def subscribe(client: APIClient, workflow: str, event: str, filter: Any = None) -> dict[str, Any]:
    response = client.post("/api/v1/triggers", {"workflow": workflow, "event": event, "filter": filter},
                           format="json")
    assert response.status_code == 201, response.content
    return response.json()


def runs_of(tenant: Tenant) -> list[WorkflowRun]:
    with tenant_context(tenant):
        return list(WorkflowRun.objects.order_by("created_at"))


def test_an_event_starts_each_subscribed_workflow_whose_filter_it_meets(tenant, client_a):
    for name in ("fulfil", "notify", "audit"):
        put(tenant, name)
    subscribe(client_a, "fulfil", "order.paid")
    subscribe(client_a, "notify", "order.paid", {"path": "event.payload.amount", "op": "gt", "value": 100})
    subscribe(client_a, "audit", "order.refunded")

    small = client_a.post("/api/v1/events", {"name": "order.paid", "key": "o-1", "payload": {"amount": 20}},
                          format="json")
    large = client_a.post("/api/v1/events", {"name": "order.paid", "key": "o-2", "payload": {"amount": 500}},
                          format="json")

    assert (small.status_code, large.status_code) == (201, 201)
    assert len(small.json()["runs"]) == 1
    assert len(large.json()["runs"]) == 2
    runs = {str(run.id): run for run in runs_of(tenant)}
    assert set(runs) == set(small.json()["runs"]) | set(large.json()["runs"])
    started = runs[small.json()["runs"][0]]
    assert started.workflow_name == "fulfil"
    assert started.tags == ["event:order.paid"]
    assert started.input == {"id": small.json()["id"], "name": "order.paid", "key": "o-1",
                             "payload": {"amount": 20}, "created_at": small.json()["created_at"]}
    assert sorted(runs[r].workflow_name for r in large.json()["runs"]) == ["fulfil", "notify"]
    listed = client_a.get("/api/v1/events?name=order.paid").json()["results"]
    assert [e["key"] for e in listed] == ["o-2", "o-1"]  # newest first


def test_the_runs_of_an_event_with_a_long_name_are_listed_by_its_whole_tag(tenant, client_a):
    """An event's name may have 200 characters: its runs' tag is ``event:<the whole name>``, which
    ``?tag=`` finds. Before, the tag was cut at 100 characters, and the list refused the whole one."""
    put(tenant, "fulfil")
    name = "order." + "x" * 194
    subscribe(client_a, "fulfil", name)
    sent = client_a.post("/api/v1/events", {"name": name}, format="json")
    assert sent.status_code == 201, sent.content
    assert [run.tags for run in runs_of(tenant)] == [[f"event:{name}"]]
    listed = client_a.get("/api/v1/runs", {"tag": f"event:{name}"})
    assert listed.status_code == 200, listed.content
    assert [run["id"] for run in listed.json()["results"]] == sent.json()["runs"]


def test_an_event_is_idempotent_with_its_key_and_a_bulk_send_is_all_or_none(tenant, client_a):
    put(tenant, "fulfil")
    subscribe(client_a, "fulfil", "order.paid")
    body = {"name": "order.paid", "idempotency_key": "pay-1"}
    first = client_a.post("/api/v1/events", body, format="json")
    again = client_a.post("/api/v1/events", body, format="json")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json() == again.json()
    assert len(runs_of(tenant)) == 1
    other = client_a.post("/api/v1/events", {**body, "payload": {"amount": 5}}, format="json")
    assert (other.status_code, error_code(other)) == (409, "idempotency_key_reused")
    assert "another payload" in other.json()["error"]["details"]["idempotency_key"][0]
    in_batch = client_a.post("/api/v1/events/bulk", {"events": [{"name": "order.paid", "idempotency_key": "b"},
                                                                {"name": "other", "idempotency_key": "b"}]},
                             format="json")
    assert (in_batch.status_code, error_code(in_batch)) == (409, "idempotency_key_reused")
    assert in_batch.json()["error"]["details"]["events[1].idempotency_key"] == [
        "Already used for events[0], with another name."]  # not the id of an event the refusal rolled back
    assert len(runs_of(tenant)) == 1

    bulk = client_a.post("/api/v1/events/bulk", {"events": [body, {"name": "order.paid"}, {"name": "other"}]},
                         format="json")
    assert bulk.status_code == 201
    assert bulk.json()["created"] == 2
    assert bulk.json()["events"][0]["id"] == first.json()["id"]
    assert len(runs_of(tenant)) == 2

    tenant_services.override_set(tenant=tenant, field="monthly_run_quota", value=2)
    refused = client_a.post("/api/v1/events/bulk", {"events": [{"name": "other"}, {"name": "order.paid"}]},
                            format="json")
    assert (refused.status_code, error_code(refused)) == (429, "quota_exceeded")
    with tenant_context(tenant):
        assert Event.objects.count() == 3  # the refused batch left nothing, not even its untriggered event
    assert len(runs_of(tenant)) == 2


def test_two_bulk_sends_of_the_same_new_keys_in_other_orders_never_deadlock(tenant, client_a, monkeypatch):
    """Each send inserted its first key, then waited for the other's: PostgreSQL failed one (a 500).
    Here each send, once it has inserted an event, waits until the other has too, or waits for a lock."""
    import threading

    from django.db import connection

    put(tenant, "fulfil")
    subscribe(client_a, "fulfil", "order.paid")
    keys = [f"k-{n:02}" for n in range(20)]
    manager, create = type(Event.objects), type(Event.objects).create
    inserted, failures, answers = [0], [], []

    def other_inserted_or_waits() -> bool:
        return inserted[0] == 2 or another_waits_on_a_lock()

    def created(self: Any, **fields: Any) -> Event:
        event = create(self, **fields)
        if fields["idempotency_key"] in (keys[0], keys[-1]):  # each send's first insert
            inserted[0] += 1
            for _ in range(600):
                if other_inserted_or_waits():
                    break
                threading.Event().wait(0.02)
        return event

    def send(order: list[str]) -> None:
        try:
            with tenant_context(tenant):
                answers.append(services_events.events_send([{"name": "order.paid", "idempotency_key": key}
                                                            for key in order]))
        except Exception as exc:
            failures.append(exc)
        finally:
            connection.close()

    monkeypatch.setattr(manager, "create", created)
    senders = [threading.Thread(target=send, args=(order,)) for order in (keys, keys[::-1])]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(60)

    assert failures == []
    assert sorted(sum(created for _, created in answer) for answer in answers) == [0, 20]
    with tenant_context(tenant):
        assert sorted(Event.objects.values_list("idempotency_key", flat=True)) == keys
    assert len(runs_of(tenant)) == 20


def test_a_batch_whose_keys_concurrent_sends_take_one_after_another_answers_their_events(tenant):
    """Two other sends take the batch's two keys one after the other. The batch waits for the
    first's insert, whose commit fails its own; it looks again, finds that event, and waits for
    the second's, whose commit fails its insert again. It then finds both: the batch answers the
    events of its keys however many times a concurrent send takes one of them. Before, a second
    collision was a 500."""
    import threading

    from django.db import connections, transaction

    from tests.waiting import backend_pid, until_blocked

    items = {key: {"name": "order.paid", "idempotency_key": key} for key in ("k1", "k2")}
    began = {key: threading.Event() for key in items}
    holding = {key: threading.Event() for key in items}
    release = {key: threading.Event() for key in items}
    pids: dict[str, int] = {}

    def hold(key: str) -> None:  # a send of the key, committed once released
        try:
            with tenant_context(tenant), transaction.atomic():
                pids[key] = backend_pid()
                began[key].set()
                services_events.events_send([items[key]])
                holding[key].set()
                assert release[key].wait(30)
        finally:
            connections.close_all()

    second = threading.Thread(target=hold, args=("k2",))

    def in_turn() -> None:
        try:
            until_blocked(pids["batch"], by=pids["k1"])
            second.start()
            assert holding["k2"].wait(15)
            release["k1"].set()
            until_blocked(pids["batch"], by=pids["k2"])
            release["k2"].set()
        finally:
            connections.close_all()

    first = threading.Thread(target=hold, args=("k1",))
    first.start()
    assert holding["k1"].wait(15)
    pids["batch"] = backend_pid()
    controller = threading.Thread(target=in_turn)
    controller.start()
    try:
        with tenant_context(tenant):
            answered = services_events.events_send(list(items.values()))
    finally:
        for event in release.values():
            event.set()
        controller.join(30)
        for thread in (first, second):
            if thread.ident is not None:
                thread.join(30)

    with tenant_context(tenant):
        theirs = dict(Event.objects.values_list("idempotency_key", "id"))
    assert [(event.pk, created) for event, created in answered] == [(theirs["k1"], False), (theirs["k2"], False)]


def test_more_triggers_than_the_limit_is_403_plan_limit_reached_and_another_tenant_has_its_own(
    tenant, tenant_b, client_a, settings
):
    settings.DUCTOR_TRIGGERS_PER_TENANT = 2
    put(tenant, "fulfil")
    put(tenant_b[0], "fulfil")
    subscribe(client_a, "fulfil", "a")
    subscribe(client_a, "fulfil", "b")

    response = client_a.post("/api/v1/triggers", {"workflow": "fulfil", "event": "c"}, format="json")

    assert (response.status_code, error_code(response)) == (403, "plan_limit_reached")
    assert response.json()["error"]["details"] == {"limit": "triggers", "maximum": 2, "current": 2}
    assert "DUCTOR_TRIGGERS_PER_TENANT" in response.json()["error"]["message"]
    with tenant_context(tenant):
        assert EventTrigger.objects.count() == 2
    subscribe(api_client(tenant_b[1]), "fulfil", "a")  # the other tenant's count is its own


def test_an_event_whose_runs_input_would_be_over_the_payload_limit_is_413_naming_its_payload(tenant, client_a):
    """The runs take the event with its id, name, key and time around the payload: a payload just
    within the limit makes an input over it, and the 413 named ``runs[0].input``, not in the request."""
    put(tenant, "fulfil")
    subscribe(client_a, "fulfil", "order.paid")
    tenant_services.override_set(tenant=tenant, field="max_payload_bytes", value=2048)
    payload = {"note": "x" * 2000}

    alone = client_a.post("/api/v1/events", {"name": "order.paid", "payload": payload}, format="json")
    untriggered = client_a.post("/api/v1/events", {"name": "nobody.listens", "payload": payload}, format="json")
    bulk = client_a.post("/api/v1/events/bulk", {"events": [{"name": "other"}, {"name": "order.paid",
                                                                               "payload": payload}]}, format="json")

    assert (alone.status_code, error_code(alone)) == (413, "payload_too_large")
    assert list(alone.json()["error"]["details"]) == ["payload"]
    assert "id, name, key and time around its payload" in alone.json()["error"]["details"]["payload"][0]
    assert untriggered.status_code == 201  # no run to start: the payload alone is within the limit
    assert list(bulk.json()["error"]["details"]) == ["events[1].payload"]
    with tenant_context(tenant):
        assert list(Event.objects.values_list("name", flat=True)) == ["nobody.listens"]
    assert runs_of(tenant) == []


def test_another_tenants_event_never_starts_a_run_here(tenant, tenant_b, client_a):
    put(tenant, "fulfil")
    subscribe(client_a, "fulfil", "order.paid")
    theirs = api_client(tenant_b[1])
    sent = theirs.post("/api/v1/events", {"name": "order.paid"}, format="json")
    assert (sent.status_code, sent.json()["runs"]) == (201, [])
    assert runs_of(tenant) == []
    assert runs_of(tenant_b[0]) == []


def test_another_tenants_events_and_triggers_are_not_found(tenant, tenant_b, client_a):
    put(tenant, "fulfil")
    trigger = subscribe(client_a, "fulfil", "order.paid")
    event = client_a.post("/api/v1/events", {"name": "order.paid"}, format="json").json()
    theirs = api_client(tenant_b[1])
    for verb, url in (("get", f"/api/v1/events/{event['id']}"), ("get", f"/api/v1/triggers/{trigger['id']}"),
                      ("patch", f"/api/v1/triggers/{trigger['id']}"), ("delete", f"/api/v1/triggers/{trigger['id']}")):
        body = {"enabled": False} if verb == "patch" else None  # a GET's data would be its query string
        response = getattr(theirs, verb)(url, body, format="json")
        assert (response.status_code, error_code(response)) == (404, "not_found"), (verb, url)
    assert theirs.get("/api/v1/events").json()["results"] == []
    assert theirs.get("/api/v1/triggers").json()["results"] == []
    with tenant_context(tenant):
        assert EventTrigger.objects.get().enabled
    with tenant_context(tenant_b[0]):
        services.workflow_put(name="fulfil", spec=NOOP)  # the same name in B: still not A's workflow
    refused = theirs.post("/api/v1/triggers", {"workflow": "missing", "event": "x"}, format="json")
    assert (refused.status_code, error_code(refused)) == (400, "invalid")


@pytest.mark.parametrize(("body", "field"), [
    ({"workflow": "fulfil", "event": "order.paid", "filter": {"path": "event.colour", "op": "eq", "value": 1}},
     "filter.path"),
    ({"workflow": "fulfil", "event": "order.paid", "filter": {"path": "input.x", "op": "eq", "value": 1}},
     "filter.path"),
    ({"workflow": "fulfil", "event": "order.paid", "filter": {"path": "event.key", "op": "like", "value": 1}},
     "filter.op"),
    ({"workflow": "nope", "event": "order.paid"}, "workflow"),
    ({"workflow": "fulfil", "event": "has space"}, "event"),
])
def test_a_bad_trigger_is_400_naming_the_field_and_leaves_nothing(tenant, client_a, body, field):
    put(tenant, "fulfil")
    response = client_a.post("/api/v1/triggers", body, format="json")
    assert (response.status_code, error_code(response)) == (400, "invalid"), response.content
    assert field in response.json()["error"]["details"]
    with tenant_context(tenant):
        assert not EventTrigger.objects.exists()


def test_a_bad_event_is_400_naming_the_field_and_leaves_nothing(tenant, client_a):
    for body, field in (({"name": ""}, "name"), ({"name": "x", "colour": 1}, "colour"),
                        ({"name": "x", "key": 5 * "k" * 100}, "key")):
        response = client_a.post("/api/v1/events", body, format="json")
        assert response.status_code == 400, response.content
        assert field in response.json()["error"]["details"]
    too_many = client_a.post("/api/v1/events/bulk", {"events": [{"name": "x"}] * 101}, format="json")
    assert (too_many.status_code, error_code(too_many)) == (400, "invalid")
    tenant_services.override_set(tenant=tenant, field="max_payload_bytes", value=64)
    big = client_a.post("/api/v1/events/bulk", {"events": [{"name": "x"}, {"name": "x", "payload": {"y": "z" * 100}}]},
                        format="json")
    assert (big.status_code, error_code(big)) == (413, "payload_too_large")
    assert "events[1].payload" in big.json()["error"]["details"]
    with tenant_context(tenant):
        assert not Event.objects.exists()


def test_a_bulk_of_one_event_names_its_bad_field_by_its_place_in_events(tenant, client_a):
    """``payload`` and ``idempotency_key`` are no fields of a bulk body: its one event's are named
    ``events[0]...``, as a bulk of more events names them and ``runs/bulk`` names a single run's."""
    assert client_a.post("/api/v1/events", {"name": "x", "idempotency_key": "k"}, format="json").status_code == 201
    reused = client_a.post("/api/v1/events/bulk", {"events": [{"name": "y", "idempotency_key": "k"}]}, format="json")
    assert (reused.status_code, error_code(reused)) == (409, "idempotency_key_reused")
    assert list(reused.json()["error"]["details"]) == ["events[0].idempotency_key"]
    tenant_services.override_set(tenant=tenant, field="max_payload_bytes", value=64)
    big = client_a.post("/api/v1/events/bulk", {"events": [{"name": "x", "payload": {"y": "z" * 100}}]}, format="json")
    assert (big.status_code, error_code(big)) == (413, "payload_too_large")
    assert list(big.json()["error"]["details"]) == ["events[0].payload"]
    put(tenant, "fulfil")
    subscribe(client_a, "fulfil", "order.paid")  # its runs' input, the event around its payload, is over the limit
    started = client_a.post("/api/v1/events/bulk", {"events": [{"name": "order.paid", "payload": {"y": "z" * 20}}]},
                            format="json")
    assert (started.status_code, error_code(started)) == (413, "payload_too_large")
    assert list(started.json()["error"]["details"]) == ["events[0].payload"]
    alone = client_a.post("/api/v1/events", {"name": "x", "payload": {"y": "z" * 100}}, format="json")
    assert list(alone.json()["error"]["details"]) == ["payload"]
    with tenant_context(tenant):
        assert list(Event.objects.values_list("name", flat=True)) == ["x"]
    assert runs_of(tenant) == []


def test_a_disabled_or_deleted_trigger_starts_nothing(tenant, client_a):
    put(tenant, "fulfil")
    trigger = subscribe(client_a, "fulfil", "order.paid")
    assert client_a.patch(f"/api/v1/triggers/{trigger['id']}", {"enabled": False}, format="json").status_code == 200
    assert client_a.post("/api/v1/events", {"name": "order.paid"}, format="json").json()["runs"] == []
    assert client_a.delete(f"/api/v1/triggers/{trigger['id']}").status_code == 204
    assert client_a.post("/api/v1/events", {"name": "order.paid"}, format="json").json()["runs"] == []
    assert runs_of(tenant) == []


@pytest.mark.parametrize("gone", ["trigger", "workflow"])
def test_a_change_of_a_trigger_deleted_since_it_was_read_is_404_and_does_not_bring_it_back(tenant, client_a, gone):
    """A change reads the trigger (its tenant's, or 404), then writes it: deleted in between, by its
    own deletion or its workflow's, it stays deleted (404), rather than being inserted again or, its
    workflow gone, failing on the reference at the commit (a 500)."""
    from ductor_project.core.errors import NotFound

    put(tenant, "fulfil")
    trigger = subscribe(client_a, "fulfil", "order.paid")
    with tenant_context(tenant):
        read = services_events.trigger_of(trigger["id"])
    path = f"/api/v1/triggers/{trigger['id']}" if gone == "trigger" else "/api/v1/workflows/fulfil"
    assert client_a.delete(path).status_code == 204

    with tenant_context(tenant), pytest.raises(NotFound):
        services_events.trigger_update(read, {"enabled": False})
    with tenant_context(tenant):
        assert not EventTrigger.objects.exists()


def test_changes_of_other_fields_of_one_trigger_at_once_are_all_kept(tenant, client_a):
    """Each change writes the fields it names onto the trigger as stored when it is locked, not onto
    the trigger as read before: the change that commits second keeps the first one's."""
    put(tenant, "fulfil")
    trigger = subscribe(client_a, "fulfil", "order.paid")
    with tenant_context(tenant):
        first, second = (services_events.trigger_of(trigger["id"]) for _ in range(2))
        services_events.trigger_update(first, {"enabled": False})
        services_events.trigger_update(second, {"event": "order.refunded"})

    stored = client_a.get(f"/api/v1/triggers/{trigger['id']}").json()
    assert (stored["enabled"], stored["event"]) == (False, "order.refunded")


# --- retention ----------------------------------------------------------------------------------


def test_events_older_than_their_tenants_retention_are_deleted_in_batches_and_no_others(tenant, tenant_b):
    from datetime import timedelta

    from django.utils import timezone

    from workflows.triggers.events import expire_events

    tenant_services.override_set(tenant=tenant, field="event_retention_days", value=1)
    tenant_services.override_set(tenant=tenant_b[0], field="event_retention_days", value=30)
    for owner in (tenant, tenant_b[0]):
        with tenant_context(owner):
            for age_days in (0, 2, 2, 2):
                event = Event.objects.create(name="order.paid", payload={"age": age_days})
                Event.objects.filter(pk=event.pk).update(created_at=timezone.now() - timedelta(days=age_days))

    # No time for a second batch: one batch per tenant a pass, two of tenant a's old ones.
    assert expire_events(batch=2, budget_s=0) == 2
    assert expire_events(batch=2, budget_s=0) == 1

    with tenant_context(tenant):
        assert [e.payload["age"] for e in Event.objects.all()] == [0]
    with tenant_context(tenant_b[0]):
        assert Event.objects.count() == 4


def test_a_pass_deletes_batch_after_batch_of_a_tenant_that_has_more_than_one(tenant, tenant_b):
    """A tenant may send events faster than one batch a pass (a bulk call holds 100): a pass goes on,
    batch after batch and the tenants in turn, while it has time, so the old events do not pile up."""
    from datetime import timedelta

    from django.utils import timezone

    from workflows.triggers.events import expire_events

    for owner in (tenant, tenant_b[0]):
        tenant_services.override_set(tenant=owner, field="event_retention_days", value=1)
        with tenant_context(owner):
            Event.objects.bulk_create([Event(name="order.paid", payload={"n": n}) for n in range(5)])
            Event.objects.update(created_at=timezone.now() - timedelta(days=2))
            Event.objects.create(name="order.paid", payload={"n": "recent"})

    # Time for every batch (however slow the host), and no rest: three batches of each tenant, in turn.
    assert expire_events(batch=2, budget_s=3600, rest=0) == 10

    for owner in (tenant, tenant_b[0]):
        with tenant_context(owner):
            assert [e.payload["n"] for e in Event.objects.all()] == ["recent"]
    assert expire_events(batch=2) == 0


def idle_tenants(count: int, prefix: str) -> None:
    """``count`` tenants that have nothing, in one statement."""
    Tenant.objects.bulk_create([Tenant(slug=f"{prefix}-{n}", name=f"{prefix}-{n}") for n in range(count)])


def old_event(tenant: Tenant) -> None:
    with tenant_context(tenant):
        event = Event.objects.create(name="order.paid")
        Event.objects.filter(pk=event.pk).update(created_at=timezone.now() - timedelta(days=2))


def test_a_pass_of_the_events_retention_costs_the_same_however_many_tenants_have_nothing_to_delete(tenant):
    """Each tenant a pass looked at cost its retention's read (a cache's round trips, or queries) and a
    delete, whether it had old events or not: on a platform of idle tenants, a pass did a hundred of
    each for nothing."""
    from workflows.triggers.events import expire_events

    tenant_services.override_set(tenant=tenant, field="event_retention_days", value=1)

    def a_pass() -> int:
        old_event(tenant)
        with CaptureQueriesContext(connection) as queries:
            assert expire_events(rest=0) == 1
        return len(queries.captured_queries)

    idle_tenants(3, "idle")
    few = a_pass()
    idle_tenants(30, "more-idle")
    assert a_pass() == few


def test_an_event_sent_again_under_its_key_after_its_retention_is_recorded_and_starts_its_runs_again(
    tenant, client_a
):
    """An event's idempotency key stands while the event is kept: once the retention deleted it, the
    key is free, and the same event is recorded again with new runs (docs/triggers.md says so)."""
    from datetime import timedelta

    from django.utils import timezone

    from workflows.triggers.events import expire_events

    tenant_services.override_set(tenant=tenant, field="event_retention_days", value=1)
    put(tenant, "fulfil")
    subscribe(client_a, "fulfil", "order.paid")
    body = {"name": "order.paid", "key": "42", "idempotency_key": "pay-42"}
    first = client_a.post("/api/v1/events", body, format="json").json()
    with tenant_context(tenant):
        Event.objects.update(created_at=timezone.now() - timedelta(days=2))
    assert expire_events() == 1

    again = client_a.post("/api/v1/events", body, format="json")

    assert again.status_code == 201
    assert again.json()["id"] != first["id"]
    assert len(again.json()["runs"]) == 1
    assert again.json()["runs"] != first["runs"]


def test_a_retention_override_must_be_at_least_a_day(tenant):
    with pytest.raises(Exception, match="at least 1"):
        tenant_services.override_set(tenant=tenant, field="event_retention_days", value=0)


def test_a_trigger_of_a_workflow_archived_since_starts_nothing_and_the_event_says_why(tenant, client_a):
    for name in ("fulfil", "notify"):
        put(tenant, name)
        subscribe(client_a, name, "order.paid")
    assert client_a.post("/api/v1/workflows/fulfil/archive").status_code == 200

    sent = client_a.post("/api/v1/events", {"name": "order.paid", "key": "o-1"}, format="json")

    assert sent.status_code == 201, sent.content
    [refused] = sent.json()["refused"]
    assert (refused["workflow"], refused["details"]) == (
        "fulfil", {"workflow": "Workflow 'fulfil' is archived and starts no new run."})
    assert [run.workflow_name for run in runs_of(tenant)] == ["notify"]

    assert client_a.post("/api/v1/workflows/fulfil/unarchive").status_code == 200  # the trigger stayed
    again = client_a.post("/api/v1/events", {"name": "order.paid", "key": "o-2"}, format="json")
    assert (again.json()["refused"], len(again.json()["runs"])) == ([], 2)


def test_the_line_of_an_event_retention_batch_names_the_tenant_whose_events_went(tenant, logged):
    """An operator searching a tenant's lines by ``tenant_id`` finds the deletion of its events."""
    tenant_services.override_set(tenant=tenant, field="event_retention_days", value=1)
    with tenant_context(tenant):
        event = Event.objects.create(name="order.paid", payload={})
        Event.objects.filter(pk=event.pk).update(created_at=timezone.now() - timedelta(days=2))

    assert services_events.expire_events() == 1

    (line,) = [line for line in logged.json() if line["event"] == "events_expired"]
    assert (line["tenant_id"], line["tenant"], line["count"]) == (str(tenant.pk), tenant.slug, 1)
