"""What the demo sets up and runs, all of it through the public HTTP API.

Four tenants on three plans:

- ``floodco`` (free, weight 1) floods: ``FLOOD_RUNS`` runs of ``poll`` in
  ``POST /api/v1/runs/bulk`` calls of ``BULK_MAX``, each run with its
  idempotency key and in its own fair-queue partition (a run is its own
  partition). It is a runaway poller: its runs find nothing changed, so the
  ``when`` of their one step skips it and a run is one tick, one dispatch.
  The flood's runs then finish at the rate the flood is served, where runs of
  two dispatches (a bulk start's first tick, then the step) would all start,
  oldest first, before the first one finished. Started one ``POST /runs`` at a time, they would
  cost the web server more CPU than the whole demo has.
- ``acme`` (enterprise, weight 16) and ``globex`` (pro, weight 4) are the
  normal tenants. They start the feature workflows (a diamond of
  ``http.request`` steps, a sub-workflow, a ContinueAsNew loop, retries, a pool
  at its concurrency ceiling), then keep about ``BACKLOG[slug]`` of their items
  due, read from ``GET /api/v1/queue`` and topped up with bulk starts of
  one-step runs, for ``FEED_FOR_S`` seconds: both stay backlogged, whatever the
  machine's speed, so what each gets is its weighted share. Then they add
  nothing more and their queues drain.
- ``latecomer`` (enterprise, weight 16) arrives ``TRICKLE_AFTER_S`` seconds
  in and starts one run every ``TRICKLE_EVERY_S`` seconds.
- acme and globex also order from the example shop (``ductor_project.demo.shop``):
  the platform puts the shop's Celery tasks in the task catalog, both create the
  workflow ``order`` of three task nodes, with a rule that sends the shop's tasks
  to the interactive tier; ``ORDERS_AFTER_S`` seconds in, while both keep their
  queues topped up, each starts its orders in one bulk call.

The platform lifts floodco's step rate and concurrency (overrides, set through
the platform API, as an operator would): fair sharing, not its plan's
ceilings, is what must hold the flood back.

Connections point at the demo's local HTTP service (``ductor_project.demo.service``);
pools group them; rules route ``http.*`` steps to the pools, send globex's
report steps to a pool that admits one call at a time, and move acme's checkout
steps to the interactive tier.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from ductor_project.demo import shop

# Seconds from the workload's start.
FLOOD_AFTER_S = 4.0  # acme and globex first have the workers to themselves
TRICKLE_AFTER_S = 14.0
FEED_FOR_S = 40.0  # acme and globex keep their queues topped up until then
ORDERS_AFTER_S = 8.0  # acme and globex order from the shop

FLOOD_RUNS = 2_000
BULK_MAX = 500  # runs per bulk call (the API's most)
# How many items each normal tenant keeps due: (first, least, most). The number follows the
# machine's speed (``Workload._feed``): enough that the tenant never runs dry between two
# top-ups (FEED_EVERY_S plus two API calls), few enough that its oldest due item has waited
# about FEED_WAIT_S, so that its runs finish in seconds on a slow machine too.
BACKLOG = {"acme": (40, 24, 400), "globex": (15, 10, 100)}
FEED_WAIT_S = 1.0
FEED_EVERY_S = 0.3
TRICKLE_RUNS = 24
# A run started alone is one fair-queue item (its step; its ticks run inline): keep the
# trickle below the latecomer's fair share even on a slow, shared two-core machine.
TRICKLE_EVERY_S = 0.75
COUNTDOWN_FROM = 3
REPORT_PARTS = 4
REPORT_SLOW_MS = 250

FLOOD, NORMAL, TRICKLE = "flood", "normal", "trickle"


@dataclass(frozen=True)
class DemoTenant:
    slug: str
    name: str
    plan: str
    role: str
    # Platform-admin overrides on top of the plan, set through the platform API.
    overrides: dict[str, Any] = field(default_factory=dict)


TENANTS = (
    DemoTenant("floodco", "FloodCo (runaway script)", "free", FLOOD,
               overrides={"step_rate_per_s": 200.0, "step_burst": 400, "max_concurrency": 50}),
    DemoTenant("acme", "Acme", "enterprise", NORMAL),
    DemoTenant("globex", "Globex", "pro", NORMAL),
    DemoTenant("latecomer", "Latecomer", "enterprise", TRICKLE),
)


class DemoApiError(RuntimeError):
    """An API call of the demo got an answer it did not expect."""


class Api:
    """One API key's view of the public HTTP API. One per thread."""

    def __init__(self, base_url: str, key: str) -> None:
        self._client = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)

    def close(self) -> None:
        self._client.close()

    def call(self, method: str, path: str, body: Any = None, *, expect: tuple[int, ...] = (200, 201)) -> Any:
        """Send one request; retried on 429 (after ``Retry-After``). Raises ``DemoApiError`` otherwise."""
        for _ in range(20):
            response = self._client.request(method, path, json=body)
            if response.status_code != 429:
                break
            time.sleep(min(float(response.headers.get("Retry-After") or 0.5), 5.0))
        if response.status_code not in expect:
            raise DemoApiError(f"{method} {path} answered {response.status_code}: {response.text[:300]}")
        return response.json() if response.content else None

    def status_of(self, method: str, path: str) -> int:
        return self._client.request(method, path).status_code


# -- workflow specs ------------------------------------------------------------------------------

def _http(node_id: str, path: str, *, depends_on: tuple[str, ...] = (), **params: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "action", "action": "http.request", "depends_on": list(depends_on),
            "input": {"path": path, **params}}


QUOTE = {  # the diamond: order → (price, stock) → quote
    "nodes": [
        _http("order", "order/{{ $input.order }}"),
        _http("price", "price", depends_on=("order",), query={"sku": "$nodes.order.output.body.sku"}),
        _http("stock", "stock", depends_on=("order",), query={"sku": "$nodes.order.output.body.sku"}),
        _http("quote", "quote", depends_on=("price", "stock"), method="POST",
              json={"unit_price": "$nodes.price.output.body.unit_price", "qty": "$nodes.order.output.body.qty",
                    "in_stock": "$nodes.stock.output.body.in_stock"}),
    ],
    "output": {"order": "$input.order", "sku": "$nodes.order.output.body.sku",
               "qty": "$nodes.order.output.body.qty", "total": "$nodes.quote.output.body.total"},
}

CHECKOUT = {  # a sub-workflow: the quote runs as a child run, the parent waits for its output
    "nodes": [
        {"id": "quote", "type": "subworkflow", "workflow": "quote", "input": {"order": "$input.order"}},
        {"id": "confirm", "type": "action", "action": "echo", "depends_on": ["quote"],
         "input": {"order": "$input.order", "total": "$nodes.quote.output.total", "confirmed": True}},
    ],
    "output": "$nodes.confirm.output",
}

COUNTDOWN = {  # ContinueAsNew: each round asks the service for n - 1 and continues until it is 0
    "nodes": [
        _http("count", "countdown", query={"n": "$input.n"}),
        {"id": "again", "type": "continue_as_new", "depends_on": ["count"],
         "when": {"path": "nodes.count.output.body.n", "op": "gt", "value": 0},
         "input": {"n": "$nodes.count.output.body.n"}},
    ],
    "output": {"reached": "$nodes.count.output.body.n"},
}

CHARGE = {  # retries: the service fails the first calls of each key; `fail` succeeds on attempt 2
    "nodes": [
        {**_http("charge", "flaky", query={"key": "$run.id"}),
         "retry": {"max_attempts": 5, "backoff_s": 0.5, "max_backoff_s": 2, "jitter": False}},
        {"id": "ledger", "type": "action", "action": "fail",
         "input": {"message": "ledger locked, try again", "succeed_on_attempt": 2},
         "retry": {"max_attempts": 3, "backoff_s": 0.3, "jitter": False}},
        {"id": "receipt", "type": "action", "action": "echo", "depends_on": ["charge", "ledger"],
         "input": {"charged_after": "$nodes.charge.output.body.attempts", "ledger": "$nodes.ledger.output"}},
    ],
    "output": "$nodes.receipt.output",
}

REPORT = {  # a concurrency ceiling: four parallel calls through a pool that admits one at a time
    "nodes": [
        *(_http(f"part_{i}", "slow", query={"ms": REPORT_SLOW_MS}) for i in range(1, REPORT_PARTS + 1)),
        {"id": "merge", "type": "action", "action": "echo",
         "depends_on": [f"part_{i}" for i in range(1, REPORT_PARTS + 1)], "input": {"parts": REPORT_PARTS}},
    ],
}

ONE_STEP = {"nodes": [{"id": "work", "type": "action", "action": "sleep_ms", "input": {"ms": 20}}]}

POLL = {  # the flood: the sync step runs only when something changed; the runaway poller's runs find nothing
    "nodes": [{"id": "sync", "type": "action", "action": "sleep_ms", "input": {"ms": 20},
               "when": {"path": "input.changed", "op": "eq", "value": True}}],
}

HELLO = {"nodes": [{"id": "hello", "type": "action", "action": "echo", "input": {"hello": "$input.n"}}]}


# -- setup ---------------------------------------------------------------------------------------

@dataclass
class Setup:
    """What setup created: each tenant's API key and the names of its objects."""

    keys: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (tenant, what, request)


def _connection(name: str, base_url: str, secret: str) -> dict[str, Any]:
    return {"name": name, "kind": "http", "config": {"base_url": base_url, "timeout_s": 5},
            "secret": secret}


SHOP_ORDER_WORKFLOW = "workflow order (shop tasks: reserve → charge → ship)"


def set_up(base_url: str, platform_key: str, service_url: str, service_token: str) -> Setup:
    """Create the tenants, the shop's catalog tasks and everything the tenants own, through the API.
    Raises ``DemoApiError``."""
    setup = Setup()
    _create_tenants(base_url, platform_key, setup)
    _create_catalog(base_url, platform_key, setup)
    for slug, calls in _tenant_objects(service_url, service_token).items():
        _post_all(base_url, setup, slug, calls)
    return setup


def _create_tenants(base_url: str, platform_key: str, setup: Setup) -> None:
    """Each tenant with its first API key, and its overrides, as the platform admin."""
    platform = Api(base_url, platform_key)
    try:
        for tenant in TENANTS:
            created = platform.call("POST", "/api/v1/tenants", {"slug": tenant.slug, "name": tenant.name,
                                                               "plan": tenant.plan, "create_api_key": True})
            setup.keys[tenant.slug] = created["api_key"]
            setup.calls.append((tenant.slug, f"tenant on the {tenant.plan} plan", "POST /api/v1/tenants"))
            for limit, value in tenant.overrides.items():
                platform.call("PUT", f"/api/v1/tenants/{tenant.slug}/overrides/{limit}",
                              {"value": value, "reason": "demo: only fair sharing holds the flood back"})
                setup.calls.append((tenant.slug, f"override {limit} = {value} (platform admin)",
                                    f"PUT /api/v1/tenants/{tenant.slug}/overrides/{limit}"))
    finally:
        platform.close()


def _create_catalog(base_url: str, platform_key: str, setup: Setup) -> None:
    """The shop's Celery tasks in the platform's task catalog, as the platform admin."""
    platform = Api(base_url, platform_key)
    try:
        for entry in shop.CATALOG:
            platform.call("POST", "/api/v1/task-catalog", entry)
            setup.calls.append(("platform", f"catalog task {entry['name']} (queue {entry['queue']})",
                                "POST /api/v1/task-catalog"))
    finally:
        platform.close()


def _post_all(base_url: str, setup: Setup, slug: str, calls: list[tuple[str, str, dict[str, Any]]]) -> None:
    """POST each (what, path, body) of ``calls`` in order with the tenant's key, and record it in ``setup``."""
    api = Api(base_url, setup.keys[slug])
    try:
        for what, path, body in calls:
            api.call("POST", path, body)
            setup.calls.append((slug, what, f"POST {path}"))
    finally:
        api.close()


def _tenant_objects(service_url: str, token: str) -> dict[str, list[tuple[str, str, dict[str, Any]]]]:
    """What each tenant creates, in order: (what, path, body) per call."""
    return {
        "acme": [
            ("connection shop-eu", "/api/v1/connections", _connection("shop-eu", f"{service_url}/eu", token)),
            ("connection shop-us", "/api/v1/connections", _connection("shop-us", f"{service_url}/us", token)),
            ("pool shop (round robin, default)", "/api/v1/pools",
             {"name": "shop", "strategy": "round_robin", "is_default": True,
              "members": [{"connection": "shop-eu"}, {"connection": "shop-us"}]}),
            ("rule: checkout steps → interactive tier", "/api/v1/rules",
             {"name": "checkout is interactive", "priority": 5, "match": {"workflow": "checkout"},
              "action": {"tier": "interactive"}}),
            ("rule: http.* → pool shop", "/api/v1/rules",
             {"name": "shop calls", "priority": 10, "match": {"action": "http.*"}, "action": {"pool": "shop"}}),
            ("workflow quote (diamond)", "/api/v1/workflows", {"name": "quote", "spec": QUOTE}),
            ("workflow checkout (sub-workflow)", "/api/v1/workflows", {"name": "checkout", "spec": CHECKOUT}),
            ("workflow countdown (ContinueAsNew)", "/api/v1/workflows", {"name": "countdown", "spec": COUNTDOWN}),
            ("workflow refresh (one step)", "/api/v1/workflows", {"name": "refresh", "spec": ONE_STEP}),
            *shop.ROUTING,
            (SHOP_ORDER_WORKFLOW, "/api/v1/workflows", {"name": shop.WORKFLOW, "spec": shop.ORDER}),
        ],
        "globex": [
            ("connection payments-api", "/api/v1/connections",
             _connection("payments-api", f"{service_url}/pay", token)),
            ("connection reports-api", "/api/v1/connections",
             _connection("reports-api", f"{service_url}/reports", token)),
            ("pool payments (default)", "/api/v1/pools",
             {"name": "payments", "is_default": True, "members": [{"connection": "payments-api"}]}),
            ("pool reports (max_concurrency 1)", "/api/v1/pools",
             {"name": "reports", "max_concurrency": 1, "members": [{"connection": "reports-api"}]}),
            ("rule: report steps → pool reports", "/api/v1/rules",
             {"name": "reports one at a time", "priority": 10, "match": {"workflow": "report", "action": "http.*"},
              "action": {"pool": "reports"}}),
            ("rule: http.* → pool payments", "/api/v1/rules",
             {"name": "payments calls", "priority": 20, "match": {"action": "http.*"},
              "action": {"pool": "payments"}}),
            ("workflow charge (retries)", "/api/v1/workflows", {"name": "charge", "spec": CHARGE}),
            ("workflow report (concurrency ceiling)", "/api/v1/workflows", {"name": "report", "spec": REPORT}),
            ("workflow sync (one step)", "/api/v1/workflows", {"name": "sync", "spec": ONE_STEP}),
            *shop.ROUTING,
            (SHOP_ORDER_WORKFLOW, "/api/v1/workflows", {"name": shop.WORKFLOW, "spec": shop.ORDER}),
        ],
        "floodco": [
            ("workflow poll (one step, skipped unless the input changed)", "/api/v1/workflows",
             {"name": "poll", "spec": POLL}),
        ],
        "latecomer": [
            ("workflow hello (one step)", "/api/v1/workflows", {"name": "hello", "spec": HELLO}),
        ],
    }


# -- the workload --------------------------------------------------------------------------------

@dataclass
class Workload:
    """The runs the demo starts, in background threads. ``feature_runs`` names the feature runs' ids.

    ``events`` holds what happened when, in seconds from ``start()`` (the chart marks them).
    """

    base_url: str
    keys: dict[str, str]
    say: Callable[[str], None]
    stop: threading.Event = field(default_factory=threading.Event)
    feature_runs: dict[str, tuple[str, str]] = field(default_factory=dict)  # check -> (tenant, run id)
    order_runs: dict[str, dict[str, str]] = field(default_factory=dict)  # tenant -> order -> run id
    submitted: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    trickle_started: bool = False
    _started_at: float = 0.0
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self._started_at = time.monotonic()
        for name, target in (("flood", self._flood), ("acme", self._acme), ("globex", self._globex),
                             ("trickle", self._trickle), ("shop", self._shop)):
            thread = threading.Thread(target=self._guard, args=(target,), name=f"demo-{name}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def elapsed(self) -> float:
        return time.monotonic() - self._started_at

    def done_submitting(self) -> bool:
        return not any(thread.is_alive() for thread in self._threads)

    def join(self, timeout_s: float = 5.0) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout_s)

    def _guard(self, target: Callable[[], None]) -> None:
        try:
            target()
        except (DemoApiError, httpx.HTTPError) as exc:
            with self._lock:
                self.errors.append(f"{threading.current_thread().name}: {exc}")

    def event(self, label: str, message: str) -> None:
        """Record that ``label`` happened now (for the chart) and say ``message``."""
        with self._lock:
            self.events.append((self.elapsed(), label))
        self.say(message)

    def _count(self, slug: str, runs: int) -> None:
        with self._lock:
            self.submitted[slug] = self.submitted.get(slug, 0) + runs

    def _wait_until(self, at_s: float) -> bool:
        """Sleep until ``at_s`` seconds from the start; False if the workload was stopped meanwhile."""
        return not self.stop.wait(max(0.0, at_s - self.elapsed()))

    def _start_run(self, api: Api, slug: str, workflow: str, key: str, run_input: dict[str, Any],
                   **extra: Any) -> str:
        run = api.call("POST", "/api/v1/runs", {"workflow": workflow, "input": run_input,
                                                "idempotency_key": key, **extra})
        self._count(slug, 1)
        return str(run["id"])

    def _start_bulk(self, api: Api, slug: str, workflow: str, first: int, count: int,
                    **run_input: Any) -> None:
        batch = [{"workflow": workflow, "input": {"n": i, **run_input}, "idempotency_key": f"demo-{workflow}-{i}"}
                 for i in range(first, first + count)]
        self._count(slug, int(api.call("POST", "/api/v1/runs/bulk", {"runs": batch})["created"]))

    def _feature(self, api: Api, slug: str, check: str, workflow: str, run_input: dict[str, Any],
                 **extra: Any) -> None:
        run_id = self._start_run(api, slug, workflow, f"demo-{workflow}", run_input, **extra)
        with self._lock:
            self.feature_runs[check] = (slug, run_id)

    def _feed(self, api: Api, slug: str, workflow: str) -> None:
        """Keep the tenant backlogged until ``FEED_FOR_S``: top its due items up with bulk starts.

        How many it keeps due (``BACKLOG[slug]``) grows by half when a top-up finds less than
        half of them left (it could run dry before the next) and shrinks while its oldest due
        item has waited more than ``FEED_WAIT_S`` (it has more than it gets through in that time).
        """
        target, least, most = BACKLOG[slug]
        started = 0
        while self.elapsed() < FEED_FOR_S and not self.stop.is_set():
            queue = api.call("GET", "/api/v1/queue")
            due = int(queue["due"])
            if started and due < target // 2:
                target = min(most, round(target * 1.5))
            elif float(queue["oldest_waiting_ms"]) > FEED_WAIT_S * 1000:
                target = max(least, round(target * 0.85))
            missing = target - due
            if missing > 0:
                count = min(missing, BULK_MAX)
                self._start_bulk(api, slug, workflow, started, count)
                started += count
            self.stop.wait(FEED_EVERY_S)

    def _flood(self) -> None:
        if not self._wait_until(FLOOD_AFTER_S):
            return
        api = Api(self.base_url, self.keys["floodco"])
        self.event("floodco floods", f"floodco floods: {FLOOD_RUNS:,} runs of poll, each its own partition")
        try:
            for first in range(0, FLOOD_RUNS, BULK_MAX):
                if self.stop.is_set():
                    return
                self._start_bulk(api, "floodco", "poll", first, min(BULK_MAX, FLOOD_RUNS - first), changed=False)
            calls = -(-FLOOD_RUNS // BULK_MAX)
            self.event("flood queued", f"floodco queued {FLOOD_RUNS:,} runs in {calls} bulk calls")
        finally:
            api.close()

    def _acme(self) -> None:
        api = Api(self.base_url, self.keys["acme"])
        try:
            self._feature(api, "acme", "diamond", "quote", {"order": "A-1001"})
            self._feature(api, "acme", "sub-workflow", "checkout", {"order": "A-1002"})
            self._feature(api, "acme", "continue-as-new", "countdown", {"n": COUNTDOWN_FROM})
            self._feed(api, "acme", "refresh")
        finally:
            api.close()

    def _globex(self) -> None:
        api = Api(self.base_url, self.keys["globex"])
        try:
            self._feature(api, "globex", "retry", "charge", {"amount": 42})
            self._feature(api, "globex", "ceiling", "report", {})
            self._feed(api, "globex", "sync")
            if not self.stop.is_set():  # acme stops at the same moment
                self.event("acme, globex stop", "acme and globex stop adding work; their queues drain")
        finally:
            api.close()

    def _shop(self) -> None:
        """acme and globex each start their orders from the shop in one bulk call."""
        if not self._wait_until(ORDERS_AFTER_S):
            return
        apis = {slug: Api(self.base_url, self.keys[slug]) for slug in shop.SHOPPERS}
        try:
            self.event("shop orders", f"acme and globex order from the shop: {shop.ORDERS_EACH} orders each, and "
                                      "globex one the warehouse cannot fill")
            for slug, api in apis.items():
                runs = shop.order_runs(slug)
                body = api.call("POST", "/api/v1/runs/bulk", {"runs": runs})
                self._count(slug, int(body["created"]))
                with self._lock:
                    self.order_runs[slug] = {run["input"]["order"]: str(made["id"])
                                             for run, made in zip(runs, body["runs"], strict=True)}
        finally:
            for api in apis.values():
                api.close()

    def _trickle(self) -> None:
        if not self._wait_until(TRICKLE_AFTER_S):
            return
        api = Api(self.base_url, self.keys["latecomer"])
        self.trickle_started = True
        self.event("latecomer arrives",
                   f"latecomer arrives: one run every {TRICKLE_EVERY_S:g} s, {TRICKLE_RUNS} in all")
        try:
            next_at = time.monotonic()
            for i in range(TRICKLE_RUNS):
                if self.stop.wait(max(0.0, next_at - time.monotonic())):
                    return
                self._start_run(api, "latecomer", "hello", f"demo-hello-{i}", {"n": i})
                next_at += TRICKLE_EVERY_S
            self.event("latecomer done", "latecomer started its last run")
        finally:
            api.close()
