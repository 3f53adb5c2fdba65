"""Webhooks end to end: real Celery worker, dispatcher and coordinator processes, and a real receiver.

One worker (concurrency 2), one ``manage.py run_dispatcher`` and one ``manage.py run_coordinator``
serve the whole module, with small ``DUCTOR_WEBHOOK_*`` settings so that retries take a fraction of
a second; every test is transactional, so those processes see its rows. The receivers listen on
127.0.0.1 in this process (the processes run with ``DUCTOR_HTTP_ALLOW_PRIVATE`` on). Every wait is
on a condition: what the receiver got, or a row's state.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from ductor_sdk.webhooks import verify
from rest_framework.test import APIClient

from ductor_project.core.context import tenant_context
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.conftest import api_client
from tests.processes import Processes, running_processes
from tests.waiting import queue_is_empty, wait_for
from tests.workflows.webhook_receiver import Receiver, running_receiver
from workflows import services as workflow_services
from workflows.models import WebhookDelivery, WebhookEndpoint, WorkflowRun

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# Through a worker: the run succeeds once its echo step has run.
ECHO = {"nodes": [{"id": "say", "type": "action", "action": "echo", "input": {"hello": "$input.who"}}],
        "output": {"said": "$nodes.say.output"}}
STACK_ENV = {
    "DUCTOR_LEASE_MS": "3000",
    "DUCTOR_HTTP_ALLOW_PRIVATE": "true",
    "DUCTOR_WEBHOOK_BACKOFF_S": "0.2",
    "DUCTOR_WEBHOOK_MAX_ATTEMPTS": "10",
    "DUCTOR_WEBHOOK_DISABLE_AFTER": "3",
    "DUCTOR_WEBHOOK_TIMEOUT_S": "30",
}


@pytest.fixture(scope="module")
def stack(django_db_setup: None) -> Iterator[Processes]:
    with running_processes(env=STACK_ENV) as running:
        yield running


@pytest.fixture(autouse=True)
def quiet_after(stack: Processes, transactional_db: None, settings: Any) -> Iterator[None]:
    """After each test, before its tables are flushed: nothing is pending any more, and nothing is
    queued or running. A delivery or a retry that wrote while the flush truncates the tables would
    deadlock with it (the processes serve the whole module and outlive the test)."""
    settings.DUCTOR_HTTP_ALLOW_PRIVATE = True  # this process checks the receivers' URLs at create
    yield
    WebhookEndpoint.all_tenants.update(enabled=False)
    WebhookDelivery.all_tenants.filter(status=WebhookDelivery.Status.PENDING).update(
        status=WebhookDelivery.Status.FAILED)
    wait_for(queue_is_empty, timeout=60, what="the last deliveries, retries and runs to finish")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as running:
        yield running


def tenant_with_flow(make_tenant: Any, slug: str) -> tuple[Tenant, APIClient]:
    tenant, key = make_tenant(slug)
    with tenant_context(tenant):
        workflow_services.workflow_put(name="greet", spec=ECHO)
    return tenant, api_client(key)


def subscribe(client: APIClient, url: str, events: list[str]) -> dict[str, Any]:
    response = client.post("/api/v1/webhooks", {"url": url, "events": events}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def start(tenant: Tenant, who: str) -> WorkflowRun:
    with tenant_context(tenant):
        run, _ = workflow_services.run_start(workflow="greet", input={"who": who})
        return run


def stored(tenant: Tenant, model: Any, pk: Any) -> Any:
    with tenant_context(tenant):
        return model.objects.filter(pk=pk).first()


def test_a_finished_run_is_posted_to_the_receiver_signed_so_that_the_sdk_verifies_it(stack, make_tenant, receiver):
    tenant, client = tenant_with_flow(make_tenant, "hooked")
    endpoint = subscribe(client, receiver.url, ["run.succeeded"])

    run = start(tenant, "ada")
    [sent] = receiver.wait_for(1)

    verify(sent.body, sent.headers["ductor-signature"], endpoint["secret"])
    body = json.loads(sent.body)
    assert (body["type"], body["data"]["run"]["id"]) == ("run.succeeded", str(run.pk))
    assert body["data"]["run"]["output"] == {"said": {"hello": "ada"}}
    assert sent.headers["ductor-webhook-id"] == body["id"]
    delivered = wait_for(lambda: (d := stored(tenant, WebhookDelivery, body["id"])).status == "delivered" and d,
                         what="the delivery to be recorded as delivered")
    assert [attempt["status_code"] for attempt in delivered.attempts] == [200]


def test_a_receiver_answering_500_gets_retries_then_the_endpoint_is_disabled(stack, make_tenant, receiver):
    receiver.status = 500
    tenant, client = tenant_with_flow(make_tenant, "failing-hook")
    endpoint = subscribe(client, receiver.url, ["run.succeeded"])

    start(tenant, "bob")
    sent = receiver.wait_for(3)
    disabled = wait_for(lambda: not (e := stored(tenant, WebhookEndpoint, endpoint["id"])).enabled and e,
                        what="the endpoint to be disabled")

    assert {request.headers["ductor-webhook-id"] for request in sent} == {sent[0].headers["ductor-webhook-id"]}
    for request in sent:
        verify(request.body, request.headers["ductor-signature"], endpoint["secret"])
    assert disabled.disabled_reason == "3 consecutive failed attempts; last: HTTP 500"
    delivery = wait_for(lambda: (d := stored(tenant, WebhookDelivery, sent[0].headers["ductor-webhook-id"]))
                        .status == "failed" and d, what="the delivery to fail")
    *attempts, note = delivery.attempts
    assert [attempt["status_code"] for attempt in attempts] == [500, 500, 500]
    assert note["note"].startswith("not sent again: this attempt disabled the endpoint (3 consecutive")
    wait_for(queue_is_empty, what="the queue to empty")
    assert len(receiver.requests) == 3  # no attempt after the endpoint was disabled


def test_a_tenant_s_slow_endpoint_does_not_delay_another_tenant_s_deliveries(stack, make_tenant):
    slow_tenant, slow_client = tenant_with_flow(make_tenant, "slow-hook")
    tenant_services.override_set(tenant=slow_tenant, field="max_concurrency", value=1, reason="its fair share")
    quick_tenant, quick_client = tenant_with_flow(make_tenant, "quick-hook")
    with running_receiver() as slow, running_receiver() as quick:
        slow.gate = threading.Event()  # holds each request until the test opens it
        subscribe(slow_client, slow.url, ["run.succeeded"])
        subscribe(quick_client, quick.url, ["run.succeeded"])
        for n in range(3):
            start(slow_tenant, f"slow-{n}")
        slow.wait_for(1)  # the slow tenant's first delivery is stuck at its endpoint

        start(quick_tenant, "quick")
        quick.wait_for(1)

        assert (len(slow.requests), slow.answered) == (1, 0)  # still stuck while the other tenant was served
        slow.gate.set()
        slow.wait_for(3)
