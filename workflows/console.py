"""The run console: what the admin shows operators and tenant staff of runs and of a tenant.

Reads only, for the admin's run list, run page and tenant page (``workflows.admin`` serves them):

- times to the millisecond (``17:20:01.123``) and durations in the unit that fits them
  (``12.4 ms``, ``1.203 s``, ``3 min 2 s``): what a step cost can be read off the page;
- the timeline: every attempt of every node on the run's own time axis, what it waited
  (queued to started) and what it ran (started to finished);
- an attempt's routing trace in one line: ``rule r → pool p → connection c, because …``;
- the lineage: parent and child runs, the run it continued from and its successor;
- a tenant's usage against its plan, its queue now, and its recent share of step starts
  against its weight-fair share.

A run's rows are read in the run's tenant context, through the scoped managers. The fairness
share is the one read across tenants: it counts every tenant's step starts, and only a
superuser's page says whose they are. The tenant page lives here, not in ``tenants``, because
it reads the queue and the steps (``tenants`` imports neither).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Q
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ductor_project.core.context import tenant_context
from scheduling import fair_queue
from tenants.entitlements import CEILING_FIELDS, effective_entitlements, resolve_many
from tenants.models import Tenant, Tier
from tenants.selectors import entitlements_report
from workflows.dag_svg import COLOURS
from workflows.models import StepRun, WorkflowRun
from workflows.selectors import steps_preview
from workflows.why import Waiting, why_waiting

EMPTY = "—"
# A status the DAG has no colour for (a run's ``continued``).
OTHER_COLOUR = "#455a64"
# Backgrounds light enough to need dark text.
LIGHT_COLOURS = frozenset({"#bdbdbd", "#9e9e9e"})
# The most attempts, and payload bytes, one run page shows (the first ones, in order).
MAX_ATTEMPTS = 300
MAX_ATTEMPT_BYTES = 2_000_000
# The most children the lineage links.
MAX_CHILD_LINKS = 50
# Step starts counted for the fairness share.
FAIRNESS_WINDOW = timedelta(minutes=5)
TIERS = tuple(Tier.values)


# --- times and durations --------------------------------------------------------------------


def clock(value: datetime | None) -> str:
    """``17:20:01.123`` in the current time zone, or ``—``."""
    if value is None:
        return EMPTY
    local = timezone.localtime(value)
    return f"{local:%H:%M:%S}.{local.microsecond // 1000:03d}"


def moment(value: datetime | None) -> str:
    """``2025-12-01 17:20:01.123 UTC`` in the current time zone, named, or ``—``."""
    if value is None:
        return EMPTY
    local = timezone.localtime(value)
    return f"{local:%Y-%m-%d} {clock(value)} {local:%Z}"


def duration_text(seconds: float) -> str:
    """A duration in the unit that fits it: ``0.8 ms``, ``12.4 ms``, ``1.203 s``, ``3 min 2 s``,
    ``2 h 5 min``, ``3 d 4 h``. A negative one (clocks of two hosts) reads as 0."""
    seconds = max(seconds, 0.0)
    if seconds < 0.99995:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 60:
        return f"{seconds:.3f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def span_text(start: datetime | None, end: datetime | None, *, done: bool, now: datetime,
              ongoing: str = "running for") -> str:
    """``end - start``; ``running for …`` (``ongoing``) while it has no end and is not ``done``;
    ``—`` when it never started (or ended without an end time)."""
    if start is None or (end is None and done):
        return EMPTY
    if end is None:
        return f"{ongoing} {duration_text((now - start).total_seconds())}"
    return duration_text((end - start).total_seconds())


def run_duration(run: WorkflowRun, now: datetime | None = None) -> str:
    """How long the run ran (finished - started), ``running for …`` while it runs."""
    if run.started_at is None and not run.is_terminal:
        return "not started"
    return span_text(run.started_at, run.finished_at, done=run.is_terminal, now=now or timezone.now())


# --- statuses ---------------------------------------------------------------------------------


def status_colour(status: str) -> str:
    """The status's colour: the DAG's, so the badge and the drawing agree."""
    return COLOURS.get(status, OTHER_COLOUR)


def status_badge(status: str) -> SafeString:
    """A small coloured badge naming the status (styled by ``.ductor-badge``)."""
    colour = status_colour(status)
    ink = "#1b1b1b" if colour in LIGHT_COLOURS else "#ffffff"
    return format_html('<span class="ductor-badge" style="background-color: {}; color: {}">{}</span>',
                       colour, ink, status)


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


# --- routing ------------------------------------------------------------------------------------


def _named(value: Any, key: str = "name") -> str:
    return str(value.get(key) or value.get("id") or "?") if isinstance(value, dict) else ""


def routing_line(trace: dict[str, Any] | None) -> str:
    """An attempt's routing trace (``RoutingDecision.trace()``, with what its admission added) in
    one line: ``rule r → pool p → connection c, because …``. The reason is admission's when it
    chose a connection, else the decision's."""
    if not trace:
        return "not routed: the engine runs this step itself"
    rule = f"rule {_named(trace.get('rule'))}" if isinstance(trace.get("rule"), dict) else "default rule"
    if not trace.get("allowed", True):
        return f"{rule} → refused, because {trace.get('reason') or 'no reason recorded'}"
    pool = trace.get("pool")
    connection = trace.get("connection")
    if isinstance(connection, dict):
        chosen = f"connection {_named(connection)}"
    elif pool is None or trace.get("admitted"):
        chosen = "no connection"
    else:
        chosen = "connection not chosen yet"
    pool_text = f"pool {_named(pool)}" if isinstance(pool, dict) else "no pool"
    because = trace.get("admitted") or trace.get("reason") or "no reason recorded"
    return f"{rule} → {pool_text} → {chosen}, because {because}"


# --- the timeline -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """A stretch of the run's time axis, in percent of it (CSS ``left`` and ``width``)."""

    left: str
    width: str


@dataclass(frozen=True)
class Axis:
    """The run's time axis: from its creation to its end (now, while it runs)."""

    start: datetime
    end: datetime

    @property
    def seconds(self) -> float:
        return max((self.end - self.start).total_seconds(), 0.001)

    def bar(self, start: datetime | None, end: datetime | None) -> Bar | None:
        if start is None or end is None:
            return None
        left = min(max((start - self.start).total_seconds() / self.seconds, 0.0), 1.0)
        width = min(max((end - start).total_seconds() / self.seconds, 0.0), 1.0 - left)
        return Bar(f"{left * 100:.3f}", f"{max(width * 100, 0.2):.3f}")

    def ticks(self, count: int = 4) -> list[tuple[str, str]]:
        """``count + 1`` labels along the axis: (left in percent, offset from the start)."""
        return [(f"{100 * i / count:.3f}", "+" + duration_text(self.seconds * i / count) if i else "0")
                for i in range(count + 1)]


@dataclass(frozen=True)
class Attempt:
    """One attempt of one node as the timeline shows it."""

    step: StepRun
    queued: str
    started: str
    finished: str
    waited: str
    ran: str
    routing: str
    routing_trace: str
    colour: str
    wait_bar: Bar | None
    run_bar: Bar | None
    payloads: list[tuple[str, str]]

    @property
    def badge(self) -> SafeString:
        return status_badge(self.step.status)


@dataclass(frozen=True)
class Timeline:
    attempts: list[Attempt]
    total: int
    ticks: list[tuple[str, str]]

    @property
    def truncated(self) -> bool:
        return len(self.attempts) < self.total


def _axis(run: WorkflowRun, steps: list[StepRun], now: datetime) -> Axis:
    moments = [t for step in steps for t in (step.created_at, step.started_at, step.finished_at) if t]
    start = min([run.created_at, *moments])
    end = max([run.finished_at or (start if run.is_terminal else now), *moments])
    return Axis(start, end)


def _attempt(step: StepRun, axis: Axis, now: datetime) -> Attempt:
    done = step.status in StepRun.TERMINAL
    running_until = step.finished_at or (None if done else now)
    payloads = [(name, pretty_json(getattr(step, name)))
                for name in ("input", "output", "error") if getattr(step, name) is not None]
    return Attempt(
        step=step, queued=clock(step.created_at), started=clock(step.started_at), finished=clock(step.finished_at),
        waited=span_text(step.created_at, step.started_at, done=done or step.started_at is not None, now=now,
                         ongoing="waiting for"),
        ran=span_text(step.started_at, step.finished_at, done=done, now=now),
        routing=routing_line(step.routing), routing_trace=pretty_json(step.routing) if step.routing else "",
        colour=status_colour(step.status),
        wait_bar=axis.bar(step.created_at, step.started_at or running_until),
        run_bar=axis.bar(step.started_at, running_until), payloads=payloads,
    )


def timeline(run: WorkflowRun, now: datetime | None = None) -> Timeline:
    """Every attempt of every node of ``run`` (the first ``MAX_ATTEMPTS``), in the order they were
    created, placed on the run's time axis. Reads in the run's tenant context."""
    now = now or timezone.now()
    with tenant_context(run.tenant):
        preview = steps_preview(run, MAX_ATTEMPTS, MAX_ATTEMPT_BYTES)
    axis = _axis(run, preview.steps, now)
    return Timeline([_attempt(step, axis, now) for step in preview.steps], preview.total, axis.ticks())


# --- lineage ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunLink:
    """Another run of the same lineage, and how it relates to this one."""

    relation: str
    run_id: Any
    workflow_name: str
    status: str
    node_id: str = ""

    @property
    def badge(self) -> SafeString:
        return status_badge(self.status)


def _relation(run: WorkflowRun, row: dict[str, Any]) -> str:
    if row["id"] == run.parent_run_id:
        return "parent"
    if row["id"] == run.continued_from_id:
        return "continued from"
    if row["continued_from_id"] == run.pk:
        return "successor"
    if row["id"] == run.rerun_of_id:
        return "rerun of"
    if row["rerun_of_id"] == run.pk:
        return "rerun"
    return "child"


def lineage(run: WorkflowRun) -> list[RunLink]:
    """The parent, the predecessor (ContinueAsNew), the successor, the run it reruns, and the first
    children and reruns of ``run``: one query, in the run's tenant context."""
    related = Q(parent_run_id=run.pk) | Q(continued_from_id=run.pk) | Q(rerun_of_id=run.pk)
    known = [pk for pk in (run.parent_run_id, run.continued_from_id, run.rerun_of_id) if pk]
    if known:
        related |= Q(pk__in=known)
    with tenant_context(run.tenant):
        rows = list(WorkflowRun.objects.filter(related).order_by("created_at").values(
            "id", "workflow_name", "status", "parent_run_id", "parent_node_id", "continued_from_id", "rerun_of_id",
        )[:MAX_CHILD_LINKS + len(known) + 1])
    order = {"parent": 0, "continued from": 1, "rerun of": 2, "successor": 3, "child": 4, "rerun": 5}
    links = [RunLink(_relation(run, row), row["id"], row["workflow_name"], row["status"],
                     row["parent_node_id"] if row["parent_run_id"] == run.pk else "") for row in rows]
    return sorted(links, key=lambda link: order[link.relation])


# --- why it waits and what can be done ------------------------------------------------------------


@dataclass(frozen=True)
class WaitingRow:
    """One waiting step and what holds it (``workflows.why.Waiting``), as the run page shows it."""

    waiting: Waiting
    until: str
    details: str


def until_text(until: datetime | None, now: datetime) -> str:
    """``17:20:05.000 (in 3.200 s)``, or ``—``."""
    if until is None:
        return EMPTY
    return f"{clock(until)} (in {duration_text((until - now).total_seconds())})"


def waiting(run: WorkflowRun, now: datetime | None = None) -> list[WaitingRow]:
    """What holds each waiting step of ``run`` (``workflows.why``), in the run's tenant context;
    nothing for a finished run."""
    if run.is_terminal:
        return []
    now = now or timezone.now()
    with tenant_context(run.tenant):
        found = why_waiting(run)
    return [WaitingRow(w, until_text(w.until, now), pretty_json(w.details) if w.details else "") for w in found]


@dataclass(frozen=True)
class RunAction:
    """A button of the run page: a POST to the admin URL ``url_name`` (with the run's id), offered
    while ``offered(run)`` holds and the user may take it."""

    name: str
    label: str
    url_name: str
    offered: Callable[[WorkflowRun], bool]


# The run page's actions. An action joins this list together with the service that carries it
# out and its admin view.
RUN_ACTIONS: tuple[RunAction, ...] = (
    RunAction("cancel", "Cancel run", "admin:workflows_workflowrun_cancel",
              lambda run: not run.is_terminal and not run.cancel_requested),
    RunAction("retry", "Retry run", "admin:workflows_workflowrun_retry",
              lambda run: run.status == WorkflowRun.Status.FAILED and run.parent_run_id is None),
    RunAction("rerun", "Rerun", "admin:workflows_workflowrun_rerun", lambda run: True),
)


# --- the tenant page ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """One limit of the plan and how much of it is used."""

    label: str
    used: int
    limit: int
    note: str = ""

    @property
    def percent(self) -> int:
        return min(100, round(100 * self.used / self.limit)) if self.limit > 0 else 100

    @property
    def used_text(self) -> str:
        return f"{self.used:,}"

    @property
    def limit_text(self) -> str:
        return f"{self.limit:,}"

    @property
    def full(self) -> bool:
        return self.used >= self.limit


def plan_usage(report: dict[str, Any]) -> list[Usage]:
    """The usage rows of ``entitlements_report``: runs this month, steps in flight, each ceiling."""
    limits, used = report["limits"], report["usage"]
    resets = report["resets"]["monthly_run_quota"]
    rows = [
        Usage("runs this month", used["runs_this_month"], limits["monthly_run_quota"],
              f"resets {timezone.localtime(resets):%Y-%m-%d %H:%M %Z}"),
        Usage("steps in flight", used["steps_in_flight"], limits["max_concurrency"], "the tenant's concurrency"),
    ]
    rows += [Usage(kind.replace("_", " "), used["objects"][kind], limits[limit])
             for kind, limit in CEILING_FIELDS.items()]
    return rows


@dataclass(frozen=True)
class TierRow:
    tier: str
    backlog: int
    due: int
    in_flight: int
    oldest: str


def queue_rows(tenant: Tenant, tiers: list[str]) -> list[TierRow]:
    """The tenant's queue now, per tier then in total (``fair_queue.stats``: one Redis round trip):
    the ``tiers`` its plan allows, and any other that holds something."""
    stats = fair_queue.stats(tenant)
    shown = [(tier, s) for tier, s in stats.tiers.items() if tier in tiers or s.backlog or s.in_flight]
    by_tier = sorted(shown, key=lambda item: TIERS.index(item[0]) if item[0] in TIERS else len(TIERS))

    def age(ms: int) -> str:
        return duration_text(ms / 1000) if ms > 0 else EMPTY

    rows = [TierRow(tier, s.backlog, s.due, s.in_flight, age(s.oldest_waiting_ms)) for tier, s in by_tier]
    rows.append(TierRow("total", stats.backlog, stats.due, stats.in_flight, age(stats.oldest_waiting_ms)))
    return rows


@dataclass(frozen=True)
class Share:
    """A tenant's step starts in the window, against its weight-fair share among the tenants that
    started steps in it."""

    tenant: Tenant
    starts: int
    weight: int
    share: float
    fair_share: float

    @property
    def share_percent(self) -> str:
        return f"{100 * self.share:.1f}%"

    @property
    def fair_percent(self) -> str:
        return f"{100 * self.fair_share:.1f}%"

    @property
    def ratio(self) -> str:
        return f"{self.share / self.fair_share:.2f}" if self.fair_share > 0 and self.starts else EMPTY


@dataclass(frozen=True)
class Fairness:
    """Step starts of the last ``window_s`` seconds: the tenant's share, the totals, and (for a
    superuser only) every tenant's share."""

    window_s: int
    total_starts: int
    tenants: int
    total_weight: int
    own: Share
    everyone: list[Share] = field(default_factory=list)

    @property
    def window(self) -> str:
        return f"{self.window_s // 60} min" if self.window_s % 60 == 0 else f"{self.window_s} s"


def _weight(tenant: Tenant) -> int:
    with tenant_context(tenant):  # each tenant's limits are read in its own context
        return effective_entitlements(tenant).weight


def recent_starts(since: datetime) -> dict[Any, int]:
    """Step starts since ``since`` per tenant id. Crosses tenants: counts only."""
    counts = StepRun.all_tenants.filter(started_at__gte=since).values_list("tenant_id").annotate(n=Count("id"))
    return {tenant_id: n for tenant_id, n in counts.order_by()}


def fairness(tenant: Tenant, *, everyone: bool, now: datetime | None = None) -> Fairness:
    """``tenant``'s share of the step starts of the last ``FAIRNESS_WINDOW``, against its
    weight-fair share: its weight over the weights of the tenants that started steps (a tenant
    that started none is weighed as if it had joined them). The system tenant is left out: its
    tier goes first, it is not weighed."""
    starts = recent_starts((now or timezone.now()) - FAIRNESS_WINDOW)
    active = [t for t in Tenant.objects.filter(pk__in=list(starts)) if not t.is_system]
    # Read together: each tenant's own, on a page that ranks hundreds of them, was its round trips each.
    weights = {pk: limits.weight for pk, limits in resolve_many(active).items()}
    active = [t for t in active if t.pk in weights]
    active_weight = sum(weights.values())
    total = sum(starts[t.pk] for t in active)

    def share(of: Tenant) -> Share:
        if of.pk in weights:
            count, weight, weighed = starts[of.pk], weights[of.pk], active_weight
        else:
            count, weight = 0, _weight(of)
            weighed = active_weight + weight
        return Share(of, count, weight, count / total if total else 0.0, weight / weighed if weighed else 0.0)

    ranked = sorted(active, key=lambda t: (-starts[t.pk], t.slug)) if everyone else []
    return Fairness(int(FAIRNESS_WINDOW.total_seconds()), total, len(active), active_weight, share(tenant),
                    [share(t) for t in ranked])


def tenant_page(tenant: Tenant, *, everyone: bool) -> dict[str, Any]:
    """What the tenant page shows: its plan and usage, its queue, its recent fairness share."""
    with tenant_context(tenant):
        report = entitlements_report(tenant)
        queue = queue_rows(tenant, report["limits"]["allowed_tiers"])
    return {
        "limits": report["limits"], "usage": plan_usage(report), "queue": queue,
        "fairness": fairness(tenant, everyone=everyone),
    }
