"""Diagnostic tasks of the tenancy core."""

from __future__ import annotations

import os
from typing import Any

from ductor_project.core.context import current_tenant
from tenants.tasking import tenant_task


@tenant_task(name="ductor.tenant_ping")
def tenant_ping(token: str = "") -> dict[str, Any]:
    """Answer which tenant the worker ran this task for, and in which process."""
    tenant = current_tenant()
    return {"tenant_id": str(tenant.pk), "slug": tenant.slug, "pid": os.getpid(), "token": token}
