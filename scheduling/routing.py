"""The routing pipeline: where a step's tenant-scoped decisions are made.

    tenant context → entitlements → rules (cached per tenant) → pool
    → connection (pool strategy, skipping open breakers and full connections)
    → admission through the capacity counters (tenant, pool, connection)

``route(step)`` decides and explains; it consumes nothing, so it also serves
the dry-run endpoint. ``admit(decision, holder_id, lease_s)`` takes the
capacity when the step is dispatched, all scopes or none, and ``release``
gives it back. Every decision carries a trace: the rule that matched (or the
default), the pool, each candidate with its state, the connection chosen and
why.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from ductor_project.core import capacity, scripts
from ductor_project.core.context import current_tenant
from ductor_project.core.keys import redis_key
from ductor_project.core.redis import get_redis
from scheduling import LUA_DIR
from scheduling.circuit import STATES, BreakerState, breaker_key
from scheduling.models import Pool
from scheduling.routing_table import MemberInfo, PoolInfo, RuleInfo, routing_table
from scheduling.rules import Step, matches, render_partition_key
from tenants.entitlements import effective_entitlements
from tenants.models import Tier

DEFAULT_TIER = Tier.STANDARD


@dataclass
class Candidate:
    connection_id: str
    name: str
    weight: int
    priority: int
    state: str
    in_flight: int
    limit: int | None
    eligible: bool
    why: str

    @property
    def busy(self) -> bool:
        """At its concurrency limit with its breaker not open: a slot frees when a call ends."""
        return self.limit is not None and self.in_flight >= self.limit and self.state != BreakerState.OPEN

    def describe(self) -> dict[str, Any]:
        return {
            "connection_id": self.connection_id, "name": self.name, "weight": self.weight,
            "priority": self.priority, "breaker": self.state, "in_flight": self.in_flight,
            "limit": self.limit, "eligible": self.eligible, "why": self.why,
        }


@dataclass
class RoutingDecision:
    allowed: bool
    reason: str
    tier: str
    partition_key: str | None = None
    rule: RuleInfo | None = None
    pool: PoolInfo | None = None
    connection: MemberInfo | None = None
    candidates: list[Candidate] = field(default_factory=list)
    # Refused only because every usable connection is busy: the step should wait, not fail.
    saturated: bool = False

    @property
    def connection_id(self) -> str | None:
        return self.connection.connection_id if self.connection else None

    def trace(self) -> dict[str, Any]:
        """The decision as stored on a step attempt and returned by the explain endpoint."""
        return {
            "allowed": self.allowed,
            "reason": self.reason,
            "rule": self.rule.describe() if self.rule else "default",
            "tier": self.tier,
            "partition_key": self.partition_key,
            "pool": {"id": self.pool.id, "name": self.pool.name, "strategy": self.pool.strategy}
            if self.pool else None,
            "candidates": [c.describe() for c in self.candidates],
            "connection": {"id": self.connection.connection_id, "name": self.connection.name}
            if self.connection else None,
        }


def _first_match(rules: tuple[RuleInfo, ...], step: Step) -> RuleInfo | None:
    for rule in rules:
        if matches(rule.match, step):
            return rule
    return None


def candidate_states(pool: PoolInfo) -> list[Candidate]:
    """Breaker state and live leases of every member of ``pool``: one Redis round trip."""
    if not pool.members:
        return []
    keys: list[str] = []
    for member in pool.members:
        keys.append(breaker_key(member.connection_id))
        keys.append(capacity.connection_scope(member.connection_id, 1).key())
    flat = scripts.run(LUA_DIR / "breaker_state.lua", keys, [settings.DUCTOR_BREAKER_FAILURES])
    out = []
    for index, member in enumerate(pool.members):
        state = STATES[int(flat[2 * index])]
        in_flight = int(flat[2 * index + 1])
        full = member.max_concurrency is not None and in_flight >= member.max_concurrency
        if state == BreakerState.OPEN:
            eligible, why = False, "circuit breaker open"
        elif full:
            eligible, why = False, f"at its concurrency limit ({member.max_concurrency})"
        else:
            eligible, why = True, "half-open: trial call" if state == BreakerState.HALF_OPEN else "available"
        out.append(Candidate(
            connection_id=member.connection_id, name=member.name, weight=member.weight,
            priority=member.priority, state=str(state), in_flight=in_flight,
            limit=member.max_concurrency, eligible=eligible, why=why,
        ))
    return out


def choose(pool: PoolInfo, candidates: list[Candidate]) -> tuple[Candidate | None, str]:
    """Pick a connection by the pool's strategy among eligible candidates."""
    eligible = [c for c in candidates if c.eligible]
    if not eligible:
        return None, "no eligible connection in the pool"
    strategy = pool.strategy
    if strategy == Pool.Strategy.FAILOVER:
        chosen = min(eligible, key=lambda c: (c.priority, c.name))
        return chosen, f"failover: first available by priority ({chosen.priority})"
    if strategy == Pool.Strategy.LEAST_INFLIGHT:
        chosen = min(eligible, key=lambda c: (c.in_flight, c.priority, c.name))
        return chosen, f"least in-flight ({chosen.in_flight})"
    if strategy == Pool.Strategy.WEIGHTED:
        weights = [max(c.weight, 0) for c in eligible]
        if sum(weights) == 0:
            return None, "every eligible connection has weight 0"
        chosen = random.choices(eligible, weights=weights)[0]
        return chosen, f"weighted: {chosen.weight} of {sum(weights)}"
    turn = int(get_redis().incr(redis_key("rr", pool.id)))
    chosen = eligible[turn % len(eligible)]
    return chosen, f"round robin: turn {turn}"


def route(step: Step) -> RoutingDecision:
    """Decide where ``step`` goes, for the tenant in context. Consumes no capacity.

    Raises ``TenantScopeError`` without a tenant. A warm decision does not touch
    PostgreSQL: rules and pools come from the per-tenant routing cache.
    """
    tenant = current_tenant()
    limits = effective_entitlements(tenant)
    table = routing_table()
    rule = _first_match(table.rules, step)
    action = rule.action if rule else {}
    tier = action.get("tier") or step.tier or DEFAULT_TIER
    partition = render_partition_key(action["partition_key"], step) if "partition_key" in action else None
    decision = RoutingDecision(allowed=True, reason="", tier=tier, partition_key=partition, rule=rule)
    if "deny" in action:
        decision.allowed, decision.reason = False, f"denied by rule '{rule.name}': {action['deny']}"  # type: ignore[union-attr]
        return decision
    if tier not in limits.allowed_tiers:
        decision.allowed = False
        decision.reason = f"tier '{tier}' is not allowed by plan '{limits.plan}'"
        return decision
    pool_name = action.get("pool") or step.pool or table.default_pool
    source = "rule" if action.get("pool") else "step hint" if step.pool else "tenant default"
    if pool_name is None:
        decision.reason = "no pool: the step runs without a connection"
        return decision
    pool = table.pools.get(pool_name)
    if pool is None:
        decision.allowed = False
        decision.reason = f"pool '{pool_name}' ({source}) does not exist"
        return decision
    decision.pool = pool
    decision.candidates = candidate_states(pool)
    if not pool.members:
        decision.reason = f"pool '{pool.name}' ({source}) has no connections; the step runs without one"
        return decision
    chosen, why = choose(pool, decision.candidates)
    if chosen is None:
        decision.allowed = False
        decision.saturated = any(c.busy for c in decision.candidates)
        decision.reason = f"pool '{pool.name}' ({source}): {why}"
        return decision
    decision.connection = next(m for m in pool.members if m.connection_id == chosen.connection_id)
    decision.reason = f"pool '{pool.name}' ({source}); {why}: {chosen.name}"
    return decision


def scopes_for(decision: RoutingDecision, *, tenant_admitted: bool = False) -> list[capacity.Scope]:
    """The capacity scopes a step takes: the tenant's, its pool's and its connection's (when limited).

    ``tenant_admitted``: the fair queue already took the tenant's slot at dequeue.
    """
    limits = effective_entitlements(current_tenant())
    scopes = [] if tenant_admitted else [capacity.tenant_scope(limits.max_concurrency)]
    if decision.pool is not None and decision.pool.max_concurrency is not None:
        scopes.append(capacity.pool_scope(decision.pool.id, decision.pool.max_concurrency))
    if decision.connection is not None and decision.connection.max_concurrency is not None:
        scopes.append(
            capacity.connection_scope(decision.connection.connection_id, decision.connection.max_concurrency)
        )
    return scopes


def admit(
    decision: RoutingDecision, holder_id: str, lease_s: float, *, tenant_admitted: bool = False
) -> tuple[bool, float]:
    """Take the decision's capacity for ``holder_id``: every scope or none, then the rates.

    Returns ``(admitted, retry_after_s)``. A refusal holds nothing. With
    ``tenant_admitted`` (a step the fair queue dispatched, which already took the
    tenant's slot and step rate), only the pool and connection limits are taken.
    """
    limits = effective_entitlements(current_tenant())
    scopes = scopes_for(decision, tenant_admitted=tenant_admitted)
    if scopes and not capacity.acquire(scopes, holder_id, lease_s):
        return False, 0.0
    rates: list[tuple[str, float, int]] = (
        [] if tenant_admitted else [("steps", limits.step_rate_per_s, limits.step_burst)]
    )
    if decision.pool is not None and decision.pool.rate_per_s:
        rates.append((f"pool:{decision.pool.id}", decision.pool.rate_per_s, decision.pool.burst or 1))
    if decision.connection is not None and decision.connection.rate_per_s:
        member = decision.connection
        rates.append((f"connection:{member.connection_id}", member.rate_per_s or 0, member.burst or 1))
    # Peek every limiter before charging any, so a refusal normally charges nothing.
    for limiter, rate, burst in rates:
        verdict = capacity.rate_peek(limiter, rate_per_s=rate, burst=burst)
        if not verdict.allowed:
            capacity.release(holder_id)
            return False, verdict.retry_after_s
    for limiter, rate, burst in rates:
        verdict = capacity.rate_check(limiter, rate_per_s=rate, burst=burst)
        if not verdict.allowed:
            capacity.release(holder_id)
            return False, verdict.retry_after_s
    return True, 0.0


def release(holder_id: str) -> None:
    """Give back what ``admit`` took. Idempotent."""
    capacity.release(holder_id)
