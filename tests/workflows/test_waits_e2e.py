"""Waits end to end: a real Celery worker, dispatcher and coordinator, through the public API.

A run waiting for an event holds no worker, so it survives its worker's SIGKILL and resumes when
the event comes; a signal resumes its run; a timeout (a coordinator wake-up) gives the node's
default or fails it, even after Redis lost everything (the reconciler puts the wake-up back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ductor_project.core.context import tenant_context
from ductor_project.core.redis import get_redis
from tenants.models import Tenant
from tests.conftest import api_client
from tests.processes import Processes, running_processes
from tests.waiting import queue_is_empty, wait_for
from workflows import services as workflow_services
from workflows.models import WorkflowRun

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# Waits for the order's payment, then says so.
PAID = {"nodes": [{"id": "paid", "type": "wait_for_event", "event": "order.paid", "key": "$input.order_id"},
                  {"id": "ship", "type": "action", "action": "echo", "depends_on": ["paid"],
                   "input": {"amount": "$nodes.paid.output.amount"}}],
        "output": {"shipped": "$nodes.ship.output.amount"}}


@pytest.fixture(scope="module")
def stack(django_db_setup: None) -> Iterator[Processes]:
    with running_processes() as running:
        yield running


@pytest.fixture(autouse=True)
def quiet_after(stack: Processes, transactional_db: None) -> Iterator[None]:
    """After each test, before its tables are flushed: what it left waiting is cancelled, and nothing
    is queued or running (a write during the flush's TRUNCATE would deadlock with it)."""
    yield
    for run in WorkflowRun.all_tenants.select_related("tenant").exclude(status__in=WorkflowRun.TERMINAL):
        with tenant_context(run.tenant):
            workflow_services.run_cancel(run=WorkflowRun.objects.get(pk=run.pk))
    wait_for(queue_is_empty, timeout=30, what="the queue to empty")


@pytest.fixture
def tenant(make_tenant: Any) -> tuple[Tenant, Any]:
    made, key = make_tenant("waiter")
    return made, api_client(key)


def put(client: Any, spec: dict[str, Any], name: str = "order") -> None:
    response = client.post("/api/v1/workflows", {"name": name, "spec": spec}, format="json")
    assert response.status_code == 201, response.content


def start(client: Any, order_id: str, name: str = "order") -> str:
    response = client.post("/api/v1/runs", {"workflow": name, "input": {"order_id": order_id}}, format="json")
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


def run_of(client: Any, run_id: str) -> dict[str, Any]:
    return dict(client.get(f"/api/v1/runs/{run_id}").json())


def ended(client: Any, run_id: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        run = run_of(client, run_id)
        return run if run["status"] in ("succeeded", "failed", "cancelled") else None
    return check


def step_status(client: Any, run_id: str, node_id: str) -> str | None:
    steps = client.get(f"/api/v1/runs/{run_id}/steps").json()["results"]
    return next((step["status"] for step in reversed(steps) if step["node_id"] == node_id), None)


def test_a_waiting_run_survives_its_worker_s_kill_and_resumes_on_its_event_only(stack, tenant):
    _, client = tenant
    put(client, PAID)
    mine, other = start(client, "o-1"), start(client, "o-2")
    wait_for(lambda: step_status(client, mine, "paid") == "waiting", timeout=20, what="the wait")

    stack.worker.kill()
    stack.stack.stop(stack.worker)
    stack.worker = stack.start_worker()

    sent = client.post("/api/v1/events", {"name": "order.paid", "key": "o-1", "payload": {"amount": 12}},
                       format="json")
    assert sent.status_code == 201, sent.content
    run = wait_for(ended(client, mine), timeout=60, what="the resumed run to end")
    assert (run["status"], run["output"]) == ("succeeded", {"shipped": 12})
    assert run_of(client, other)["status"] == "running"
    assert step_status(client, other, "paid") == "waiting"


def test_a_signal_resumes_its_run(stack, tenant):
    _, client = tenant
    put(client, {"nodes": [{"id": "approval", "type": "wait_for_event", "event": "approved"}],
                 "output": "$nodes.approval.output"})
    run_id = start(client, "o-1")
    wait_for(lambda: step_status(client, run_id, "approval") == "waiting", timeout=20, what="the wait")

    sent = client.post(f"/api/v1/runs/{run_id}/signal", {"name": "approved", "payload": {"by": "ann"}},
                       format="json")

    assert sent.status_code == 201, sent.content
    run = wait_for(ended(client, run_id), timeout=30, what="the signalled run to end")
    assert (run["status"], run["output"]) == ("succeeded", {"by": "ann"})


def test_timeouts_give_the_default_or_fail_the_node_even_after_redis_lost_everything(stack, tenant):
    _, client = tenant
    put(client, {"nodes": [{"id": "paid", "type": "wait_for_event", "event": "order.paid", "key": "$input.order_id",
                            "timeout_s": 2, "default": {"paid": False}}],
                 "output": "$nodes.paid.output"}, name="lenient")
    put(client, {"nodes": [{"id": "paid", "type": "wait_for_event", "event": "order.paid", "timeout_s": 2}]},
        name="strict")
    lenient, strict = start(client, "o-1", "lenient"), start(client, "o-1", "strict")
    wait_for(lambda: step_status(client, lenient, "paid") == "waiting", timeout=20, what="the wait")
    wait_for(lambda: step_status(client, strict, "paid") == "waiting", timeout=20, what="the wait")

    get_redis().flushdb()  # the timeouts' wake-ups go with it: the reconciler puts them back

    done = wait_for(ended(client, lenient), timeout=60, what="the lenient run to time out")
    failed = wait_for(ended(client, strict), timeout=60, what="the strict run to time out")
    assert (done["status"], done["output"]) == ("succeeded", {"paid": False})
    assert (failed["status"], failed["error"]["error"]["code"]) == ("failed", "wait_timed_out")
