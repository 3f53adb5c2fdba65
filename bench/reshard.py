"""Benchmark of a tenant's move between fair-queue shards (``scheduling.resharding``).

A tenant with 10,000 waiting items (100 partitions over the three customer tiers) and 50 items in
flight is moved from shard 0 to shard 1 and back, ``MOVES`` times, on the embedded Redis (or
``REDIS_URL``). Each move reports how long the tenant's operations waited (fence to map: its pause)
and the whole move (with the clean-up of the old shard's keys). Progress goes to stderr; the last line
of stdout is one JSON object.

    DUCTOR_DATA_DIR=.ductor/bench .venv/bin/python bench/reshard.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import log, setup_django  # noqa: E402 - the repository root goes on the path first

WAITING = 10_000
IN_FLIGHT = 50
PARTITIONS = 100
MOVES = 6


def main() -> None:
    os.environ["DUCTOR_QUEUE_SHARDS"] = "2"
    setup_django("reshard")

    from ductor_project.core.keys import forget_shard_map, shard_of
    from ductor_project.core.redis import get_redis
    from scheduling import fair_queue as fq
    from scheduling import resharding
    from tenants.models import Tenant

    get_redis().flushdb()
    forget_shard_map()
    # The queue needs only the tenant's id and limits: a throwaway tenant keeps the database out of it.
    while shard_of(str(tenant_id := uuid.uuid4())) != 0:
        pass
    tenant = Tenant(id=tenant_id, slug="bench-reshard")
    conf = fq.TenantConf(weight=1, max_concurrency=None, rate_per_s=None, burst=1, tiers=fq.TIERS[1:])
    tiers = conf.tiers
    items = [fq.NewItem(f"i{n}", tiers[n % len(tiers)], f"p{n % PARTITIONS}", {"n": n, "pad": "x" * 100})
             for n in range(WAITING + IN_FLIGHT)]
    fq.bulk_enqueue([fq.TenantBatch(tenant, items, conf=conf)])
    taken = fq.dequeue_many(shard=0, lease_ms=600_000, limit=IN_FLIGHT)
    log(f"{WAITING + IN_FLIGHT} items queued, {len(taken)} in flight")
    reports = []
    for n in range(MOVES):
        report = resharding.move_tenant(str(tenant.pk), 1 - n % 2)
        assert report is not None
        reports.append(report)
        log(f"move {n + 1}: {report.keys} keys, pause {report.paused_s * 1000:.1f} ms, "
            f"move {report.seconds * 1000:.1f} ms")
    pauses = [r.paused_s * 1000 for r in reports]
    moves = [r.seconds * 1000 for r in reports]
    print(json.dumps({
        "waiting_items": WAITING, "in_flight": IN_FLIGHT, "keys": reports[-1].keys, "moves": MOVES,
        "pause_ms": {"median": round(statistics.median(pauses), 1), "max": round(max(pauses), 1)},
        "move_ms": {"median": round(statistics.median(moves), 1), "max": round(max(moves), 1)},
    }))


if __name__ == "__main__":
    main()
