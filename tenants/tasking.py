"""The one base of every Celery task: it carries the tenant.

``@tenant_task(...)`` declares a task. Sending it stamps ``tenant_id`` both as a
keyword argument and as a message header (taken from the tenant context when
not given). The worker refuses a message that carries no tenant, or two that
disagree: it logs the refusal and rejects the message without running the
body. Otherwise the body runs inside ``tenant_context(tenant)``, which is reset
afterwards even on error, so two tasks run back to back on one worker process
never share a tenant. Work of the system tenant goes to ``ductor.system``.

Each worker process keeps the tenants it has seen while their stamp is the same
(``tenants.freshness``: a task then reads no PostgreSQL just to learn its tenant), and its database
connection across tasks: Celery's per-task close is off (``CELERY_DB_REUSE_MAX``),
and each task starts with Django's own check of it (age, errors, health).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import structlog
from celery import Task
from celery.exceptions import Reject
from django.db import connections
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from ductor_project.celery import SYSTEM_QUEUE, app
from ductor_project.core.context import TenantScopeError, no_tenant, peek_tenant, tenant_context
from tenants import freshness
from tenants.models import Tenant

log = structlog.get_logger(__name__)

TENANT_HEADER = "ductor_tenant_id"
_tenants: freshness.Copies[Tenant | None] = freshness.Copies()


def cached_tenant(tenant_id: str) -> Tenant | None:
    """The tenant ``tenant_id`` as this process last read it, while its stamp is the same
    (``tenants.freshness``), or None if there is no such tenant (read again every time)."""
    try:
        pk = uuid.UUID(str(tenant_id))
    except ValueError:
        return None
    tenant = _tenants.get(freshness.TenantRef(pk), lambda: Tenant.objects.filter(pk=pk).first())
    if tenant is None:
        _tenants.forget(freshness.TenantRef(pk))  # a tenant made later is found at once
    return tenant


@receiver([post_save, post_delete], sender=Tenant)
def _tenant_changed(sender: Any, instance: Tenant, created: bool = False, **kwargs: Any) -> None:
    """A tenant's row changed or went: every process's copies of it are stale. A new tenant has
    none (a process that looked for it kept nothing), so its creation writes no stamp."""
    if not created:
        freshness.bump(instance)


def refresh_db_connections() -> None:
    """Django's per-request connection check, for a task: drop connections that are too old or
    broken, and have the next query check health. Never one inside a transaction (eager calls)."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


class TenantTaskRefused(Reject):
    """A task message without a usable tenant. It is rejected, never run."""


class UnknownTenant(LookupError):
    """Work named a tenant that does not exist (any more)."""


def restore_tenant(tenant_id: str) -> Tenant:
    """The tenant a task or a handed-off item runs for, before it runs: the database connections
    checked first (``refresh_db_connections``), the tenant read from the process's cache.

    With ``acting_for``, the one way a worker restores a tenant. Raises ``UnknownTenant`` when
    there is no such tenant.
    """
    refresh_db_connections()
    tenant = cached_tenant(tenant_id)
    if tenant is None:
        raise UnknownTenant(tenant_id)
    return tenant


@contextmanager
def acting_for(tenant: Tenant, **log_context: Any) -> Iterator[Tenant]:
    """Act for ``tenant`` alone inside the block (whatever was in context before is not seen),
    with the logs bound to ``log_context``; everything is reset afterwards, even on error."""
    with no_tenant(), tenant_context(tenant), structlog.contextvars.bound_contextvars(**log_context):
        yield tenant


class TenantTask(Task):
    abstract = True
    acks_late = True
    reject_on_worker_lost = True
    # Celery's own argument check would refuse the tenant_id it does not declare;
    # apply_async checks the caller's arguments itself, before adding it.
    typing = False

    def apply_async(  # type: ignore[override]
        self, args: Any = None, kwargs: dict[str, Any] | None = None, **options: Any
    ) -> Any:
        kwargs = dict(kwargs or {})
        tenant_id = kwargs.pop("tenant_id", None)
        self.__header__(*(args or ()), **kwargs)  # type: ignore[attr-defined]  # TypeError on bad arguments
        if tenant_id is None:
            tenant = peek_tenant()
            if tenant is None:
                raise TenantScopeError(f"task {self.name} sent with no tenant in context")
            tenant_id = tenant.pk
        if "queue" not in options and str(tenant_id) == str(Tenant.system().pk):
            options["queue"] = SYSTEM_QUEUE  # a queue given reads no tenant: a retry sent while PostgreSQL is away
        kwargs["tenant_id"] = str(tenant_id)
        headers = dict(options.pop("headers", None) or {})
        headers[TENANT_HEADER] = str(tenant_id)
        return super().apply_async(args, kwargs, headers=headers, **options)

    def _header_tenant(self) -> str | None:
        request = self.request
        value = getattr(request, TENANT_HEADER, None)
        headers = getattr(request, "headers", None)
        if value is None and isinstance(headers, dict):
            value = headers.get(TENANT_HEADER)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tenant_id = kwargs.pop("tenant_id", None)
        header = self._header_tenant()
        if tenant_id is None or (header is not None and str(header) != str(tenant_id)):
            log.error("task_refused_without_tenant", task=self.name, task_id=self.request.id,
                      header_tenant=header, arg_tenant=tenant_id)
            raise TenantTaskRefused("task carries no tenant", requeue=False)
        try:
            tenant = restore_tenant(str(tenant_id))
        except UnknownTenant as exc:
            log.error("task_refused_unknown_tenant", task=self.name, task_id=self.request.id,
                      tenant_id=tenant_id)
            raise TenantTaskRefused("unknown tenant", requeue=False) from exc
        with acting_for(tenant, task=self.name, task_id=self.request.id):
            if self.request.called_directly:
                return super().__call__(*args, **kwargs)
            # Run by a worker (or ``apply``): its tracer already pushed this task and the message's
            # request, which ``Task.__call__`` would hide behind one holding only the arguments.
            return self.run(*args, **kwargs)


def tenant_task(*args: Any, **options: Any) -> Callable[..., Any]:
    """Declare a Celery task that carries its tenant (see module docs), on Ductor's app only: not
    shared with another Celery app created in the same process (a team's, whose own task of the
    same name, such as ``ductor_sdk``'s ``ductor.task_failed`` errback, must stay its own)."""
    options.setdefault("base", TenantTask)
    options.setdefault("shared", False)
    return app.task(*args, **options)
