"""Tenant context for session requests to the admin.

A staff user with a membership acts for that tenant for the whole request;
the context is reset when the response is built. Superusers get no tenant:
the admin reads across tenants through ``all_tenants`` and enters a row's own
tenant when it edits it. API requests set their context in ``tenants.api``.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from ductor_project.core.context import tenant_context
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
        if tenant is None:
            return self.get_response(request)
        with tenant_context(tenant):
            response = self.get_response(request)
            # Render lazily-evaluated responses while the tenant is still in context.
            render = getattr(response, "render", None)
            if callable(render) and not getattr(response, "is_rendered", True):
                response = render()
            return response
