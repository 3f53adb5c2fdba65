"""The example shop (``examples/shop``) against a real Ductor, as the demo runs it (``ductor_project.demo.shop``).

The shop is a Django project of its own: its own database (``<test database>_shop`` on this run's
server, created by the tables' owner, migrated by the shop's own ``manage.py``, dropped afterwards),
its own Celery app and worker process, no Ductor import. Ductor's worker, dispatcher and
coordinator serve the module, as in ``tests/workflows/test_engine_e2e.py``; the shop's queue has
the demo's shared slots. The catalog entries, routing and workflow are the demo's own, created
through the API.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from celery import Celery
from django.conf import settings
from django.db import connection
from psycopg import sql

from ductor_project.demo import shop
from ductor_project.stack import Child, Stack
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.conftest import api_client, service_env, service_stack
from tests.workflows.test_engine_e2e import by_node, drained, finished, put, start, steps

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

LEASE_MS = 3000
MUG_CENTS = 1200  # examples/shop/shop/migrations/0002_products.py


def _url(url: str, database: str) -> str:
    return urlsplit(url)._replace(path=f"/{database}").geturl()


@pytest.fixture(scope="module")
def running(django_db_setup: None) -> Iterator[str]:
    """Ductor's processes and the shop's worker, up; the shop's database, migrated. Yields its URL."""
    from ductor_project.core.redis import get_redis

    get_redis().flushdb()
    owner = settings.DATABASE_OWNER_URL or settings.DATABASE_URL
    name = connection.settings_dict["NAME"] + "_shop"
    with psycopg.connect(_url(owner, "postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = _url(owner, name)
    env = {**shop.child_env(database_url=url, broker_url=settings.CELERY_BROKER_URL, secret_key="shop-test-key"),
           "SHOP_RESULT_BACKEND": settings.CELERY_RESULT_BACKEND}
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("DUCTOR_LEASE_MS", str(LEASE_MS))
            mp.setenv("DUCTOR_TASK_QUEUE_SLOTS", shop.SLOTS)
            stack = service_stack()
            try:
                migrate = shop.start_migrate(stack, env)
                children = _start(stack, env)
                shop.finish_migrate(stack, migrate)
                stack.wait_ready(*children, timeout_s=90)
                yield url
            finally:
                stack.stop_all(grace_s=20)
    finally:
        with psycopg.connect(_url(owner, "postgres"), autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _start(stack: Stack, shop_env: dict[str, str]) -> list[Child]:
    """Ductor's worker, dispatcher and coordinator, and the shop's worker, all starting at once."""
    name = f"worker-{os.getpid()}"
    return [
        stack.worker(name, concurrency=2, hostname=f"{name}@localhost", env=service_env(),
                     extra=["--pool", "prefork", "--without-heartbeat"]),
        stack.dispatcher(env=service_env()),
        stack.coordinator(env=service_env()),
        shop.start_worker(stack, shop_env),
    ]


@pytest.fixture(autouse=True)
def shop_slots(settings: Any) -> None:
    """This process enqueues too (a run's first tick runs where it starts): the same slots."""
    settings.DUCTOR_TASK_QUEUE_SLOTS = dict([shop.SLOTS.split("=")])


@pytest.fixture
def catalog(transactional_db: None) -> None:
    """The shop's tasks in the catalog, created through the platform API."""
    _, raw = tenant_services.platform_key_create(name="shop-test")
    platform = api_client(raw)
    for entry in shop.CATALOG:
        response = platform.post("/api/v1/task-catalog", entry, format="json")
        assert response.status_code == 201, response.content


@pytest.fixture
def shopper(catalog: None, make_tenant: Callable[..., tuple[Tenant, str]]) -> Callable[..., Tenant]:
    """A tenant with the demo's routing of the shop's tasks and its workflow ``order``, through its API."""
    def make(plan: str = "enterprise") -> Tenant:
        tenant, key = make_tenant(plan=plan)
        client = api_client(key)
        for _, path, body in [*shop.ROUTING, ("workflow", "/api/v1/workflows",
                                                {"name": shop.WORKFLOW, "spec": shop.ORDER})]:
            response = client.post(path, body, format="json")
            assert response.status_code == 201, response.content
        return tenant

    return make


def shop_orders(url: str) -> dict[tuple[str, str], tuple[str, int, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tenant_id, ref, status, charged_cents, tracking FROM shop_order").fetchall()
    return {(t, r): (status, cents, tracking) for t, r, status, cents, tracking in rows}


def payments(url: str, tenant: Tenant, ref: str) -> list[tuple[str, int, int]]:
    with psycopg.connect(url) as conn:
        return [(key, attempt, cents) for key, attempt, cents in conn.execute(
            "SELECT p.idempotency_key, p.attempt, p.amount_cents FROM shop_payment p "
            "JOIN shop_order o ON o.id = p.order_id WHERE o.tenant_id = %s AND o.ref = %s",
            (str(tenant.pk), ref)).fetchall()]


def test_the_shops_tasks_are_in_the_catalog_for_its_plans_only(catalog, make_tenant):
    _, pro_key = make_tenant(plan="pro")
    _, free_key = make_tenant(plan="free")
    listed = api_client(pro_key).get("/api/v1/tasks").json()
    assert sorted(task["name"] for task in listed) == ["shop.charge", "shop.reserve_stock", "shop.ship"]
    assert {task["queue"] for task in listed} == {shop.QUEUE}
    assert api_client(free_key).get("/api/v1/tasks").json() == []


def test_two_tenants_orders_run_on_the_shops_worker_and_its_database_keeps_them_under_each_tenant(
        running, shopper):
    tenants = [shopper(), shopper(plan="pro")]
    runs = [(tenant, f"o-{n}-{i}", start(tenant, shop.WORKFLOW, {"order": f"o-{n}-{i}", "sku": "mug",
                                                                "quantity": i}).pk)
            for n, tenant in enumerate(tenants) for i in (1, 2)]
    done = [(tenant, ref, finished(tenant, run_id)) for tenant, ref, run_id in runs]
    rows = shop_orders(running)
    for tenant, ref, run in done:
        assert run.status == "succeeded", run.error
        quantity = int(ref.rsplit("-", 1)[1])
        assert run.output["order"] == ref
        assert run.output["charged_cents"] == quantity * MUG_CENTS
        assert run.output["tracking"].startswith("SHOP-")
        step = by_node(tenant, run)["charge"]
        assert step.routing["connection"]["name"] == "shop-worker"
        assert step.routing["tier"] == "interactive"
        assert rows[(str(tenant.pk), ref)] == ("shipped", quantity * MUG_CENTS, run.output["tracking"])
        assert payments(running, tenant, ref) == [(f"{run.pk}:charge:1", 1, quantity * MUG_CENTS)]
    assert {tenant_id for tenant_id, _ in rows} >= {str(t.pk) for t in tenants}
    drained(*tenants)


def test_a_retried_charge_attempt_finds_the_charge_and_does_not_charge_twice(running, shopper):
    tenant = shopper()
    run = finished(tenant, start(tenant, shop.WORKFLOW, {"order": "retry-1", "sku": "mug", "quantity": 3}).pk)
    assert run.status == "succeeded", run.error
    charged = by_node(tenant, run)["charge"]
    client = Celery("shop-test-client", broker=settings.CELERY_BROKER_URL, backend=settings.CELERY_RESULT_BACKEND,
                    set_as_current=False)
    # Attempt 2 of the same step, as Ductor sends it after a lost answer (the key changes per attempt).
    headers = {"ductor_tenant_id": str(tenant.pk), "ductor_run_id": str(run.pk), "ductor_step_id": str(charged.id),
               "ductor_node_id": "charge", "ductor_attempt": 2, "ductor_idempotency_key": f"{run.pk}:charge:2",
               "ductor_workflow": shop.WORKFLOW}
    again = client.send_task("shop.charge", kwargs={"order": "retry-1"}, queue=shop.QUEUE, headers=headers,
                             serializer="json").get(timeout=30)
    assert again == charged.output
    assert again["charged_on_attempt"] == 1
    assert payments(running, tenant, "retry-1") == [(f"{run.pk}:charge:1", 1, 3 * MUG_CENTS)]
    drained(tenant)


def test_an_order_the_warehouse_cannot_fill_fails_at_reserve_with_its_out_of_stock_exception(running, shopper):
    tenant = shopper()
    run = finished(tenant, start(tenant, shop.WORKFLOW, shop.OUT_OF_STOCK).pk)
    assert run.status == "failed"
    (reserve,) = steps(tenant, run)  # not retried (OutOfStock says so), nothing charged, nothing shipped
    assert reserve.node_id == "reserve"
    assert reserve.error["code"] == "task_failed"
    assert reserve.error["message"] == (f"OutOfStock: order {shop.OUT_OF_STOCK['order']} asks for 3 x poster, "
                                        "2 in stock")
    assert reserve.error["exception"] == {"type": "OutOfStock", "module": "shop.services"}
    assert reserve.error["retryable"] is False
    assert (str(tenant.pk), shop.OUT_OF_STOCK["order"]) not in shop_orders(running)
    drained(tenant)


def test_a_catalogued_task_the_shops_worker_does_not_have_fails_its_step_at_once(running, shopper):
    # A name in the catalog that the shop's code does not register: Celery discards the message, and
    # the SDK's hook sends the step's errback (without it, the step would wait out its 30 s timeout).
    _, raw = tenant_services.platform_key_create(name="shop-missing")
    entry = {"name": "shop.refund", "queue": shop.QUEUE, "timeout_s": 600, "plans": ["enterprise"]}
    assert api_client(raw).post("/api/v1/task-catalog", entry, format="json").status_code == 201
    tenant = shopper()
    spec = {"nodes": [{"id": "refund", "type": "task", "task": "shop.refund", "input": {"order": "r-1"},
                       "retry": {"max_attempts": 2, "backoff_s": 0.1, "jitter": False}}]}
    put(tenant, "refund", spec)
    run = finished(tenant, start(tenant, "refund", {}).pk)
    assert run.status == "failed"
    attempts = steps(tenant, run)
    assert [(s.attempt, s.error["code"]) for s in attempts] == [(1, "task_failed"), (2, "task_failed")]
    for attempt in attempts:
        assert attempt.error["exception"] == {"type": "NotRegistered", "module": "celery.exceptions"}
        assert "'shop.refund' is not registered on " in attempt.error["message"]
        assert attempt.error.get("retryable", True) is True  # another worker may have it
        assert (attempt.finished_at - attempt.started_at).total_seconds() < 30  # not the timeout (600 s)
    drained(tenant)


def test_the_readmes_builder_form_compiles_to_the_demos_order_spec():
    from ductor_sdk import Input, Retry, Workflow

    wf = Workflow("order", description="Reserve, charge, ship: the shop's tasks")
    reserve = wf.task("reserve", task="shop.reserve_stock",
                      input={"order": Input["order"], "sku": Input["sku"], "quantity": Input["quantity"]},
                      retry=Retry(max_attempts=3, backoff_s=0.5, jitter=False))
    charge = wf.task("charge", task="shop.charge", input={"order": Input["order"]}, depends_on=[reserve],
                     retry=Retry(max_attempts=3, backoff_s=0.5, jitter=False))
    ship = wf.task("ship", task="shop.ship", input={"order": Input["order"]}, depends_on=[charge])
    wf.output(order=Input["order"], charged_cents=charge.output["charged_cents"], tracking=ship.output["tracking"])
    assert wf.to_spec() == shop.ORDER
