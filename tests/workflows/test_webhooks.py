"""Webhooks on the real PostgreSQL and Redis, with a real HTTP receiver on 127.0.0.1.

The API (validation naming each field, the secret shown once, rotation), another tenant's endpoints
and deliveries not found on any verb, the deliveries a run's outcome creates in its own transaction
(and none, nor any query, for a tenant without endpoints), and the delivery item's handler, called
as a worker would: signing, retries with backoff, disabling an endpoint that keeps failing, and the
address policy. The end-to-end path through real processes is ``test_webhooks_e2e``.
"""

from __future__ import annotations

import gzip
import json
import threading
import tracemalloc
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from ductor_sdk.webhooks import WebhookSignatureError, verify
from rest_framework.test import APIClient

from ductor_project.core.context import tenant_context
from scheduling import fair_queue
from scheduling.dispatch.handlers import Failed, ItemContext
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.conftest import api_client, error_code
from tests.waiting import in_a_thread, until_another_waits_on_a_lock
from tests.workflows.webhook_receiver import Receiver, running_receiver
from workflows import services
from workflows.engine import steps
from workflows.engine import tick as engine_tick
from workflows.models import StepRun, WebhookDelivery, WebhookEndpoint, WorkflowRun
from workflows.triggers import webhook_delivery, webhooks

pytestmark = pytest.mark.django_db(transaction=True)

# Its one node is skipped unless input.go: a run of it succeeds in its start's own inline tick.
QUIET = {"nodes": [{"id": "n", "type": "action", "action": "noop",
                    "when": {"path": "input.go", "op": "eq", "value": True}}]}
FAILING = {"nodes": [{"id": "boom", "type": "action", "action": "fail",
                      "input": {"message": "no luck", "retryable": False}}]}
PUBLIC = "https://93.184.216.34/hooks/ductor"  # a public address literal: no DNS needed


@pytest.fixture
def tenant(redis_client: Any, tenant_a: tuple[Tenant, str]) -> Tenant:
    return tenant_a[0]


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    """A receiver on 127.0.0.1, which the address policy lets through only with DUCTOR_HTTP_ALLOW_PRIVATE."""
    settings.DUCTOR_HTTP_ALLOW_PRIVATE = True
    with running_receiver() as running:
        yield running


def put(tenant: Tenant, name: str, spec: dict[str, Any] = QUIET) -> None:
    with tenant_context(tenant):
        services.workflow_put(name=name, spec=spec)


def subscribe(client: APIClient, url: str = PUBLIC, events: list[str] | None = None, **fields: Any) -> dict[str, Any]:
    response = client.post("/api/v1/webhooks", {"url": url, "events": events or ["run.succeeded"], **fields},
                           format="json")
    assert response.status_code == 201, response.content
    return response.json()


def start(tenant: Tenant, workflow: str, **input: Any) -> WorkflowRun:
    with tenant_context(tenant):
        run, _ = services.run_start(workflow=workflow, input=input)
        return WorkflowRun.objects.get(pk=run.pk)


def deliveries(tenant: Tenant, **filters: Any) -> list[WebhookDelivery]:
    with tenant_context(tenant):
        return list(WebhookDelivery.objects.filter(**filters).order_by("created_at"))


def stored(tenant: Tenant, model: Any, pk: Any) -> Any:
    with tenant_context(tenant):
        return model.objects.get(pk=pk)


def deliver(tenant: Tenant, delivery: WebhookDelivery) -> Failed | None:
    """Run the delivery's item handler, as a worker does once the item is dispatched."""
    item = webhooks.item_id(delivery.pk)
    ctx = ItemContext(tenant_id=str(tenant.pk), item_id=item, tier="standard", partition=item, delivery=1,
                      waited_ms=0)
    with tenant_context(tenant):
        return webhook_delivery.execute_delivery(ctx, {"kind": "webhook", "delivery_id": str(delivery.pk)})


def make_due(tenant: Tenant, delivery: WebhookDelivery) -> None:
    """Bring the delivery's next attempt forward to now (as if its backoff had passed)."""
    with tenant_context(tenant):
        WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())


def queued(tenant: Tenant, item_id: str) -> bool:
    return fair_queue.pending([(tenant, item_id)])[0]


def wake_waits(tenant: Tenant, delivery: WebhookDelivery) -> bool:
    """Whether the delivery's retry wake-up waits in the fair queue (an item of the system tenant)."""
    return fair_queue.pending([(Tenant.system(), f"wake:{tenant.pk}:webhook_retry:{delivery.pk}")])[0]


def one_delivery(tenant: Tenant, client: APIClient, receiver: Receiver, **fields: Any) -> WebhookDelivery:
    """An endpoint on the receiver and the delivery of one run's success to it."""
    put(tenant, "quiet")
    subscribe(client, receiver.url, **fields)
    run = start(tenant, "quiet")
    [delivery] = deliveries(tenant, run=run)
    return delivery


# --- the API --------------------------------------------------------------------------------------------


def test_an_endpoint_is_created_with_its_secret_shown_once_read_changed_listed_and_deleted(tenant, client_a):
    put(tenant, "quiet")
    made = subscribe(client_a, events=["run.failed", "run.succeeded", "run.failed"], workflows=["quiet"],
                     description="ops")

    assert made["secret"].startswith("whsec_")
    assert len(made["secret"]) > 40
    assert made["events"] == ["run.succeeded", "run.failed"]  # normalized: in the documented order, once each
    assert (made["workflows"], made["enabled"], made["consecutive_failures"]) == (["quiet"], True, 0)
    read = client_a.get(f"/api/v1/webhooks/{made['id']}").json()
    assert "secret" not in read
    assert read == {key: value for key, value in made.items() if key != "secret"}
    with tenant_context(tenant):
        assert made["secret"] not in WebhookEndpoint.objects.get(pk=made["id"]).secret  # stored encrypted
    assert [row["id"] for row in client_a.get("/api/v1/webhooks").json()["results"]] == [made["id"]]
    assert all("secret" not in row for row in client_a.get("/api/v1/webhooks").json()["results"])

    patched = client_a.patch(f"/api/v1/webhooks/{made['id']}", {"events": ["step.failed"]}, format="json")
    assert (patched.status_code, patched.json()["events"], patched.json()["workflows"]) == (200, ["step.failed"],
                                                                                            ["quiet"])
    replaced = client_a.put(f"/api/v1/webhooks/{made['id']}", {"url": PUBLIC, "events": ["run.cancelled"]},
                            format="json")
    assert (replaced.status_code, replaced.json()["workflows"], replaced.json()["description"]) == (200, [], "")
    assert client_a.delete(f"/api/v1/webhooks/{made['id']}").status_code == 204
    assert client_a.get(f"/api/v1/webhooks/{made['id']}").status_code == 404


@pytest.mark.parametrize(("url", "message"), [
    ("ftp://93.184.216.34/x", "https"),
    ("http://93.184.216.34/x", "https"),
    ("https://user:pass@93.184.216.34/x", "credentials"),
    ("https://93.184.216.34/x#frag", "fragment"),
    ("https://93.184.216.34/" + "x" * 2000, "2000"),
    ("https:///nohost", "host"),
    ("https://example.com:99999/hook", "port"),
    ("https://example.com:0/hook", "port"),
    ("https://93.184.216.34/a b", "spaces"),
    ("https://xn--/hook", "Not a URL"),  # an IDNA label that decodes to nothing
    ("https://xn--a.example/hook", "Not a URL"),
    ("https://[/hook", "host name"),  # taken as the host %5B, which no resolver finds
    ("https://a<b.example/hook", "host name"),
    ("https://a..example/hook", "host name"),
    ("not a url", ""),
    ("", ""),
])
def test_a_bad_url_is_400_naming_url(tenant, client_a, url, message):
    response = client_a.post("/api/v1/webhooks", {"url": url, "events": ["run.failed"]}, format="json")

    assert (response.status_code, error_code(response)) == (400, "invalid"), response.content
    assert list(response.json()["error"]["details"]) == ["url"]
    assert message in response.json()["error"]["message"]


@pytest.mark.parametrize("url", [
    "https://127.0.0.1/hook", "https://10.1.2.3/hook", "https://192.168.0.7:8443/hook", "https://[::1]/hook",
    "https://169.254.169.254/latest/meta-data", "https://[::ffff:127.0.0.1]/hook", "https://0.0.0.0/hook",
    "https://localhost:8000/hook",  # the loopback name
    # The other forms a resolver reads as an IPv4 address without asking DNS.
    "https://127.1/hook", "https://2130706433/hook", "https://0x7f000001/hook", "https://017700000001/hook",
    "https://0/hook",
])
def test_a_private_address_or_the_loopback_name_is_refused_at_create(tenant, client_a, url):
    response = client_a.post("/api/v1/webhooks", {"url": url, "events": ["run.failed"]}, format="json")

    assert (response.status_code, error_code(response)) == (400, "invalid"), response.content
    assert response.json()["error"]["details"]["url"][0].endswith("only public addresses may be called.")
    made = subscribe(client_a)
    changed = client_a.patch(f"/api/v1/webhooks/{made['id']}", {"url": url}, format="json")
    assert (changed.status_code, list(changed.json()["error"]["details"])) == (400, ["url"])
    with tenant_context(tenant):
        assert list(WebhookEndpoint.objects.values_list("url", flat=True)) == [PUBLIC]


@pytest.mark.parametrize(("body", "field", "code"), [
    ({"url": PUBLIC, "events": []}, "events", "invalid"),
    ({"url": PUBLIC, "events": ["run.exploded"]}, "events", "invalid"),
    ({"url": PUBLIC, "events": "run.failed"}, "events", "invalid"),
    ({"url": PUBLIC}, "events", "invalid"),
    ({"events": ["run.failed"]}, "url", "invalid"),
    ({"url": PUBLIC, "events": ["run.failed"], "workflows": ["nope"]}, "workflows", "invalid"),
    ({"url": PUBLIC, "events": ["run.failed"], "description": "a\x00b"}, "description", "invalid"),
    ({"url": PUBLIC, "events": ["run.failed"], "secret": "mine"}, "secret", "unknown_field"),
    ({"url": 7, "events": ["run.failed"]}, "url", "invalid"),
])
def test_bad_input_is_400_with_a_stable_code_naming_the_field(tenant, client_a, body, field, code):
    response = client_a.post("/api/v1/webhooks", body, format="json")

    assert (response.status_code, error_code(response)) == (400, code), response.content
    assert field in response.json()["error"]["details"]
    with tenant_context(tenant):
        assert not WebhookEndpoint.objects.exists()


def test_more_endpoints_than_the_limit_is_403_plan_limit_reached(tenant, client_a, settings):
    settings.DUCTOR_WEBHOOKS_PER_TENANT = 2
    subscribe(client_a)
    subscribe(client_a)

    response = client_a.post("/api/v1/webhooks", {"url": PUBLIC, "events": ["run.failed"]}, format="json")

    assert (response.status_code, error_code(response)) == (403, "plan_limit_reached")
    assert response.json()["error"]["details"]["maximum"] == 2


def test_rotation_signs_with_both_secrets_during_its_grace_and_with_the_new_one_only_after(
    tenant, client_a, receiver
):
    delivery = one_delivery(tenant, client_a, receiver)
    [made] = client_a.get("/api/v1/webhooks").json()["results"]
    first = client_a.get(f"/api/v1/webhooks/{made['id']}")  # no secret here
    assert "secret" not in first.json()
    with tenant_context(tenant):
        old = webhook_delivery.signing_secrets(WebhookEndpoint.objects.get(pk=made["id"]))[0]

    rotated = client_a.post(f"/api/v1/webhooks/{made['id']}/rotate", {"grace_s": 3600}, format="json")
    assert rotated.status_code == 200
    new = rotated.json()["secret"]
    assert new.startswith("whsec_")
    assert new != old
    assert rotated.json()["previous_secret_expires_at"] is not None
    deliver(tenant, delivery)
    [sent] = receiver.wait_for(1)
    assert sent.headers["ductor-signature"].count("v1=") == 2
    verify(sent.body, sent.headers["ductor-signature"], new)
    verify(sent.body, sent.headers["ductor-signature"], old)  # a receiver not yet told of the new one

    again = client_a.post(f"/api/v1/webhooks/{made['id']}/rotate", {"grace_s": 0}, format="json").json()
    assert again["previous_secret_expires_at"] is None
    with tenant_context(tenant):
        endpoint = WebhookEndpoint.objects.get(pk=made["id"])
        assert webhook_delivery.signing_secrets(endpoint) == [again["secret"]]
    bad = client_a.post(f"/api/v1/webhooks/{made['id']}/rotate", {"grace_s": -1}, format="json")
    assert (bad.status_code, list(bad.json()["error"]["details"])) == (400, ["grace_s"])


def test_idor_webhooks_and_deliveries_of_another_tenant_are_not_found_on_every_verb(
    tenant, client_a, tenant_b, receiver
):
    delivery = one_delivery(tenant, client_a, receiver)
    endpoint = str(delivery.endpoint_id)
    theirs = api_client(tenant_b[1])
    calls = [("get", f"/api/v1/webhooks/{endpoint}"), ("patch", f"/api/v1/webhooks/{endpoint}"),
             ("put", f"/api/v1/webhooks/{endpoint}"), ("delete", f"/api/v1/webhooks/{endpoint}"),
             ("post", f"/api/v1/webhooks/{endpoint}/rotate"), ("get", f"/api/v1/webhooks/{endpoint}/deliveries"),
             ("get", f"/api/v1/webhooks/{endpoint}/deliveries/{delivery.pk}"),
             ("post", f"/api/v1/webhooks/{endpoint}/deliveries/{delivery.pk}/redeliver")]
    for verb, url in calls:
        body = None if verb == "get" else {"url": PUBLIC, "events": ["run.failed"], "enabled": False}  # a GET's
        response = getattr(theirs, verb)(url, body, format="json")  # data would be its query string
        assert (response.status_code, error_code(response)) == (404, "not_found"), (verb, url)
    assert theirs.get("/api/v1/webhooks").json()["results"] == []

    # Their own endpoint does not reach our delivery either.
    mine = subscribe(theirs)
    crossed = theirs.get(f"/api/v1/webhooks/{mine['id']}/deliveries/{delivery.pk}")
    assert crossed.status_code == 404
    assert theirs.get(f"/api/v1/webhooks/{mine['id']}/deliveries").json()["results"] == []
    with tenant_context(tenant):
        row = WebhookEndpoint.objects.get(pk=endpoint)
        assert (row.enabled, row.url) == (True, receiver.url)
        assert WebhookDelivery.objects.get(pk=delivery.pk).status == "pending"


def purge(batch: int = 1000) -> int:
    """One pass of the coordinator's purge of deleted endpoints, one batch of each."""
    return webhook_delivery.purge_deleted_endpoints(batch=batch, budget_s=0, rest=0)


def test_deleting_an_endpoint_hides_it_at_once_and_leaves_its_log_to_the_purge_in_batches(
    tenant, client_a, tenant_b, receiver
):
    delivery = one_delivery(tenant, client_a, receiver)  # pending: not sent yet
    endpoint = str(delivery.endpoint_id)
    for _ in range(4):
        start(tenant, "quiet")
    theirs = api_client(tenant_b[1])
    put(tenant_b[0], "quiet")
    kept = subscribe(theirs, receiver.url)
    start(tenant_b[0], "quiet")

    assert client_a.delete(f"/api/v1/webhooks/{endpoint}").status_code == 204

    # Gone for the tenant at once; its log is not deleted in the request's transaction.
    for url in (f"/api/v1/webhooks/{endpoint}", f"/api/v1/webhooks/{endpoint}/deliveries",
                f"/api/v1/webhooks/{endpoint}/deliveries/{delivery.pk}"):
        assert client_a.get(url).status_code == 404, url
    assert client_a.get("/api/v1/webhooks").json()["results"] == []
    assert len(deliveries(tenant)) == 5
    assert deliver(tenant, delivery) is None  # its pending delivery is not sent
    start(tenant, "quiet")  # nor is a run that ends now delivered to it
    assert len(deliveries(tenant)) == 5
    assert receiver.requests == []

    # The purge removes its log a batch at a time, then its row.
    assert purge(batch=2) == 2
    assert len(deliveries(tenant)) == 3
    assert WebhookEndpoint.all_tenants.filter(pk=endpoint).exists()
    purge(batch=2)
    purge(batch=2)
    assert deliveries(tenant) == []
    assert not WebhookEndpoint.all_tenants.filter(pk=endpoint).exists()
    assert purge(batch=2) == 0

    # Another tenant's endpoint and deliveries are untouched.
    assert theirs.get(f"/api/v1/webhooks/{kept['id']}").status_code == 200
    assert len(deliveries(tenant_b[0])) == 1


def test_an_endpoint_being_purged_leaves_the_limit(tenant, client_a, settings):
    settings.DUCTOR_WEBHOOKS_PER_TENANT = 1
    made = subscribe(client_a)
    assert client_a.delete(f"/api/v1/webhooks/{made['id']}").status_code == 204
    subscribe(client_a)  # the deleted one does not count while its log waits for the purge


# --- the deliveries of an outcome ----------------------------------------------------------------------


def test_a_run_s_success_creates_one_delivery_per_subscribed_endpoint_and_enqueues_it(tenant, client_a):
    put(tenant, "quiet")
    put(tenant, "other")
    every = subscribe(client_a, events=["run.succeeded", "run.failed"])
    only_quiet = subscribe(client_a, events=["run.succeeded"], workflows=["quiet"])
    failures_only = subscribe(client_a, events=["run.failed", "step.failed"])
    disabled = subscribe(client_a, events=["run.succeeded"], enabled=False)

    run = start(tenant, "quiet", who="ada")
    other = start(tenant, "other")

    assert run.status == other.status == "succeeded"
    made = deliveries(tenant, run=run)
    assert sorted(str(d.endpoint_id) for d in made) == sorted([every["id"], only_quiet["id"]])
    assert [str(d.endpoint_id) for d in deliveries(tenant, run=other)] == [every["id"]]
    assert not deliveries(tenant, endpoint_id=failures_only["id"])
    assert not deliveries(tenant, endpoint_id=disabled["id"])
    delivery = made[0]
    assert (delivery.type, delivery.status, delivery.attempts) == ("run.succeeded", "pending", [])
    body = delivery.body
    assert (body["id"], body["type"]) == (str(delivery.pk), "run.succeeded")
    assert body["data"]["run"] == {"id": str(run.pk), "workflow": "quiet", "version": 1, "status": "succeeded",
                                   "input": {"who": "ada"}, "output": None, "error": None, "tags": [],
                                   "started_at": body["data"]["run"]["started_at"],
                                   "finished_at": body["data"]["run"]["finished_at"]}
    assert body["data"]["run"]["finished_at"].endswith("Z")
    assert all(queued(tenant, webhooks.item_id(d.pk)) for d in made)


def test_a_failed_step_and_a_failed_run_are_delivered_with_the_step_s_error(tenant, client_a):
    put(tenant, "failing", FAILING)
    runs = subscribe(client_a, events=["run.failed"])
    step_failures = subscribe(client_a, events=["step.failed"])
    run = start(tenant, "failing")
    with tenant_context(tenant):
        step = StepRun.objects.get(run=run)
    assert deliveries(tenant) == []  # nothing has ended yet

    ctx = ItemContext(tenant_id=str(tenant.pk), item_id=f"step:{step.pk}", tier="standard",
                      partition=f"step:{step.pk}", delivery=1, waited_ms=0)
    with tenant_context(tenant):
        steps.execute_step(ctx, {"step_id": str(step.pk)})

    [failed_run] = deliveries(tenant, endpoint_id=runs["id"])
    [failed_step] = deliveries(tenant, endpoint_id=step_failures["id"])
    assert failed_run.body["data"]["run"]["status"] == "failed"
    assert failed_run.body["data"]["run"]["error"]["node"] == "boom"
    assert "step" not in failed_run.body["data"]
    assert failed_step.type == "step.failed"
    assert failed_step.body["data"]["step"]["node_id"] == "boom"
    assert failed_step.body["data"]["step"]["attempt"] == 1
    assert failed_step.body["data"]["step"]["error"]["code"] == "action_failed"
    assert failed_step.body["data"]["step"]["error"]["message"] == "no luck"


def test_a_cancelled_run_is_delivered(tenant, client_a):
    put(tenant, "failing", FAILING)
    endpoint = subscribe(client_a, events=["run.cancelled"])
    run = start(tenant, "failing")
    with tenant_context(tenant):
        services.run_cancel(run=run)
        engine_tick.tick(run.pk)

    [delivery] = deliveries(tenant, endpoint_id=endpoint["id"])
    assert (delivery.type, delivery.body["data"]["run"]["status"]) == ("run.cancelled", "cancelled")


def test_a_delivery_of_a_run_in_a_tier_its_plan_has_lost_since_is_queued_in_the_plans_default_tier(tenant, client_a):
    put(tenant, "failing", FAILING)
    subscribe(client_a, events=["run.failed"])
    with tenant_context(tenant):
        run, _ = services.run_start(workflow="failing", input={}, tier="interactive")
        step = StepRun.objects.get(run=run)
    tenant_services.override_set(tenant=tenant, field="allowed_tiers", value=["standard", "batch"])  # a downgrade

    ctx = ItemContext(tenant_id=str(tenant.pk), item_id=f"step:{step.pk}", tier="interactive",
                      partition=f"step:{step.pk}", delivery=1, waited_ms=0)
    with tenant_context(tenant):
        steps.execute_step(ctx, {"step_id": str(step.pk)})

    [delivery] = deliveries(tenant, run=run)
    assert queued(tenant, webhooks.item_id(delivery.pk))
    assert fair_queue.stats(tenant=tenant).tiers["standard"].backlog == 1


def test_deliveries_are_written_in_the_outcome_s_transaction_and_a_rollback_leaves_none(tenant, client_a):
    put(tenant, "quiet")
    subscribe(client_a)

    inside: list[int] = []

    def start_then_fail() -> None:
        with tenant_context(tenant), transaction.atomic():
            services.run_start(workflow="quiet", input={})
            inside.append(WebhookDelivery.objects.count())
            raise RuntimeError("the outcome's transaction fails")

    with pytest.raises(RuntimeError):
        start_then_fail()

    assert inside == [1]  # there, inside the outcome's transaction

    assert deliveries(tenant) == []
    with tenant_context(tenant):
        assert not WorkflowRun.objects.exists()
    assert fair_queue.stats(tenant).backlog == 0  # nothing was enqueued for it


def test_a_tenant_without_endpoints_gets_no_delivery_and_a_finished_run_costs_it_no_query(
    tenant, client_a, tenant_b
):
    put(tenant, "quiet")
    put(tenant_b[0], "quiet")
    subscribe(api_client(tenant_b[1]))  # another tenant's endpoint is not this one's
    start(tenant, "quiet")  # the first outcome reads the (empty) list of endpoints once

    with CaptureQueriesContext(connection) as queries:
        run = start(tenant, "quiet")

    assert run.status == "succeeded"
    assert not [query["sql"] for query in queries if "webhook" in query["sql"]]
    assert deliveries(tenant) == []


def test_an_endpoint_created_disabled_says_why_as_one_disabled_through_the_api_does(client_a):
    created = subscribe(client_a, enabled=False)
    changed = client_a.patch(f"/api/v1/webhooks/{subscribe(client_a)['id']}", {"enabled": False}, format="json").json()

    assert created["enabled"] is changed["enabled"] is False
    assert created["disabled_reason"] == changed["disabled_reason"] == "disabled through the API"
    assert created["disabled_at"] is not None


def test_a_change_of_an_endpoint_is_seen_at_once_by_the_process_that_made_it(tenant, client_a):
    put(tenant, "quiet")
    start(tenant, "quiet")  # the copy of the (empty) endpoints, trusted for 2 s
    endpoint = subscribe(client_a)
    assert len(deliveries(tenant, run=start(tenant, "quiet"))) == 1
    client_a.patch(f"/api/v1/webhooks/{endpoint['id']}", {"enabled": False}, format="json")
    assert deliveries(tenant, run=start(tenant, "quiet")) == []


# --- sending ---------------------------------------------------------------------------------------------


def test_a_delivery_is_a_signed_json_post_the_sdk_verifies_and_a_2xx_delivers_it(tenant, client_a, receiver):
    delivery = one_delivery(tenant, client_a, receiver)
    [made] = client_a.get("/api/v1/webhooks").json()["results"]
    with tenant_context(tenant):
        WebhookEndpoint.objects.filter(pk=made["id"]).update(consecutive_failures=3)

    assert deliver(tenant, delivery) is None
    [sent] = receiver.wait_for(1)

    headers = sent.headers
    assert sent.path == "/hook"
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"] == "Ductor-Webhooks/1"
    assert headers["ductor-webhook-id"] == str(delivery.pk)
    timestamp = int(headers["ductor-webhook-timestamp"])
    assert headers["ductor-signature"].startswith(f"t={timestamp},v1=")
    assert json.loads(sent.body) == delivery.body
    with tenant_context(tenant):
        secret = webhook_delivery.signing_secrets(WebhookEndpoint.objects.get(pk=made["id"]))[0]
    verify(sent.body, headers["ductor-signature"], secret, now=timestamp)
    with pytest.raises(WebhookSignatureError):
        verify(sent.body + b" ", headers["ductor-signature"], secret, now=timestamp)
    with pytest.raises(WebhookSignatureError):
        verify(sent.body, headers["ductor-signature"], "whsec_not-it", now=timestamp)
    done = stored(tenant, WebhookDelivery, delivery.pk)
    assert (done.status, done.next_attempt_at, len(done.attempts)) == ("delivered", None, 1)
    assert done.finished_at is not None
    assert done.attempts[0]["status_code"] == 200
    assert done.attempts[0]["error"] is None
    assert done.attempts[0]["response"] == '{"ok": true}'
    assert stored(tenant, WebhookEndpoint, made["id"]).consecutive_failures == 0

    assert deliver(tenant, delivery) is None  # a duplicate item: nothing is sent again
    assert len(receiver.requests) == 1


def test_a_compressed_answer_is_inflated_only_as_far_as_the_log_keeps_it(tenant, client_a, receiver):
    """64 MiB of one letter in 64 KiB of gzip, sent though no compression was asked for: the attempt
    holds about what it logs in memory, not the 64 MiB httpx inflates a network piece to."""
    receiver.answer, receiver.headers = gzip.compress(b"a" * 64 * 1024 * 1024, compresslevel=9), {
        "Content-Encoding": "gzip"}
    delivery = one_delivery(tenant, client_a, receiver)
    tracemalloc.start()
    try:
        deliver(tenant, delivery)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    row = stored(tenant, WebhookDelivery, delivery.pk)
    assert (row.status, row.attempts[0]["status_code"]) == ("delivered", 200)
    assert row.attempts[0]["response"] == "a" * 500
    assert peak < 8 * 1024 * 1024, f"{peak} bytes held to read an answer of which 4 KiB are read"


def test_an_answer_holding_a_nul_character_is_logged_with_it_replaced(tenant, client_a, receiver):
    """PostgreSQL keeps no NUL in text: the attempt's record failed, so the delivery stayed pending,
    sent again each time its claim ran out, never counted nor logged."""
    receiver.answer = b'{"ok": "\x00"}'
    delivery = one_delivery(tenant, client_a, receiver)

    assert deliver(tenant, delivery) is None

    row = stored(tenant, WebhookDelivery, delivery.pk)
    assert (row.status, row.attempts[0]["status_code"]) == ("delivered", 200)
    assert row.attempts[0]["response"] == '{"ok": "\ufffd"}'


def test_a_500_is_retried_with_backoff_then_the_delivery_fails_after_its_attempts(
    tenant, client_a, receiver, settings
):
    settings.DUCTOR_WEBHOOK_MAX_ATTEMPTS = 3
    settings.DUCTOR_WEBHOOK_BACKOFF_S = 10.0
    receiver.status = 500
    delivery = one_delivery(tenant, client_a, receiver)

    result = deliver(tenant, delivery)

    assert isinstance(result, Failed)
    assert "HTTP 500" in result.error
    first = stored(tenant, WebhookDelivery, delivery.pk)
    assert first.status == "pending"
    assert (first.attempts[0]["status_code"], first.attempts[0]["error"]) == (500, "HTTP 500")
    assert len(first.attempts[0]["response"]) == 500  # the first 500 characters of the answer
    attempted_at = datetime.fromisoformat(first.attempts[0]["at"])
    assert timedelta(seconds=5) <= first.next_attempt_at - attempted_at <= timedelta(seconds=11)  # 10 s, jittered
    assert wake_waits(tenant, delivery)  # the coordinator wakes it when it is due
    assert deliver(tenant, delivery) is None  # not due yet: nothing is sent
    assert len(receiver.requests) == 1

    make_due(tenant, delivery)
    deliver(tenant, delivery)
    second = stored(tenant, WebhookDelivery, delivery.pk)
    attempted_at = datetime.fromisoformat(second.attempts[1]["at"])
    assert timedelta(seconds=10) <= second.next_attempt_at - attempted_at <= timedelta(seconds=21)  # doubled
    make_due(tenant, delivery)
    deliver(tenant, delivery)

    last = stored(tenant, WebhookDelivery, delivery.pk)
    assert (last.status, last.next_attempt_at, len(last.attempts)) == ("failed", None, 3)
    assert len(receiver.wait_for(3)) == 3
    assert {r.headers["ductor-webhook-id"] for r in receiver.requests} == {str(delivery.pk)}
    assert stored(tenant, WebhookEndpoint, delivery.endpoint_id).consecutive_failures == 3
    assert stored(tenant, WebhookEndpoint, delivery.endpoint_id).enabled


def test_an_endpoint_that_keeps_failing_is_disabled_with_a_reason_and_its_pending_deliveries_stop(
    tenant, client_a, receiver, settings
):
    settings.DUCTOR_WEBHOOK_DISABLE_AFTER = 2
    receiver.status = 500
    first = one_delivery(tenant, client_a, receiver)
    second, third = start(tenant, "quiet"), start(tenant, "quiet")
    [second_delivery] = deliveries(tenant, run=second)

    deliver(tenant, first)
    deliver(tenant, second_delivery)

    endpoint = stored(tenant, WebhookEndpoint, first.endpoint_id)
    assert (endpoint.enabled, endpoint.consecutive_failures) == (False, 2)
    assert endpoint.disabled_reason == "2 consecutive failed attempts; last: HTTP 500"
    assert endpoint.disabled_at is not None
    [stopped] = deliveries(tenant, run=third)
    assert (stopped.status, stopped.next_attempt_at) == ("failed", None)
    assert stopped.attempts[-1]["note"].startswith("not sent: the endpoint was disabled (2 consecutive")
    tripped = stored(tenant, WebhookDelivery, second_delivery.pk)  # the one whose attempt disabled it says so
    assert tripped.status == "failed"
    assert [entry.get("status_code") for entry in tripped.attempts] == [500, None]
    assert tripped.attempts[-1]["note"] == ("not sent again: this attempt disabled the endpoint (2 consecutive "
                                            "failed attempts; last: HTTP 500)")
    assert {d.status for d in deliveries(tenant)} == {"failed"}
    assert deliveries(tenant, run=start(tenant, "quiet")) == []  # a disabled endpoint gets nothing new
    make_due(tenant, stopped)
    deliver(tenant, stopped)
    assert len(receiver.requests) == 2
    read = client_a.get(f"/api/v1/webhooks/{endpoint.pk}").json()
    assert (read["enabled"], read["disabled_reason"]) == (False, endpoint.disabled_reason)

    again = client_a.patch(f"/api/v1/webhooks/{endpoint.pk}", {"enabled": True}, format="json").json()
    assert (again["enabled"], again["consecutive_failures"], again["disabled_reason"]) == (True, 0, "")
    assert len(deliveries(tenant, run=start(tenant, "quiet"))) == 1


def test_nothing_is_sent_to_an_endpoint_disabled_after_its_delivery_was_made(tenant, client_a, receiver):
    delivery = one_delivery(tenant, client_a, receiver)
    with tenant_context(tenant):  # as another process would, whose copy of the endpoints is older
        WebhookEndpoint.objects.filter(pk=delivery.endpoint_id).update(enabled=False, disabled_reason="by hand")

    assert deliver(tenant, delivery) is None

    row = stored(tenant, WebhookDelivery, delivery.pk)
    assert (row.status, [entry.get("note") for entry in row.attempts]) == (
        "failed", ["not sent: the endpoint was disabled (by hand)"])
    assert receiver.requests == []


def test_a_success_zeroes_the_consecutive_failures(tenant, client_a, receiver):
    receiver.status = 502
    first = one_delivery(tenant, client_a, receiver)
    deliver(tenant, first)
    assert stored(tenant, WebhookEndpoint, first.endpoint_id).consecutive_failures == 1
    receiver.status = 204
    make_due(tenant, first)
    deliver(tenant, first)
    assert stored(tenant, WebhookEndpoint, first.endpoint_id).consecutive_failures == 0
    assert stored(tenant, WebhookDelivery, first.pk).status == "delivered"


def test_a_retry_after_of_a_503_is_waited_for(tenant, client_a, receiver):
    receiver.status, receiver.headers = 503, {"Retry-After": "120"}
    delivery = one_delivery(tenant, client_a, receiver)

    deliver(tenant, delivery)

    row = stored(tenant, WebhookDelivery, delivery.pk)
    attempted_at = datetime.fromisoformat(row.attempts[0]["at"])
    assert timedelta(seconds=120) <= row.next_attempt_at - attempted_at <= timedelta(seconds=121)


def test_a_2xx_whose_body_does_not_decode_as_its_content_encoding_says_delivers_and_is_logged(
    tenant, client_a, receiver
):
    receiver.headers = {"Content-Encoding": "gzip"}  # over a body that is not gzip
    delivery = one_delivery(tenant, client_a, receiver)

    assert deliver(tenant, delivery) is None  # the handler records the attempt; it does not raise

    row = stored(tenant, WebhookDelivery, delivery.pk)
    assert (row.status, len(row.attempts)) == ("delivered", 1)
    assert (row.attempts[0]["status_code"], row.attempts[0]["error"]) == (200, None)


@pytest.mark.parametrize(("timeout_s", "late"), [
    (0.3, {"delay_s": 2.0}),  # no answer in time
    (0.5, {"head_pause_s": 0.3}),  # its head in two pieces: no read waits 0.5 s, the whole head takes more
], ids=["no-answer", "head-in-pieces"])
def test_an_answer_not_all_there_within_the_timeout_is_a_timed_out_attempt(
    tenant, client_a, receiver, settings, timeout_s, late
):
    settings.DUCTOR_WEBHOOK_TIMEOUT_S = timeout_s
    for name, value in late.items():
        setattr(receiver, name, value)
    delivery = one_delivery(tenant, client_a, receiver)

    deliver(tenant, delivery)

    row = stored(tenant, WebhookDelivery, delivery.pk)
    assert row.status == "pending"
    assert (row.attempts[0]["status_code"], row.attempts[0]["error"]) == (None, f"timed out after {timeout_s:g} s")


def test_an_answer_whose_head_never_ends_is_hung_up_on_at_the_timeout_not_waited_for(
    tenant, client_a, receiver, settings
):
    """One header line every 0.1 s, each well within the timeout of a read: the attempt ends at its
    timeout all the same, its connection closed, rather than hold its delivery for as long as the
    endpoint likes (past its claim, when the delivery would be attempted again at the same time)."""
    settings.DUCTOR_WEBHOOK_TIMEOUT_S = 0.5
    receiver.head_pause_s, receiver.trickle = 0.1, threading.Event()
    delivery = one_delivery(tenant, client_a, receiver)
    bound = threading.Timer(30, receiver.trickle.set)  # else a sender that waits for the head waits forever
    bound.start()
    try:
        deliver(tenant, delivery)
        ended_unanswered = receiver.answered == 0
    finally:
        bound.cancel()

    assert ended_unanswered, "the attempt waited for the whole head"
    row = stored(tenant, WebhookDelivery, delivery.pk)
    assert (row.status, row.attempts[0]["status_code"], row.attempts[0]["error"]) == (
        "pending", None, "timed out after 0.5 s")


def test_a_private_address_is_refused_at_the_attempt_when_the_policy_forbids_it(tenant, client_a, receiver, settings):
    delivery = one_delivery(tenant, client_a, receiver)  # accepted while DUCTOR_HTTP_ALLOW_PRIVATE was on
    settings.DUCTOR_HTTP_ALLOW_PRIVATE = False

    deliver(tenant, delivery)
    row = stored(tenant, WebhookDelivery, delivery.pk)
    assert row.attempts[0]["error"] == "the URL must be https"

    with tenant_context(tenant):  # an https URL on the same address: refused before any socket is opened
        WebhookEndpoint.objects.filter(pk=delivery.endpoint_id).update(url=receiver.url.replace("http:", "https:"))
    make_due(tenant, delivery)
    deliver(tenant, delivery)

    row = stored(tenant, WebhookDelivery, delivery.pk)
    assert row.attempts[1]["error"] == "host '127.0.0.1' resolves to a loopback address; only public addresses " \
                                       "may be called"
    assert (row.status, row.attempts[1]["status_code"]) == ("pending", None)
    assert receiver.requests == []


def test_backoff_doubles_with_jitter_up_to_an_hour_and_waits_at_least_a_retry_after(settings):
    settings.DUCTOR_WEBHOOK_BACKOFF_S = 10.0
    for tried in range(1, 15):
        nominal = min(10.0 * 2 ** (tried - 1), 3600.0)
        assert nominal / 2 <= webhook_delivery.backoff_s(tried) <= nominal
    assert webhook_delivery.backoff_s(1, retry_after_s=90.0) == 90.0
    assert webhook_delivery.backoff_s(1, retry_after_s=86_400.0) == 3600.0


def test_a_redelivery_sends_a_finished_delivery_again_with_new_attempts(tenant, client_a, receiver, settings):
    settings.DUCTOR_WEBHOOK_MAX_ATTEMPTS = 1
    receiver.status = 500
    delivery = one_delivery(tenant, client_a, receiver)
    deliver(tenant, delivery)
    assert stored(tenant, WebhookDelivery, delivery.pk).status == "failed"
    url = f"/api/v1/webhooks/{delivery.endpoint_id}/deliveries/{delivery.pk}"

    receiver.status = 200
    again = client_a.post(f"{url}/redeliver")

    assert (again.status_code, again.json()["status"]) == (200, "pending")
    assert again.json()["attempts"][-1]["note"] == "redelivery requested"
    assert queued(tenant, webhooks.item_id(delivery.pk))
    deliver(tenant, delivery)
    read = client_a.get(url).json()
    assert (read["status"], [a.get("status_code") for a in read["attempts"]]) == ("delivered", [500, None, 200])
    assert read["body"] == delivery.body
    client_a.patch(f"/api/v1/webhooks/{delivery.endpoint_id}", {"enabled": False}, format="json")
    refused = client_a.post(f"{url}/redeliver")
    assert (refused.status_code, error_code(refused)) == (409, "conflict")


def test_the_delivery_log_lists_newest_first_in_pages(tenant, client_a, receiver):
    first = one_delivery(tenant, client_a, receiver)
    later = [start(tenant, "quiet") for _ in range(2)]
    url = f"/api/v1/webhooks/{first.endpoint_id}/deliveries"

    page = client_a.get(f"{url}?page_size=2").json()

    ids = [deliveries(tenant, run=run)[0].pk for run in reversed(later)]
    assert [row["id"] for row in page["results"]] == [str(pk) for pk in ids]
    assert "body" not in page["results"][0]
    rest = client_a.get(page["next"]).json()
    assert [row["id"] for row in rest["results"]] == [str(first.pk)]
    assert rest["results"][0]["run"] == str(first.run_id)
    bad = client_a.get(f"{url}?page_size=0")
    assert (bad.status_code, list(bad.json()["error"]["details"])) == (400, ["page_size"])
    assert client_a.get(f"{url}/not-a-uuid").status_code == 404


# --- the reconciler --------------------------------------------------------------------------------------


def test_the_reconciler_enqueues_again_a_pending_delivery_whose_attempt_is_overdue(tenant, client_a, redis_client):
    put(tenant, "quiet")
    subscribe(client_a)
    stale, fresh = start(tenant, "quiet"), start(tenant, "quiet")
    [lost] = deliveries(tenant, run=stale)
    [recent] = deliveries(tenant, run=fresh)
    later = timezone.now() + timedelta(minutes=5)
    with tenant_context(tenant):
        WebhookDelivery.objects.filter(pk=lost.pk).update(next_attempt_at=timezone.now() - timedelta(minutes=1))
        WebhookDelivery.objects.filter(pk=recent.pk).update(next_attempt_at=later)
    redis_client.flushdb()  # Redis lost every item

    assert webhook_delivery.reconcile_deliveries() == 1
    assert queued(tenant, webhooks.item_id(lost.pk))
    assert not queued(tenant, webhooks.item_id(recent.pk))
    assert webhook_delivery.reconcile_deliveries() == 1  # again: coalesced with the waiting item
    assert fair_queue.stats(tenant).backlog == 1

    assert webhook_delivery.reconcile_deliveries(full=True) == 2  # after a flush: every pending one
    assert wake_waits(tenant, recent)  # not due yet: its wake-up is back
    assert fair_queue.stats(tenant).backlog == 1


def test_at_most_the_webhook_concurrency_of_a_tenant_s_deliveries_are_in_flight_at_once(tenant, settings):
    """A tenant's slow endpoints hold DUCTOR_WEBHOOK_CONCURRENCY worker slots at most: the dequeue
    admits no more of its deliveries until one is acked."""
    from ductor_project.core.context import no_tenant
    from ductor_project.core.keys import shard_of

    settings.DUCTOR_WEBHOOK_CONCURRENCY = 2
    with tenant_context(tenant), transaction.atomic():
        webhooks.enqueue_deliveries([webhooks.Queued(f"d{n}", "standard") for n in range(5)])
    shard = shard_of(str(tenant.pk))
    with no_tenant():
        first = fair_queue.dequeue_many(shard=shard, lease_ms=30_000, limit=10)
        assert [item.item_id for item in first] == ["webhook:d0", "webhook:d1"]
        assert fair_queue.dequeue_many(shard=shard, lease_ms=30_000, limit=10) == []
    with tenant_context(tenant):
        fair_queue.ack(first[0].item_id, delivery=first[0].delivery)
    with no_tenant():
        assert [item.item_id for item in fair_queue.dequeue_many(shard=shard, lease_ms=30_000, limit=10)] == [
            "webhook:d2"]


@pytest.mark.parametrize("step", ["delete", "purge"])
@pytest.mark.django_db(transaction=True)
def test_deleting_or_purging_an_endpoint_while_an_attempt_is_recorded_waits_for_it_and_never_deadlocks(
    tenant: Tenant, client_a: APIClient, receiver: Receiver, step: str
) -> None:
    """An attempt's record locks the endpoint, then its delivery; a delete whose cascade took the
    deliveries, then the endpoint, waited for it as it waited for the delete, and PostgreSQL failed
    one (a 500). The delete and the purge of the deleted endpoint's log take the endpoint first."""
    import threading

    delivery = one_delivery(tenant, client_a, receiver)
    endpoint = stored(tenant, WebhookEndpoint, delivery.endpoint_id)
    if step == "purge":
        with tenant_context(tenant):
            webhooks.webhook_delete(endpoint)
    locked, go, failures = threading.Event(), threading.Event(), []

    def record() -> None:  # an attempt's record, held between its two locks
        try:
            with tenant_context(tenant), transaction.atomic():
                webhook_delivery._count(endpoint.pk, ok=False)
                locked.set()
                go.wait(30)
                WebhookDelivery.objects.select_for_update().filter(pk=delivery.pk).first()
        except Exception as exc:
            failures.append(exc)
        finally:
            connection.close()

    def delete_or_purge() -> None:
        try:
            if step == "delete":
                with tenant_context(tenant):
                    webhooks.webhook_delete(endpoint)
            else:
                purge()
        except Exception as exc:
            failures.append(exc)
        finally:
            connection.close()

    recorder, other = threading.Thread(target=record), threading.Thread(target=delete_or_purge)
    recorder.start()
    assert locked.wait(30)
    other.start()
    until_another_waits_on_a_lock(timeout=30)  # the delete or the purge, for the endpoint's row
    go.set()
    recorder.join(30)
    other.join(30)

    assert failures == []
    purge()
    assert not deliveries(tenant)
    assert not WebhookEndpoint.all_tenants.filter(pk=endpoint.pk).exists()


def test_a_run_ending_while_its_endpoint_is_deleted_ends_without_a_delivery_to_it(tenant, monkeypatch):
    """An outcome's deliveries go to the endpoints of the process's copy that still exist, locked until the
    outcome commits: a deletion of one in progress is waited for, and the endpoint left out. Before, the
    delivery's reference to the deleted endpoint failed at the outcome's commit, and the outcome with it:
    here a start whose own first tick ends its run, which answered 500."""
    import threading

    put(tenant, "quiet")
    with tenant_context(tenant):
        made = webhooks.webhook_create(url=PUBLIC, events=["run.succeeded"])
        assert [endpoint.pk for endpoint in webhooks.enabled_endpoints()] == [made.endpoint.pk]
    reached, forget = threading.Event(), webhooks.forget_endpoints

    def forget_once_another_waits() -> None:
        reached.set()
        until_another_waits_on_a_lock()  # the run's start, waiting for the endpoint this deletion holds
        forget()

    monkeypatch.setattr(webhooks, "forget_endpoints", forget_once_another_waits)
    results: dict[str, Any] = {}

    def delete() -> str:
        with tenant_context(tenant):
            webhooks.webhook_delete(made.endpoint)
        return "deleted"

    deleting = in_a_thread(results, "delete", delete)
    assert reached.wait(15)
    try:
        with tenant_context(tenant):
            run, _ = services.run_start(workflow="quiet")
    finally:
        deleting.join(30)

    assert results["delete"] == "deleted"
    with tenant_context(tenant):
        assert WorkflowRun.objects.get(pk=run.pk).status == WorkflowRun.Status.SUCCEEDED
        assert not WebhookDelivery.objects.exists()


def test_idor_another_tenant_s_backlog_of_overdue_deliveries_never_starves_the_repair_of_a_lost_one(
    tenant, client_a, tenant_b, monkeypatch
):
    """Tenant A's deliveries waiting their turn (a slow endpoint's backlog, a suspension) stay pending
    and overdue, each already queued: a pass that took the most overdue first, every tenant's alike,
    took A's again and again, and tenant B's delivery whose item was lost (a worker died in its
    attempt, a wake-up was lost) was never enqueued again while A's backlog lasted."""
    monkeypatch.setattr(webhook_delivery, "RECONCILE_BATCH", 2)
    b = tenant_b[0]
    put(tenant, "quiet")
    put(b, "quiet")
    subscribe(client_a)
    subscribe(api_client(tenant_b[1]))
    backlog = [delivery for _ in range(3) for delivery in deliveries(tenant, run=start(tenant, "quiet"))]
    [lost] = deliveries(b, run=start(b, "quiet"))
    with tenant_context(tenant):
        WebhookDelivery.objects.filter(pk__in=[d.pk for d in backlog]).update(
            next_attempt_at=timezone.now() - timedelta(hours=1))
        assert all(queued(tenant, webhooks.item_id(d.pk)) for d in backlog)  # waiting their turn
    with tenant_context(b):
        WebhookDelivery.objects.filter(pk=lost.pk).update(next_attempt_at=timezone.now() - timedelta(minutes=1))
        fair_queue.remove(webhooks.item_id(lost.pk))
    assert not queued(b, webhooks.item_id(lost.pk))

    webhook_delivery.reconcile_deliveries()

    assert queued(b, webhooks.item_id(lost.pk))
    assert all(queued(tenant, webhooks.item_id(d.pk)) for d in backlog)
