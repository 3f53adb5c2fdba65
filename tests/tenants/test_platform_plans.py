"""GET /api/v1/entitlements, the platform-admin plan and override endpoints, and the admin.

Platform endpoints answer superusers (session) and platform keys; a tenant API
key is told they do not exist (404). A refused request changes nothing.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from rest_framework.test import APIClient

from ductor_project.core.capacity import acquire, tenant_scope
from ductor_project.core.context import tenant_context
from tenants import services, usage
from tenants.models import Plan, Tenant, TenantEntitlementOverride, TenantMembership
from tenants.usage import next_reset, quota_consume, register_ceiling_counter
from tests.conftest import api_client, error_code
from tests.scoped.models import Folder, Note
from tests.tenants.seeded_plans import SEEDED, limits_of

User = get_user_model()


@pytest.fixture
def superuser(db) -> Any:
    return User.objects.create_superuser("root", "root@example.com", "pw")


@pytest.fixture
def superuser_api(superuser) -> APIClient:
    client = APIClient()
    client.force_login(superuser)
    return client


@pytest.fixture
def platform_key_api(db) -> APIClient:
    _, raw = services.platform_key_create(name="ops")
    return api_client(raw)


@pytest.fixture(params=["superuser_session", "platform_key"])
def platform(request, db) -> APIClient:
    # ``db`` is named here so that pytest-django orders these tests with the
    # other database tests (the clients below are looked up dynamically).
    name = "superuser_api" if request.param == "superuser_session" else "platform_key_api"
    return request.getfixturevalue(name)


@pytest.fixture
def counted(monkeypatch) -> None:
    """Count Folders as pools and Notes as rules (stand-ins for the real models)."""
    monkeypatch.setattr(usage, "_CEILING_COUNTERS", {})
    register_ceiling_counter("pools", lambda: Folder.objects.count())
    register_ceiling_counter("rules", lambda: Note.objects.count())


def overrides_of(tenant: Tenant) -> dict[str, Any]:
    return dict(TenantEntitlementOverride.all_tenants.filter(tenant=tenant).values_list("field", "value"))


def plan_of(tenant: Tenant) -> str:
    return Tenant.objects.get(pk=tenant.pk).plan_id


# --- GET /api/v1/entitlements ------------------------------------------------------


def test_entitlements_report_limits_overrides_usage_and_reset_times(
    tenant_a, client_a, redis_client, counted
):
    tenant = tenant_a[0]
    services.override_set(tenant=tenant, field="max_pools", value=7)
    with tenant_context(tenant):
        quota_consume()
        quota_consume()
        assert acquire([tenant_scope(10)], "holder-1", lease_s=60)
        assert acquire([tenant_scope(10)], "holder-2", lease_s=60)
        folder = Folder.objects.create(name="f1")
        Folder.objects.create(name="f2")
        Note.objects.create(folder=folder)

    response = client_a.get("/api/v1/entitlements")

    assert response.status_code == 200
    body = response.json()
    assert body["tenant"] == "tenant-a"
    limits = body["limits"]
    assert limits.pop("plan") == "enterprise"
    assert limits.pop("overridden") == ["max_pools"]
    assert limits == limits_of("enterprise") | {"max_pools": 7}
    assert body["usage"] == {
        "runs_this_month": 2,
        "steps_in_flight": 2,
        "objects": {"workflows": 0, "pools": 2, "connections": 0, "rules": 1, "schedules": 0, "fairness_keys": 0},
    }
    assert datetime.fromisoformat(body["resets"]["monthly_run_quota"]) == next_reset()


def test_tenant_b_never_sees_tenant_as_numbers(tenant_a, client_a, tenant_b, client_b, redis_client, counted):
    a = tenant_a[0]
    services.override_set(tenant=a, field="max_pools", value=7)
    with tenant_context(a):
        quota_consume()
        acquire([tenant_scope(10)], "holder-a", lease_s=60)
        Folder.objects.create(name="a-only")

    body = client_b.get("/api/v1/entitlements").json()

    assert body["tenant"] == "tenant-b"
    assert body["limits"]["max_pools"] == SEEDED["enterprise"]["max_pools"]
    assert body["limits"]["overridden"] == []
    assert body["usage"] == {
        "runs_this_month": 0,
        "steps_in_flight": 0,
        "objects": {"workflows": 0, "pools": 0, "connections": 0, "rules": 0, "schedules": 0, "fairness_keys": 0},
    }
    assert client_a.get("/api/v1/entitlements").json()["usage"]["runs_this_month"] == 1


def test_entitlements_follow_a_plan_change_at_once(tenant_a, client_a, redis_client, platform_key_api):
    assert client_a.get("/api/v1/entitlements").json()["limits"]["plan"] == "enterprise"
    moved = platform_key_api.post("/api/v1/tenants/tenant-a/plan", {"plan": "free"}, format="json")
    assert moved.status_code == 200
    limits = client_a.get("/api/v1/entitlements").json()["limits"]
    assert limits["plan"] == "free"
    assert limits["max_pools"] == SEEDED["free"]["max_pools"]


def test_entitlements_need_a_tenant_credential(db, platform_key_api):
    assert APIClient().get("/api/v1/entitlements").status_code == 401
    response = platform_key_api.get("/api/v1/entitlements")
    assert response.status_code == 403
    assert error_code(response) == "permission_denied"


# --- platform: plans ---------------------------------------------------------------


def test_platform_admin_lists_the_plans_with_their_numbers(platform):
    response = platform.get("/api/v1/plans")
    assert response.status_code == 200
    plans = response.json()
    assert [plan["slug"] for plan in plans] == ["free", "pro", "enterprise"]
    for plan in plans:
        assert {k: plan[k] for k in SEEDED[plan["slug"]]} == SEEDED[plan["slug"]]


def test_platform_admin_retrieves_one_plan(platform):
    response = platform.get("/api/v1/plans/pro")
    assert response.status_code == 200
    body = response.json()
    assert body["slug"] == "pro"
    assert {k: body[k] for k in SEEDED["pro"]} == SEEDED["pro"]
    missing = platform.get("/api/v1/plans/gold")
    assert missing.status_code == 404
    assert error_code(missing) == "not_found"


# --- platform: a tenant's plan -------------------------------------------------------


def test_platform_admin_moves_a_tenant_to_another_plan(platform, tenant_a, redis_client):
    response = platform.post("/api/v1/tenants/tenant-a/plan", {"plan": "pro"}, format="json")
    assert response.status_code == 200
    assert response.json()["plan"] == "pro"
    assert plan_of(tenant_a[0]) == "pro"
    limits = platform.get("/api/v1/tenants/tenant-a/entitlements").json()["limits"]
    assert limits["plan"] == "pro"
    assert limits["max_concurrency"] == SEEDED["pro"]["max_concurrency"]


def test_setting_an_unknown_plan_is_a_400_naming_plan_and_changes_nothing(platform, tenant_a):
    response = platform.post("/api/v1/tenants/tenant-a/plan", {"plan": "gold"}, format="json")
    assert response.status_code == 400
    assert error_code(response) == "invalid"
    assert "plan" in response.json()["error"]["details"]
    assert plan_of(tenant_a[0]) == "enterprise"


@pytest.mark.parametrize(
    ("body", "code", "named"),
    [
        ({}, "invalid", "plan"),
        ({"plan": ""}, "invalid", "plan"),
        ({"plan": "pro", "tier": "x"}, "unknown_field", "tier"),
    ],
)
def test_a_malformed_plan_request_is_a_400_naming_the_field_and_changes_nothing(
    platform, tenant_a, body, code, named
):
    response = platform.post("/api/v1/tenants/tenant-a/plan", body, format="json")
    assert response.status_code == 400
    assert error_code(response) == code
    assert named in response.json()["error"]["details"]
    assert plan_of(tenant_a[0]) == "enterprise"


def test_setting_the_plan_of_an_unknown_tenant_is_a_404(platform, db):
    response = platform.post("/api/v1/tenants/nobody/plan", {"plan": "pro"}, format="json")
    assert response.status_code == 404


def test_the_system_tenant_is_not_reachable_through_the_platform_endpoints(platform, db):
    system = Tenant.system()
    plan_before = plan_of(system)
    assert platform.post("/api/v1/tenants/system/plan", {"plan": "pro"}, format="json").status_code == 404
    assert platform.put(
        "/api/v1/tenants/system/overrides/max_pools", {"value": 1}, format="json"
    ).status_code == 404
    assert platform.get("/api/v1/tenants/system/entitlements").status_code == 404
    assert plan_of(system) == plan_before
    assert overrides_of(system) == {}


# --- platform: overrides ---------------------------------------------------------------


def test_platform_admin_sets_and_clears_an_override(platform, tenant_a, client_a, redis_client):
    url = "/api/v1/tenants/tenant-a/overrides/max_pools"
    assert client_a.get("/api/v1/entitlements").json()["limits"]["max_pools"] == 200  # cached now

    response = platform.put(url, {"value": 7, "reason": "contract #12"}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert (body["field"], body["value"], body["reason"]) == ("max_pools", 7, "contract #12")
    assert body["updated_at"]

    listed = platform.get("/api/v1/tenants/tenant-a/overrides").json()
    assert [(row["field"], row["value"]) for row in listed] == [("max_pools", 7)]
    limits = client_a.get("/api/v1/entitlements").json()["limits"]
    assert (limits["max_pools"], limits["overridden"]) == (7, ["max_pools"])

    assert platform.put(url, {"value": 8}, format="json").json()["value"] == 8  # replaces it
    assert overrides_of(tenant_a[0]) == {"max_pools": 8}

    cleared = platform.delete(url)
    assert cleared.status_code == 204
    assert overrides_of(tenant_a[0]) == {}
    limits = client_a.get("/api/v1/entitlements").json()["limits"]
    assert (limits["max_pools"], limits["overridden"]) == (200, [])
    assert platform.delete(url).status_code == 204  # clearing again is harmless


def test_an_override_value_is_normalized(platform, tenant_a):
    url = "/api/v1/tenants/tenant-a/overrides/allowed_tiers"
    response = platform.put(url, {"value": ["batch", "interactive"]}, format="json")
    assert response.status_code == 200
    assert response.json()["value"] == ["interactive", "batch"]
    rate = platform.put("/api/v1/tenants/tenant-a/overrides/api_rate_per_s", {"value": 2}, format="json")
    assert rate.json()["value"] == 2.0


def test_an_override_of_one_tenant_is_invisible_to_another(platform, tenant_a, tenant_b, client_b):
    platform.put("/api/v1/tenants/tenant-a/overrides/max_pools", {"value": 7}, format="json")
    assert platform.get("/api/v1/tenants/tenant-b/overrides").json() == []
    assert client_b.get("/api/v1/entitlements").json()["limits"]["max_pools"] == 200


@pytest.mark.parametrize("method", ["put", "delete"])
def test_an_override_of_an_unknown_limit_is_a_400_naming_the_field_and_changes_nothing(
    platform, tenant_a, method
):
    response = getattr(platform, method)(
        "/api/v1/tenants/tenant-a/overrides/max_widgets", {"value": 3}, format="json"
    )
    assert response.status_code == 400
    assert error_code(response) == "invalid"
    error = response.json()["error"]
    assert "field" in error["details"]
    assert "max_widgets" in error["message"]
    assert overrides_of(tenant_a[0]) == {}


@pytest.mark.parametrize(
    ("field", "raw_body"),
    [
        ("max_pools", '{"value": "many"}'),
        ("max_pools", '{"value": -1}'),
        ("max_pools", '{"value": 1.5}'),
        ("max_pools", '{"value": null}'),  # refused by the serializer
        ("max_pools", '{"value": 4294967296}'),
        ("api_rate_per_s", '{"value": 0}'),
        ("step_rate_per_s", '{"value": 1e400}'),  # infinite: refused by the serializer
        ("api_burst", '{"value": 0}'),
        ("weight", '{"value": true}'),
        ("allowed_tiers", '{"value": ["gold"]}'),
        ("allowed_tiers", '{"value": []}'),
    ],
)
def test_an_override_with_a_bad_value_is_a_400_naming_the_field_and_changes_nothing(
    platform, tenant_a, redis_client, field, raw_body
):
    response = platform.put(
        f"/api/v1/tenants/tenant-a/overrides/{field}", raw_body, content_type="application/json"
    )
    assert response.status_code == 400, response.content
    assert error_code(response) == "invalid"
    error = response.json()["error"]
    assert "value" in error["details"]
    assert "value" in error["message"]
    if "null" not in raw_body and "1e400" not in raw_body:
        assert f"'{field}'" in error["message"]  # the limit is named too
    assert overrides_of(tenant_a[0]) == {}
    limits = platform.get("/api/v1/tenants/tenant-a/entitlements").json()["limits"]
    assert limits["overridden"] == []


@pytest.mark.parametrize(
    ("body", "code", "named"),
    [({}, "invalid", "value"), ({"value": 3, "why": "x"}, "unknown_field", "why")],
)
def test_a_malformed_override_body_is_a_400_naming_the_field(platform, tenant_a, body, code, named):
    response = platform.put("/api/v1/tenants/tenant-a/overrides/max_pools", body, format="json")
    assert response.status_code == 400
    assert error_code(response) == code
    assert named in response.json()["error"]["details"]
    assert overrides_of(tenant_a[0]) == {}


def test_platform_admin_reads_a_tenants_entitlements(platform, tenant_a, redis_client, counted):
    tenant = tenant_a[0]
    with tenant_context(tenant):
        quota_consume(runs=3)
        acquire([tenant_scope(5)], "h", lease_s=60)
        Folder.objects.create(name="f")

    response = platform.get("/api/v1/tenants/tenant-a/entitlements")

    assert response.status_code == 200
    body = response.json()
    assert body["tenant"] == "tenant-a"
    assert body["limits"]["plan"] == "enterprise"
    assert body["usage"] == {
        "runs_this_month": 3, "steps_in_flight": 1,
        "objects": {"workflows": 0, "pools": 1, "connections": 0, "rules": 0, "schedules": 0, "fairness_keys": 0},
    }
    assert datetime.fromisoformat(body["resets"]["monthly_run_quota"]) == next_reset()


# --- platform endpoints refuse tenant keys -----------------------------------------------

PLATFORM_CALLS = [
    ("get", "/api/v1/plans", None),
    ("get", "/api/v1/plans/free", None),
    ("post", "/api/v1/tenants/{slug}/plan", {"plan": "free"}),
    ("get", "/api/v1/tenants/{slug}/entitlements", None),
    ("get", "/api/v1/tenants/{slug}/overrides", None),
    ("put", "/api/v1/tenants/{slug}/overrides/max_pools", {"value": 999}),
    ("delete", "/api/v1/tenants/{slug}/overrides/max_pools", None),
]


@pytest.mark.parametrize(("method", "path", "body"), PLATFORM_CALLS)
@pytest.mark.parametrize("target", ["tenant-a", "tenant-b"])
def test_a_tenant_api_key_gets_404_on_every_platform_endpoint_and_changes_nothing(
    tenant_a, client_a, tenant_b, redis_client, method, path, body, target
):
    services.override_set(tenant=tenant_a[0], field="max_pools", value=5)
    services.override_set(tenant=tenant_b[0], field="max_pools", value=5)

    response = getattr(client_a, method)(path.format(slug=target), body, format="json")

    assert response.status_code == 404
    assert error_code(response) == "not_found"
    for tenant in (tenant_a[0], tenant_b[0]):
        assert plan_of(tenant) == "enterprise"
        assert overrides_of(tenant) == {"max_pools": 5}


@pytest.mark.parametrize(("method", "path", "body"), PLATFORM_CALLS)
def test_an_anonymous_request_to_a_platform_endpoint_is_401(tenant_a, method, path, body):
    response = getattr(APIClient(), method)(path.format(slug="tenant-a"), body, format="json")
    assert response.status_code == 401
    assert error_code(response) == "not_authenticated"
    assert plan_of(tenant_a[0]) == "enterprise"


def test_a_staff_session_that_is_not_superuser_gets_404_on_platform_endpoints(tenant_a):
    staff = User.objects.create_user("staff-a", password="pw", is_staff=True)
    with tenant_context(tenant_a[0]):
        TenantMembership.objects.create(user=staff, role=TenantMembership.Role.OWNER)
    client = APIClient()
    client.force_login(staff)
    assert client.get("/api/v1/plans").status_code == 404
    response = client.post("/api/v1/tenants/tenant-a/plan", {"plan": "free"}, format="json")
    assert response.status_code == 404
    assert plan_of(tenant_a[0]) == "enterprise"


def test_a_revoked_platform_key_is_refused(db, tenant_a):
    key, raw = services.platform_key_create(name="old")
    key.revoked_at = key.created_at
    key.save()
    response = api_client(raw).post("/api/v1/tenants/tenant-a/plan", {"plan": "free"}, format="json")
    assert response.status_code == 401
    assert plan_of(tenant_a[0]) == "enterprise"


# --- the admin -----------------------------------------------------------------------------

ADMIN_PAGES = [
    "/admin/tenants/plan/",
    "/admin/tenants/plan/add/",
    "/admin/tenants/plan/free/change/",
    "/admin/tenants/tenantentitlementoverride/",
    "/admin/tenants/tenantentitlementoverride/add/",
]


@pytest.fixture
def staff_of_a(tenant_a) -> Client:
    """A staff member of tenant A holding every Django permission of the tenants app.

    With every model permission, only the superuser-only rule keeps them out.
    """
    staff = User.objects.create_user("staff-a", password="pw", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(content_type__app_label="tenants"))
    with tenant_context(tenant_a[0]):
        TenantMembership.objects.create(user=staff, role=TenantMembership.Role.OWNER)
    client = Client()
    client.force_login(staff)
    return client


@pytest.mark.parametrize("page", ADMIN_PAGES)
def test_a_superuser_can_open_the_plan_and_override_admin(superuser, page, db):
    client = Client()
    client.force_login(superuser)
    assert client.get(page).status_code == 200


def test_the_superuser_sees_every_tenants_overrides_in_the_admin(superuser, tenant_a, tenant_b):
    services.override_set(tenant=tenant_a[0], field="max_pools", value=5)
    services.override_set(tenant=tenant_b[0], field="max_rules", value=6)
    client = Client()
    client.force_login(superuser)
    page = client.get("/admin/tenants/tenantentitlementoverride/").content.decode()
    assert "max_pools" in page
    assert "max_rules" in page


@pytest.mark.parametrize("page", ADMIN_PAGES)
def test_a_staff_member_of_a_tenant_cannot_open_the_plan_or_override_admin(staff_of_a, tenant_a, page):
    services.override_set(tenant=tenant_a[0], field="max_pools", value=5)
    assert staff_of_a.get(page).status_code == 403


def test_a_staff_member_of_a_tenant_cannot_see_or_change_its_own_override_in_the_admin(staff_of_a, tenant_a):
    row = services.override_set(tenant=tenant_a[0], field="max_pools", value=5)
    change = f"/admin/tenants/tenantentitlementoverride/{row.pk}/change/"
    assert staff_of_a.get(change).status_code == 403
    response = staff_of_a.post(change, {"tenant": str(tenant_a[0].pk), "field": "max_pools", "value": "500"})
    assert response.status_code == 403
    delete = f"/admin/tenants/tenantentitlementoverride/{row.pk}/delete/"
    assert staff_of_a.post(delete, {"post": "yes"}).status_code == 403
    assert overrides_of(tenant_a[0]) == {"max_pools": 5}


def test_a_staff_member_of_a_tenant_cannot_edit_a_plan_in_the_admin(staff_of_a, db):
    response = staff_of_a.post("/admin/tenants/plan/free/change/", {"slug": "free", "max_pools": "999"})
    assert response.status_code == 403
    assert Plan.objects.get(pk="free").max_pools == SEEDED["free"]["max_pools"]


def test_the_admin_index_of_a_staff_member_does_not_list_plans_or_overrides(staff_of_a, superuser):
    page = staff_of_a.get("/admin/").content.decode()
    assert "/admin/tenants/plan/" not in page
    assert "/admin/tenants/tenantentitlementoverride/" not in page
    root = Client()
    root.force_login(superuser)
    root_page = root.get("/admin/").content.decode()
    assert "/admin/tenants/plan/" in root_page
    assert "/admin/tenants/tenantentitlementoverride/" in root_page


def test_a_tenant_staff_member_cannot_change_the_plan_of_their_own_tenant_in_the_admin(staff_of_a, tenant_a):
    tenant = tenant_a[0]
    staff_of_a.post(
        f"/admin/tenants/tenant/{tenant.pk}/change/",
        {"name": "renamed", "plan": "free", "slug": "tenant-a", "status": "active"},
    )
    assert plan_of(tenant) == "enterprise"


def test_error_bodies_of_platform_endpoints_have_the_one_shape(platform, tenant_a):
    response = platform.post("/api/v1/tenants/tenant-a/plan", {"plan": "gold"}, format="json")
    assert set(json.loads(response.content)) == {"error"}
    assert set(json.loads(response.content)["error"]) == {"code", "message", "details"}
