"""The routing pipeline: where a step's tenant-scoped decisions are made, once per attempt.

    tenant context → entitlements → rules (cached per tenant) → tier, partition, pool
    → the fair queue, which admits the item at dequeue: the tenant's slot and rate, the pool's,
      and one of the pool's connections (``scheduling.admission``)

``route(step)`` decides, for the tenant in context, where a step attempt goes:
the rule that matched (or the default), its tier, its partition key and its
pool. It consumes nothing and reads no Redis beyond the routing version, so
the tick calls it once per attempt and stores the decision on the attempt; the
worker never routes again. Which connection of the pool the attempt uses is
decided when its slot is free, by the dequeue that admits it, and recorded on
the attempt when it starts (``RoutingDecision.admitted``).

``explain(step)`` is the dry run: the same decision, and how admission would
treat an item of its pool now (each candidate's breaker, slots and rate, and
the connection it would choose), taking no slot, no rate token and no
round-robin turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ductor_project.core.context import current_tenant
from scheduling import admission
from scheduling.fair_queue import AdmissionView
from scheduling.models import Pool
from scheduling.routing_table import PoolInfo, RoutingTable, RuleInfo, routing_table
from scheduling.rules import Step, matches, render_partition_key
from tenants.entitlements import effective_entitlements
from tenants.models import Tier

DEFAULT_TIER = Tier.STANDARD


@dataclass
class RoutingDecision:
    """Where a step attempt goes. ``allowed`` False: it must not run (``reason`` says why)."""

    allowed: bool
    reason: str
    tier: str
    partition_key: str | None = None
    fairness_key: str | None = None
    rule: RuleInfo | None = None
    pool: PoolInfo | None = None

    @property
    def pool_id(self) -> str | None:
        return self.pool.id if self.pool else None

    def trace(self) -> dict[str, Any]:
        """The decision as stored on a step attempt: the connection is chosen at admission."""
        return {
            "allowed": self.allowed,
            "reason": self.reason,
            "rule": self.rule.describe() if self.rule else "default",
            "tier": self.tier,
            "partition_key": self.partition_key,
            "fairness_key": self.fairness_key,
            "pool": {"id": self.pool.id, "name": self.pool.name, "strategy": self.pool.strategy}
            if self.pool else None,
            "candidates": [{"connection_id": m.connection_id, "name": m.name} for m in self.pool.members]
            if self.pool else [],
            "connection": None,
        }


def _first_match(rules: tuple[RuleInfo, ...], step: Step) -> RuleInfo | None:
    for rule in rules:
        if matches(rule.match, step):
            return rule
    return None


def _pool_refusal(pool: PoolInfo) -> str | None:
    """Why no item of ``pool`` could ever be admitted, or None."""
    if pool.strategy == Pool.Strategy.WEIGHTED and pool.members and not any(m.weight > 0 for m in pool.members):
        return "every connection has weight 0"
    return None


def route(step: Step) -> RoutingDecision:
    """Decide where ``step`` goes, for the tenant in context. Consumes nothing.

    Raises ``TenantScopeError`` without a tenant. A warm decision touches neither
    PostgreSQL nor Redis beyond the routing version: rules and pools come from the
    per-tenant routing cache.
    """
    return _route(step, routing_table())


def _route(step: Step, table: RoutingTable) -> RoutingDecision:
    limits = effective_entitlements(current_tenant())
    rule = _first_match(table.rules, step)
    action = rule.action if rule else {}
    tier = action.get("tier") or step.tier or DEFAULT_TIER
    partition = render_partition_key(action["partition_key"], step) if "partition_key" in action else None
    fairness = render_partition_key(action["fairness_key"], step) if "fairness_key" in action else None
    decision = RoutingDecision(allowed=True, reason="", tier=tier, partition_key=partition, fairness_key=fairness,
                               rule=rule)
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
    refusal = _pool_refusal(pool)
    if refusal is not None:
        decision.allowed, decision.reason = False, f"pool '{pool.name}' ({source}): {refusal}"
    elif not pool.members:
        decision.reason = f"pool '{pool.name}' ({source}) has no connections; the step runs without one"
    else:
        decision.reason = f"pool '{pool.name}' ({source}); a connection is chosen when a slot is free"
    return decision


@dataclass
class Explanation:
    """A dry run: the routing decision, and how admission would treat it now."""

    decision: RoutingDecision
    view: AdmissionView | None = None
    names: dict[str, str] = field(default_factory=dict)

    def trace(self) -> dict[str, Any]:
        trace = self.decision.trace()
        pool = self.decision.pool
        if pool is None or self.view is None:
            trace["admission"] = None
            return trace
        view = self.view
        members = {m.connection_id: m for m in pool.members}
        trace["candidates"] = [
            {"connection_id": m.connection_id, "name": self.names.get(m.connection_id, ""),
             "weight": members[m.connection_id].weight, "priority": members[m.connection_id].priority,
             "breaker": m.breaker, "in_flight": m.in_flight, "limit": m.limit, "eligible": m.eligible,
             "why": m.why}
            for m in view.members
        ]
        if view.admitted and view.connection_id:
            trace["connection"] = {"id": view.connection_id, "name": self.names.get(view.connection_id, "")}
        trace["admission"] = {
            "admitted": view.admitted, "why": view.why, "parked": view.parked, "retry_at_ms": view.retry_at_ms,
            "pool_in_flight": view.pool_in_flight, "pool_limit": view.pool_limit,
        }
        return trace


def explain(step: Step) -> Explanation:
    """How ``step`` would be routed and admitted now, for the tenant in context. Takes no slot,
    no rate token and no round-robin turn: only reads."""
    table = routing_table()
    decision = _route(step, table)
    if decision.pool is None:  # a refused pool still shows its candidates' state
        return Explanation(decision)
    names = {m.connection_id: m.name for m in decision.pool.members}
    return Explanation(decision, admission.peek(decision.pool, table), names)
