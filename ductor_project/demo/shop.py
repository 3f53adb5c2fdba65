"""The example shop in the demo: a team's own Django project whose Celery tasks Ductor's workflows call.

``examples/shop`` is not Ductor: its own settings, models, migrations, database and Celery app
(it imports ``ductor_sdk`` only). The demo runs it as a team would beside a Ductor:

- its database is the scratch ``<database>_demo_shop`` (``ductor_project.demo.scratch``), migrated by
  the shop's own ``manage.py migrate`` as a child of the stack too (``start_migrate``) while the stack starts,
  with ``SHOP_DATABASE_URL`` and without Ductor's ``DJANGO_SETTINGS_MODULE``;
- its Celery worker is one more child of the stack (``start_worker``: queue ``shop``, concurrency
  ``CONCURRENCY``), on Ductor's broker (the scratch Redis), so that Ductor's result callbacks go back
  there; ``ductor_sdk.worker.install`` in its app forwards a failed task's exception to Ductor;
- Ductor's children get ``DUCTOR_TASK_QUEUE_SLOTS=shop=2`` (``SLOTS``): at most two shop tasks in
  flight across every tenant, each freed slot handed to the next task in the weighted fair order,
  so the tenants share the shop's worker fairly where the work starts;
- the platform puts its three tasks in the catalog (``CATALOG``); acme and globex each route them
  (``ROUTING``) to a celery connection of the queue ``shop`` (their default pools hold HTTP
  connections, which would admit the task steps by their own limits instead of the queue's shared
  slots) in the interactive tier, and create the workflow ``order`` (``ORDER``: reserve → charge →
  ship); in the workload each starts ``ORDERS_EACH`` orders in one bulk call
  (``scenario.Workload._shop``), globex one more that the warehouse cannot fill (``OUT_OF_STOCK``:
  its reserve step fails with ``OutOfStock``).

Why the interactive tier: a tenant's weight holds for all of its dispatches in a tier together,
and its own items go oldest first. In the standard tier, behind the top-ups that keep acme and
globex backlogged, the shop's tasks would take whatever turns their tenant's older work left them,
and the tenants' shares of the shop's slots would say nothing of their weights. The interactive
tier is served first and holds nothing else of theirs: there the shop's tasks are each tenant's
whole backlog, and its slots go to them in the weighted fair order.

The summary's shop line comes from the dispatchers' ``task_published`` log lines
(``metrics.task_shares``).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ductor_project.stack import ROOT, Child, Stack

DIR = ROOT / "examples" / "shop"
QUEUE = "shop"
CONCURRENCY = 2
SLOTS = f"{QUEUE}={CONCURRENCY}"  # DUCTOR_TASK_QUEUE_SLOTS: as many slots as the worker has processes
WORKFLOW = "order"
SHOPPERS = ("acme", "globex")
ORDERS_EACH = 16
MIGRATE_TIMEOUT_S = 90.0
POLL_S = 0.1
TASK_TIMEOUT_S = 30.0

_ORDER_REF = {"type": "object", "required": ["order"], "additionalProperties": False,
              "properties": {"order": {"type": "string", "minLength": 1}}}
CATALOG = [
    {"name": "shop.reserve_stock", "queue": QUEUE, "timeout_s": TASK_TIMEOUT_S, "plans": ["pro", "enterprise"],
     "description": "Reserve an order's stock in the shop's warehouse (fails with OutOfStock)",
     "input_schema": {"type": "object", "required": ["order", "sku", "quantity"], "additionalProperties": False,
                      "properties": {"order": {"type": "string", "minLength": 1}, "sku": {"type": "string"},
                                     "quantity": {"type": "integer", "minimum": 1}}}},
    {"name": "shop.charge", "queue": QUEUE, "timeout_s": TASK_TIMEOUT_S, "plans": ["pro", "enterprise"],
     "description": "Charge a reserved order, once", "input_schema": _ORDER_REF},
    {"name": "shop.ship", "queue": QUEUE, "timeout_s": TASK_TIMEOUT_S, "plans": ["pro", "enterprise"],
     "description": "Ship a charged order; its tracking number", "input_schema": _ORDER_REF},
]


# What each of the SHOPPERS creates before the workflow: (what, path, body).
ROUTING: list[tuple[str, str, dict[str, Any]]] = [
    ("connection shop-worker (celery, queue shop)", "/api/v1/connections",
     {"name": "shop-worker", "kind": "celery", "config": {"queue": QUEUE}}),
    ("pool shop-tasks", "/api/v1/pools", {"name": "shop-tasks", "members": [{"connection": "shop-worker"}]}),
    ("rule: shop.* tasks → pool shop-tasks, interactive tier", "/api/v1/rules",
     {"name": "shop tasks", "priority": 1, "match": {"action": "shop.*"},
      "action": {"pool": "shop-tasks", "tier": "interactive"}}),
]


def _task(node_id: str, task: str, node_input: dict[str, Any], *depends_on: str) -> dict[str, Any]:
    return {"id": node_id, "type": "task", "task": task, "input": node_input, "depends_on": list(depends_on)}


ORDER = {  # the shop's tasks as steps, each order's number from the run's input
    "nodes": [
        {**_task("reserve", "shop.reserve_stock",
                 {"order": "$input.order", "sku": "$input.sku", "quantity": "$input.quantity"}),
         "retry": {"max_attempts": 3, "backoff_s": 0.5, "jitter": False}},  # OutOfStock is not retried
        {**_task("charge", "shop.charge", {"order": "$input.order"}, "reserve"),
         "retry": {"max_attempts": 3, "backoff_s": 0.5, "jitter": False}},
        _task("ship", "shop.ship", {"order": "$input.order"}, "charge"),
    ],
    "output": {"order": "$input.order", "charged_cents": "$nodes.charge.output.charged_cents",
               "tracking": "$nodes.ship.output.tracking"},
}
SKUS = ("mug", "tee")
OUT_OF_STOCK = {"order": "globex-poster", "sku": "poster", "quantity": 3}  # the warehouse has 2 posters
EXPECTED_FAILURES = {"globex": 1}


def order_runs(slug: str) -> list[dict[str, Any]]:
    """The tenant's order runs, for one ``POST /api/v1/runs/bulk``: ``ORDERS_EACH`` that the warehouse
    fills, and for globex the one it cannot."""
    runs = [{"workflow": WORKFLOW, "idempotency_key": f"demo-order-{slug}-{i}",
             "input": {"order": f"{slug}-{i}", "sku": SKUS[i % len(SKUS)], "quantity": i % 3 + 1}}
            for i in range(1, ORDERS_EACH + 1)]
    if slug == "globex":
        runs.append({"workflow": WORKFLOW, "idempotency_key": "demo-order-globex-poster", "input": OUT_OF_STOCK})
    return runs


def child_env(*, database_url: str, broker_url: str, secret_key: str) -> dict[str, str]:
    """The shop's processes' environment: its own settings module, database, broker and secret key,
    on its own path; nothing of Ductor's Django."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(SHOP_DATABASE_URL=database_url, SHOP_BROKER_URL=broker_url, SHOP_SECRET_KEY=secret_key,
               PYTHONPATH=str(DIR))
    return env


class ShopError(RuntimeError):
    """The shop's migration failed or did not finish in time."""


def start_migrate(stack: Stack, env: dict[str, str]) -> Child:
    """The shop's own ``manage.py migrate`` as a child of ``stack``; ``finish_migrate`` waits for it."""
    return stack.start("shop-migrate", [sys.executable, str(DIR / "manage.py"), "migrate", "--noinput"], env=env)


def finish_migrate(stack: Stack, child: Child, timeout_s: float = MIGRATE_TIMEOUT_S) -> None:
    """Wait for the migration to exit, then take it out of ``stack``'s supervision (which would start an
    exited child again). Raises ``ShopError``, with its log's tail, unless it exited with 0 in time."""
    deadline = time.monotonic() + timeout_s
    while child.alive() and time.monotonic() < deadline:
        time.sleep(POLL_S)
    code = child.exit_code()
    stack.stop(child, grace_s=0)
    if code != 0:
        what = "did not finish" if code is None else f"exited with {code}"
        raise ShopError(f"the shop's migrate {what} (log: {child.log_path}):\n{child.output()[-2000:]}")


def start_worker(stack: Stack, env: dict[str, str]) -> Child:
    """The shop's Celery worker (``celery -A shop_project worker -Q shop``) as a child of ``stack``."""
    return stack.worker("shop-worker", app="shop_project", concurrency=CONCURRENCY, env=env,
                        extra=["-Q", QUEUE, "--pool", "prefork", "--without-heartbeat"])
