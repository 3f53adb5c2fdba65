"""The demo, start to end: stack up, set up through the API, run the workload live, check, summarize, stop.

Runs inside the scratch databases (``workflows.demo.scratch``); the
management command arranges that. Returns how many checks failed.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone
from rich.console import Console
from rich.table import Table

from ductor_project.stack import Stack
from ductor_project.webserver import free_port
from tenants import services as tenant_services
from tenants.models import PlatformKey, Tenant
from workflows.demo import chart, metrics, scenario, scratch
from workflows.demo.scenario import TENANTS, Api, DemoApiError, Workload
from workflows.demo.service import FLAKY_FAILURES, DemoService, order_line, unit_price
from workflows.demo.view import DemoView, Row, fmt_ms

WORKERS, WORKER_CONCURRENCY, DISPATCHERS, WEB_WORKERS = 1, 4, 1, 2
WORKLOAD_CAP_S = 100.0  # the workload window ends here even if the normal tenants' runs are not all done
# Once the others are done, the window stays open this long: the flood gets the whole machine.
FLOOD_ALONE_S = 4.0
READY_TIMEOUT_S = 90.0
QUEUE_EVERY_S = 3.0
STOP_GRACE_S = 3.0  # the scratch database is dropped afterwards: a child cut short loses nothing
BUCKET_S = 2.0
MIN_CONTESTED = 20  # starts a tenant must have competed for to count in Jain's index


@dataclass
class Check:
    name: str
    detail: str
    ok: bool


def run(console: Console, box: scratch.Scratch) -> int:
    """The whole demo. Returns the number of failed checks; everything it started is stopped on return."""
    data_dir: Path = settings.DUCTOR_DATA_DIR
    logging.getLogger().setLevel(logging.WARNING)  # the live view owns the terminal; children log to files
    phases = _Phases()
    console.rule("[bold]Ductor demo")
    console.print("Four tenants share one worker pool while one of them floods it. Everything goes through "
                  "the public HTTP API of a real gunicorn server, Celery workers, a fair-queue dispatcher "
                  "and the coordinator.", highlight=False)
    if not box.migrated:
        with console.status("migrating the scratch database..."):
            call_command("migrate", interactive=False, verbosity=0)
    service = DemoService(token=secrets.token_urlsafe(16))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    view = DemoView(console, f"web {base} · {WORKERS} worker x {WORKER_CONCURRENCY} · {DISPATCHERS} dispatcher "
                             f"· coordinator · local service {service.url}")
    # The demo's own local service is on 127.0.0.1: let http.request reach private addresses.
    # INFO in JSON: the summary reads the "dispatched" lines (workflows.demo.metrics).
    stack = Stack(data_dir=data_dir, port=port, workers=WORKERS, worker_concurrency=WORKER_CONCURRENCY,
                  dispatchers=DISPATCHERS, web_workers=WEB_WORKERS, say=view.note,
                  extra_env={"DATABASE_URL": box.database_url, "REDIS_URL": box.redis_url,
                             "DUCTOR_HTTP_ALLOW_PRIVATE": "1", "DUCTOR_LOG_LEVEL": "INFO",
                             "DUCTOR_LOG_FORMAT": "json"})
    key_row: PlatformKey | None = None
    workload: Workload | None = None
    try:
        service.start()
        with console.status("starting gunicorn, a Celery worker, a dispatcher and the coordinator..."):
            stack.start()
            _wait_ready(base, stack)
        phases.done("stack up")
        key_row, platform_key = tenant_services.platform_key_create(name=f"demo-{secrets.token_hex(4)}")
        with console.status("creating tenants, connections, pools, rules and workflows through the API..."):
            setup = scenario.set_up(base, platform_key, service.url, service.token)
        _print_setup(console, setup)
        phases.done("setup")
        tenants = {t.slug: Tenant.objects.get(slug=t.slug) for t in TENANTS}
        weights = _weights(base, setup.keys)
        # Dispatchers log what they publish; workers what they take themselves (handoff).
        logs = [f"dispatcher-{i + 1}.log" for i in range(DISPATCHERS)] + [f"worker-{i + 1}.log" for i in range(WORKERS)]
        log = metrics.DispatchLog([data_dir / "logs" / name for name in logs],
                                  {str(tenant.pk): slug for slug, tenant in tenants.items()})
        t0 = timezone.now()
        workload = Workload(base, setup.keys, say=view.note)
        _watch(view, stack, workload, tenants, log, weights, base, setup.keys)
        until = (timezone.now() - t0).total_seconds()
        phases.done("workload")
        checks = _checks(base, setup.keys, workload, service, tenants)
        with console.status("stopping the stack..."):
            workload.join()
            stack.say = lambda _: None  # a child cut short after the grace period loses nothing here
            stack.stop(grace_s=STOP_GRACE_S)
        phases.done("checks and stop")
        log.read()
        _summary(console, tenants, log.dispatches, weights, t0, until, workload, data_dir)
        _print_checks(console, checks)
        phases.done("summary")
        console.print(f"Demo took {phases}.", highlight=False)
        return sum(not c.ok for c in checks)
    finally:
        if workload is not None:
            workload.join(1.0)
        stack.stop(grace_s=STOP_GRACE_S)
        service.stop()
        if key_row is not None:
            key_row.revoked_at = timezone.now()
            key_row.save(update_fields=["revoked_at"])


class _Phases:
    def __init__(self) -> None:
        self._start = self._last = time.monotonic()
        self._parts: list[str] = []

    def done(self, name: str) -> None:
        now = time.monotonic()
        self._parts.append(f"{name} {now - self._last:.0f} s")
        self._last = now

    def __str__(self) -> str:
        return f"{time.monotonic() - self._start:.0f} s ({', '.join(self._parts)})"


def _wait_ready(base: str, stack: Stack) -> None:
    """Until the web server answers (401 without a key is an answer); restarts children that died."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        stack.check()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/api/v1/tenant", timeout=2).status_code < 500:
                return
        time.sleep(0.3)
    raise DemoApiError(f"the web server did not answer within {READY_TIMEOUT_S:.0f} s (see its log)")


def _weights(base: str, keys: dict[str, str]) -> dict[str, int]:
    """Each tenant's fair-share weight, as its entitlements say (GET /api/v1/entitlements)."""
    weights = {}
    for slug, key in keys.items():
        api = Api(base, key)
        try:
            weights[slug] = int(api.call("GET", "/api/v1/entitlements")["limits"]["weight"])
        finally:
            api.close()
    return weights


def _print_setup(console: Console, setup: scenario.Setup) -> None:
    table = Table(title="Set up through the API", title_justify="left", box=None, header_style="bold")
    for column in ("tenant", "created", "request"):
        table.add_column(column)
    for slug, what, request in setup.calls:
        table.add_row(slug, what, request)
    console.print(table)


def _watch(view: DemoView, stack: Stack, workload: Workload, tenants: dict[str, Tenant],
           log: metrics.DispatchLog, weights: dict[str, int], base: str, keys: dict[str, str]) -> None:
    """Run the workload with the live view until ``FLOOD_ALONE_S`` after the normal tenants' and the
    latecomer's runs are all done (or the time cap)."""
    apis = {slug: Api(base, key) for slug, key in keys.items()}
    labels = {t.slug: f"{t.plan} · w{weights[t.slug]}" for t in TENANTS}
    queues: dict[str, Any] = {}
    next_queue = 0.0
    start = time.monotonic()
    workload.start()
    flood_total = scenario.FLOOD_RUNS
    others_done_at: float | None = None
    try:
        with view:
            while True:
                now = time.monotonic()
                stack.check()
                log.read()
                lately = metrics.recent(log.dispatches, timezone.now())
                snaps = {slug: metrics.live(tenant, lately) for slug, tenant in tenants.items()}
                if now >= next_queue:
                    next_queue = now + QUEUE_EVERY_S
                    for slug, api in apis.items():
                        with contextlib.suppress(DemoApiError, httpx.HTTPError):
                            queues[slug] = api.call("GET", "/api/v1/queue")
                others = [s for t, s in ((t, snaps[t.slug]) for t in TENANTS) if t.role != scenario.FLOOD]
                flood = snaps["floodco"]
                done = (workload.done_submitting() and flood.started >= flood_total
                        and all(s.finished == s.started for s in others))
                view.update([Row(t.slug, labels[t.slug], snaps[t.slug], queues.get(t.slug)) for t in TENANTS],
                            _status(workload, flood, flood_total))
                if workload.errors:
                    for error in workload.errors:
                        view.note(f"[error] {error}")
                    break
                if done and others_done_at is None:
                    others_done_at = now
                    workload.event("others done", f"the normal tenants' and the latecomer's runs are all done; "
                                                  f"floodco has finished {flood.finished:,} of its "
                                                  f"{flood.started:,} and now has the workers to itself")
                if others_done_at is not None and now - others_done_at >= FLOOD_ALONE_S:
                    view.note(f"floodco has finished {flood.finished:,} of its {flood.started:,} runs")
                    break
                if now - start >= WORKLOAD_CAP_S:
                    view.note(f"time cap ({WORKLOAD_CAP_S:.0f} s) reached")
                    break
                time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
    finally:
        for api in apis.values():
            api.close()


def _status(workload: Workload, flood: metrics.Live, flood_total: int) -> str:
    if flood.started:
        parts = [f"floodco: {flood.finished:,} of {flood_total:,} runs done"]
    else:
        parts = [f"floodco floods {scenario.FLOOD_AFTER_S:g} s in"]
    if workload.elapsed() < scenario.FEED_FOR_S:
        parts.append(f"acme, globex: queues topped up until {scenario.FEED_FOR_S:g} s")
    else:
        parts.append("acme, globex: no new work, draining")
    if not workload.trickle_started:
        parts.append(f"latecomer arrives {scenario.TRICKLE_AFTER_S:g} s in")
    else:
        parts.append(f"latecomer: {workload.submitted.get('latecomer', 0)}/{scenario.TRICKLE_RUNS} runs started")
    return " · ".join(parts)


# -- checks (through the API) ------------------------------------------------------------------

def _checks(base: str, keys: dict[str, str], workload: Workload, service: DemoService,
            tenants: dict[str, Tenant]) -> list[Check]:
    checks: list[Check] = []
    apis = {slug: Api(base, key) for slug, key in keys.items()}

    def check(name: str, fn: Callable[[], tuple[bool, str]]) -> None:
        try:
            ok, detail = fn()
        except (DemoApiError, httpx.HTTPError, KeyError, StopIteration, TypeError, ValueError) as exc:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        checks.append(Check(name, detail, ok))

    def run_of(feature: str) -> dict[str, Any]:
        slug, run_id = workload.feature_runs[feature]
        return dict(apis[slug].call("GET", f"/api/v1/runs/{run_id}"))

    def diamond() -> tuple[bool, str]:
        run = run_of("diamond")
        steps = [s for s in run["steps"] if s["status"] == "succeeded"]
        used = sorted({(s["routing"] or {}).get("connection", {}).get("name", "?") for s in steps})
        line = order_line("A-1001")
        expected = round(unit_price(line["sku"]) * line["qty"], 2)
        total = (run["output"] or {}).get("total")
        ok = run["status"] == "succeeded" and len(steps) == 4 and total == expected and len(used) == 2
        return ok, (f"{run['status']}; 4 http.request steps order → (price, stock) → quote through pool shop "
                    f"({', '.join(used)}); total {total} (expected {expected})")

    def subworkflow() -> tuple[bool, str]:
        run = run_of("sub-workflow")
        step = next(s for s in run["steps"] if s["node_id"] == "quote")
        child = apis["acme"].call("GET", f"/api/v1/runs/{step['child_run']}")
        confirm = next(s for s in run["steps"] if s["node_id"] == "confirm")
        tier = (confirm["routing"] or {}).get("tier")
        ok = (run["status"] == "succeeded" and child["status"] == "succeeded"
              and child["parent_run"] == run["id"] and run["output"]["total"] == child["output"]["total"]
              and tier == "interactive")
        return ok, (f"checkout {run['status']}; child run '{child['workflow_name']}' {child['status']} at depth "
                    f"{child['nesting_depth']}, its total {child['output']['total']} passed up; the checkout "
                    f"step went to the '{tier}' tier by rule")

    def continue_as_new() -> tuple[bool, str]:
        run = run_of("continue-as-new")
        lineage = apis["acme"].call("GET", f"/api/v1/runs/{run['id']}/lineage")
        chain, node = [], (lineage["tree"] or [None])[0]
        while node is not None:
            chain.append(node["status"])
            node = node["successor"]
        expected = ["continued"] * (scenario.COUNTDOWN_FROM - 1) + ["succeeded"]
        return chain == expected, f"{len(chain)} runs in one lineage: {' → '.join(chain)}"

    def retry() -> tuple[bool, str]:
        run = run_of("retry")
        attempts = {node: [s for s in run["steps"] if s["node_id"] == node] for node in ("charge", "ledger")}
        codes = [str((s["error"] or {}).get("code")) for s in attempts["charge"] if s["status"] == "failed"]
        ok = (run["status"] == "succeeded" and len(attempts["charge"]) == FLAKY_FAILURES + 1
              and len(attempts["ledger"]) == 2)
        return ok, (f"{run['status']}; charge: {len(attempts['charge'])} attempts ({', '.join(codes)} then 200), "
                    f"ledger (fail, succeed_on_attempt 2): {len(attempts['ledger'])} attempts")

    def ceiling() -> tuple[bool, str]:
        run = run_of("ceiling")
        stats = service.stats()
        calls = stats["calls"].get("reports slow", 0)
        pools = {((s["routing"] or {}).get("pool") or {}).get("name") for s in run["steps"]
                 if s["node_id"].startswith("part_")}
        ok = (run["status"] == "succeeded" and stats["slow_max_concurrent"] == 1
              and calls == scenario.REPORT_PARTS and pools == {"reports"})
        return ok, (f"{run['status']}; {scenario.REPORT_PARTS} parallel steps through pool 'reports' "
                    f"(max_concurrency 1): the service saw {calls} calls, at most "
                    f"{stats['slow_max_concurrent']} at once")

    def isolation() -> tuple[bool, str]:
        _, run_id = workload.feature_runs["diamond"]
        status = apis["globex"].status_of("GET", f"/api/v1/runs/{run_id}")
        return status == 404, f"globex asks for acme's run: {status}"

    def flood() -> tuple[bool, str]:
        live = metrics.live(tenants["floodco"], [])
        wanted = scenario.FLOOD_RUNS
        ok = live.started >= wanted and live.finished > 0 and live.failed == 0
        return ok, (f"floodco started {live.started:,} runs, each its own partition; {live.finished:,} "
                    f"finished by the checks, after the window ({live.failed} failed): "
                    "slowed to its share, not starved")

    def all_done() -> tuple[bool, str]:
        parts, ok = [], True
        for t in TENANTS:
            if t.role == scenario.FLOOD:
                continue
            live = metrics.live(tenants[t.slug], [])
            ok = ok and live.failed == 0 and live.finished == live.started
            parts.append(f"{t.slug} {live.finished - live.failed}/{live.started}")
        return ok, "succeeded: " + ", ".join(parts)

    def secrets_used() -> tuple[bool, str]:
        stats = service.stats()
        return stats["refused"] == 0, (f"{sum(stats['calls'].values())} calls to the local service, "
                                       f"{stats['refused']} without the connection's secret")

    try:
        check("diamond of http.request steps", diamond)
        check("sub-workflow, tier rule", subworkflow)
        check("ContinueAsNew loop", continue_as_new)
        check("retries", retry)
        check("concurrency ceiling", ceiling)
        check("tenant isolation", isolation)
        check("flood: thousands of runs", flood)
        check("every other run succeeded", all_done)
        check("connection secrets", secrets_used)
    finally:
        for api in apis.values():
            api.close()
    if workload.errors:
        checks.append(Check("workload", "; ".join(workload.errors), False))
    return checks


def _print_checks(console: Console, checks: list[Check]) -> None:
    table = Table(title="Checks", title_justify="left", header_style="bold")
    for column in ("check", "what happened", "ok"):
        table.add_column(column)
    for c in checks:
        table.add_row(c.name, c.detail, "[green]yes" if c.ok else "[red]NO")
    console.print(table)


# -- the summary (from PostgreSQL) -------------------------------------------------------------

def _summary(console: Console, tenants: dict[str, Tenant], dispatches: list[metrics.Dispatch],
             weights: dict[str, int], t0: datetime, until: float, workload: Workload, data_dir: Path) -> None:
    data = metrics.collect(tenants, [d for d in dispatches if (d.at - t0).total_seconds() <= until], t0)
    shares = metrics.shares(data, weights, until)
    table = Table(title=f"Fairness over the {until:.0f} s workload window", title_justify="left",
                  header_style="bold")
    for column, justify in (("tenant", "left"), ("plan (weight)", "left"), ("runs done", "right"),
                            ("dispatches while backlogged", "right"), ("share", "right"), ("fair share", "right"),
                            ("share ÷ fair", "right"), ("wait p50", "right"), ("wait p99", "right"),
                            ("run latency p50", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for t in TENANTS:
        row, share = data[t.slug], shares[t.slug]
        done = [finished - created for created, finished in row.runs if finished is not None and finished <= until]
        ratio = "-" if share.ratio is None else f"{share.ratio:.2f}"
        if t.role == scenario.TRICKLE:  # never backlogged for long: served as it arrives (see below)
            ratio = "[dim]trickle[/dim]"
        table.add_row(
            t.slug, f"{t.plan} ({weights[t.slug]})", f"{len(done):,}/{len(row.runs):,}",
            f"{share.got:,} of {share.contested:,}", _pct(share.share), _pct(share.fair),
            ratio, fmt_ms(metrics.percentile(row.waits_ms, 50)),
            fmt_ms(metrics.percentile(row.waits_ms, 99)), _seconds(metrics.percentile(done, 50)),
        )
    console.print(table)
    trickle = [t.slug for t in TENANTS if t.role == scenario.TRICKLE]
    counted = {slug: s.ratio for slug, s in shares.items()
               if s.ratio is not None and s.contested >= MIN_CONTESTED and slug not in trickle}
    index = metrics.jain(v for v in counted.values() if v is not None)
    jain = "-" if index is None else f"{index:.3f}"
    console.print(
        f"Jain's index of share ÷ fair over {', '.join(counted) or 'no tenant'}: [bold]{jain}[/bold] (1.0: each "
        "got the same fraction of its weighted share). Dispatches are the fair queue's hand-outs (run ticks and "
        "steps); a tenant's share counts those made while it and another tenant both had work waiting; waits "
        f"run from due to dispatch. The trickle ({', '.join(trickle)}) has work waiting only for moments, and a "
        "tenant that has just become active is served at once (within about one round of the others), so it "
        "gets more than its fair share of the few dispatches made while it waits: its figure is its wait.",
        highlight=False)
    flood = data["floodco"]
    finished = sum(1 for _, end in flood.runs if end is not None and end <= until)
    console.print(f"floodco queued {len(flood.runs):,} runs in as many partitions; a run of its is one dispatch, "
                  f"so it finished {finished:,} of them at the rate of its share while the others were "
                  f"backlogged, and faster once they drained. The {len(flood.runs) - finished:,} left are dropped "
                  "with the demo's scratch database.", highlight=False)
    mids, rates, waits = metrics.per_bucket(data, until, BUCKET_S)
    got, fair = metrics.shares_per_bucket(data, weights, until, BUCKET_S)
    names = {"floodco floods": f"floodco floods ({len(flood.runs):,} runs)", "latecomer arrives": "latecomer arrives",
             "latecomer done": "latecomer's last run", "acme, globex stop": "acme, globex add no more work (shaded)",
             "others done": "others done"}
    markers = [(at, names[label]) for at, label in workload.events if label in names]
    drain_from = next((at for at, label in workload.events if label == "acme, globex stop"), None)
    labels = {t.slug: f"{t.slug} ({t.plan}, weight {weights[t.slug]})" for t in TENANTS}
    headline = "While backlogged together, share of the dispatches (fair share): " + ", ".join(
        f"{slug} {_pct(shares[slug].share)} ({_pct(shares[slug].fair)})" for slug in counted
    ) + f"; Jain's index {jain}"
    path = chart.write_chart(
        data_dir / "demo-throughput.png", labels=labels, times=mids, dispatches_per_s=rates, share=got, fair=fair,
        waits_ms=waits, markers=markers, drain_from=drain_from, end=until, headline=headline,
        subtitle=(f"{WORKERS} Celery worker x {WORKER_CONCURRENCY} processes, {DISPATCHERS} dispatcher; a "
                  "floodco run is one dispatch (its tick), a one-step run of the others one or two (its step, "
                  f"after a queued first tick for bulk starts); {BUCKET_S:g}-second buckets"),
    )
    console.print(f"Chart: [bold]{path}[/bold]", highlight=False)


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 100:.1f}%" if value < 0.095 else f"{value * 100:.0f}%"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"
