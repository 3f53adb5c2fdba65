"""End-to-end fairness through real Celery workers: the fair broker against plain Celery, same run.

An adversarial mix, published in the same order on both sides:

- ``fair-heavy`` (weight 1): 3,000 partitions x 3 items, enqueued first;
- ``fair-light-1/2/3`` (weights 1, 2 and 4): 5 partitions each, enough items to stay
  backlogged through the whole window, enqueued right after;
- ``fair-trickle`` (weight 1): arrives once the others are backlogged and enqueues one item
  at a time, the next one as soon as the previous one started.

Every task sleeps ``TASK_MS`` and, when it starts, appends ``<tenant>|<item>`` to one Redis
list: the list is the order in which tasks actually started. Weights come from the plans
(free = 1, pro = 4) and one override (2); rate and concurrency ceilings are lifted by
overrides so that only the scheduling is measured.

- **Ductor**: ``WORKERS`` x ``CONCURRENCY`` real ``celery -A ductor_project worker``
  processes and ``DISPATCHERS`` ``manage.py run_dispatcher`` processes; items go through
  the fair queue (``bench.sleep`` items, see ``bench/_worker_tasks.py``).
- **Celery baseline**: the same number of workers and processes of a plain Celery app with
  default settings (one shared queue, prefetch 4, early ack; ``bench/_plain_celery.py``),
  the same tasks published in the same order.

Figures, over the window from the moment every non-trickle tenant is backlogged until
``WINDOW_STARTS`` tasks started (or a non-trickle tenant ran dry): each non-trickle
tenant's share of the starts divided by its weight's share (ideal 1.0), the worst of those,
Jain's index of them, and the trickle tenant's wait in dispatch slots (tasks of others that
started between its enqueue and its start) p50/p99/max. The last trickle item may start
after the window closed (its full wait counts); one that has not started 10 s later (plain
Celery: never within the run) counts with the slots it waited so far
(``trickle_censored``). Since the trickle tenant comes back as soon as its item started,
start-time fair queueing serves it once per weighted round of the others
(``trickle_round_slots`` = their weights over its weight), plus the messages already
published ahead of it (at most the dispatch buffer).

Two more scenarios, with the three light tenants (weights 1, 2 and 4), each in both cost modes
in the same run (``DUCTOR_FAIR_COST``: ``time``, the product's default, and ``items``, the baseline):

- ``work``: fair by work. The three tenants' items take ``WORK_MS`` (100, 10 and 30 ms). Over a
  window of ``WORK_WINDOW_S`` (after ``WORK_WARMUP_S``, with every tenant backlogged to its end),
  each tenant's share of the worker time its items used (``bench.work`` records each item's start
  and end on the worker; intervals are cut to the window) over its weight's share.
- ``keys``: two levels. ``fair-keys`` (weight 1) has ``KEYS`` fairness keys: one floods
  (``KEY_FLOOD`` items), each of the others keeps one item waiting, enqueueing the next as soon as
  the previous started; ``fair-other`` (weight 1) is backlogged beside it. The other keys' waits in
  the keyed tenant's dispatch slots (its starts between an enqueue and that item's start) p50/p99,
  against ``active_keys``; and the keyed tenant's share of all starts over its weight's share.
- ``steps``: bulk-started one-node runs through the engine (``STEP_RUNS`` per tenant, started
  before the pipeline is up, so each tenant's first ticks are all waiting): each tenant's share of
  the step starts (``StepRun.started_at``) per weight, over the window from the first step start
  until the first tenant's last one; beside it (``work``) each tenant's share of the worker time its
  items (ticks and steps) used in that window, from the workers' ``item_finished`` records, and the
  mean work of each kind. In ``time`` mode the queue shares worker time by weight, so step starts
  follow the weights as closely as the tenants' items cost the same: the weight-1 tenant has about
  a seventh of the window's starts, and the variance of its items' measured durations is what
  remains of the figure's noise (hence ``STEP_RUNS``).

Each gives ``worst_share_per_weight`` and ``jain``. ``bench/fairness.py [items|work|keys|steps]...``
runs some (default: all).

Needs its own data dir (it FLUSHES Redis): ``DUCTOR_DATA_DIR=.ductor/bench-x python
bench/fairness.py``. Progress on stderr; the last stdout line is one JSON object
``{"ductor": {...}, "celery_baseline": {...}, "work": {"time": ..., "items": ...}, "keys": {...},
"steps": {...}}``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    bench_stack,
    bench_worker,
    fair_broker,
    flush_state,
    log,
    percentile,
    redis_client,
    setup_django,
    wait_until,
)
from ductor_project.stack import Child, Stack

HEAVY = "fair-heavy"
TRICKLE = "fair-trickle"
# slug -> (plan, weight override or None); the weight is what the plan or override says.
TENANTS = {
    HEAVY: ("free", None),
    "fair-light-1": ("free", None),
    "fair-light-2": ("free", 2),
    "fair-light-3": ("pro", None),
    TRICKLE: ("free", None),
}
KEYED, OTHER = "fair-keys", "fair-other"
KEY_TENANTS = {KEYED: ("free", None), OTHER: ("free", None)}
HEAVY_PARTITIONS, HEAVY_PER_PARTITION = 3000, 3
LIGHT_PARTITIONS, LIGHT_ITEMS = 5, 1500
TASK_MS = 10
WORKERS, CONCURRENCY, DISPATCHERS = 2, 2, 2
WINDOW_STARTS = 1500
TRICKLE_AFTER_STARTS = 200  # the trickle tenant arrives this many starts into the window
RUN_CAP_S = 60.0
TIER = "standard"
LIGHT = ("fair-light-1", "fair-light-2", "fair-light-3")
MODES = ("time", "items")
WORK_MS = dict(zip(LIGHT, (100, 10, 30), strict=True))
# Enough for each tenant to stay backlogged through the window in either mode (4 slots, 17 s).
WORK_ITEMS = dict(zip(LIGHT, (500, 2500, 1800), strict=True))
WORK_WARMUP_S, WORK_WINDOW_S = 2.0, 15.0
STEP_RUNS, STEP_BULK = 1500, 500  # runs per tenant, started this many per bulk call
KEYS, KEY_FLOOD, KEY_WINDOW_STARTS = 50, 3000, 1500


def make_tenants() -> dict[str, Any]:
    """The bench tenants (created once per data dir), with their limits lifted and weights set."""
    from tenants import services
    from tenants.models import Tenant

    tenants = {}
    for slug, (plan, weight) in {**TENANTS, **KEY_TENANTS}.items():
        tenant = Tenant.objects.filter(slug=slug).first() or services.tenant_create(slug=slug, plan=plan)
        services.tenant_set_plan(tenant=tenant, plan_slug=plan)
        limits: dict[str, Any] = {"max_concurrency": 100_000, "step_rate_per_s": 1e6, "step_burst": 1_000_000,
                                  "monthly_run_quota": 1 << 40}
        if weight is not None:
            limits["weight"] = weight
        for field, value in limits.items():
            services.override_set(tenant=tenant, field=field, value=value, reason="bench/fairness.py")
        tenants[slug] = Tenant.objects.get(pk=tenant.pk)
    return tenants


def workload() -> list[tuple[str, list[tuple[str, str]]]]:
    """The adversarial order: (slug, [(item id, partition)]) per tenant, heavy first."""
    heavy = [(f"h{p}-{k}", f"p{p}") for k in range(HEAVY_PER_PARTITION) for p in range(HEAVY_PARTITIONS)]
    order = [(HEAVY, heavy)]
    for slug in TENANTS:
        if slug.startswith("fair-light"):
            order.append((slug, [(f"l{n}", f"p{n % LIGHT_PARTITIONS}") for n in range(LIGHT_ITEMS)]))
    return order


def trickle(redis: Any, key: str, submit: Callable[[int], None], *, begin: int, end: int,
            deadline: float, settle_s: float) -> tuple[list[int], bool]:
    """Enqueue trickle items one at a time, each once the previous started; their waits in slots.

    The last item, if still waiting when the window closes, gets ``settle_s`` more to start;
    if it does not, it counts with the slots it waited so far and the result says
    ``censored``.
    """
    while redis.llen(key) < begin:
        if time.monotonic() > deadline:
            return [], False
        time.sleep(0.01)
    log(f"trickle tenant arrives after {begin} starts")
    waits: list[int] = []
    k = 0
    while redis.llen(key) < end and time.monotonic() < deadline:
        enqueued_at = redis.llen(key)  # read before the enqueue: a start in between counts (conservative)
        submit(k)
        target = f"{TRICKLE}|t{k}".encode()
        seen = enqueued_at
        give_up = None
        while True:
            length = redis.llen(key)
            rows = redis.lrange(key, seen, length - 1) if length > seen else []
            if target in rows:
                waits.append(seen + rows.index(target) - enqueued_at)
                break
            seen = length
            if give_up is None and (length >= end or time.monotonic() > deadline):
                give_up = time.monotonic() + settle_s
            if give_up is not None and time.monotonic() > give_up:
                waits.append(length - enqueued_at)
                return waits, True
            time.sleep(0.005)
        k += 1
    return waits, False


class WindowClock:
    """Times the window: from now until its last start (or the deadline), from a thread of its own."""

    def __init__(self, redis: Any, key: str, end: int, deadline: float) -> None:
        self.started_at = time.monotonic()
        self.closed_at = self.started_at
        self._thread = threading.Thread(target=self._watch, args=(redis, key, end, deadline), daemon=True)
        self._thread.start()

    def _watch(self, redis: Any, key: str, end: int, deadline: float) -> None:
        while redis.llen(key) < end and time.monotonic() < deadline:
            time.sleep(0.02)
        self.closed_at = time.monotonic()

    def seconds(self) -> float:
        """Waits for the window to close; its length."""
        self._thread.join()
        return self.closed_at - self.started_at


def analyse(rows: list[str], begin: int, end: int, weights: dict[str, int], totals: dict[str, int],
            waits: list[int], censored: bool, seconds: float) -> dict[str, Any]:
    """The figures of one side from the start order ``rows``."""
    slugs = [row.split("|", 1)[0] for row in rows]
    # The window closes at the last start of the first non-trickle tenant that ran dry.
    started: Counter[str] = Counter()
    for index, slug in enumerate(slugs):
        started[slug] += 1
        if slug != TRICKLE and started[slug] == totals[slug]:
            end = min(end, index + 1)
            break
    end = min(end, len(slugs))
    window = Counter(slug for slug in slugs[begin:end] if slug != TRICKLE)
    backlogged = [slug for slug in TENANTS if slug != TRICKLE]
    served = sum(window[slug] for slug in backlogged)
    total_weight = sum(weights[slug] for slug in backlogged)
    ratio = {
        slug: (window[slug] / served) / (weights[slug] / total_weight) if served else 0.0
        for slug in backlogged
    }
    values = list(ratio.values())
    jain = sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if any(values) else 0.0
    return {
        "worst_share_per_weight": round(min(values), 4),
        "jain": round(jain, 4),
        "trickle_wait_p50": percentile(waits, 50) if waits else None,
        "trickle_wait_p99": percentile(waits, 99) if waits else None,
        "trickle_wait_max": max(waits) if waits else None,
        "active_tenants": len(backlogged) + 1,
        # One weighted round of the others, in slots, for the trickle tenant (SFQ serves it
        # once per round while it keeps coming back): its wait cannot be much below this.
        "trickle_round_slots": sum(weights[slug] for slug in backlogged) / weights[TRICKLE],
        "share_per_weight": {slug: round(v, 4) for slug, v in ratio.items()},
        "window_starts": end - begin,
        "window_tasks_per_s": round((end - begin) / seconds, 1) if seconds else None,
        "trickle_samples": len(waits),
        "trickle_censored": censored,
    }


def run_ductor(stack: Stack, tenants: dict[str, Any], weights: dict[str, int]) -> dict[str, Any]:
    from bench._worker_tasks import STARTS
    from scheduling import fair_queue as fq

    redis = redis_client()
    redis.flushdb()
    children = fair_broker(stack, "ductor-", workers=WORKERS, concurrency=CONCURRENCY, dispatchers=DISPATCHERS)
    log("ductor: workers and dispatchers up; enqueueing the adversarial mix")

    totals = {}
    for slug, items in workload():
        batch = [fq.NewItem(item_id, TIER, partition, {"kind": "bench.sleep", "ms": TASK_MS})
                 for item_id, partition in items]
        fq.bulk_enqueue([fq.TenantBatch(tenants[slug], batch)])
        totals[slug] = len(items)
    totals[TRICKLE] = 1 << 30
    begin = redis.llen(STARTS)
    log(f"ductor: all backlogged after {begin} starts")

    def submit(k: int) -> None:
        fq.enqueue(f"t{k}", tier=TIER, partition=f"t{k}", payload={"kind": "bench.sleep", "ms": TASK_MS},
                   tenant=tenants[TRICKLE])

    return window("ductor", stack, children, submit, begin=begin, weights=weights, totals=totals, settle_s=10.0)


def window(side: str, stack: Stack, children: list[Child], submit: Callable[[int], None], *, begin: int,
           weights: dict[str, int], totals: dict[str, int], settle_s: float) -> dict[str, Any]:
    """The measured window of one side, from ``begin`` starts on: the trickle tenant arrives
    (``submit`` enqueues its items), then ``children`` are stopped and the start order analysed."""
    from bench._worker_tasks import STARTS

    redis = redis_client()
    deadline = time.monotonic() + RUN_CAP_S
    clock = WindowClock(redis, STARTS, begin + WINDOW_STARTS, deadline)
    waits, censored = trickle(redis, STARTS, submit, begin=begin + TRICKLE_AFTER_STARTS,
                              end=begin + WINDOW_STARTS, deadline=deadline, settle_s=settle_s)
    seconds = clock.seconds()
    stack.stop(*children)
    rows = [row.decode() for row in redis.lrange(STARTS, 0, -1)]
    result = analyse(rows, begin, begin + WINDOW_STARTS, weights, totals, waits, censored, seconds)
    log(f"{side}: {json.dumps(result)}")
    return result


def run_celery(stack: Stack, weights: dict[str, int]) -> dict[str, Any]:
    from django.conf import settings

    from bench._worker_tasks import STARTS

    redis = redis_client()
    redis.flushdb()
    os.environ["BENCH_STARTS_KEY"] = STARTS
    os.environ["REDIS_URL"] = settings.REDIS_URL
    from bench._plain_celery import app, plain_sleep

    # Published before the workers start: publishing one message at a time is slow enough that
    # running workers would drain the heavy tenant's backlog before the light tenants arrive.
    log("celery: publishing the same mix in the same order")
    totals = {}
    with app.producer_or_acquire() as producer:
        for slug, items in workload():
            for item_id, _ in items:
                plain_sleep.apply_async((slug, item_id, TASK_MS), producer=producer)
            totals[slug] = len(items)
    totals[TRICKLE] = 1 << 30
    workers = [bench_worker(stack, f"plain-worker-{i}", "bench._plain_celery", concurrency=CONCURRENCY, tasks=False)
               for i in range(WORKERS)]
    stack.wait_ready(*workers)
    log(f"celery: all published; plain workers up ({redis.llen(STARTS)} started)")

    def submit(k: int) -> None:
        plain_sleep.apply_async((TRICKLE, f"t{k}", TASK_MS))

    # FIFO: the trickle item waits behind the whole backlog; settling would take minutes.
    return window("celery", stack, workers, submit, begin=0, weights=weights, totals=totals, settle_s=0.0)


def shares(amounts: dict[str, float], weights: dict[str, int]) -> dict[str, Any]:
    """Each tenant's share of ``amounts`` over its weight's share; the worst and Jain's index of them."""
    total, total_weight = sum(amounts.values()), sum(weights[slug] for slug in amounts)
    ratio = {slug: (amounts[slug] / total) / (weights[slug] / total_weight) if total else 0.0 for slug in amounts}
    values = list(ratio.values())
    jain = sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if any(values) else 0.0
    return {"worst_share_per_weight": round(min(values), 4), "jain": round(jain, 4),
            "share_per_weight": {slug: round(v, 4) for slug, v in ratio.items()}}


def run_work(stack: Stack, tenants: dict[str, Any], weights: dict[str, int], mode: str) -> dict[str, Any]:
    """The ``work`` scenario in one cost mode (see the module docs)."""
    from bench._worker_tasks import WORK
    from ductor_project.core.context import tenant_context
    from scheduling import fair_queue as fq

    redis = redis_client()
    redis.flushdb()
    children = fair_broker(stack, f"work-{mode}-", workers=WORKERS, concurrency=CONCURRENCY,
                           dispatchers=DISPATCHERS, env={"DUCTOR_FAIR_COST": mode})
    fq.bulk_enqueue([fq.TenantBatch(tenants[slug], [
        fq.NewItem(f"w{n}", TIER, f"p{n}", {"kind": "bench.work", "ms": WORK_MS[slug]}) for n in range(count)])
        for slug, count in WORK_ITEMS.items()])
    begin = time.time() + WORK_WARMUP_S
    end = begin + WORK_WINDOW_S
    time.sleep(end - time.time())
    backlogged = {}
    for slug in LIGHT:
        with tenant_context(tenants[slug]):
            backlogged[slug] = fq.stats().due > 0
    time.sleep(max(WORK_MS.values()) / 1000 + 1.0)  # the items of the window's end finish, their records flushed
    stack.stop(*children)
    busy = dict.fromkeys(LIGHT, 0.0)
    items = Counter[str]()
    for row in redis.lrange(WORK, 0, -1):
        slug, start, stop = row.decode().split("|")
        overlap = min(float(stop), end) - max(float(start), begin)
        if overlap > 0:
            busy[slug] += overlap
            items[slug] += 1
    result = {**shares(busy, weights), "worker_s": {slug: round(s, 3) for slug, s in busy.items()},
              "items_in_window": dict(items), "backlogged_throughout": all(backlogged.values()),
              "window_s": WORK_WINDOW_S}
    log(f"work ({mode}): {json.dumps(result)}")
    return result


def run_keys(stack: Stack, tenants: dict[str, Any], weights: dict[str, int]) -> dict[str, Any]:
    """The ``keys`` scenario (see the module docs)."""
    from bench._worker_tasks import STARTS
    from scheduling import fair_queue as fq

    redis = redis_client()
    redis.flushdb()
    children = fair_broker(stack, "keys-", workers=WORKERS, concurrency=CONCURRENCY, dispatchers=DISPATCHERS)
    body = {"kind": "bench.sleep", "ms": TASK_MS}
    fq.bulk_enqueue([
        fq.TenantBatch(tenants[KEYED], [fq.NewItem(f"f{n}", TIER, f"fp{n % 200}", body, key="flood")
                                        for n in range(KEY_FLOOD)]),
        fq.TenantBatch(tenants[OTHER], [fq.NewItem(f"o{n}", TIER, f"op{n % 200}", body) for n in range(KEY_FLOOD)]),
    ])

    def submit(key: int, j: int) -> str:
        item_id = f"c{key}-{j}"
        fq.enqueue(item_id, tier=TIER, partition=item_id, payload=body, key=f"c{key}", tenant=tenants[KEYED])
        return f"{KEYED}|{item_id}"

    keyed_starts = 0  # the keyed tenant's starts so far: its dispatch slots
    pending = {key: (submit(key, 0), 0, 0) for key in range(1, KEYS)}  # key -> (row, j, keyed starts then)
    waits: list[int] = []
    seen, rows = 0, []
    deadline = time.monotonic() + RUN_CAP_S
    while keyed_starts < KEY_WINDOW_STARTS and time.monotonic() < deadline:
        length = redis.llen(STARTS)
        new = [row.decode() for row in redis.lrange(STARTS, seen, length - 1)] if length > seen else []
        seen = length
        for row in new:
            rows.append(row)
            if not row.startswith(f"{KEYED}|"):
                continue
            keyed_starts += 1
            key = next((k for k, (want, _, _) in pending.items() if want == row), None)
            if key is not None:
                _, j, at = pending[key]
                waits.append(keyed_starts - 1 - at)
                pending[key] = (submit(key, j + 1), j + 1, keyed_starts)
        time.sleep(0.005)
    stack.stop(*children)
    by_tenant = Counter(row.split("|", 1)[0] for row in rows)
    result = {
        **shares({slug: float(by_tenant[slug]) for slug in (KEYED, OTHER)}, weights),
        "other_keys_wait_p50": percentile(waits, 50) if waits else None,
        "other_keys_wait_p99": percentile(waits, 99) if waits else None,
        "other_keys_wait_max": max(waits) if waits else None,
        "active_keys": KEYS,
        "samples": len(waits),
        "keyed_tenant_starts": keyed_starts,
    }
    log(f"keys: {json.dumps(result)}")
    return result


def run_steps(stack: Stack, tenants: dict[str, Any], weights: dict[str, int], mode: str) -> dict[str, Any]:
    """The ``steps`` scenario in one cost mode (see the module docs)."""
    from ductor_project.core.context import tenant_context
    from ductor_project.core.keys import redis_key
    from workflows.models import StepRun
    from workflows.services import run_start_many, workflow_put

    flush_state()
    runs: dict[str, list[Any]] = {}
    for slug in LIGHT:
        with tenant_context(tenants[slug]):
            workflow_put(name="one", spec={"nodes": [{"id": "a", "type": "action", "action": "noop"}]})
            runs[slug] = [run.pk for _ in range(0, STEP_RUNS, STEP_BULK)
                          for run, _ in run_start_many(runs=[{"workflow": "one"}] * STEP_BULK)]
    log(f"steps ({mode}): {STEP_RUNS} runs of each tenant bulk-started; starting the pipeline")
    env = {**stack.env, "DUCTOR_FAIR_COST": mode}
    children = [stack.dispatcher(f"steps-{mode}-dispatcher-{i}", env=env) for i in range(DISPATCHERS)]
    children += [bench_worker(stack, f"steps-{mode}-worker-{i}", concurrency=CONCURRENCY,
                              env={"DUCTOR_FAIR_COST": mode}) for i in range(WORKERS)]
    all_runs = [pk for pks in runs.values() for pk in pks]
    wait_until(lambda: StepRun.all_tenants.filter(run_id__in=all_runs, status="succeeded").count() == len(all_runs),
               what="every step", timeout=600.0, every=0.5)
    stack.stop(*children)
    estimates = {}  # what each tenant's ticks and steps were charged at the end (time mode)
    for slug in LIGHT:
        with tenant_context(tenants[slug]):
            raw = redis_client().hgetall(redis_key("fq", "est"))
        estimates[slug] = {k.decode(): round(float(v), 2) for k, v in raw.items()}
    starts = sorted((step.started_at, slug) for slug, pks in runs.items()
                    for step in StepRun.all_tenants.filter(run_id__in=pks).only("started_at"))
    last = {slug: max(at for at, s in starts if s == slug) for slug in LIGHT}
    window = [slug for at, slug in starts if at <= min(last.values())]
    work, mean_ms = worker_time(children, {str(tenants[slug].pk): slug for slug in LIGHT},
                                starts[0][0].timestamp(), min(last.values()).timestamp())
    result = {**shares(Counter(window), weights), "window_starts": len(window),
              "work": {**shares(work, weights), "mean_work_ms": mean_ms}, "estimates_ms": estimates,
              "steps_per_s": round(len(starts) / (starts[-1][0] - starts[0][0]).total_seconds(), 1)}
    log(f"steps ({mode}): {json.dumps(result)}")
    return result


def worker_time(children: list[Child], slugs: dict[str, str], start: float, end: float,
                ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """From the workers' logs (their ``item_finished`` records, read as the demo reads them): each tenant's
    work (ms) of the items that finished between ``start`` and ``end`` (Unix seconds), and its mean work per
    item kind there."""
    from ductor_project.demo.metrics import read_work

    done: dict[tuple[str, str], list[float]] = {}
    for item in read_work([child.log_path for child in children if "worker" in child.name], slugs):
        if start <= item.finished.timestamp() <= end:
            done.setdefault((item.slug, item.kind), []).append(item.work_ms)
    work = {slug: sum(sum(v) for (s, _), v in done.items() if s == slug) for slug in slugs.values()}
    mean = {slug: {kind: round(sum(v) / len(v), 2) for (s, kind), v in done.items() if s == slug}
            for slug in slugs.values()}
    return work, mean


def main() -> int:
    setup_django("bench/fairness.py")
    from django.conf import settings

    from bench._worker_tasks import STARTS
    from tenants.entitlements import effective_entitlements

    scenarios = sys.argv[1:] or ["items", "work", "keys", "steps"]
    unknown = set(scenarios) - {"items", "work", "keys", "steps"}
    if unknown:
        print(f"unknown scenarios {sorted(unknown)}: give items, work, keys and/or steps", file=sys.stderr)
        return 2
    started = time.monotonic()
    tenants = make_tenants()
    weights = {slug: effective_entitlements(tenant).weight for slug, tenant in tenants.items()}
    log(f"weights: {weights}")
    # BENCH_STARTS_KEY: where the plain Celery side's tasks record their starts (bench/_plain_celery.py).
    stack = bench_stack("fairness", BENCH_STARTS_KEY=STARTS)
    out: dict[str, Any] = {}
    try:
        if "items" in scenarios:
            out["ductor"] = run_ductor(stack, tenants, weights)
            out["celery_baseline"] = run_celery(stack, weights)
        if "work" in scenarios:
            out["work"] = {mode: run_work(stack, tenants, weights, mode) for mode in MODES}
        if "keys" in scenarios:
            out["keys"] = run_keys(stack, tenants, weights)
        if "steps" in scenarios:
            out["steps"] = {mode: run_steps(stack, tenants, weights, mode) for mode in MODES}
    finally:
        stack.stop_all()
        redis_client().flushdb()
    log(f"done in {time.monotonic() - started:.0f}s")
    print(json.dumps({
        **out,
        "config": {"work_ms": WORK_MS, "step_runs": STEP_RUNS, "weights": weights, "task_ms": TASK_MS,
                   "workers": WORKERS, "concurrency": CONCURRENCY,
                   "dispatchers": DISPATCHERS, "dispatch_buffer": settings.DUCTOR_DISPATCH_BUFFER,
                   "heavy_items": HEAVY_PARTITIONS * HEAVY_PER_PARTITION, "heavy_partitions": HEAVY_PARTITIONS,
                   "light_items": LIGHT_ITEMS, "light_partitions": LIGHT_PARTITIONS},
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
