"""Benchmark of the fair queue's core (no Celery): throughput, and dequeue cost against tenant count.

One client, no pipelining for what is measured, against the embedded Redis (or
``REDIS_URL``):

- fair-queue cycles per second: enqueue one item, dequeue it, ack it (three
  scripts, three round trips), against raw ``LPUSH``+``RPOP`` pairs (two round
  trips) on the same server in the same run;
- the cost of one dequeue (µs, median of every call) with 10, 1,000 and 100,000
  tenants all backlogged in one tier, and with 100,000 tenants of ``KEYS`` fairness
  keys each, all backlogged (``100000x10``: the second level), each dequeue followed
  by its ack. The four populations live in four shards of the same Redis and are
  measured in interleaved rounds, so that a noisy host slows them alike. Every dequeue
  checks and takes the tenant's concurrency slot and charges its step rate.

Tenants are made-up ids (no database rows): their keys come from
``ductor_project.core.keys`` through the fair queue, and their limits are passed
explicitly. The bench FLUSHES its Redis database, so it refuses to run unless
``DUCTOR_DATA_DIR`` (its own embedded services) is set, or ``--flush`` is given.
Progress goes to stderr; the last line of stdout is one JSON object.

    DUCTOR_DATA_DIR=.ductor/bench .venv/bin/python bench/dispatch_core.py
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import log, measure  # noqa: E402 - the repository root goes on the path first

SIZES = (10, 1_000, 100_000)
# The keyed population: this many tenants of KEYS fairness keys each (one item per key).
KEYED_TENANTS, KEYS = 100_000, 10
SHARDS = len(SIZES) + 1
ROUNDS = 5
CYCLE_PHASE_S = 0.8
DEQUEUES_PER_ROUND = 300
LEASE_MS = 60_000
TIER = "standard"


def main() -> int:
    if "DUCTOR_DATA_DIR" not in os.environ and "--flush" not in sys.argv:
        log("dispatch_core flushes its Redis: set DUCTOR_DATA_DIR (e.g. .ductor/bench) or pass --flush")
        return 2
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ductor_project.settings")
    # One shard per tenant population, so that all three are measured in the same rounds.
    os.environ["DUCTOR_QUEUE_SHARDS"] = str(SHARDS)
    import django

    from ductor_project import embedded

    embedded.boot()  # the data dir's embedded servers, started if they are not running (a no-op with URLs set)
    django.setup()

    from ductor_project.core.keys import redis_key, shard_of
    from ductor_project.core.redis import get_redis
    from scheduling import fair_queue as fq
    from tenants.models import Tenant

    redis = get_redis()
    redis.flushdb()
    conf = fq.TenantConf(weight=1, max_concurrency=100, rate_per_s=1_000_000.0, burst=1_000, tiers=(TIER,))

    def make_tenants(shard: int, count: int) -> list[Tenant]:
        """Throwaway tenants (no rows: only their ids are read) that map to ``shard``."""
        tenants: list[Tenant] = []
        while len(tenants) < count:
            tenant_id = uuid.uuid4()
            if shard_of(str(tenant_id)) == shard:
                tenants.append(Tenant(id=tenant_id, slug=f"bench-{tenant_id.hex[:8]}"))
        return tenants

    # -- cycles per second against LPUSH+RPOP ------------------------------------------
    cycle_tenants = make_tenants(0, 10)
    counter = redis_key("bench", "lpush-rpop", tenant=cycle_tenants[0])

    def baseline(i: int) -> None:
        redis.lpush(counter, i)
        redis.rpop(counter)

    def cycle(i: int) -> None:
        tenant = cycle_tenants[i % len(cycle_tenants)]
        fq.bulk_enqueue([fq.TenantBatch(tenant, [fq.NewItem(f"c{i}", TIER, f"p{i % 3}", i)], conf)])
        got = fq.dequeue(shard=0, lease_ms=LEASE_MS)
        if got is None or not fq.ack(got.item_id, delivery=got.delivery, tenant=tenant):
            raise RuntimeError("a cycle lost its item")

    cycles = pairs = 0
    cycle_s = pair_s = 0.0
    for r in range(ROUNDS):
        n, s = measure(baseline, CYCLE_PHASE_S)
        pairs, pair_s = pairs + n, pair_s + s
        n, s = measure(cycle, CYCLE_PHASE_S)
        cycles, cycle_s = cycles + n, cycle_s + s
        log(f"round {r + 1}/{ROUNDS}: {cycles / cycle_s:.0f} cycles/s, {pairs / pair_s:.0f} lpush+rpop/s")
    redis.flushdb()

    # -- dequeue cost against tenant count ---------------------------------------------
    total = ROUNDS * DEQUEUES_PER_ROUND
    populations: dict[int, dict[str, Tenant]] = {}
    names = {shard: str(size) for shard, size in enumerate(SIZES)}
    names[len(SIZES)] = f"{KEYED_TENANTS}x{KEYS}"
    for shard, size in enumerate(SIZES):
        started = time.perf_counter()
        tenants = make_tenants(shard, size)
        # Enough items that every tenant stays backlogged through all the rounds: one more
        # than it can be served, in two partitions (one of them is locked while in flight).
        per_tenant = math.ceil(total / size) + 1
        batches = (
            fq.TenantBatch(t, [fq.NewItem(f"i{j}", TIER, f"p{j % 2}") for j in range(per_tenant)], conf)
            for t in tenants
        )
        queued = fq.bulk_enqueue(batches)
        populations[shard] = {str(t.pk): t for t in tenants}
        log(f"{size} tenants: {queued} items queued in {time.perf_counter() - started:.1f}s")
    started = time.perf_counter()
    keyed = make_tenants(len(SIZES), KEYED_TENANTS)
    # One item per key, in a partition of its own: every key of every tenant stays backlogged (a tenant
    # is served at most total / KEYED_TENANTS + 1 times).
    queued = fq.bulk_enqueue(
        fq.TenantBatch(t, [fq.NewItem(f"k{k}", TIER, f"p{k}", key=f"key-{k}") for k in range(KEYS)], conf)
        for t in keyed
    )
    populations[len(SIZES)] = {str(t.pk): t for t in keyed}
    log(f"{KEYED_TENANTS} tenants x {KEYS} keys: {queued} items queued in {time.perf_counter() - started:.1f}s")

    timings: dict[int, list[float]] = {shard: [] for shard in populations}
    for r in range(ROUNDS):
        for shard, tenants_by_id in populations.items():
            for _ in range(DEQUEUES_PER_ROUND):
                start = time.perf_counter()
                got = fq.dequeue(shard=shard, lease_ms=LEASE_MS)
                timings[shard].append(time.perf_counter() - start)
                if got is None:
                    raise RuntimeError(f"shard {shard} ran dry: the tenants must stay backlogged")
                fq.ack(got.item_id, delivery=got.delivery, tenant=tenants_by_id[got.tenant_id])
        log(f"round {r + 1}/{ROUNDS}: " + ", ".join(
            f"{names[s]}: {statistics.median(t) * 1e6:.0f}us" for s, t in timings.items()
        ))
    redis.flushdb(asynchronous=True)  # over a million keys: longer than a socket timeout to free at once

    dequeue_us = {names[s]: round(statistics.median(t) * 1e6, 1) for s, t in timings.items()}
    cycles_per_s = cycles / cycle_s
    baseline_per_s = pairs / pair_s
    result = {
        "cycles_per_s": round(cycles_per_s, 1),
        "baseline_lpush_rpop_per_s": round(baseline_per_s, 1),
        "ratio": round(cycles_per_s / baseline_per_s, 3),
        "dequeue_us": dequeue_us,
        "dequeue_us_mean": {names[s]: round(statistics.fmean(t) * 1e6, 1) for s, t in timings.items()},
        "dequeue_cost_ratio_100k_vs_10": round(dequeue_us["100000"] / dequeue_us["10"], 3),
        "dequeue_cost_ratio_100k_x10_keys_vs_10": round(dequeue_us[names[len(SIZES)]] / dequeue_us["10"], 3),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
