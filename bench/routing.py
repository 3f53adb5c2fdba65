"""Benchmark of ``route()``: decisions per second with a warm and a cold routing cache.

A throwaway tenant (a unique slug per run) gets 200 rules, of which only one,
late in priority order, matches the benchmark step, and a weighted pool of
three connections. One client, against the embedded PostgreSQL and Redis (or
``DATABASE_URL`` / ``REDIS_URL``). Three kinds of decision are timed, in
interleaved slices so that the load of a shared host falls on all alike:

- **warm**: this process holds the tenant's table of the current version (one
  Redis GET for the version, the entitlements from the process cache; the
  connection is chosen later, at admission, so no candidate is read here);
- **shared**: a fresh process (``forget_local()``) that finds the table in the
  shared cache (Redis) and unpickles it;
- **cold**: neither holds it (``forget_local()`` and the cached table deleted
  before each decision), so the table is built from PostgreSQL.

Only the ``route()`` calls are timed. PostgreSQL queries are counted with
``CaptureQueriesContext``. A same-run baseline, raw Redis ``GET``s per second
in the same slices, says what the host's round trip costs:
``warm_decision_in_redis_gets`` is a warm decision's time in ``GET``s (it makes
one round trip, for the routing version, when the entitlements are in the
process cache). Progress goes to stderr; the last line of stdout is
one JSON object. The tenant, its rows and its Redis keys are removed at the end.

    DUCTOR_DATA_DIR=.ductor/bench .venv/bin/python bench/routing.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RULES = 200
MATCHING_PRIORITY = 190
ROUNDS = 5
SLICE_S = 0.6


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ductor_project.settings")
    import django

    django.setup()

    from django.core.cache import cache
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from ductor_project.core.context import tenant_context
    from ductor_project.core.keys import tenant_key
    from ductor_project.core.redis import get_redis
    from scheduling import routing_table
    from scheduling.models import Connection, Pool, PoolMember, Rule
    from scheduling.routing import route
    from scheduling.rules import Step, validate_action, validate_match
    from tenants import services
    from tenants.entitlements import effective_entitlements

    call_command("migrate", verbosity=0)
    tenant = services.tenant_create(slug=f"bench-routing-{uuid.uuid4().hex[:10]}", plan="enterprise")
    log(f"tenant {tenant.slug}: {RULES} rules, the matching one at priority {MATCHING_PRIORITY}")
    started = time.perf_counter()
    try:
        with tenant_context(tenant):
            tiers = effective_entitlements(tenant).allowed_tiers
            connections = [
                Connection.objects.create(
                    name=f"api-{i}", kind="http", config={"base_url": f"https://api-{i}.example.com"}
                )
                for i in range(3)
            ]
            main_pool = Pool.objects.create(name="main", strategy=Pool.Strategy.WEIGHTED)
            for i, conn in enumerate(connections):
                PoolMember.objects.create(pool=main_pool, connection=conn, weight=i + 1, priority=i)
            Pool.objects.create(name="other", strategy=Pool.Strategy.ROUND_ROBIN, is_default=True)
            for priority in range(1, RULES + 1):
                match, action = _rule(priority)
                Rule.objects.create(
                    name=f"rule-{priority}", priority=priority, match=validate_match(match),
                    action=validate_action(action, allowed_tiers=tiers),
                )
            step = Step(
                workflow="billing.invoice", action="http.request", tags=("eu", "pii"),
                input={"customer": {"id": 7, "tier": "gold", "region": "eu"}, "amount": 120},
            )
            decision = route(step)
            if decision.rule is None or decision.rule.priority != MATCHING_PRIORITY or decision.pool is None:
                raise RuntimeError(f"the benchmark step routed unexpectedly: {decision.trace()}")
            log(f"set up in {time.perf_counter() - started:.1f} s; decision: {decision.reason}")

            def cold_prepare() -> None:
                routing_table.forget_local()
                cache.delete(routing_table.table_key())

            redis = get_redis()
            baseline_key = tenant_key("bench", "get")

            def decide() -> None:
                route(step)

            def redis_get() -> None:
                redis.get(baseline_key)

            phases: dict[str, tuple[Callable[[], None], Callable[[], None] | None]] = {
                "warm": (decide, None),
                "shared": (decide, routing_table.forget_local),
                "cold": (decide, cold_prepare),
                "baseline": (redis_get, None),
            }
            for timed, prepare in phases.values():  # warm up: connections, scripts, code paths
                _measure(timed, prepare, 0.3)
            totals = {name: [0, 0.0, 0] for name in phases}
            ratios = []
            for round_no in range(1, ROUNDS + 1):
                rates = {}
                for name, (timed, prepare) in phases.items():
                    with CaptureQueriesContext(connection) as queries:
                        count, elapsed = _measure(timed, prepare, SLICE_S)
                    totals[name][0] += count
                    totals[name][1] += elapsed
                    totals[name][2] += len(queries)
                    rates[name] = count / elapsed
                ratios.append(rates["warm"] / rates["cold"])
                log(
                    f"round {round_no}/{ROUNDS}: warm {rates['warm']:.0f}/s, shared cache "
                    f"{rates['shared']:.0f}/s, cold {rates['cold']:.0f}/s, ratio {ratios[-1]:.1f}; "
                    f"raw Redis GET {rates['baseline']:.0f}/s"
                )
    finally:
        _clean_up(tenant, get_redis())

    per_s = {name: count / elapsed for name, (count, elapsed, _) in totals.items()}
    queries_per = {name: queries / count for name, (count, _, queries) in totals.items()}
    result = {
        "warm_decisions_per_s": round(per_s["warm"], 1),
        "cold_decisions_per_s": round(per_s["cold"], 1),
        "shared_cache_decisions_per_s": round(per_s["shared"], 1),
        "ratio": round(per_s["warm"] / per_s["cold"], 2),
        "ratio_by_round": {
            "min": round(min(ratios), 2), "median": round(statistics.median(ratios), 2),
            "max": round(max(ratios), 2),
        },
        "warm_db_queries_per_decision": round(queries_per["warm"], 3),
        "shared_cache_db_queries_per_decision": round(queries_per["shared"], 3),
        "cold_db_queries_per_decision": round(queries_per["cold"], 3),
        "baseline_redis_get_per_s": round(per_s["baseline"], 1),
        "warm_decision_in_redis_gets": round(per_s["baseline"] / per_s["warm"], 2),
        "warm_decisions": totals["warm"][0],
        "rules": RULES,
        "matching_rule_priority": MATCHING_PRIORITY,
        "pool_members": 3,
        "strategy": "weighted",
        "rounds": ROUNDS,
        "seconds_per_slice": SLICE_S,
    }
    print(json.dumps(result))


def _rule(priority: int) -> tuple[dict[str, object], dict[str, object]]:
    """Rule ``priority``: the matching one, or one of several kinds that miss the benchmark step."""
    if priority == MATCHING_PRIORITY:
        return (
            {"workflow": "billing.*", "action": "http.*", "tags": ["eu"], "conditions": [
                {"path": "customer.tier", "op": "eq", "value": "gold"},
                {"path": "amount", "op": "gt", "value": 100},
            ]},
            {"pool": "main", "partition_key": "customer-{input.customer.id}"},
        )
    kind = priority % 5
    if kind == 0:
        return {"workflow": f"shipping-{priority}.*"}, {"pool": "other"}
    if kind == 1:
        return {"workflow": "billing.*", "action": f"python.task{priority}"}, {"tier": "batch"}
    if kind == 2:
        return {"workflow": "billing.*", "tags": ["eu", f"team-{priority}"]}, {"pool": "other"}
    if kind == 3:
        return (
            {"workflow": "billing.*", "conditions": [
                {"path": "customer.region", "op": "in", "value": ["us", "ca", f"r{priority}"]},
            ]},
            {"deny": f"region rule {priority}"},
        )
    return (
        {"conditions": [
            {"path": "customer.tier", "op": "eq", "value": "gold"},
            {"path": "amount", "op": "lt", "value": priority % 50},
        ]},
        {"tier": "interactive"},
    )


def _measure(
    timed: Callable[[], None], prepare: Callable[[], None] | None, seconds: float
) -> tuple[int, float]:
    """Call ``timed`` repeatedly for about ``seconds``; ``prepare`` runs before each call, untimed."""
    count, spent = 0, 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if prepare is not None:
            prepare()
        start = time.perf_counter()
        timed()
        spent += time.perf_counter() - start
        count += 1
    return count, spent


def _clean_up(tenant: object, redis: object) -> None:
    """Delete the benchmark tenant's rows and every Redis key of it (cache entries included)."""
    from ductor_project.core.context import tenant_context
    from scheduling.models import Connection, Pool, PoolMember, Rule
    from tenants.models import Tenant

    assert isinstance(tenant, Tenant)
    tenant_id, slug = tenant.pk, tenant.slug
    with tenant_context(tenant):
        for model in (Rule, PoolMember, Pool, Connection):
            model.objects.all().delete()
    tenant.delete()
    keys = list(redis.scan_iter(match=f"*t:{tenant_id}:*", count=1000))  # type: ignore[attr-defined]
    for start in range(0, len(keys), 500):
        redis.delete(*keys[start:start + 500])  # type: ignore[attr-defined]
    log(f"cleaned up: tenant {slug} and {len(keys)} Redis keys")


if __name__ == "__main__":
    main()
