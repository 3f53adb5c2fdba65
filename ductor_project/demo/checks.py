"""The demo's checks, all through the public API: one function per feature, each returning (ok, what happened).

The shop's check also reads the shop's own database, to see its orders under each tenant's id.

``run_checks`` runs every check in ``CHECKS`` in order; a check whose API call or reading fails counts as
failed (with the error as its detail), so that one broken feature never hides the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
from rich.console import Console
from rich.table import Table

from ductor_project.demo import metrics, scenario, shop
from ductor_project.demo.scenario import TENANTS, Api, DemoApiError, Workload
from ductor_project.demo.service import FLAKY_FAILURES, DemoService, order_line, unit_price
from tenants.models import Tenant

Outcome = tuple[bool, str]
# What a check may raise when a run or a field is not what it expects: a failed check, not a crash.
CHECK_ERRORS = (DemoApiError, httpx.HTTPError, psycopg.Error, KeyError, StopIteration, TypeError, ValueError)


@dataclass
class Check:
    name: str
    detail: str
    ok: bool


@dataclass
class Seen:
    """What the checks read: each tenant's API, the workload's feature runs, the local service, the tenants,
    the shop's database."""

    apis: dict[str, Api]
    workload: Workload
    service: DemoService
    tenants: dict[str, Tenant]
    shop_database_url: str

    def run_of(self, feature: str) -> dict[str, Any]:
        """The feature's run, as its tenant reads it (GET /api/v1/runs/<id>)."""
        slug, run_id = self.workload.feature_runs[feature]
        return dict(self.apis[slug].call("GET", f"/api/v1/runs/{run_id}"))


def diamond(seen: Seen) -> Outcome:
    run = seen.run_of("diamond")
    steps = [s for s in run["steps"] if s["status"] == "succeeded"]
    used = sorted({(s["routing"] or {}).get("connection", {}).get("name", "?") for s in steps})
    line = order_line("A-1001")
    expected = round(unit_price(line["sku"]) * line["qty"], 2)
    total = (run["output"] or {}).get("total")
    ok = run["status"] == "succeeded" and len(steps) == 4 and total == expected and len(used) == 2
    return ok, (f"{run['status']}; 4 http.request steps order → (price, stock) → quote through pool shop "
                f"({', '.join(used)}); total {total} (expected {expected})")


def subworkflow(seen: Seen) -> Outcome:
    run = seen.run_of("sub-workflow")
    step = next(s for s in run["steps"] if s["node_id"] == "quote")
    child = seen.apis["acme"].call("GET", f"/api/v1/runs/{step['child_run']}")
    confirm = next(s for s in run["steps"] if s["node_id"] == "confirm")
    tier = (confirm["routing"] or {}).get("tier")
    ok = (run["status"] == "succeeded" and child["status"] == "succeeded"
          and child["parent_run"] == run["id"] and run["output"]["total"] == child["output"]["total"]
          and tier == "interactive")
    return ok, (f"checkout {run['status']}; child run '{child['workflow_name']}' {child['status']} at depth "
                f"{child['nesting_depth']}, its total {child['output']['total']} passed up; the checkout "
                f"step went to the '{tier}' tier by rule")


def continue_as_new(seen: Seen) -> Outcome:
    run = seen.run_of("continue-as-new")
    lineage = seen.apis["acme"].call("GET", f"/api/v1/runs/{run['id']}/lineage")
    chain, node = [], (lineage["tree"] or [None])[0]
    while node is not None:
        chain.append(node["status"])
        node = node["successor"]
    expected = ["continued"] * (scenario.COUNTDOWN_FROM - 1) + ["succeeded"]
    return chain == expected, f"{len(chain)} runs in one lineage: {' → '.join(chain)}"


def retry(seen: Seen) -> Outcome:
    run = seen.run_of("retry")
    attempts = {node: [s for s in run["steps"] if s["node_id"] == node] for node in ("charge", "ledger")}
    codes = [str((s["error"] or {}).get("code")) for s in attempts["charge"] if s["status"] == "failed"]
    ok = (run["status"] == "succeeded" and len(attempts["charge"]) == FLAKY_FAILURES + 1
          and len(attempts["ledger"]) == 2)
    return ok, (f"{run['status']}; charge: {len(attempts['charge'])} attempts ({', '.join(codes)} then 200), "
                f"ledger (fail, succeed_on_attempt 2): {len(attempts['ledger'])} attempts")


def ceiling(seen: Seen) -> Outcome:
    run = seen.run_of("ceiling")
    stats = seen.service.stats()
    calls = stats["calls"].get("reports slow", 0)
    pools = {((s["routing"] or {}).get("pool") or {}).get("name") for s in run["steps"]
             if s["node_id"].startswith("part_")}
    ok = (run["status"] == "succeeded" and stats["slow_max_concurrent"] == 1
          and calls == scenario.REPORT_PARTS and pools == {"reports"})
    return ok, (f"{run['status']}; {scenario.REPORT_PARTS} parallel steps through pool 'reports' "
                f"(max_concurrency 1): the service saw {calls} calls, at most "
                f"{stats['slow_max_concurrent']} at once")


def isolation(seen: Seen) -> Outcome:
    _, run_id = seen.workload.feature_runs["diamond"]
    status = seen.apis["globex"].status_of("GET", f"/api/v1/runs/{run_id}")
    return status == 404, f"globex asks for acme's run: {status}"


def flood(seen: Seen) -> Outcome:
    live = metrics.live(seen.tenants["floodco"], [])
    wanted = scenario.FLOOD_RUNS
    ok = live.started >= wanted and live.finished > 0 and live.failed == 0
    return ok, (f"floodco started {live.started:,} runs, each its own partition; {live.finished:,} "
                f"finished by the checks, after the window ({live.failed} failed): "
                "slowed to its share, not starved")


def all_done(seen: Seen) -> Outcome:
    parts, ok = [], True
    for t in TENANTS:
        if t.role == scenario.FLOOD:
            continue
        live = metrics.live(seen.tenants[t.slug], [])
        expected = shop.EXPECTED_FAILURES.get(t.slug, 0)
        ok = ok and live.failed == expected and live.finished == live.started
        parts.append(f"{t.slug} {live.finished - live.failed}/{live.started}")
    failures = ", ".join(f"{slug}'s {n}" for slug, n in shop.EXPECTED_FAILURES.items())
    return ok, "succeeded: " + ", ".join(parts) + f"; failed: {failures} out-of-stock order, as it should"


def shop_orders(seen: Seen) -> Outcome:
    """The shop's orders: each succeeded with the outputs of its tasks, which the shop's own database
    agrees with; the one the warehouse cannot fill failed in its reserve step with ``OutOfStock``."""
    rows = _shop_rows(seen.shop_database_url)
    parts, ok, refused = [], True, None
    for slug in shop.SHOPPERS:
        tenant_id, shipped = str(seen.tenants[slug].pk), 0
        for ref, run_id in seen.workload.order_runs[slug].items():
            run = seen.apis[slug].call("GET", f"/api/v1/runs/{run_id}")
            if ref == shop.OUT_OF_STOCK["order"]:
                refused = run
                ok = ok and (tenant_id, ref) not in rows
                continue
            out = run["output"] or {}
            ok = ok and run["status"] == "succeeded" and rows.get((tenant_id, ref)) == (
                "shipped", out.get("charged_cents"), out.get("tracking"))
            shipped += run["status"] == "succeeded"
        mine = sum(1 for tid, _ in rows if tid == tenant_id)
        parts.append(f"{slug} {shipped}/{shop.ORDERS_EACH} shipped, {mine} orders under its id in the shop's db")
    error = _reserve_error(refused)
    ok = ok and refused is not None and refused["status"] == "failed" and error.get("code") == "task_failed" \
        and str(error.get("message", "")).startswith("OutOfStock: ") \
        and (error.get("exception") or {}).get("type") == "OutOfStock" and error.get("retryable") is False
    return ok, (f"{'; '.join(parts)}; outputs match its rows; {shop.OUT_OF_STOCK['order']} "
                f"{refused['status'] if refused else 'not started'} at reserve: {error.get('code')} "
                f"\"{error.get('message')}\"")


def _shop_rows(url: str) -> dict[tuple[str, str], tuple[str, int, str]]:
    """The shop's orders, ``(tenant id, order) -> (status, charged cents, tracking)``, from its own database."""
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT tenant_id, ref, status, charged_cents, tracking FROM shop_order").fetchall()
    return {(str(t), str(r)): (str(st), int(c), str(tr)) for t, r, st, c, tr in found}


def _reserve_error(run: dict[str, Any] | None) -> dict[str, Any]:
    """The error of the run's (last) reserve attempt; empty if it has none."""
    reserve = [s for s in (run or {}).get("steps", []) if s["node_id"] == "reserve"]
    return dict((reserve[-1]["error"] if reserve else None) or {})


def secrets_used(seen: Seen) -> Outcome:
    stats = seen.service.stats()
    return stats["refused"] == 0, (f"{sum(stats['calls'].values())} calls to the local service, "
                                   f"{stats['refused']} without the connection's secret")


CHECKS: tuple[tuple[str, Callable[[Seen], Outcome]], ...] = (
    ("diamond of http.request steps", diamond),
    ("sub-workflow, tier rule", subworkflow),
    ("ContinueAsNew loop", continue_as_new),
    ("retries", retry),
    ("concurrency ceiling", ceiling),
    ("tenant isolation", isolation),
    ("flood: thousands of runs", flood),
    ("every other run succeeded", all_done),
    ("shop orders (task nodes)", shop_orders),
    ("connection secrets", secrets_used),
)


def run_checks(base: str, keys: dict[str, str], workload: Workload, service: DemoService,
               tenants: dict[str, Tenant], shop_database_url: str) -> list[Check]:
    """Every check of ``CHECKS`` in order, then one failed "workload" check if the workload had errors.
    Never raises for a check that fails; closes the API clients it opened."""
    seen = Seen({slug: Api(base, key) for slug, key in keys.items()}, workload, service, tenants,
                shop_database_url)
    try:
        checks = [_check(name, fn, seen) for name, fn in CHECKS]
    finally:
        for api in seen.apis.values():
            api.close()
    if workload.errors:
        checks.append(Check("workload", "; ".join(workload.errors), False))
    return checks


def _check(name: str, fn: Callable[[Seen], Outcome], seen: Seen) -> Check:
    try:
        ok, detail = fn(seen)
    except CHECK_ERRORS as exc:
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    return Check(name, detail, ok)


def print_checks(console: Console, checks: list[Check]) -> None:
    """The table of every check, what happened and whether it passed."""
    table = Table(title="Checks", title_justify="left", header_style="bold")
    for column in ("check", "what happened", "ok"):
        table.add_column(column)
    for c in checks:
        table.add_row(c.name, c.detail, "[green]yes" if c.ok else "[red]NO")
    console.print(table)
