"""The tenant context: which tenant the current code acts for.

A ``ContextVar`` rather than a thread-local, so that it is isolated per thread,
per asyncio task, and is reset after every request and every Celery task.
Reading scoped data with no tenant set raises ``TenantScopeError``: the context
fails closed.

The context holds the tenant's row (``tenants.models.Tenant``); this layer imports
no app, so it knows a tenant only as a ``TenantLike``: its id, slug and whether
it is the system tenant. What it hands back is the row that was put in.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

SYSTEM_TENANT_SLUG = "system"


class TenantLike(Protocol):
    """What the low layer reads of a tenant (``tenants.models.Tenant`` is one)."""

    @property
    def pk(self) -> Any: ...

    @property
    def slug(self) -> str: ...

    @property
    def is_system(self) -> bool: ...


T = TypeVar("T", bound=TenantLike)

# The row put in by ``tenant_context`` (Any: callers read it as the Tenant model it is).
_current: ContextVar[Any] = ContextVar("ductor_tenant", default=None)
# Why the code in context reads across tenants (``across_tenants``), or "" when it does not.
_across: ContextVar[str] = ContextVar("ductor_across_tenants", default="")


class TenantScopeError(RuntimeError):
    """Scoped data was touched with no tenant in context, or across tenants."""


def id_text(tenant: TenantLike) -> str:
    """``str(tenant.pk)``: the tenant's id as cache keys, the session's scope and log lines name it."""
    pk = tenant.pk
    return _uuid_text(pk.int) if isinstance(pk, uuid.UUID) else str(pk)


@functools.lru_cache(maxsize=65_536)
def _uuid_text(value: int) -> str:
    # A UUID's text is made in Python (about 1.3 µs here), and a worker names the tenant of a step
    # as text dozens of times (docs/performance.md). Kept by the UUID's integer, which hashes and
    # compares in C (a UUID does both in Python). A pure function of an immutable value: nothing
    # of a tenant's data is kept.
    return str(uuid.UUID(int=value))


def current_tenant() -> Any:
    """The tenant in context (the ``Tenant`` row). Raises ``TenantScopeError`` when none is set."""
    tenant = _current.get()
    if tenant is None:
        raise TenantScopeError("no tenant in context: wrap the code in tenant_context(tenant)")
    return tenant


def peek_tenant() -> Any:
    """The tenant in context, or None. For logging and diagnostics only, never for scoping."""
    return _current.get()


def named_or_current(tenant: TenantLike | None, *, what: str) -> Any:
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
def tenant_context(tenant: T) -> Iterator[T]:
    """Act as ``tenant`` inside the block. The previous context is restored on exit, always."""
    if tenant is None or getattr(tenant, "pk", None) is None:
        raise TenantScopeError("tenant_context() needs a saved tenant")
    token, across = _current.set(tenant), _across.set("")
    try:
        yield tenant
    finally:
        _across.reset(across)
        _current.reset(token)


@contextmanager
def across_tenants(reason: str) -> Iterator[None]:
    """Read and write across tenants inside the block, for ``reason`` (the admin, a reconciler,
    a key lookup): the database then serves it as its maintenance role, which row-level
    security lets see every tenant's rows. ``Model.all_tenants`` enters it by itself; a
    ``tenant_context`` inside the block acts for its tenant alone again."""
    if not reason:
        raise ValueError("across_tenants() needs a reason")
    token = _across.set(reason)
    try:
        yield
    finally:
        _across.reset(token)


def database_scope() -> tuple[str, str]:
    """Whom the database serves the code in context as: ``("across", reason)`` inside
    ``across_tenants``, ``("tenant", id)`` inside a tenant's context, else ``("none", "")``
    (which row-level security shows no tenant's rows)."""
    reason = _across.get()
    if reason:
        return "across", reason
    tenant = _current.get()
    return ("tenant", id_text(tenant)) if tenant is not None else ("none", "")


@contextmanager
def no_tenant() -> Iterator[None]:
    """Run the block with no tenant in context (used by workers between tasks)."""
    token, across = _current.set(None), _across.set("")
    try:
        yield
    finally:
        _across.reset(across)
        _current.reset(token)
