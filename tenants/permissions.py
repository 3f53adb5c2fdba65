"""Who may call what: tenant members by scope, platform admins for platform endpoints."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from ductor_project.core.errors import ErrorCode, Forbidden, NotFound
from tenants.models import ApiKey, PlatformKey, Tenant, TenantMembership
from tenants.scoping import TenantScopedModel
from tenants.selectors import membership_for_user

READ_ONLY_ROLES = {TenantMembership.Role.VIEWER}


def request_tenant(request: Request) -> Tenant | None:
    """The tenant a request acts for: its API key's, or the session user's membership."""
    if hasattr(request, "_ductor_tenant"):
        return request._ductor_tenant
    tenant: Tenant | None = None
    if isinstance(request.auth, ApiKey):
        tenant = request.auth.tenant
    elif request.user is not None and getattr(request.user, "is_authenticated", False):
        membership = _membership(request)
        tenant = membership.tenant if membership else None
    request._ductor_tenant = tenant  # type: ignore[attr-defined]
    return tenant


def _membership(request: Request) -> TenantMembership | None:
    """The session user's membership, looked up once per request."""
    if not hasattr(request, "_ductor_membership"):
        request._ductor_membership = membership_for_user(request.user)  # type: ignore[attr-defined]
    return request._ductor_membership  # type: ignore[attr-defined]


def can_write(request: Request) -> bool:
    if isinstance(request.auth, ApiKey):
        return request.auth.has_scope(ApiKey.Scope.WRITE)
    membership = _membership(request)
    return membership is not None and membership.role not in READ_ONLY_ROLES


def can_read(request: Request) -> bool:
    if isinstance(request.auth, ApiKey):
        return request.auth.has_scope(ApiKey.Scope.READ) or can_write(request)
    return _membership(request) is not None


class IsTenantMember(BasePermission):
    """A tenant key or a member session; ``read`` scope for safe methods, ``write`` otherwise.

    A view with ``changes_nothing = True`` (a dry run) needs only ``read`` for every method.
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        tenant = request_tenant(request)
        if tenant is None:
            if is_platform_admin(request):
                raise Forbidden("This endpoint acts for a tenant; use a tenant API key.")
            return False
        if not tenant.is_active:
            state = "being deleted" if tenant.is_deleting else "suspended"
            raise Forbidden(f"Tenant '{tenant.slug}' is {state}.", code=ErrorCode.TENANT_SUSPENDED)
        # A view may declare that even its POST only reads (a dry run): the read scope is enough.
        reads = request.method in SAFE_METHODS or getattr(view, "changes_nothing", False)
        allowed = can_read(request) if reads else can_write(request)
        if not allowed:
            refuse_unseen_object(view)
            needed = "read" if reads else "write"
            raise Forbidden(
                f"This request needs the '{needed}' scope.", code=ErrorCode.INSUFFICIENT_SCOPE
            )
        return True


def refuse_unseen_object(view: Any) -> None:
    """On a detail route, raise ``NotFound`` unless the object is in the view's (scoped) queryset:
    its ``get_queryset()``, or, when that is the class's ``.none()`` (a view whose reads go through
    selectors declares one for the schema alone), the tenant's rows of its model.

    Runs before a scope refusal, so that another tenant's id is a 404 whatever
    the caller's scopes, exactly like an id that does not exist; and the tenant's own object is
    a 403 that names the scope it needs.
    """
    lookup_field: str | None = getattr(view, "lookup_field", None)
    if not lookup_field or not hasattr(view, "get_queryset"):
        return
    value = getattr(view, "kwargs", {}).get(getattr(view, "lookup_url_kwarg", None) or lookup_field)
    if value is None:
        return
    try:
        seen = view.get_queryset()
        if seen.query.is_empty() and issubclass(seen.model, TenantScopedModel):
            seen = seen.model.objects.all()  # the tenant's own, as the scoped manager shows them
        found = seen.filter(**{lookup_field: value}).exists()
    except (DjangoValidationError, ValueError, TypeError):
        found = False
    if not found:
        raise NotFound()


def is_platform_admin(request: Request) -> bool:
    if isinstance(request.auth, PlatformKey):
        return True
    user = request.user
    return bool(user is not None and getattr(user, "is_superuser", False))


class IsPlatformAdmin(BasePermission):
    """Superusers and platform keys. Anyone else is told the endpoint does not exist (404)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.user is None or not getattr(request.user, "is_authenticated", False):
            return False
        if not is_platform_admin(request):
            raise NotFound()
        return True
