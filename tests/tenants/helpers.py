"""Helpers of the tenancy API tests."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from ductor_project.core.context import tenant_context
from tenants.models import ApiKey, Tenant, TenantMembership


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    """The response is ``status`` with exactly ``{"error": {"code", "message", "details"}}``."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    body = json.loads(response.content)
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"code", "message", "details"}, error
    assert error["code"] == code, error
    assert isinstance(error["message"], str)
    assert error["message"]
    assert isinstance(error["details"], dict)
    return dict(error)


def key_rows() -> list[tuple[Any, ...]]:
    """Every API key row of every tenant, as stored (to prove a refused request changed nothing)."""
    return list(
        ApiKey.all_tenants.order_by("pk").values_list(
            "pk", "tenant_id", "name", "secret_hash", "scopes", "expires_at", "revoked_at"
        )
    )


def tenant_rows() -> list[tuple[Any, ...]]:
    return list(Tenant.objects.order_by("pk").values_list("pk", "slug", "name", "status", "plan_id"))


def make_user(username: str, *, tenant: Tenant | None = None, role: str = "owner", **flags: Any) -> Any:
    """A user, with a membership in ``tenant`` if given. ``flags`` are ``is_staff``/``is_superuser``."""
    user = get_user_model().objects.create_user(username=username, password="pw-" + username, **flags)
    if tenant is not None:
        with tenant_context(tenant):
            TenantMembership.objects.create(user=user, role=role)
    return user


def grant(user: Any, *codenames: str) -> None:
    """Give ``user`` model permissions by ``app_label.codename``."""
    for name in codenames:
        app_label, codename = name.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))


def staff_client(username: str, tenant: Tenant, role: str, *codenames: str) -> Any:
    """A Django test client logged in as a staff member of ``tenant`` with ``role`` and the
    permissions ``codenames``."""
    from django.test import Client

    user = make_user(username, tenant=tenant, role=role, is_staff=True)
    grant(user, *codenames)
    client = Client()
    client.force_login(user)
    return client
