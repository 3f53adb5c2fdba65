"""Tasks of the scoped test app: probes of what a worker process runs with.

The worker autodiscovers them because ``tests.scoped`` is an installed app of
the test settings.
"""

from __future__ import annotations

import os
from typing import Any

from ductor_project.celery import app
from ductor_project.core.context import current_tenant, peek_tenant
from tenants.tasking import tenant_task
from tests.scoped.models import Folder


@tenant_task(name="tests.scoped.fail_in_tenant")
def fail_in_tenant() -> None:
    """Fail inside the tenant context (the context must still be reset)."""
    raise RuntimeError(f"failing inside tenant {current_tenant().slug}")


@tenant_task(name="tests.scoped.create_folder")
def create_folder(name: str) -> dict[str, Any]:
    """Write a scoped row: it must land in the task's tenant."""
    folder = Folder.objects.create(name=name)
    return {"tenant_id": str(folder.tenant_id), "pid": os.getpid()}


@app.task(name="tests.scoped.peek_tenant")
def peek_tenant_between_tasks() -> dict[str, Any]:
    """A plain task (no tenant): reports whatever tenant the process still has in context."""
    tenant = peek_tenant()
    return {"tenant_id": str(tenant.pk) if tenant else None, "pid": os.getpid()}


@tenant_task(name="tests.scoped.retry_once", bind=True, max_retries=1)
def retry_once(self: Any, run_id: str = "") -> None:
    """Ask Celery to run it again, once: Celery's own retry line is written for it."""
    if not self.request.retries:
        raise self.retry(countdown=0)
