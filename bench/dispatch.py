"""Dispatch throughput end to end: no-op tasks through real workers, against plain Celery.

The fair queue's core (cycles per second, dequeue cost against tenant count) is
``bench/dispatch_core.py``'s to measure; ``make bench`` runs both, and this measures only:

1. **End to end**: ``WORKERS`` x ``CONCURRENCY`` real ``celery -A ductor_project worker``
   processes and ``DISPATCHERS`` ``manage.py run_dispatcher`` processes (``BENCH_DISPATCHERS``).
   In ``ROUNDS`` interleaved rounds (``BENCH_ROUNDS``; the side that goes first alternates,
   so that a noisy host slows both alike), on the same workers and Redis:
   - **fair broker**: bulk-enqueue ``TASKS`` ``noop`` items (``TENANTS`` tenants, one
     partition per item) and time until every one is acked;
   - **plain Celery**: publish ``TASKS`` ``bench.noop`` tasks (a plain ``@app.task``, results
     ignored like ``execute_item``'s) and time until the queue is empty and nothing is unacked.
   Each side's rate is its total tasks over its total time; ``e2e_ratio`` is their quotient
   (``e2e_ratio_median_round``: the median of the per-round quotients).
2. The same again on workers started with ``DUCTOR_HANDOFF_MS=0`` and a dispatch buffer of 2
   (``without_handoff``):
   every item through a Celery message of its own, none taken by a worker that finished one.

Needs its own data dir (it FLUSHES Redis): ``DUCTOR_DATA_DIR=.ductor/bench-x python
bench/dispatch.py``. Progress on stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_stack, fair_broker, log, plain_celery_noops, redis_client, setup_django

WORKERS, CONCURRENCY = 2, 2
# One dispatcher keeps 4 worker slots busy; on 2 cores a second one only takes CPU from them.
DISPATCHERS = int(os.environ.get("BENCH_DISPATCHERS", "1"))
TENANTS = 4
TASKS = 1000
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
WARMUP_TASKS = 300
TIER = "standard"
DONE_TIMEOUT_S = 120.0
POLL_S = 0.02


def make_tenant(slug: str) -> Any:
    """The tenant ``slug`` (made if missing) with limits that no benchmark reaches."""
    from tenants import services
    from tenants.models import Tenant

    tenant = Tenant.objects.filter(slug=slug).first() or services.tenant_create(slug=slug, plan="pro")
    for field, value in {"max_concurrency": 100_000, "step_rate_per_s": 1e6, "step_burst": 1_000_000}.items():
        services.override_set(tenant=tenant, field=field, value=value, reason="bench/dispatch.py")
    return Tenant.objects.get(pk=tenant.pk)


def make_tenants() -> list[Any]:
    return [make_tenant(f"dispatch-{n}") for n in range(TENANTS)]


def wait_until(done: Callable[[], bool]) -> None:
    """Poll ``done`` (one cheap Redis call on either side) every ``POLL_S``."""
    deadline = time.monotonic() + DONE_TIMEOUT_S
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError("tasks did not finish in time")
        time.sleep(POLL_S)


def queue_idle() -> bool:
    """Every shard of the fair queue is idle: nothing in flight, and no tenant ready, parked or on
    a timer (an item waiting behind a locked partition implies one in flight). One call per shard."""
    from django.conf import settings

    from scheduling import fair_queue as fq

    for shard in map(fq.global_stats, range(settings.DUCTOR_QUEUE_SHARDS)):
        if shard.in_flight or shard.timers or any(
                tier.ready_tenants or tier.blocked_tenants for tier in shard.tiers.values()):
            return False
    return True


def ductor_round(tenants: list[Any], count: int, tag: str, idle: Callable[[], bool] = queue_idle) -> float:
    """Seconds from the first enqueue until every item is acked, which ``idle`` polls for (a caller
    that counts the polls passes its own)."""
    from scheduling import fair_queue as fq

    started = time.perf_counter()
    batches = [
        fq.TenantBatch(tenant, [fq.NewItem(f"{tag}-{i}", TIER, f"{tag}-{i}", {"kind": "bench.noop"})
                                for i in range(n, count, len(tenants))])
        for n, tenant in enumerate(tenants)
    ]
    fq.bulk_enqueue(batches)
    wait_until(idle)
    return time.perf_counter() - started


def celery_round(count: int) -> float:
    """Seconds from the first publish until the queue is empty and no message is unacked."""
    return plain_celery_noops(count, wait_until)


def run_e2e(**overrides: str) -> dict[str, Any]:
    """The interleaved rounds, on workers and dispatchers started for them with the settings
    ``overrides`` in their environment; they are stopped afterwards, whatever happened."""
    redis = redis_client()
    redis.flushdb()
    tenants = make_tenants()
    stack = bench_stack("dispatch", **overrides)
    try:
        fair_broker(stack, "", workers=WORKERS, concurrency=CONCURRENCY, dispatchers=DISPATCHERS)
        ductor_s, celery_s = rounds(tenants, "".join(f" {name}={value}" for name, value in overrides.items()))
    finally:
        stack.stop_all()
    e2e = TASKS * ROUNDS / sum(ductor_s)
    baseline = TASKS * ROUNDS / sum(celery_s)
    return {
        "e2e_tasks_per_s": round(e2e, 1),
        "baseline_celery_tasks_per_s": round(baseline, 1),
        "e2e_ratio": round(e2e / baseline, 3),
        "e2e_rounds_tasks_per_s": [round(TASKS / s, 1) for s in ductor_s],
        "baseline_rounds_tasks_per_s": [round(TASKS / s, 1) for s in celery_s],
        "e2e_ratio_median_round": round(statistics.median(c / d for d, c in zip(ductor_s, celery_s, strict=True)), 3),
    }


def rounds(tenants: list[Any], label: str) -> tuple[list[float], list[float]]:
    """A warm-up, then ``ROUNDS`` interleaved rounds; each side's seconds per round."""
    log(f"e2e{label}: workers and dispatchers up; warming up")
    ductor_round(tenants, WARMUP_TASKS, "warm")
    celery_round(WARMUP_TASKS)

    ductor_s: list[float] = []
    celery_s: list[float] = []
    for r in range(ROUNDS):
        # Alternate which side goes first, so that a load trend on the host favours neither.
        if r % 2:
            celery_s.append(celery_round(TASKS))
        ductor_s.append(ductor_round(tenants, TASKS, f"r{r}"))
        if not r % 2:
            celery_s.append(celery_round(TASKS))
        log(f"round {r + 1}/{ROUNDS}{label}: fair broker {TASKS / ductor_s[-1]:.0f} tasks/s, "
            f"plain Celery {TASKS / celery_s[-1]:.0f} tasks/s")
    return ductor_s, celery_s


def main() -> int:
    setup_django("bench/dispatch.py")
    from django.conf import settings

    started = time.monotonic()
    try:
        e2e = run_e2e()
        # Every item through a Celery message of its own: the dispatchers' path alone.
        # (With a buffer: without handoff, it keeps the slots busy between dispatch rounds.)
        plain = {"DUCTOR_HANDOFF_MS": "0", "DUCTOR_DISPATCH_BUFFER": os.environ.get("DUCTOR_DISPATCH_BUFFER", "2")}
        e2e["without_handoff"] = {**run_e2e(**plain), "settings": plain}
    finally:
        redis_client().flushdb()
    log(f"e2e: {json.dumps(e2e)}")
    log(f"done in {time.monotonic() - started:.0f}s")
    result = {
        **e2e,
        "config": {"workers": WORKERS, "concurrency": CONCURRENCY, "dispatchers": DISPATCHERS,
                   "tasks_per_round": TASKS, "rounds": ROUNDS, "tenants": TENANTS,
                   "dispatch_buffer": settings.DUCTOR_DISPATCH_BUFFER, "handoff_ms": settings.DUCTOR_HANDOFF_MS},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
