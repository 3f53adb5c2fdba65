"""Fixtures of the scheduling tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tenants import services
from tenants.models import Tenant


@pytest.fixture
def weighted(make_tenant: Callable[..., tuple[Tenant, str]]) -> Callable[[str, int], Tenant]:
    """Make a tenant (enterprise plan) whose fair-share weight is overridden to ``weight``."""

    def make(slug: str, weight: int) -> Tenant:
        tenant, _ = make_tenant(slug)
        services.override_set(tenant=tenant, field="weight", value=weight)
        return Tenant.objects.get(pk=tenant.pk)

    return make
