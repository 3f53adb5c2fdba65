"""Tenant context for session requests to the admin.

A staff user with a membership acts for that tenant for the whole request;
the context is reset when the response is built. Superusers get no tenant:
their request runs ``across_tenants`` (the database serves it as the
maintenance role, so the rows it shows can be read, their links followed),
and it enters a row's own tenant when it edits it. API requests set their
context in ``tenants.api``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from django.http import HttpRequest, HttpResponse

from ductor_project.core.context import across_tenants, tenant_context
from ductor_project.logs import mark_request_tenant
from tenants.models import Tenant
from tenants.selectors import membership_for_user


def admin_tenant_for(user: object) -> Tenant | None:
    """The tenant a staff (non-superuser) user administers, or None."""
    if getattr(user, "is_superuser", False):
        return None
    membership = membership_for_user(user)
    return membership.tenant if membership else None


class SessionTenantMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith("/admin/"):
            return self.get_response(request)
        tenant = admin_tenant_for(request.user)
        request.admin_tenant = tenant  # type: ignore[attr-defined]
        scope: AbstractContextManager[object]
        if tenant is not None:
            scope = tenant_context(tenant)
            mark_request_tenant(request, tenant)  # for the lines of a 4xx and the access line, written after the scope
        elif getattr(request.user, "is_superuser", False):
            scope = across_tenants("the admin, for a superuser")
        else:
            return self.get_response(request)
        with scope:
            response = self.get_response(request)
            # Render lazily-evaluated responses while the tenant is still in context.
            render = getattr(response, "render", None)
            if callable(render) and not getattr(response, "is_rendered", True):
                response = render()
            return response
