"""The seeded plans as docs/entitlements.md documents them (tenants/migrations/0003_plans.py, and
0004_plan_max_schedules.py for ``max_schedules``, 0005_plan_event_retention.py for
``event_retention_days``, 0006_plan_history_retention.py for ``history_retention_days``, 0007_plan_max_fairness_keys.py
for ``max_fairness_keys``)."""

from __future__ import annotations

from typing import Any

from tenants.entitlements import LIMIT_FIELDS

# The numbers docs/entitlements.md documents; tenants/migrations/0003_plans.py and 0004 seed them.
SEEDED: dict[str, dict[str, Any]] = {
    "free": {
        "name": "Free", "max_concurrency": 5, "step_rate_per_s": 5.0, "step_burst": 10,
        "monthly_run_quota": 10_000, "max_workflows": 10, "max_pools": 3, "max_connections": 5,
        "max_rules": 20, "max_schedules": 10, "max_fairness_keys": 10, "max_nesting_depth": 2,
        "max_payload_bytes": 65_536,
        "event_retention_days": 7, "history_retention_days": 7,
        "api_rate_per_s": 10.0, "api_burst": 20, "weight": 1, "allowed_tiers": ["standard", "batch"],
    },
    "pro": {
        "name": "Pro", "max_concurrency": 50, "step_rate_per_s": 50.0, "step_burst": 100,
        "monthly_run_quota": 1_000_000, "max_workflows": 200, "max_pools": 20, "max_connections": 50,
        "max_rules": 250, "max_schedules": 200, "max_fairness_keys": 1000, "max_nesting_depth": 5,
        "max_payload_bytes": 524_288,
        "event_retention_days": 30, "history_retention_days": 30,
        "api_rate_per_s": 50.0, "api_burst": 100, "weight": 4,
        "allowed_tiers": ["interactive", "standard", "batch"],
    },
    "enterprise": {
        "name": "Enterprise", "max_concurrency": 500, "step_rate_per_s": 500.0, "step_burst": 1000,
        "monthly_run_quota": 50_000_000, "max_workflows": 2000, "max_pools": 200,
        "max_connections": 500, "max_rules": 1000, "max_schedules": 2000, "max_fairness_keys": 100_000,
        "max_nesting_depth": 10,
        "max_payload_bytes": 1_048_576, "event_retention_days": 90, "history_retention_days": 90,
        "api_rate_per_s": 200.0, "api_burst": 400,
        "weight": 16,
        "allowed_tiers": ["interactive", "standard", "batch"],
    },
}


def limits_of(plan: str) -> dict[str, Any]:
    return {name: SEEDED[plan][name] for name in LIMIT_FIELDS}
