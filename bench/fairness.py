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

Needs its own data dir (it FLUSHES Redis): ``DUCTOR_DATA_DIR=.ductor/bench-x python
bench/fairness.py``. Progress on stderr; the last stdout line is one JSON object
``{"ductor": {...}, "celery_baseline": {...}}``.
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

from bench._common import bench_stack, bench_worker, fair_broker, log, percentile, redis_client, setup_django
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
HEAVY_PARTITIONS, HEAVY_PER_PARTITION = 3000, 3
LIGHT_PARTITIONS, LIGHT_ITEMS = 5, 1500
TASK_MS = 10
WORKERS, CONCURRENCY, DISPATCHERS = 2, 2, 2
WINDOW_STARTS = 1500
TRICKLE_AFTER_STARTS = 200  # the trickle tenant arrives this many starts into the window
RUN_CAP_S = 60.0
TIER = "standard"


def make_tenants() -> dict[str, Any]:
    """The bench tenants (created once per data dir), with their limits lifted and weights set."""
    from tenants import services
    from tenants.models import Tenant

    tenants = {}
    for slug, (plan, weight) in TENANTS.items():
        tenant = Tenant.objects.filter(slug=slug).first() or services.tenant_create(slug=slug, plan=plan)
        services.tenant_set_plan(tenant=tenant, plan_slug=plan)
        limits: dict[str, Any] = {"max_concurrency": 100_000, "step_rate_per_s": 1e6, "step_burst": 1_000_000}
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


def main() -> int:
    setup_django("bench/fairness.py")
    from django.conf import settings

    from bench._worker_tasks import STARTS
    from tenants.entitlements import effective_entitlements

    started = time.monotonic()
    tenants = make_tenants()
    weights = {slug: effective_entitlements(tenant).weight for slug, tenant in tenants.items()}
    log(f"weights: {weights}")
    # BENCH_STARTS_KEY: where the plain Celery side's tasks record their starts (bench/_plain_celery.py).
    stack = bench_stack("fairness", BENCH_STARTS_KEY=STARTS)
    try:
        ductor = run_ductor(stack, tenants, weights)
        baseline = run_celery(stack, weights)
    finally:
        stack.stop_all()
        redis_client().flushdb()
    log(f"done in {time.monotonic() - started:.0f}s")
    print(json.dumps({
        "ductor": ductor,
        "celery_baseline": baseline,
        "config": {"weights": weights, "task_ms": TASK_MS, "workers": WORKERS, "concurrency": CONCURRENCY,
                   "dispatchers": DISPATCHERS, "dispatch_buffer": settings.DUCTOR_DISPATCH_BUFFER,
                   "heavy_items": HEAVY_PARTITIONS * HEAVY_PER_PARTITION, "heavy_partitions": HEAVY_PARTITIONS,
                   "light_items": LIGHT_ITEMS, "light_partitions": LIGHT_PARTITIONS},
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
