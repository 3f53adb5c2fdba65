"""Deleting a tenant: ``DELETE /api/v1/tenants/{slug}`` (platform callers only) marks a suspended
tenant ``deleting`` and answers 202 at once; an active one is ``409 conflict`` naming ``status`` and
nothing changes. A tenant being deleted authenticates no more, never comes back, and changes no
more; another tenant goes on as before. The admin's delete takes the same path."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import transaction
from django.test import Client
from rest_framework.test import APIClient

from ductor_project.core.errors import Conflict
from tenants import services
from tenants.models import Tenant, TenantEntitlementOverride
from tests.conftest import api_client
from tests.tenants.helpers import assert_error, key_rows, make_user, tenant_rows
from tests.waiting import in_a_thread, until_another_waits_on_a_lock


@pytest.fixture
def platform(db: None) -> APIClient:
    return api_client(services.platform_key_create(name="ops")[1])


@pytest.fixture
def suspended(tenant_a: tuple[Tenant, str]) -> Tenant:
    return services.tenant_set_status(tenant=tenant_a[0], status=Tenant.Status.SUSPENDED)


def test_deleting_an_active_tenant_is_409_naming_status_and_changes_nothing(
    platform: APIClient, tenant_a: tuple[Tenant, str], client_a: APIClient
) -> None:
    before, keys = tenant_rows(), key_rows()
    error = assert_error(platform.delete("/api/v1/tenants/tenant-a"), 409, "conflict")
    assert set(error["details"]) == {"status"}
    assert (tenant_rows(), key_rows()) == (before, keys)
    assert client_a.get("/api/v1/tenant").status_code == 200


def test_deleting_a_suspended_tenant_is_202_marks_it_deleting_and_again_changes_nothing(
    platform: APIClient, suspended: Tenant, tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str],
    client_b: APIClient,
) -> None:
    first = platform.delete("/api/v1/tenants/tenant-a")
    assert first.status_code == 202, first.content
    assert first.json()["status"] == "deleting"
    marked = Tenant.objects.get(pk=suspended.pk)
    again = platform.delete(f"/api/v1/tenants/{suspended.pk}")
    assert again.status_code == 202
    assert again.json() == first.json()
    assert Tenant.objects.get(pk=suspended.pk).updated_at == marked.updated_at

    assert_error(api_client(tenant_a[1]).get("/api/v1/tenant"), 401, "invalid_api_key")
    assert client_b.get("/api/v1/tenant").json()["slug"] == "tenant-b"
    listed = {t["slug"]: t["status"] for t in platform.get("/api/v1/tenants").json()["results"]}
    assert listed == {"tenant-a": "deleting", "tenant-b": "active"}
    assert platform.get("/api/v1/tenants/tenant-a").json()["status"] == "deleting"


def test_a_tenant_being_deleted_is_never_activated_again_nor_changed(
    platform: APIClient, suspended: Tenant
) -> None:
    assert platform.delete("/api/v1/tenants/tenant-a").status_code == 202
    before = tenant_rows()
    for path, body in (("activate", {}), ("suspend", {}), ("plan", {"plan": "pro"})):
        response = platform.post(f"/api/v1/tenants/tenant-a/{path}", data=json.dumps(body),
                                 content_type="application/json")
        assert set(assert_error(response, 409, "conflict")["details"]) == {"status"}, path
    response = platform.put("/api/v1/tenants/tenant-a/overrides/max_concurrency",
                            data=json.dumps({"value": 3}), content_type="application/json")
    assert_error(response, 409, "conflict")
    assert tenant_rows() == before
    assert not TenantEntitlementOverride.all_tenants.filter(tenant=suspended).exists()


def test_a_tenant_being_deleted_keeps_its_overrides_until_its_purge(platform: APIClient, suspended: Tenant) -> None:
    """Removing an override is a change as setting one is: refused, 409 naming status."""
    services.override_set(tenant=suspended, field="max_concurrency", value=3)
    assert platform.delete("/api/v1/tenants/tenant-a").status_code == 202
    before = tenant_rows()
    response = platform.delete("/api/v1/tenants/tenant-a/overrides/max_concurrency")
    assert set(assert_error(response, 409, "conflict")["details"]) == {"status"}
    assert tenant_rows() == before
    assert TenantEntitlementOverride.all_tenants.filter(tenant=suspended, field="max_concurrency").exists()


def test_only_platform_callers_delete_a_tenant(
    suspended: Tenant, client_b: APIClient, tenant_b: tuple[Tenant, str]
) -> None:
    assert_error(client_b.delete("/api/v1/tenants/tenant-a"), 404, "not_found")
    assert_error(client_b.delete("/api/v1/tenants/tenant-b"), 404, "not_found")
    assert_error(api_client().delete("/api/v1/tenants/tenant-a"), 401, "not_authenticated")
    staff = APIClient()
    staff.force_login(make_user("staff", tenant=tenant_b[0], is_staff=True))
    assert_error(staff.delete("/api/v1/tenants/tenant-a"), 404, "not_found")
    assert Tenant.objects.get(pk=suspended.pk).status == Tenant.Status.SUSPENDED
    root = APIClient()
    root.force_login(make_user("root", is_staff=True, is_superuser=True))
    assert root.delete("/api/v1/tenants/tenant-a").status_code == 202
    assert_error(root.delete("/api/v1/tenants/system"), 404, "not_found")
    assert_error(root.delete("/api/v1/tenants/nobody"), 404, "not_found")


@pytest.mark.django_db(transaction=True)
def test_an_activation_that_meets_a_deletion_under_way_waits_for_it_and_is_refused(
    tenant_a: tuple[Tenant, str]
) -> None:
    """The activation read the tenant suspended, before the deletion committed: written over it, it
    brought a tenant being purged back to life."""
    tenant = services.tenant_set_status(tenant=tenant_a[0], status=Tenant.Status.SUSPENDED)
    held, release, results = threading.Event(), threading.Event(), {}

    def delete() -> str:
        with transaction.atomic():
            services.tenant_delete(tenant=Tenant.objects.get(pk=tenant.pk))
            held.set()
            assert release.wait(30)
        return "deleted"

    deleting = in_a_thread(results, "delete", delete)
    assert held.wait(15)
    activating = in_a_thread(results, "activate", lambda: services.tenant_set_status(
        tenant=Tenant.objects.get(pk=tenant.pk), status=Tenant.Status.ACTIVE))
    until_another_waits_on_a_lock()
    release.set()
    for thread in (deleting, activating):
        thread.join(30)

    assert results["delete"] == "deleted"
    assert isinstance(results["activate"], Conflict), results["activate"]
    assert Tenant.objects.get(pk=tenant.pk).status == Tenant.Status.DELETING


def test_a_member_s_session_of_a_tenant_being_deleted_is_refused_as_a_suspended_tenant_s(
    platform: APIClient, suspended: Tenant
) -> None:
    member = APIClient()
    member.force_login(make_user("member", tenant=suspended))
    assert platform.delete("/api/v1/tenants/tenant-a").status_code == 202
    error = assert_error(member.get("/api/v1/workflows"), 403, "tenant_suspended")
    assert error["message"] == "Tenant 'tenant-a' is being deleted."


def test_the_system_tenant_is_never_deleted_by_the_service(db: None) -> None:
    with pytest.raises(Exception, match="cannot be deleted"):
        services.tenant_delete(tenant=Tenant.system())
    assert Tenant.system().status == Tenant.Status.ACTIVE


# --- the admin ---------------------------------------------------------------------------------------


@pytest.fixture
def root(db: None) -> Client:
    client = Client()
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


def _delete_page(tenant: Tenant) -> str:
    return f"/admin/tenants/tenant/{tenant.pk}/delete/"


def test_the_admin_delete_of_a_suspended_tenant_marks_it_and_keeps_its_rows_for_the_purge(
    root: Client, suspended: Tenant, tenant_b: tuple[Tenant, str]
) -> None:
    keys = key_rows()
    page = root.get(_delete_page(suspended))
    assert page.status_code == 200
    assert "tenant-a and all its data" in page.content.decode()
    response = root.post(_delete_page(suspended), {"post": "yes"}, follow=True)
    assert response.status_code == 200, response.content[:300]
    assert "Tenant tenant-a is being deleted: its data is purged in the background." in response.content.decode()
    assert Tenant.objects.get(pk=suspended.pk).status == Tenant.Status.DELETING
    assert key_rows() == keys  # not Django's cascade: the purge deletes them in batches
    assert Tenant.objects.get(pk=tenant_b[0].pk).status == Tenant.Status.ACTIVE
    assert root.get(f"/admin/tenants/tenant/{suspended.pk}/change/").status_code == 200  # read-only now


def test_the_admin_refuses_to_delete_an_active_tenant_and_to_activate_one_being_deleted(
    root: Client, tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str]
) -> None:
    active = tenant_a[0]
    assert "suspend it first" in root.get(_delete_page(active)).content.decode()
    refused = root.post(_delete_page(active), {"post": "yes"})
    assert refused.status_code == 200  # the page again, naming it protected
    assert "suspend it first" in refused.content.decode()
    listed = root.post("/admin/tenants/tenant/", {"action": "delete_selected", "post": "yes",
                                                  "_selected_action": [str(active.pk), str(tenant_b[0].pk)]})
    assert listed.status_code == 200  # the page that names what is protected
    assert {t.status for t in Tenant.objects.exclude(slug="system")} == {Tenant.Status.ACTIVE}

    services.tenant_set_status(tenant=active, status=Tenant.Status.SUSPENDED)
    marked = root.post("/admin/tenants/tenant/", {"action": "delete_selected", "post": "yes",
                                                  "_selected_action": [str(active.pk)]}, follow=True)
    assert "Being deleted, their data purged in the background: tenant-a." in marked.content.decode()
    response = root.post("/admin/tenants/tenant/", {"action": "activate", "index": "0",
                                                    "_selected_action": [str(active.pk), str(tenant_b[0].pk)]},
                         follow=True)
    assert "is being deleted" in response.content.decode()
    assert Tenant.objects.get(pk=active.pk).status == Tenant.Status.DELETING


def test_the_admin_form_does_not_set_deleting_by_hand(root: Client, tenant_a: tuple[Tenant, str]) -> None:
    tenant = tenant_a[0]
    response = root.post(f"/admin/tenants/tenant/{tenant.pk}/change/",
                         {"slug": tenant.slug, "name": tenant.name, "status": "deleting", "plan": tenant.plan_id})
    assert response.status_code == 200
    assert "Suspend the tenant, then delete it." in response.content.decode()
    assert Tenant.objects.get(pk=tenant.pk).status == Tenant.Status.ACTIVE
