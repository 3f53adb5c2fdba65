"""The demo's figures: every dispatch of the fair queue, the work its workers did, and runs from PostgreSQL.

**Dispatches.** Every item the fair queue hands to a worker (a run's tick or a
step) is logged as one ``dispatched`` line with the tenant and ``waited_ms``,
how long the item had been due: by the dispatcher that published it, or by the
worker that took it itself (handoff). That is the fair queue's own
record, so the demo reads it (``ItemLog``): PostgreSQL keeps no trace of
the ticks that follow each step, and counting only what it keeps (first ticks
and steps) would credit a tenant whose runs are all in their first tick (the
flood, served oldest first) with half as much again as it got.

**Worker time.** Every item a worker ran is logged by that worker as one
``item_finished`` line (tenant, kind, outcome, ``work_ms``: how long its handler
ran, what the fair queue charges its tenant), written as the handler returns. The
item kept one worker process busy over ``[finish - work_ms, finish]``; the demo
attributes its work to that interval, cut where it crosses a bucket's edge or the
window's, rather than to the moment it finished: a bucket then holds the work done
in it, and a 2-second bucket never holds more than the pool's processes x 2 s.
Items that failed count as well (their tenant is charged for them too). Task
steps run on the team's own worker (the shop's), not the pool's: they have no
``item_finished`` line and no part in the worker time.

**Backlogged.** An item waits from when it became due to its dispatch; items
still waiting at the end come from PostgreSQL (runs not started, steps queued).
A tenant is backlogged while one of its items waits. A task step (below) is
dispatched too, but it waits for a slot of its team's worker and runs there: it
is left out of the pool's backlog, dispatches and waits (``collect``), else a
tenant whose only waiting work is task steps would be owed pool time it has no
use for.

**Share of worker time while backlogged (the headline).** Between two events
(an item due or dispatched, an item's work starting or ending) the set of
backlogged tenants and the number of each tenant's items running are constant.
Over every such stretch in which a tenant and at least one other tenant were
backlogged, the tenant is owed ``weight / sum of the backlogged tenants'
weights`` of the work the backlogged tenants' items did, and it got its own part
of that work; its *fair share* is what it was owed over that work, its *share*
what it got of it, and ``share / fair`` is 1.0 for a scheduler that divides
worker time exactly by weight. The work of a tenant with nothing waiting (its
last items finishing) is left out: it was handed out while that tenant was
waiting, and no scheduler can take it back, so owing part of it to the others
would lower all their ratios whenever the tenants come and go. The work done in
a stretch was dispatched a moment before (the dispatch buffer, then the item's
own run time), so a tenant's share lags its backlog by about one item; over a
window of thousands of items that is noise, but a tenant with one item at a time
(the trickle) runs it only once it has stopped waiting, so it shows almost none
of the work done while it waited: its figure is its wait. Per bucket (the
chart), every stretch counts: a tenant alone with work waiting is owed all of
the backlogged tenants' work, and a tenant with nothing waiting is owed what its
items did (nobody was kept from it), so both add up to 1 in every bucket with
work.

**Share of the dispatches** (the secondary column) is counted the same way, one
dispatch at a time: at each dispatch, every backlogged tenant is owed ``weight /
sum of the backlogged tenants' weights`` of it. Jain's index of ``share / fair``
over the tenants is 1.0 when all got the same fraction of what they were owed.

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
    item_id: str


@dataclass(frozen=True)
class TaskStart:
    """A task step published to a team's Celery queue."""

    slug: str
    at: datetime
    waited_ms: float
    task: str
    queue: str
    item_id: str


@dataclass(frozen=True)
class Work:
    """An item a worker ran (its ``item_finished`` line): it kept one worker process busy for ``work_ms``
    until ``finished``."""

    slug: str
    kind: str
    finished: datetime
    work_ms: float


LogRecord = Dispatch | TaskStart | Work
_EVENTS = (b'"dispatched"', b'"task_published"', b'"item_finished"')


def parse_line(line: bytes, slugs: Mapping[str, str]) -> LogRecord | None:
    """The record a child's JSON log line holds, for a tenant in ``slugs`` (tenant id -> slug); None for
    any other line, another tenant's (the system's), or one that does not parse."""
    if not any(event in line for event in _EVENTS):
        return None
    try:
        record = json.loads(line)
        slug = slugs.get(str(record.get("tenant_id")))
        if slug is None:
            return None
        at = datetime.fromisoformat(record["timestamp"])
        event = record.get("event")
        if event == "dispatched":
            return Dispatch(slug, at, float(record.get("waited_ms", 0)), str(record.get("item_id")))
        if event == "task_published":
            return TaskStart(slug, at, float(record.get("waited_ms", 0)), str(record.get("task")),
                             str(record.get("queue")), str(record.get("item_id")))
        if event == "item_finished":
            return Work(slug, str(record.get("kind")), at, float(record["work_ms"]))
        return None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def read_work(paths: Iterable[Path], slugs: Mapping[str, str]) -> list[Work]:
    """Every ``item_finished`` record of the tenants in ``slugs`` in the whole of the files at ``paths``
    (missing files have none)."""
    found: list[Work] = []
    for path in paths:
        if path.exists():
            records = (parse_line(line, slugs) for line in path.read_bytes().splitlines())
            found.extend(record for record in records if isinstance(record, Work))
    return found


class ItemLog:
    """Follows the dispatchers' and workers' log files from where they ended when this was made: the
    dispatches, task starts and finished items of the tenants it knows."""

    def __init__(self, paths: Sequence[Path], tenant_slugs: Mapping[str, str]) -> None:
        self.slugs = dict(tenant_slugs)  # tenant id -> slug; other tenants (the system's) are ignored
        self._offsets = {path: path.stat().st_size if path.exists() else 0 for path in paths}
        self._partial = {path: b"" for path in paths}
        self.dispatches: list[Dispatch] = []
        self.task_starts: list[TaskStart] = []
        self.work: list[Work] = []

    def read(self) -> list[Dispatch]:
        """The dispatches logged since the last call (also kept in ``dispatches``); the task starts
        are kept in ``task_starts``, the finished items in ``work``."""
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
                found = parse_line(line, self.slugs)
                if isinstance(found, Dispatch):
                    new.append(found)
                elif isinstance(found, TaskStart):
                    self.task_starts.append(found)
                elif isinstance(found, Work):
                    self.work.append(found)
        self.dispatches.extend(new)
        return new


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
    work: list[tuple[float, float]] = field(default_factory=list)  # (began, finished): a worker process busy


def collect(tenants: Mapping[str, Tenant], dispatches: Sequence[Dispatch], work: Sequence[Work],
            t0: datetime, *, task_starts: Iterable[TaskStart] = ()) -> dict[str, TenantData]:
    """Dispatched items and the work the workers did from the log; still-waiting items and all runs from
    PostgreSQL (three queries a tenant). The dispatches of task steps (those in ``task_starts``) are left
    out: they waited for their team's worker, not the pool's (module doc)."""
    def sec(value: datetime) -> float:
        return (value - t0).total_seconds()

    tasks = {(start.slug, start.item_id) for start in task_starts}
    data = {slug: TenantData() for slug in tenants}
    for d in dispatches:
        if (d.slug, d.item_id) in tasks:
            continue
        at = sec(d.at)
        data[d.slug].items.append((at - d.waited_ms / 1000, at))
        data[d.slug].waits_ms.append(d.waited_ms)
    for w in work:
        finished = sec(w.finished)
        data[w.slug].work.append((finished - w.work_ms / 1000, finished))
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
    """What a tenant got and was owed of what was shared while it and another tenant were backlogged:
    dispatches (``shares``, ``task_shares``) or worker-seconds (``work_shares``)."""

    got: float  # dispatches to the tenant, or the work its items did, while it and another were backlogged
    contested: float  # the same, to or of anyone
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


# -- worker time ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Stretch:
    """A stretch of the window in which nothing changed: the tenants backlogged, and how many worker
    processes each tenant's items kept busy (``running``; tenants with none are left out)."""

    start: float
    end: float
    backlogged: tuple[str, ...]
    running: Mapping[str, int]

    def work(self, start: float | None = None, end: float | None = None) -> dict[str, float]:
        """The worker-seconds each running tenant's items did in the stretch (or the part of it from
        ``start`` to ``end``)."""
        seconds = (self.end if end is None else end) - (self.start if start is None else start)
        return {slug: n * seconds for slug, n in self.running.items()}


def _stretches(data: Mapping[str, TenantData], until: float) -> Iterator[Stretch]:
    """The window ``[0, until]`` cut wherever a tenant's backlog or its running items change, in time order.

    An item is waiting over ``[due, dispatched)`` (to the end of the window if not dispatched in it);
    work is cut to the window."""
    events: list[tuple[float, int, str, int]] = []  # (time, 0 backlog | 1 running, tenant, +1 or -1)
    for slug, row in data.items():
        for due, dispatched in row.items:
            if due > until:
                continue
            events.append((due, 0, slug, 1))
            if dispatched is not None and dispatched <= until:
                events.append((dispatched, 0, slug, -1))
        for began, finished in row.work:
            if began < until and finished > 0:
                events.append((max(began, 0.0), 1, slug, 1))
                events.append((min(finished, until), 1, slug, -1))
    events.sort()
    waiting: dict[str, int] = defaultdict(int)
    running: dict[str, int] = defaultdict(int)
    last = 0.0

    def now(end: float) -> Stretch:
        return Stretch(last, end, tuple(s for s, n in waiting.items() if n > 0),
                       {s: n for s, n in running.items() if n > 0})

    for at, what, slug, step in events:
        if at > last:
            yield now(at)
            last = at
        (waiting if what == 0 else running)[slug] += step
    if until > last:
        yield now(until)


def work_shares(data: Mapping[str, TenantData], weights: Mapping[str, int], until: float) -> dict[str, Share]:
    """Each tenant's worker-seconds against its weighted share of the backlogged tenants' work, over the
    stretches in which it and another tenant were backlogged (module doc)."""
    got: dict[str, float] = defaultdict(float)
    contested: dict[str, float] = defaultdict(float)
    owed: dict[str, float] = defaultdict(float)
    for stretch in _stretches(data, until):
        if len(stretch.backlogged) < 2:
            continue
        work = stretch.work()
        done = sum(work.get(s, 0.0) for s in stretch.backlogged)
        total = sum(weights[s] for s in stretch.backlogged)
        for s in stretch.backlogged:
            contested[s] += done
            owed[s] += weights[s] / total * done
            got[s] += work.get(s, 0.0)
    return {slug: Share(got[slug], contested[slug], owed[slug]) for slug in data}


@dataclass(frozen=True)
class BucketWork:
    """Per tenant and bucket: ``busy``, the worker processes its items kept busy on average
    (worker-seconds per second); ``share``, its fraction of the work done in the bucket; ``fair``, its
    weighted-fair fraction of that work (None for both: no work done in the bucket)."""

    busy: dict[str, list[float]]
    share: dict[str, list[float | None]]
    fair: dict[str, list[float | None]]


def work_per_bucket(data: Mapping[str, TenantData], weights: Mapping[str, int], until: float,
                    bucket_s: float) -> BucketWork:
    """The work done in each ``bucket_s`` of the window, each stretch's work in the buckets it spans.

    The backlogged tenants' work in a stretch is owed ``weight / sum of the backlogged tenants' weights``
    to each of them (a tenant alone with work waiting is owed all of it), and the work of a tenant with
    nothing waiting to itself; so shares and fair shares both add up to 1 over the tenants in every bucket
    with work.
    """
    buckets = max(1, math.ceil(until / bucket_s))
    done = [0.0] * buckets
    got = {slug: [0.0] * buckets for slug in data}
    owed = {slug: [0.0] * buckets for slug in data}
    for stretch in _stretches(data, until):
        for index, start, end in _pieces(stretch.start, stretch.end, bucket_s, buckets):
            work = stretch.work(start, end)
            done[index] += sum(work.values())
            for s, seconds in work.items():
                got[s][index] += seconds
                if s not in stretch.backlogged:
                    owed[s][index] += seconds
            shared = sum(work.get(s, 0.0) for s in stretch.backlogged)
            weight = sum(weights[s] for s in stretch.backlogged)
            for s in stretch.backlogged:
                owed[s][index] += weights[s] / weight * shared

    def fractions(values: list[float]) -> list[float | None]:
        return [value / total if total else None for value, total in zip(values, done, strict=True)]

    # The last bucket may be cut short by the end of the window.
    lengths = [max(min(bucket_s, until - i * bucket_s), 0.1) for i in range(buckets)]
    return BucketWork(
        busy={slug: [v / length for v, length in zip(row, lengths, strict=True)] for slug, row in got.items()},
        share={slug: fractions(row) for slug, row in got.items()},
        fair={slug: fractions(row) for slug, row in owed.items()},
    )


def _pieces(start: float, end: float, bucket_s: float, buckets: int) -> Iterator[tuple[int, float, float]]:
    """``[start, end)`` cut at the buckets' edges: (bucket, start, end) for each piece; the last bucket
    takes whatever lies beyond it."""
    index = min(int(start // bucket_s), buckets - 1)
    while start < end:
        edge = end if index == buckets - 1 else min(end, (index + 1) * bucket_s)
        yield index, start, edge
        start, index = edge, index + 1


def waits_per_bucket(data: Mapping[str, TenantData], until: float,
                     bucket_s: float) -> tuple[list[float], dict[str, list[float | None]]]:
    """Bucket mids, and the median wait (ms; None: no dispatch) per tenant and bucket of its dispatches."""
    buckets = max(1, math.ceil(until / bucket_s))
    mids = [(i + 0.5) * bucket_s for i in range(buckets)]
    waits: dict[str, list[float | None]] = {}
    for slug, row in data.items():
        grouped: list[list[float]] = [[] for _ in range(buckets)]
        for due, dispatched in row.items:
            if dispatched is not None and 0 <= dispatched < buckets * bucket_s:
                grouped[int(dispatched // bucket_s)].append((dispatched - due) * 1000)
        waits[slug] = [percentile(group, 50) for group in grouped]
    return mids, waits
