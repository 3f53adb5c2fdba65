"""The API rate limit: a DRF throttle keyed by tenant, on the GCRA limiter in Redis.

Each tenant has its own limiter key, so one tenant's flood never throttles
another. The limit comes from the tenant's entitlements (``api_rate_per_s``,
``api_burst``). Refused requests get ``429 rate_limited`` with ``Retry-After``.
"""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from ductor_project.core.capacity import rate_check
from ductor_project.core.context import peek_tenant
from tenants.entitlements import effective_entitlements


class TenantRateThrottle(BaseThrottle):
    def __init__(self) -> None:
        self._wait: float | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        tenant = peek_tenant()
        if tenant is None:  # platform callers and refused requests carry no tenant
            return True
        limits = effective_entitlements(tenant)
        decision = rate_check("api", rate_per_s=limits.api_rate_per_s, burst=limits.api_burst)
        if decision.allowed:
            return True
        self._wait = decision.retry_after_s
        return False

    def wait(self) -> float | None:
        return self._wait
