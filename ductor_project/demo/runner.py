"""The demo, start to end: stack up, set up through the API, run the workload live, check, summarize, stop.

Runs inside the scratch databases (``ductor_project.demo.scratch``); the
management command arranges that. Returns how many checks failed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
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

from ductor_project.demo import chart, metrics, scenario, scratch, shop
from ductor_project.demo.checks import print_checks, run_checks
from ductor_project.demo.scenario import TENANTS, Api, DemoApiError, Workload
from ductor_project.demo.service import DemoService
from ductor_project.demo.view import DemoView, Row, fmt_ms
from ductor_project.management.commands.up import start_workers
from ductor_project.stack import Child, ChildError, Stack, free_port
from tenants import services as tenant_services
from tenants.models import PlatformKey, Tenant

WORKERS, WORKER_CONCURRENCY, RESULTS_WORKERS, DISPATCHERS, WEB_WORKERS = 1, 4, 1, 1, 2
WORKLOAD_CAP_S = 100.0  # the workload window ends here even if the normal tenants' runs are not all done
# Once the others are done, the window stays open this long: the flood gets the whole machine.
FLOOD_ALONE_S = 4.0
READY_TIMEOUT_S = 90.0
QUEUE_EVERY_S = 3.0
STOP_GRACE_S = 3.0  # the scratch database is dropped afterwards: a child cut short loses nothing
BUCKET_S = 2.0
MIN_CONTESTED_S = 2.0  # worker-seconds a tenant must have competed for to count in Jain's index


def run(console: Console, box: scratch.Scratch) -> int:
    """The whole demo. Returns the number of failed checks; everything it started is stopped on return."""
    logging.getLogger().setLevel(logging.WARNING)  # the live view owns the terminal; children log to files
    phases = _Phases()
    _intro(console, box)
    service = DemoService(token=secrets.token_urlsafe(16))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    view = DemoView(console, f"web {base} · {WORKERS} worker x {WORKER_CONCURRENCY} · {RESULTS_WORKERS} results "
                             f"worker · {DISPATCHERS} dispatcher "
                             f"· coordinator · local service {service.url} · shop worker x {shop.CONCURRENCY}")
    started = _Started(Stack(settings.DUCTOR_DATA_DIR / "logs", env=_child_env(box), say=view.note), service)
    try:
        setup = _bring_up(console, started, port, phases, box)
        tenants = {t.slug: Tenant.objects.get(slug=t.slug) for t in TENANTS}
        weights = _weights(base, setup.keys)
        log = _item_log(started.stack, tenants)
        t0 = timezone.now()
        started.workload = workload = Workload(base, setup.keys, say=view.note)
        _watch(view, started.stack, workload, tenants, log, weights, base, setup.keys)
        until = (timezone.now() - t0).total_seconds()
        phases.done("workload")
        checks = run_checks(base, setup.keys, workload, service, tenants, box.shop_database_url)
        with console.status("stopping the stack..."):
            workload.join()
            started.stack.say = lambda _: None  # a child cut short after the grace period loses nothing here
            started.stack.stop_all(grace_s=STOP_GRACE_S)
        phases.done("checks and stop")
        log.read()
        _summary(console, tenants, log, weights, t0, until, workload, settings.DUCTOR_DATA_DIR)
        _print_shop(console, tenants, log.task_starts, weights, t0)
        print_checks(console, checks)
        phases.done("summary")
        console.print(f"Demo took {phases}.", highlight=False)
        return sum(not c.ok for c in checks)
    finally:
        started.close()


@dataclass
class _Started:
    """What the demo started or created, so that ``close`` undoes all of it whatever happened."""

    stack: Stack
    service: DemoService
    key_row: PlatformKey | None = None
    workload: Workload | None = None

    def close(self) -> None:
        """Stop the workload's threads, every child and the local service; revoke the platform key."""
        if self.workload is not None:
            self.workload.join(1.0)
        self.stack.stop_all(grace_s=STOP_GRACE_S)
        self.service.stop()
        if self.key_row is not None:
            self.key_row.revoked_at = timezone.now()
            self.key_row.save(update_fields=["revoked_at"])


def _intro(console: Console, box: scratch.Scratch) -> None:
    """Say what the demo does; migrate the scratch database unless it was copied from a migrated one."""
    console.rule("[bold]Ductor demo")
    console.print("Four tenants share one worker pool while one of them floods it, and two of them order from "
                  "a team's own Django project (examples/shop), whose Celery tasks run as workflow steps. "
                  "Everything goes through the public HTTP API of a real gunicorn server, Celery workers, a "
                  "fair-queue dispatcher and the coordinator.", highlight=False)
    if not box.migrated:
        with console.status("migrating the scratch database..."):
            call_command("migrate", interactive=False, verbosity=0)


def _child_env(box: scratch.Scratch) -> dict[str, str]:
    """The children's environment: the scratch databases, private addresses allowed for http.request (the
    demo's own local service is on 127.0.0.1), and INFO in JSON (the summary reads the "dispatched" and
    "item_finished" lines, ``ductor_project.demo.metrics``), and the shop's queue's slots shared by every tenant
    (``ductor_project.demo.shop``)."""
    return dict(os.environ, DATABASE_URL=box.database_url, REDIS_URL=box.redis_url, DUCTOR_HTTP_ALLOW_PRIVATE="1",
                DUCTOR_LOG_LEVEL="INFO", DUCTOR_LOG_FORMAT="json", DUCTOR_TASK_QUEUE_SLOTS=shop.SLOTS)


def _bring_up(console: Console, started: _Started, port: int, phases: _Phases,
              box: scratch.Scratch) -> scenario.Setup:
    """Start the local service, the shop's migration and the stack with the shop's worker, then set the
    tenants up through the API (a platform key of its own, revoked by ``_Started.close``)."""
    started.service.start()
    shop_env = shop.child_env(database_url=box.shop_database_url, broker_url=box.redis_url,
                              secret_key=secrets.token_urlsafe(32))
    with console.status("starting gunicorn, a Celery worker, a dispatcher, the coordinator and the shop's "
                        "worker; migrating the shop's database..."):
        migrate = shop.start_migrate(started.stack, shop_env)
        web = _start_stack(started.stack, port)
        shop_worker = shop.start_worker(started.stack, shop_env)
        try:
            shop.finish_migrate(started.stack, migrate)
        except shop.ShopError as exc:
            raise DemoApiError(str(exc)) from exc
        _wait_ready(started.stack, web, shop_worker)
    phases.done("stack up")
    started.key_row, platform_key = tenant_services.platform_key_create(name=f"demo-{secrets.token_hex(4)}")
    with console.status("creating tenants, connections, pools, rules and workflows through the API..."):
        setup = scenario.set_up(str(web.url), platform_key, started.service.url, started.service.token)
    _print_setup(console, setup)
    phases.done("setup")
    return setup


def _start_stack(stack: Stack, port: int) -> Child:
    """gunicorn, the workers (of steps, and of task nodes' outcomes), the dispatchers and the coordinator;
    returns the web server. It is ready once
    ``/api/v1/tenant`` answers (401 without a key is an answer)."""
    web = stack.web(port=port, workers=WEB_WORKERS, ready_path="/api/v1/tenant")
    start_workers(stack, workers=WORKERS, concurrency=WORKER_CONCURRENCY, results_workers=RESULTS_WORKERS)
    for i in range(DISPATCHERS):
        stack.dispatcher(f"dispatcher-{i + 1}")
    stack.coordinator()
    return web


def _item_log(stack: Stack, tenants: dict[str, Tenant]) -> metrics.ItemLog:
    """Follows what the dispatchers publish, what the workers take themselves (handoff) and what they
    finish, from now on."""
    logs = [child.log_path for child in stack.children
            if child.name.startswith(("dispatcher-", "worker-", "results-"))]
    return metrics.ItemLog(logs, {str(tenant.pk): slug for slug, tenant in tenants.items()})


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


def _wait_ready(stack: Stack, web: Child, shop_worker: Child) -> None:
    """Until the web server answers and the shop's worker is ready; restarts children that died meanwhile.
    Raises ``DemoApiError``."""
    try:
        stack.wait_ready(web, shop_worker, timeout_s=READY_TIMEOUT_S, restart=True)
    except ChildError as exc:
        raise DemoApiError(f"the web server or the shop's worker was not ready within {READY_TIMEOUT_S:.0f} s "
                           "(see their logs)") from exc


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
           log: metrics.ItemLog, weights: dict[str, int], base: str, keys: dict[str, str]) -> None:
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
    orders_noted = False
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
                orders = ({slug: metrics.runs_of(tenants[slug], shop.WORKFLOW) for slug in shop.SHOPPERS}
                          if workload.order_runs else {})
                view.update([Row(t.slug, labels[t.slug], snaps[t.slug], queues.get(t.slug)) for t in TENANTS],
                            _status(workload, flood, flood_total, orders))
                if orders and not orders_noted and all(
                        r.finished == r.started == len(workload.order_runs[slug]) for slug, r in orders.items()):
                    orders_noted = True
                    workload.event("shop orders done", f"shop orders done: {_orders_text(orders)}")
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


def _status(workload: Workload, flood: metrics.Live, flood_total: int, orders: dict[str, metrics.Runs]) -> str:
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
    if orders:
        parts.append(f"shop orders: {_orders_text(orders)}")
    else:
        parts.append(f"acme, globex order from the shop {scenario.ORDERS_AFTER_S:g} s in")
    return " · ".join(parts)


def _orders_text(orders: dict[str, metrics.Runs]) -> str:
    return ", ".join(f"{slug} {r.succeeded}/{r.started} shipped" + (f" ({r.failed} failed)" if r.failed else "")
                     for slug, r in orders.items())


# -- the summary -------------------------------------------------------------------------------

def _summary(console: Console, tenants: dict[str, Tenant], log: metrics.ItemLog, weights: dict[str, int],
             t0: datetime, until: float, workload: Workload, data_dir: Path) -> None:
    """The fairness table and what it means, over the workload window (``until`` seconds from ``t0``), then
    the PNG chart in ``data_dir``."""
    dispatches = [d for d in log.dispatches if (d.at - t0).total_seconds() <= until]
    data = metrics.collect(tenants, dispatches, log.work, t0, task_starts=log.task_starts)
    work = metrics.work_shares(data, weights, until)
    _print_shares(console, data, work, metrics.shares(data, weights, until), weights, until)
    trickle = [t.slug for t in TENANTS if t.role == scenario.TRICKLE]
    counted = {slug: s.ratio for slug, s in work.items()
               if s.ratio is not None and s.contested >= MIN_CONTESTED_S and slug not in trickle}
    index = metrics.jain(v for v in counted.values() if v is not None)
    jain = "-" if index is None else f"{index:.3f}"
    _print_notes(console, data["floodco"], until, counted=list(counted), trickle=trickle, jain=jain)
    headline = "While backlogged together, share of worker time (fair share): " + ", ".join(
        f"{slug} {_pct(work[slug].share)} ({_pct(work[slug].fair)})" for slug in counted
    ) + f"; Jain's index {jain}"
    path = _write_chart(data_dir / "demo-throughput.png", data, weights, until, workload, headline)
    console.print(f"Chart: [bold]{path}[/bold]", highlight=False)


def _print_shop(console: Console, tenants: dict[str, Tenant], starts: list[metrics.TaskStart],
                weights: dict[str, int], t0: datetime) -> None:
    """The shop's orders per tenant (PostgreSQL), and how the tenants shared its worker: each one's share of
    the shop's task starts while both had one waiting, against its weighted share (the dispatchers'
    ``task_published`` lines)."""
    runs = {slug: metrics.runs_of(tenants[slug], shop.WORKFLOW) for slug in shop.SHOPPERS}
    shares, totals = metrics.task_shares(starts, weights, queue=shop.QUEUE, t0=t0)
    mine = [s.at for s in starts if s.queue == shop.QUEUE]
    span = (max(mine) - min(mine)).total_seconds() if mine else 0.0
    console.print(
        f"Shop (examples/shop: its own Django project, database and Celery worker x {shop.CONCURRENCY}; queue "
        f"'{shop.QUEUE}' with {shop.CONCURRENCY} slots shared by every tenant): orders {_orders_text(runs)}"
        + ("; the failed order is the one out of stock" if any(r.failed for r in runs.values()) else "")
        + f"; {sum(totals.values())} task starts in {span:.1f} s.", highlight=False)
    contested = max((s.contested for s in shares.values()), default=0)
    console.print(
        f"Shop task starts while acme and globex both had one waiting ({contested:.0f}): " + ", ".join(
            f"{slug} [bold]{_pct(shares[slug].share)}[/bold] (fair {_pct(shares[slug].fair)}, weight "
            f"{weights[slug]}; share ÷ fair {_ratio(shares[slug].ratio)})"
            for slug in shop.SHOPPERS if slug in shares), highlight=False)


def _print_shares(console: Console, data: dict[str, metrics.TenantData], work: dict[str, metrics.Share],
                  dispatches: dict[str, metrics.Share], weights: dict[str, int], until: float) -> None:
    """One row per tenant: runs done, its share of the worker time while it and another tenant were
    backlogged against its fair share, its share of the dispatches then (beside it), waits."""
    table = Table(title=f"Fairness over the {until:.0f} s workload window", title_justify="left",
                  header_style="bold")
    for column, justify in (("tenant", "left"), ("plan (weight)", "left"), ("runs done", "right"),
                            ("worker-s while backlogged", "right"), ("share", "right"), ("fair share", "right"),
                            ("share ÷ fair", "right"), ("dispatches (share)", "right"), ("wait p50", "right"),
                            ("wait p99", "right"), ("run latency p50", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for t in TENANTS:
        row, share, sent = data[t.slug], work[t.slug], dispatches[t.slug]
        done = [finished - created for created, finished in row.runs if finished is not None and finished <= until]
        ratio = "-" if share.ratio is None else f"{share.ratio:.2f}"
        if t.role == scenario.TRICKLE:  # never backlogged for long: served as it arrives (see below)
            ratio = "[dim]trickle[/dim]"
        table.add_row(
            t.slug, f"{t.plan} ({weights[t.slug]})", f"{len(done):,}/{len(row.runs):,}",
            f"{_worker_s(share.got)} of {_worker_s(share.contested)}", _pct(share.share), _pct(share.fair),
            ratio, f"{sent.got:,.0f} ({_pct(sent.share)})", fmt_ms(metrics.percentile(row.waits_ms, 50)),
            fmt_ms(metrics.percentile(row.waits_ms, 99)), _seconds(metrics.percentile(done, 50)),
        )
    console.print(table)


def _print_notes(console: Console, flood: metrics.TenantData, until: float, *, counted: list[str],
                 trickle: list[str], jain: str) -> None:
    """How to read the table: what Jain's index covers, why the trickle is judged by its wait, the flood."""
    console.print(
        f"Jain's index of share ÷ fair over {', '.join(counted) or 'no tenant'}: [bold]{jain}[/bold] (1.0: each "
        "got the same fraction of its weighted share). Worker time is what the workers measured each item's "
        "handler running (run ticks and steps), what the fair queue charges; a tenant's share is its part of the "
        "worker-seconds the tenants with work waiting used while it and another tenant both had work waiting, "
        "and its fair share is its weight ÷ the sum of their weights. Dispatches are the fair queue's hand-outs, "
        "counted the same way; a tenant whose items are cheap gets more of them than its share of worker time. "
        "Waits run from due to dispatch. Task steps (the shop's) run on their team's worker: they are in the shop "
        f"lines below, not here. The trickle ({', '.join(trickle)}) has work waiting only for moments, and a "
        "tenant that has just become active is served at once (within about one round of the others); its items "
        "run once they have left the queue, so of the little work done while it waits almost none is its own: its "
        "figure is its wait.",
        highlight=False)
    finished = sum(1 for _, end in flood.runs if end is not None and end <= until)
    console.print(f"floodco queued {len(flood.runs):,} runs in as many partitions; a run of its is one dispatch, "
                  f"so it finished {finished:,} of them at the rate of its share while the others were "
                  f"backlogged, and faster once they drained. The {len(flood.runs) - finished:,} left are dropped "
                  "with the demo's scratch database.", highlight=False)


def _write_chart(path: Path, data: dict[str, metrics.TenantData], weights: dict[str, int], until: float,
                 workload: Workload, headline: str) -> Path:
    """The PNG at ``path`` (``chart.write_chart``) in ``BUCKET_S`` buckets, the workload's events marked."""
    mids, waits = metrics.waits_per_bucket(data, until, BUCKET_S)
    work = metrics.work_per_bucket(data, weights, until, BUCKET_S)
    flood_runs = len(data["floodco"].runs)
    names = {"floodco floods": f"floodco floods ({flood_runs:,} runs)", "latecomer arrives": "latecomer arrives",
             "shop orders": "acme, globex order from the shop",
             "latecomer done": "latecomer's last run", "acme, globex stop": "acme, globex add no more work (shaded)",
             "others done": "others done"}
    markers = [(at, names[label]) for at, label in workload.events if label in names]
    drain_from = next((at for at, label in workload.events if label == "acme, globex stop"), None)
    labels = {t.slug: f"{t.slug} ({t.plan}, weight {weights[t.slug]})" for t in TENANTS}
    return chart.write_chart(
        path, labels=labels, times=mids, busy=work.busy, processes=WORKERS * WORKER_CONCURRENCY,
        share=work.share, fair=work.fair, waits_ms=waits, markers=markers, drain_from=drain_from, end=until,
        headline=headline,
        subtitle=(f"{WORKERS} Celery worker x {WORKER_CONCURRENCY} processes, {DISPATCHERS} dispatcher; worker time "
                  "is each item's handler run time as its worker measured it (what the fair queue charges), "
                  f"counted where it was spent; {BUCKET_S:g}-second buckets"),
    )


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 100:.1f}%" if value < 0.095 else f"{value * 100:.0f}%"


def _worker_s(value: float) -> str:
    return f"{value:,.1f}" if value < 10 else f"{value:,.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"
