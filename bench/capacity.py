"""Benchmark of the capacity counters against the same run's raw Redis baseline.

One client, no pipelining, against the embedded Redis (or ``REDIS_URL``):

- acquire+release pairs per second (one tenant scope, a new holder each pair);
- the same with three scopes (tenant, pool, connection), for reference;
- GCRA checks per second;
- the baseline: raw ``INCR``+``DECR`` pairs per second on the same server.

Each acquire+release pair is two round trips, like ``INCR``+``DECR``. The
phases are interleaved in short slices (100 ms) so that the load of a shared
host falls on all of them alike; the per-slice ratios show how noisy it was.
Progress goes to stderr; the last line of stdout is one JSON object.

    DUCTOR_DATA_DIR=.ductor/bench .venv/bin/python bench/capacity.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import log, measure  # noqa: E402 - the repository root goes on the path first

ROUNDS = 60
SLICE_S = 0.1
GOAL_RATIO = 0.5


def main() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ductor_project.settings")
    import django

    django.setup()

    from ductor_project.core import capacity
    from ductor_project.core.context import tenant_context
    from ductor_project.core.keys import redis_key
    from ductor_project.core.redis import get_redis
    from tenants.models import Tenant

    redis = get_redis()
    # The counters need only the tenant's id: a throwaway tenant keeps the database out of it.
    tenant = Tenant(id=uuid.uuid4(), slug="bench-capacity")
    with tenant_context(tenant):
        one_scope = [capacity.tenant_scope(1_000)]
        three_scopes = [
            *one_scope, capacity.pool_scope("bench", 1_000), capacity.connection_scope("bench", 1_000)
        ]
        counter = redis_key("bench", "incr-decr")

        def baseline(i: int) -> None:
            redis.incr(counter)
            redis.decr(counter)

        def acquire_release(i: int) -> None:
            holder = f"h{i}"
            if not capacity.acquire(one_scope, holder, lease_s=30):
                raise RuntimeError("acquire refused below the limit")
            capacity.release(holder)

        def acquire_release_3(i: int) -> None:
            holder = f"m{i}"
            if not capacity.acquire(three_scopes, holder, lease_s=30):
                raise RuntimeError("acquire refused below the limit")
            capacity.release(holder)

        def gcra(i: int) -> None:
            capacity.rate_check("bench", rate_per_s=1_000_000, burst=1_000)

        phases: dict[str, Callable[[int], None]] = {
            "baseline": baseline,
            "acquire_release": acquire_release,
            "acquire_release_3": acquire_release_3,
            "gcra": gcra,
        }
        log(f"redis {redis.info('server')['redis_version']}: {ROUNDS} rounds of {SLICE_S:.1f} s slices")
        for step in phases.values():  # warm up: connection, scripts loaded
            measure(step, 0.2)

        totals = {name: [0, 0.0] for name in phases}
        ratios = []
        for round_no in range(1, ROUNDS + 1):
            rates = {}
            for name, step in phases.items():
                count, elapsed = measure(step, SLICE_S / 2 if name == "acquire_release_3" else SLICE_S)
                totals[name][0] += count
                totals[name][1] += elapsed
                rates[name] = count / elapsed
            ratios.append(rates["acquire_release"] / rates["baseline"])
            if round_no % 10 == 0:
                log(
                    f"round {round_no}/{ROUNDS}: baseline {rates['baseline']:.0f} pairs/s, "
                    f"acquire+release {rates['acquire_release']:.0f}/s "
                    f"(3 scopes {rates['acquire_release_3']:.0f}/s), gcra {rates['gcra']:.0f}/s, "
                    f"ratio {ratios[-1]:.2f}"
                )
        leftover = capacity.tenant_in_flight()
        redis.delete(counter, capacity.rate_key("bench"))

    per_s = {name: count / elapsed for name, (count, elapsed) in totals.items()}
    ratio = per_s["acquire_release"] / per_s["baseline"]
    result = {
        "acquire_release_per_s": round(per_s["acquire_release"], 1),
        "acquire_release_3_scopes_per_s": round(per_s["acquire_release_3"], 1),
        "gcra_checks_per_s": round(per_s["gcra"], 1),
        "baseline_incr_decr_per_s": round(per_s["baseline"], 1),
        "ratio": round(ratio, 3),
        "ratio_by_slice": {
            "min": round(min(ratios), 3),
            "median": round(statistics.median(ratios), 3),
            "max": round(max(ratios), 3),
        },
        "goal_ratio": GOAL_RATIO,
        "meets_goal": ratio >= GOAL_RATIO,
        "leases_left_in_flight": leftover,
        "rounds": ROUNDS,
        "seconds_per_slice": SLICE_S,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
