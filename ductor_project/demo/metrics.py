"""The demo's figures: every dispatch of the fair queue, and runs from PostgreSQL.

**Dispatches.** Every item the fair queue hands to a worker (a run's tick or a
step) is logged as one ``dispatched`` line with the tenant and ``waited_ms``,
how long the item had been due: by the dispatcher that published it, or by the
worker that took it itself (handoff). That is the fair queue's own
record, so the demo reads it (``DispatchLog``): PostgreSQL keeps no trace of
the ticks that follow each step, and counting only what it keeps (first ticks
and steps) would credit a tenant whose runs are all in their first tick (the
flood, served oldest first) with half as much again as it got.

**Share while backlogged.** An item waits from when it became due to its
dispatch; items still waiting at the end come from PostgreSQL (runs not
started, steps queued). A tenant is backlogged while one of its items waits. At
each dispatch, every backlogged tenant is owed ``weight / sum of the
backlogged tenants' weights`` of it; a tenant's *fair share* is what it was
owed over the dispatches that happened while it was backlogged and another
tenant was too, its *share* is what it got of them, and ``share / fair`` is 1.0
for an exactly weighted-fair scheduler. Jain's index of ``share / fair`` over
the tenants is 1.0 when all got the same fraction of what they were owed.

**Task starts.** A task step published to a team's Celery queue is logged by
the dispatcher as one ``task_published`` line (tenant, task, queue,
``waited_ms``) instead: ``task_shares`` counts a queue's starts the same way.

Runs (counts, latency) come from PostgreSQL, each tenant under its own context.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from django.db.models import Count, Q

from ductor_project.core.context import tenant_context
from tenants.models import Tenant
from workflows.models import StepRun, WorkflowRun

TERMINAL = [str(s) for s in WorkflowRun.TERMINAL]
RECENT_S = 5.0


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def jain(values: Iterable[float]) -> float | None:
    """Jain's fairness index: (Σx)² / (n·Σx²); 1.0 when all are equal, 1/n when one has everything."""
    xs = list(values)
    if not xs or not any(xs):
        return None
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


# -- the dispatcher's log --------------------------------------------------------------------------

@dataclass(frozen=True)
class Dispatch:
    slug: str
    at: datetime
    waited_ms: float


@dataclass(frozen=True)
class TaskStart:
    """A task step published to a team's Celery queue."""

    slug: str
    at: datetime
    waited_ms: float
    task: str
    queue: str


class DispatchLog:
    """Follows the dispatchers' log files from where they ended when this was made."""

    def __init__(self, paths: Sequence[Path], tenant_slugs: Mapping[str, str]) -> None:
        self.slugs = dict(tenant_slugs)  # tenant id -> slug; other tenants (the system's) are ignored
        self._offsets = {path: path.stat().st_size if path.exists() else 0 for path in paths}
        self._partial = {path: b"" for path in paths}
        self.dispatches: list[Dispatch] = []
        self.task_starts: list[TaskStart] = []

    def read(self) -> list[Dispatch]:
        """The dispatches logged since the last call (also kept in ``dispatches``); the task starts
        are kept in ``task_starts``."""
        new: list[Dispatch] = []
        for path, offset in self._offsets.items():
            if not path.exists():
                continue
            with path.open("rb") as handle:
                handle.seek(offset)
                chunk = self._partial[path] + handle.read()
                self._offsets[path] = handle.tell()
            lines = chunk.split(b"\n")
            self._partial[path] = lines.pop()  # an unfinished last line waits for the next read
            for line in lines:
                found = self._parse(line)
                if isinstance(found, Dispatch):
                    new.append(found)
                elif found is not None:
                    self.task_starts.append(found)
        self.dispatches.extend(new)
        return new

    def _parse(self, line: bytes) -> Dispatch | TaskStart | None:
        if b'"dispatched"' not in line and b'"task_published"' not in line:
            return None
        try:
            record = json.loads(line)
            slug = self.slugs.get(str(record.get("tenant_id")))
            if slug is None:
                return None
            at, waited_ms = datetime.fromisoformat(record["timestamp"]), float(record.get("waited_ms", 0))
            if record.get("event") == "dispatched":
                return Dispatch(slug, at, waited_ms)
            if record.get("event") == "task_published":
                return TaskStart(slug, at, waited_ms, str(record.get("task")), str(record.get("queue")))
            return None
        except (ValueError, KeyError, TypeError):
            return None


# -- live --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Live:
    started: int
    finished: int
    failed: int
    running: int
    dispatches_per_s: float
    wait_p50_ms: float | None


def live(tenant: Tenant, recent: Sequence[Dispatch]) -> Live:
    """Runs started/finished so far (one query), and the tenant's recent dispatches (rate, median wait)."""
    with tenant_context(tenant):
        counts = WorkflowRun.objects.aggregate(
            started=Count("id"),
            finished=Count("id", filter=Q(status__in=TERMINAL)),
            failed=Count("id", filter=Q(status__in=["failed", "cancelled"])),
            running=Count("id", filter=Q(status__in=["running", "waiting"])),
        )
    mine = [d.waited_ms for d in recent if d.slug == tenant.slug]
    return Live(counts["started"], counts["finished"], counts["failed"], counts["running"], len(mine) / RECENT_S,
                percentile(mine, 50))


@dataclass(frozen=True)
class Runs:
    started: int
    succeeded: int
    failed: int  # failed or cancelled

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed


def runs_of(tenant: Tenant, workflow: str) -> Runs:
    """The tenant's runs of ``workflow`` so far (one query)."""
    with tenant_context(tenant):
        counts = WorkflowRun.objects.filter(workflow_name=workflow).aggregate(
            started=Count("id"),
            succeeded=Count("id", filter=Q(status="succeeded")),
            failed=Count("id", filter=Q(status__in=["failed", "cancelled"])),
        )
    return Runs(counts["started"], counts["succeeded"], counts["failed"])


def recent(dispatches: Sequence[Dispatch], now: datetime) -> list[Dispatch]:
    cutoff = now - timedelta(seconds=RECENT_S)
    return [d for d in dispatches[-5000:] if d.at >= cutoff]


# -- after the run -----------------------------------------------------------------------------

@dataclass
class TenantData:
    """One tenant's work and runs, in seconds from the demo's start."""

    items: list[tuple[float, float | None]] = field(default_factory=list)  # (due, dispatched or None)
    waits_ms: list[float] = field(default_factory=list)
    runs: list[tuple[float, float | None]] = field(default_factory=list)  # (created, finished)


def collect(tenants: Mapping[str, Tenant], dispatches: Sequence[Dispatch], t0: datetime) -> dict[str, TenantData]:
    """Dispatched items from the log; still-waiting items and all runs from PostgreSQL (three queries a tenant)."""
    def sec(value: datetime) -> float:
        return (value - t0).total_seconds()

    data = {slug: TenantData() for slug in tenants}
    for d in dispatches:
        at = sec(d.at)
        data[d.slug].items.append((at - d.waited_ms / 1000, at))
        data[d.slug].waits_ms.append(d.waited_ms)
    for slug, tenant in tenants.items():
        row = data[slug]
        with tenant_context(tenant):
            for created, finished in WorkflowRun.objects.values_list("created_at", "finished_at").iterator(2000):
                row.runs.append((sec(created), None if finished is None else sec(finished)))
            never = WorkflowRun.objects.filter(started_at__isnull=True).exclude(status__in=TERMINAL)
            row.items.extend((sec(created), None) for created in never.values_list("created_at", flat=True))
            queued = StepRun.objects.filter(status__in=["queued", "scheduled"], started_at__isnull=True)
            for created, scheduled in queued.values_list("created_at", "scheduled_for"):
                row.items.append((sec(max(created, scheduled or created)), None))
    return data


@dataclass(frozen=True)
class Share:
    got: int  # dispatches to the tenant while it and another tenant were backlogged
    contested: int  # dispatches (to anyone) while the tenant and another tenant were backlogged
    owed: float  # the tenant's weighted share of those

    @property
    def share(self) -> float | None:
        return self.got / self.contested if self.contested else None

    @property
    def fair(self) -> float | None:
        return self.owed / self.contested if self.contested else None

    @property
    def ratio(self) -> float | None:
        return self.got / self.owed if self.owed else None


def _dispatch_walk(data: Mapping[str, TenantData], until: float) -> Iterator[tuple[float, str, list[str]]]:
    """Each dispatch up to ``until``, in time order: (when, to whom, the tenants backlogged just before it)."""
    events: list[tuple[float, int, str]] = []  # (time, 0 due | 1 dispatched, tenant)
    for slug, row in data.items():
        for due, dispatched in row.items:
            if due > until:
                continue
            events.append((due, 0, slug))
            if dispatched is not None and dispatched <= until:
                events.append((dispatched, 1, slug))
    events.sort()
    waiting: dict[str, int] = defaultdict(int)
    for at, kind, slug in events:
        if kind == 0:
            waiting[slug] += 1
            continue
        yield at, slug, [s for s, n in waiting.items() if n > 0]
        waiting[slug] -= 1


def shares(data: Mapping[str, TenantData], weights: Mapping[str, int], until: float) -> dict[str, Share]:
    """Each tenant's dispatches against its weighted share, while it was backlogged (module doc)."""
    got: dict[str, int] = defaultdict(int)
    contested: dict[str, int] = defaultdict(int)
    owed: dict[str, float] = defaultdict(float)
    for _, slug, backlogged in _dispatch_walk(data, until):
        if len(backlogged) > 1:
            total = sum(weights[s] for s in backlogged)
            for s in backlogged:
                contested[s] += 1
                owed[s] += weights[s] / total
            got[slug] += 1
    return {slug: Share(got[slug], contested[slug], owed[slug]) for slug in data}


def task_shares(starts: Sequence[TaskStart], weights: Mapping[str, int], *, queue: str,
                t0: datetime) -> tuple[dict[str, Share], dict[str, int]]:
    """Each tenant's starts of ``queue``'s tasks against its weighted share while it and another
    tenant both had one waiting (counted as ``shares`` counts dispatches), and how many it had in
    all. An item is waiting from ``waited_ms`` before its start; only started items are known (the
    log has no line for one still waiting), so the demo reads this once every task has started."""
    data: dict[str, TenantData] = defaultdict(TenantData)
    for start in starts:
        if start.queue == queue:
            at = (start.at - t0).total_seconds()
            data[start.slug].items.append((at - start.waited_ms / 1000, at))
    until = max((at for row in data.values() for _, at in row.items if at is not None), default=0.0)
    return shares(data, weights, until), {slug: len(row.items) for slug, row in data.items()}


def shares_per_bucket(data: Mapping[str, TenantData], weights: Mapping[str, int], until: float,
                      bucket_s: float) -> tuple[dict[str, list[float | None]], dict[str, list[float | None]]]:
    """Per tenant and bucket: its fraction of the bucket's dispatches, and its weighted-fair fraction of them.

    The fair fraction of a dispatch is ``weight / sum of the backlogged tenants' weights`` for each
    backlogged tenant (a tenant alone with work is owed all of it), so both add up to 1 over the
    tenants in every bucket with a dispatch; None for a bucket without one.
    """
    buckets = max(1, math.ceil(until / bucket_s))
    count = [0] * buckets
    got = {slug: [0.0] * buckets for slug in data}
    owed = {slug: [0.0] * buckets for slug in data}
    for at, slug, backlogged in _dispatch_walk(data, until):
        index = min(max(int(at // bucket_s), 0), buckets - 1)
        count[index] += 1
        got[slug][index] += 1
        total = sum(weights[s] for s in backlogged)
        for s in backlogged:
            owed[s][index] += weights[s] / total

    def fractions(values: list[float]) -> list[float | None]:
        return [value / n if n else None for value, n in zip(values, count, strict=True)]

    return ({slug: fractions(row) for slug, row in got.items()},
            {slug: fractions(row) for slug, row in owed.items()})


def per_bucket(data: Mapping[str, TenantData], until: float,
               bucket_s: float) -> tuple[list[float], dict[str, list[float]], dict[str, list[float | None]]]:
    """Bucket mids; dispatches per second and the median wait (ms; None: no dispatch) per tenant and bucket."""
    buckets = max(1, math.ceil(until / bucket_s))
    mids = [(i + 0.5) * bucket_s for i in range(buckets)]
    rates: dict[str, list[float]] = {}
    waits: dict[str, list[float | None]] = {}
    for slug, row in data.items():
        grouped: list[list[float]] = [[] for _ in range(buckets)]
        for due, dispatched in row.items:
            if dispatched is not None and 0 <= dispatched < buckets * bucket_s:
                grouped[int(dispatched // bucket_s)].append((dispatched - due) * 1000)
        # The last bucket may be cut short by the end of the window.
        rates[slug] = [len(group) / max(min(bucket_s, until - i * bucket_s), 0.1) for i, group in enumerate(grouped)]
        waits[slug] = [percentile(group, 50) for group in grouped]
    return mids, rates, waits

