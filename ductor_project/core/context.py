"""The tenant context: which tenant the current code acts for.

A ``ContextVar`` rather than a thread-local, so that it is isolated per thread,
per asyncio task, and is reset after every request and every Celery task.
Reading scoped data with no tenant set raises ``TenantScopeError``: the context
fails closed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tenants.models import Tenant

SYSTEM_TENANT_SLUG = "system"

_current: ContextVar[Tenant | None] = ContextVar("ductor_tenant", default=None)


class TenantScopeError(RuntimeError):
    """Scoped data was touched with no tenant in context, or across tenants."""


def current_tenant() -> Tenant:
    """The tenant in context. Raises ``TenantScopeError`` when none is set."""
    tenant = _current.get()
    if tenant is None:
        raise TenantScopeError("no tenant in context: wrap the code in tenant_context(tenant)")
    return tenant


def peek_tenant() -> Tenant | None:
    """The tenant in context, or None. For logging and diagnostics only, never for scoping."""
    return _current.get()


def named_or_current(tenant: Tenant | None, *, what: str) -> Tenant:
    """The tenant an operation on ``what`` acts for: ``tenant`` when named, else the one in
    context. Inside a tenant's context no other tenant can be named: that raises
    ``TenantScopeError``, as does naming none with no tenant in context (fail closed). For
    code that runs both inside a tenant's context and outside any (a dispatcher names it)."""
    in_context = _current.get()
    if tenant is None:
        return current_tenant()
    if in_context is not None and in_context.pk != tenant.pk:
        raise TenantScopeError(f"{what} of another tenant used inside a tenant context")
    return tenant


@contextmanager
def tenant_context(tenant: Tenant) -> Iterator[Tenant]:
    """Act as ``tenant`` inside the block. The previous context is restored on exit, always."""
    if tenant is None or getattr(tenant, "pk", None) is None:
        raise TenantScopeError("tenant_context() needs a saved tenant")
    token = _current.set(tenant)
    try:
        yield tenant
    finally:
        _current.reset(token)


@contextmanager
def no_tenant() -> Iterator[None]:
    """Run the block with no tenant in context (used by workers between tasks)."""
    token = _current.set(None)
    try:
        yield
    finally:
        _current.reset(token)
