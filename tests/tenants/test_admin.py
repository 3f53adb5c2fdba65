"""Django admin scoping: staff see and edit only their tenant; superusers see all; no row moves tenant."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.messages.storage.cookie import CookieStorage
from django.db import connection
from django.http import HttpRequest
from django.test import Client
from django.test.utils import CaptureQueriesContext

from ductor_project.core.context import tenant_context
from scheduling import services as routing
from tenants import services
from tenants.admin_scoping import TenantListFilter, TenantScopedAdmin
from tenants.entitlements import LIMIT_FIELDS
from tenants.models import ApiKey, Plan, PlatformKey, Tenant, TenantMembership
from tenants.scoping import TenantScopedModel
from tests.scoped.models import Folder, Note
from tests.tenants.helpers import grant, make_user
from workflows import services as workflow_services
from workflows.models import RunEvent, WebhookDelivery, WebhookEndpoint

PROJECT_APPS = ["tenants", "scheduling", "workflows", "scoped"]
SCOPED_PERMS = [
    f"{app}.{action}_{model}"
    for app, model in (
        ("scoped", "folder"),
        ("scoped", "note"),
        ("tenants", "apikey"),
        ("tenants", "tenantmembership"),
    )
    for action in ("view", "change", "add", "delete")
]


@pytest.fixture
def world(tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str]) -> SimpleNamespace:
    a, b = tenant_a[0], tenant_b[0]
    with tenant_context(a):
        fa = Folder.objects.create(name="a-folder")
        fa2 = Folder.objects.create(name="a-folder-2")
        na = Note.objects.create(folder=fa, body="a-note")
        services.api_key_create(name="a-admin-key", scopes=["read"])
    with tenant_context(b):
        fb = Folder.objects.create(name="b-folder")
        nb = Note.objects.create(folder=fb, body="b-note")
        services.api_key_create(name="b-admin-key", scopes=["read"])
    return SimpleNamespace(a=a, b=b, fa=fa, fa2=fa2, na=na, fb=fb, nb=nb)


@pytest.fixture
def staff(world: SimpleNamespace) -> Client:
    """A staff user with a membership in A and every permission on the scoped models."""
    user = make_user("staff-a", tenant=world.a, is_staff=True)
    grant(user, *SCOPED_PERMS, "tenants.view_tenant", "tenants.view_platformkey")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def superuser(world: SimpleNamespace) -> Client:
    client = Client()
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


def url(model: Any, action: str = "changelist", *args: Any) -> str:
    from django.urls import reverse

    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{action}", args=args)


def listed(client: Client, model: Any, query: str = "") -> set[Any]:
    response = client.get(url(model) + query)
    assert response.status_code == 200, response.status_code
    return {obj.pk for obj in response.context["cl"].result_list}


def folder_form(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, **extra}


# --- registration -------------------------------------------------------------------------


@pytest.mark.parametrize("app_label", PROJECT_APPS)
def test_every_model_is_registered_in_the_admin(app_label: str) -> None:
    """Registered with its own admin, or shown as an inline of a registered one."""
    inlines = {inline.model for model_admin in admin.site._registry.values() for inline in model_admin.inlines}
    missing = [
        model._meta.label
        for model in apps.get_app_config(app_label).get_models()
        if model not in admin.site._registry and model not in inlines
    ]
    assert missing == []


# --- staff with a membership ----------------------------------------------------------------


def test_staff_changelists_show_only_rows_of_their_tenant(world: SimpleNamespace, staff: Client) -> None:
    assert listed(staff, Folder) == {world.fa.pk, world.fa2.pk}
    assert listed(staff, Note) == {world.na.pk}
    with tenant_context(world.a):
        a_keys = set(ApiKey.objects.values_list("pk", flat=True))
    assert listed(staff, ApiKey) == a_keys
    assert {m.tenant_id for m in TenantMembership.all_tenants.filter(pk__in=listed(staff, TenantMembership))} == {
        world.a.pk
    }
    page = staff.get(url(ApiKey)).content.decode()
    assert "a-admin-key" in page
    assert "b-admin-key" not in page


def test_staff_tenant_changelist_shows_only_their_tenant(world: SimpleNamespace, staff: Client) -> None:
    assert listed(staff, Tenant) == {world.a.pk}


def test_staff_cannot_open_the_change_page_of_a_row_of_another_tenant(world: SimpleNamespace, staff: Client) -> None:
    for model, row in ((Folder, world.fb), (Note, world.nb)):
        response = staff.get(url(model, "change", row.pk))
        assert response.status_code in (302, 404)
        if response.status_code == 302:
            assert response["Location"] == "/admin/"
        followed = staff.get(url(model, "change", row.pk), follow=True).content.decode()
        assert "b-folder" not in followed
        assert "b-note" not in followed


def test_staff_cannot_change_or_delete_a_row_of_another_tenant(world: SimpleNamespace, staff: Client) -> None:
    response = staff.post(url(Folder, "change", world.fb.pk), folder_form("hijacked"))
    assert response.status_code in (302, 404)
    response = staff.post(url(Folder, "delete", world.fb.pk), {"post": "yes"})
    assert response.status_code in (302, 404)
    response = staff.post(url(Folder), {"action": "delete_selected", "_selected_action": [world.fb.pk], "post": "yes"})
    assert response.status_code in (200, 302)
    assert Folder.all_tenants.get(pk=world.fb.pk).name == "b-folder"
    assert Note.all_tenants.filter(pk=world.nb.pk).exists()


def test_staff_change_form_has_no_tenant_field(world: SimpleNamespace, staff: Client) -> None:
    response = staff.get(url(Folder, "change", world.fa.pk))
    assert response.status_code == 200
    assert "tenant" not in response.context["adminform"].form.fields
    assert 'name="tenant"' not in response.content.decode()


def test_staff_cannot_move_a_row_to_another_tenant(world: SimpleNamespace, staff: Client) -> None:
    response = staff.post(url(Folder, "change", world.fa.pk), folder_form("renamed", tenant=world.b.pk))
    assert response.status_code == 302
    folder = Folder.all_tenants.get(pk=world.fa.pk)
    assert (folder.name, folder.tenant_id) == ("renamed", world.a.pk)


def test_staff_add_stamps_their_own_tenant(world: SimpleNamespace, staff: Client) -> None:
    response = staff.post(url(Folder, "add"), folder_form("added", tenant=world.b.pk))
    assert response.status_code == 302
    assert Folder.all_tenants.get(name="added").tenant_id == world.a.pk


def test_staff_note_form_only_offers_folders_of_the_row_tenant(world: SimpleNamespace, staff: Client) -> None:
    for path in (url(Note, "change", world.na.pk), url(Note, "add")):
        response = staff.get(path)
        assert response.status_code == 200
        choices = set(response.context["adminform"].form.fields["folder"].queryset.values_list("pk", flat=True))
        assert choices == {world.fa.pk, world.fa2.pk}


def test_staff_cannot_point_a_note_at_a_folder_of_another_tenant(world: SimpleNamespace, staff: Client) -> None:
    response = staff.post(url(Note, "change", world.na.pk), {"folder": world.fb.pk, "body": "x", "size": 0})
    assert response.status_code == 200
    assert "folder" in response.context["adminform"].form.errors
    assert Note.all_tenants.get(pk=world.na.pk).folder_id == world.fa.pk


def test_staff_adds_an_api_key_for_their_tenant_stored_hashed(world: SimpleNamespace, staff: Client) -> None:
    response = staff.post(
        url(ApiKey, "add"), {"name": "from-admin", "scopes": "read", "tenant": world.b.pk}, follow=True
    )
    assert response.status_code == 200
    key = ApiKey.all_tenants.get(name="from-admin")
    assert key.tenant_id == world.a.pk
    raw = next(str(message).split(": ")[-1] for message in response.context["messages"])
    assert raw.startswith(f"dct_{key.prefix}_")
    assert raw not in key.secret_hash


def test_a_key_added_in_the_admin_is_shown_on_the_page_and_never_travels_in_a_cookie(
    world: SimpleNamespace, staff: Client
) -> None:
    """A cookie is logged by proxies and kept by the browser if its redirect is not followed: the
    message that shows a new key once is kept on the server, in the session, until it is shown."""
    added = staff.post(url(ApiKey, "add"), {"name": "from-admin", "scopes": "read"})
    assert added.status_code == 302
    cookie = added.cookies.get(CookieStorage.cookie_name)
    in_cookie = [str(m) for m in CookieStorage(HttpRequest())._decode(cookie.value) or []] if cookie else []

    shown = staff.get(added["Location"])
    raw = next(str(message).split(": ")[-1] for message in shown.context["messages"])

    assert raw.startswith("dct_")
    assert not any(raw in message for message in in_cookie), in_cookie
    assert raw not in str(added.cookies)
    assert raw not in str(shown.cookies)


def test_staff_adding_a_name_taken_in_their_tenant_get_the_field_s_error_not_a_crash(
    world: SimpleNamespace, staff: Client
) -> None:
    taken_folder = staff.post(url(Folder, "add"), folder_form("a-folder"))
    taken_key = staff.post(url(ApiKey, "add"), {"name": "a-admin-key", "scopes": "read"})
    other_tenants_name = staff.post(url(Folder, "add"), folder_form("b-folder"))

    assert taken_folder.status_code == taken_key.status_code == 200
    assert taken_folder.context["adminform"].form.errors
    assert taken_key.context["adminform"].form.errors
    assert ApiKey.all_tenants.filter(tenant=world.a, name="a-admin-key").count() == 1
    assert other_tenants_name.status_code == 302
    assert Folder.all_tenants.filter(tenant=world.a, name="b-folder").exists()


def test_superuser_renaming_a_row_to_a_name_taken_in_its_tenant_gets_the_field_s_error(
    world: SimpleNamespace, superuser: Client
) -> None:
    response = superuser.post(url(Folder, "change", world.fa2.pk), folder_form("a-folder"))

    assert response.status_code == 200
    assert response.context["adminform"].form.errors
    assert Folder.all_tenants.get(pk=world.fa2.pk).name == "a-folder-2"


def test_an_api_key_is_never_widened_here_its_scopes_and_expiry_stay_as_issued(
    world: SimpleNamespace, staff: Client
) -> None:
    key = ApiKey.all_tenants.get(tenant=world.a, name="a-admin-key")

    widened = {"name": "renamed", "scopes": "read,write", "expires_at_0": "2099-01-01", "expires_at_1": "00:00"}
    response = staff.post(url(ApiKey, "change", key.pk), widened)

    assert response.status_code == 302
    stored = ApiKey.all_tenants.get(pk=key.pk)
    assert (stored.name, stored.scopes, stored.expires_at) == ("a-admin-key", ["read"], None)


def test_a_viewer_reads_their_tenant_s_rows_and_changes_none_not_even_their_own_role(
    world: SimpleNamespace
) -> None:
    user = make_user("viewer-a", tenant=world.a, role=TenantMembership.Role.VIEWER, is_staff=True)
    grant(user, *SCOPED_PERMS)
    client = Client()
    client.force_login(user)
    membership = TenantMembership.all_tenants.get(user=user)

    page = client.get(url(Folder, "change", world.fa.pk))
    promoted = client.post(url(TenantMembership, "change", membership.pk), {"user": user.pk, "role": "owner"})
    renamed = client.post(url(Folder, "change", world.fa.pk), folder_form("renamed"))
    added = client.post(url(Folder, "add"), folder_form("added"))

    assert page.status_code == 200
    assert not page.context["has_change_permission"]
    assert promoted.status_code == renamed.status_code == added.status_code == 403
    assert TenantMembership.all_tenants.get(pk=membership.pk).role == TenantMembership.Role.VIEWER
    assert Folder.all_tenants.get(pk=world.fa.pk).name == "a-folder"
    assert not Folder.all_tenants.filter(name="added").exists()


def test_a_viewer_does_not_rename_their_tenant(world: SimpleNamespace) -> None:
    user = make_user("viewer-t", tenant=world.a, role=TenantMembership.Role.VIEWER, is_staff=True)
    grant(user, "tenants.view_tenant", "tenants.change_tenant")
    client = Client()
    client.force_login(user)

    page = client.get(url(Tenant, "change", world.a.pk))
    renamed = client.post(url(Tenant, "change", world.a.pk), {"name": "renamed"})

    assert page.status_code == 200
    assert not page.context["has_change_permission"]
    assert renamed.status_code == 403
    assert Tenant.objects.get(pk=world.a.pk).name == world.a.name


def test_staff_cannot_see_platform_keys(world: SimpleNamespace, staff: Client) -> None:
    assert staff.get("/admin/tenants/platformkey/").status_code == 403


def test_staff_given_the_user_permissions_neither_see_nor_take_over_another_tenant_s_user(
    world: SimpleNamespace,
) -> None:
    """Users and groups are platform data: a tenant's staff, even granted Django's permissions on
    them, do not list every tenant's users, and another tenant's user answers as one that does not
    exist: its page is not shown, its password not set."""
    theirs = make_user("b-member", tenant=world.b)
    user = make_user("staff-users", tenant=world.a, is_staff=True)
    grant(user, *(f"auth.{action}_{model}" for model in ("user", "group") for action in ("view", "change", "add",
                                                                                           "delete")))
    client = Client()
    client.force_login(user)
    password = theirs.password
    missing = 10**9

    assert client.get("/admin/auth/user/").status_code == 403
    assert client.get("/admin/auth/group/").status_code == 403
    for path in ("/admin/auth/user/{}/change/", "/admin/auth/user/{}/password/"):
        found, absent = client.get(path.format(theirs.pk)), client.get(path.format(missing))
        assert (found.status_code, found.get("Location")) == (absent.status_code, absent.get("Location"))
        assert found.status_code in (302, 403, 404)
    changed = client.post(f"/admin/auth/user/{theirs.pk}/password/",
                          {"password1": "taken-over-1", "password2": "taken-over-1"})
    assert changed.status_code in (302, 403, 404)
    client.post(f"/admin/auth/user/{theirs.pk}/change/", {"username": "b-member", "is_superuser": "on"})
    theirs.refresh_from_db()
    assert (theirs.password, theirs.is_superuser) == (password, False)


def test_staff_cannot_tell_which_platform_rows_exist(world: SimpleNamespace) -> None:
    """Plans, platform keys and the task catalog are for superusers: their pages answer staff, whatever
    permissions they hold, the same for a row that exists (a plan made for one customer, a task kept
    for one tenant) as for one that does not."""
    from workflows.models import TaskCatalogEntry

    user = make_user("staff-platform", tenant=world.b, is_staff=True)
    grant(user, *(f"{app}.{action}_{model}" for app, model in (("tenants", "plan"), ("tenants", "platformkey"),
                                                                ("workflows", "taskcatalogentry"))
                  for action in ("view", "change", "delete")))
    client = Client()
    client.force_login(user)
    entry = TaskCatalogEntry.objects.create(name="acme.only", queue="acme", tenants=[world.a.slug])
    key, _ = services.platform_key_create(name="ops")
    missing_key = "00000000-0000-0000-0000-00000000dead"
    for model, found, absent in ((TaskCatalogEntry, entry.pk, 10**9), (PlatformKey, key.pk, missing_key),
                                 ("tenants/plan", "enterprise", "no-such-plan")):
        base = f"/admin/{model}/" if isinstance(model, str) else url(model)
        for page in ("change/", "history/", "delete/"):
            seen, unseen = client.get(f"{base}{found}/{page}"), client.get(f"{base}{absent}/{page}")
            assert seen.status_code == unseen.status_code, (base, page, seen.status_code, unseen.status_code)
            assert (seen.get("Location") or "").replace(str(found), "") == (unseen.get("Location") or "").replace(
                str(absent), "")


def test_staff_without_a_membership_sees_no_scoped_rows(world: SimpleNamespace) -> None:
    user = make_user("drifter", is_staff=True)
    grant(user, *SCOPED_PERMS)
    client = Client()
    client.force_login(user)
    assert client.get(url(Folder)).status_code == 403
    assert client.get(url(Folder, "change", world.fa.pk)).status_code in (302, 403)


# --- superusers ----------------------------------------------------------------------------


def test_superuser_sees_every_tenants_rows(world: SimpleNamespace, superuser: Client) -> None:
    assert listed(superuser, Folder) == {world.fa.pk, world.fa2.pk, world.fb.pk}
    assert listed(superuser, Note) == {world.na.pk, world.nb.pk}
    assert len(listed(superuser, ApiKey)) == ApiKey.all_tenants.count()


def every_tenant_read(client: Client, path: str) -> list[str]:
    """The statements of the page at ``path`` that read the tenants table with no bound."""
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path)
    assert response.status_code == 200, response.status_code
    return [query["sql"] for query in captured.captured_queries
            if 'FROM "tenants_tenant"' in query["sql"] and "LIMIT" not in query["sql"]]


def test_a_superusers_list_and_add_page_read_a_bounded_number_of_tenants(
        world: SimpleNamespace, superuser: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its tenant filter and its form's tenant select listed every tenant: on a platform of ten thousand,
    each page of every list read and drew them all, and each add page too."""
    monkeypatch.setattr(TenantListFilter, "shown", 2)
    Tenant.objects.bulk_create([Tenant(slug=f"zz-idle-{n}", name=f"zz-idle-{n}") for n in range(5)])
    last = Tenant.objects.order_by("slug").last()

    assert every_tenant_read(superuser, url(Folder)) == []
    assert every_tenant_read(superuser, url(Folder, "add")) == []
    response = superuser.get(url(Folder) + f"?tenant__id__exact={last.pk}")
    [tenants] = [spec for spec in response.context["cl"].filter_specs if isinstance(spec, TenantListFilter)]
    assert len(tenants.lookup_choices) == 3  # the first two by slug, and the one chosen
    assert str(last.pk) in dict(tenants.lookup_choices)


def test_superuser_has_a_tenant_filter(world: SimpleNamespace, superuser: Client) -> None:
    response = superuser.get(url(Folder))
    assert "tenant" in [spec[0] if isinstance(spec, tuple) else spec for spec in response.context["cl"].list_filter]
    assert "By tenant" in response.content.decode()
    assert listed(superuser, Folder, f"?tenant__id__exact={world.b.pk}") == {world.fb.pk}
    assert listed(superuser, Note, f"?tenant__id__exact={world.a.pk}") == {world.na.pk}


def test_superuser_cannot_move_a_row_to_another_tenant(world: SimpleNamespace, superuser: Client) -> None:
    response = superuser.post(url(Folder, "change", world.fb.pk), folder_form("renamed-b", tenant=world.a.pk))
    assert response.status_code == 302
    folder = Folder.all_tenants.get(pk=world.fb.pk)
    assert (folder.name, folder.tenant_id) == ("renamed-b", world.b.pk)


def test_superuser_note_form_only_offers_folders_of_the_row_tenant(world: SimpleNamespace, superuser: Client) -> None:
    response = superuser.get(url(Note, "change", world.nb.pk))
    choices = set(response.context["adminform"].form.fields["folder"].queryset.values_list("pk", flat=True))
    assert choices == {world.fb.pk}


def test_superuser_cannot_add_a_row_linking_two_tenants(world: SimpleNamespace, superuser: Client) -> None:
    response = superuser.post(url(Note, "add"), {"tenant": world.a.pk, "folder": world.fb.pk, "body": "x", "size": 0})
    assert response.status_code == 200
    assert "folder" in response.context["adminform"].form.errors
    assert not Note.all_tenants.filter(body="x").exists()


def test_superuser_adds_a_row_in_the_chosen_tenant(world: SimpleNamespace, superuser: Client) -> None:
    response = superuser.post(url(Folder, "add"), folder_form("for-b", tenant=world.b.pk))
    assert response.status_code == 302
    assert Folder.all_tenants.get(name="for-b").tenant_id == world.b.pk


def test_superuser_bulk_delete_across_tenants_deletes_each_row_in_its_own_tenant(
    world: SimpleNamespace, superuser: Client
) -> None:
    response = superuser.post(
        url(Note),
        {"action": "delete_selected", "_selected_action": [world.na.pk, world.nb.pk], "post": "yes"},
    )
    assert response.status_code == 302
    assert not Note.all_tenants.exists()
    assert Folder.all_tenants.count() == 3


# --- odd requests a superuser can make ----------------------------------------------------------


def _admins_with(field: str) -> list[Any]:
    return [model for model in admin.site._registry if any(f.name == field for f in model._meta.get_fields())]


def test_a_year_no_date_can_have_is_a_bad_lookup_not_a_crash(world: SimpleNamespace, superuser: Client) -> None:
    models = _admins_with("created_at")
    assert len(models) > 10
    for model in models:
        response = superuser.get(url(model) + "?created_at__year=99999")
        assert response.status_code == 302, (model, response.status_code)
        assert response["Location"].endswith("?e=1")
        assert superuser.get(url(model) + "?created_at__year=2026").status_code == 200, model


def test_the_user_list_answers_a_year_no_date_can_have_as_a_bad_lookup(superuser: Client) -> None:
    for query in ("?date_joined__year=99999", "?last_login__year=0"):
        response = superuser.get(url(get_user_model()) + query)
        assert response.status_code == 302, (query, response.status_code)
        assert response["Location"].endswith("?e=1")
    assert superuser.get(url(get_user_model()) + "?date_joined__year=2026").status_code == 200


def test_an_action_on_an_id_no_row_can_have_changes_nothing_and_says_so(
        world: SimpleNamespace, superuser: Client, staff: Client) -> None:
    """A selection names rows by id: one that no row can have (not a UUID, not a number, a NUL) failed
    when the selection's query was built (a 500), on every list and for every action."""
    with tenant_context(world.a):
        keys = list(ApiKey.objects.order_by("pk").values_list("pk", "revoked_at"))
    posted = 0
    for model, model_admin in admin.site._registry.items():
        for action in [*(model_admin.actions or []), "delete_selected"]:
            for selected in ("not-a-uuid", "1\x00"):
                response = superuser.post(url(model), {"action": action, "index": "0",
                                                       "_selected_action": [selected, str(world.fa.pk)]})
                assert response.status_code in (200, 302), (model, action, selected, response.status_code)
                posted += 1
    for selected in ("not-a-uuid", "1\x00"):
        response = staff.post(url(ApiKey), {"action": "revoke", "index": "0", "_selected_action": [selected]},
                              follow=True)
        assert response.status_code == 200
        assert "A selected item has an id that no item can have." in response.content.decode()
    assert posted > 20, posted
    assert Folder.all_tenants.filter(pk=world.fa.pk).exists()
    with tenant_context(world.a):
        assert list(ApiKey.objects.order_by("pk").values_list("pk", "revoked_at")) == keys


def test_an_add_form_without_a_tenant_says_so_and_adds_nothing(world: SimpleNamespace, superuser: Client) -> None:
    """The unique checks of a scoped row run in its tenant: with none chosen, they are skipped and the
    form's own error on ``tenant`` is what the page shows."""
    checked = 0
    for model, model_admin in admin.site._registry.items():
        if not issubclass(model, TenantScopedModel) or model_admin.inlines:
            continue
        request = SimpleNamespace(user=make_user(f"probe-{model._meta.model_name}", is_staff=True, is_superuser=True),
                                  admin_tenant=None)
        if not model_admin.has_add_permission(request) or "tenant" not in model_admin.get_form(request).base_fields:
            continue
        before = model.all_tenants.count()
        for tenant in ("", "not-a-uuid"):
            response = superuser.post(url(model, "add"), {"tenant": tenant})
            assert response.status_code == 200, (model, tenant, response.status_code)
            assert "tenant" in response.context["adminform"].form.errors, model
        assert model.all_tenants.count() == before
        checked += 1
    assert checked >= 4, checked


def test_staff_with_every_permission_opens_the_add_and_change_page_of_every_scoped_model(
        world: SimpleNamespace) -> None:
    """The tenant field is not theirs: an admin that lists it among its fields failed for them (500)."""
    user = make_user("staff-every", tenant=world.a, is_staff=True)
    models = [model for model in admin.site._registry if issubclass(model, TenantScopedModel)]
    grant(user, *(f"{model._meta.app_label}.{action}_{model._meta.model_name}" for model in models
                  for action in ("add", "change", "view")))
    client = Client()
    client.force_login(user)
    opened = 0
    for model in models:
        with tenant_context(world.a):
            row = model.objects.first()
        for page in ([url(model, "add")] + ([url(model, "change", row.pk)] if row is not None else [])):
            response = client.get(page)
            assert response.status_code in (200, 403), (page, response.status_code)
            opened += response.status_code == 200
    assert opened >= 10, opened  # the others are the platform's (403 to staff)
    with tenant_context(world.a):
        key = ApiKey.objects.get(name="a-admin-key")
    assert (client.get(url(ApiKey, "add")).status_code, client.get(url(ApiKey, "change", key.pk)).status_code) == (
        200, 200)


def test_the_admin_refuses_what_the_api_refuses_with_the_field_s_error_and_saves_nothing(
        world: SimpleNamespace, superuser: Client) -> None:
    """Each was a 500: a NUL in a JSON field, a weight the fair queue refuses (saved all the same),
    a tenant slug in the form of a UUID."""
    from scheduling.models import Connection, FairnessKey

    cases = [
        (Connection, {"tenant": world.a.pk, "name": "nul", "kind": "http",
                      "config": '{"base_url": "https://a.example", "headers": {"X-A": "\\u0000"}}'}, "config", "NUL"),
        (FairnessKey, {"tenant": world.a.pk, "key": "zero", "weight": "0"}, "weight", "greater than or equal to 1"),
        (FairnessKey, {"tenant": world.a.pk, "key": "huge", "weight": "2000000000"}, "weight", "less than or equal"),
        (Tenant, {"slug": "8d314f24-4896-4e0b-a240-c689e6e12bea", "name": "x", "status": "active", "plan": "free"},
         "slug", "not in the form of a UUID"),
    ]
    for model, form, field, words in cases:
        before = model.all_tenants.count() if hasattr(model, "all_tenants") else model.objects.count()
        response = superuser.post(url(model, "add"), form)
        assert response.status_code == 200, (model, response.status_code)
        errors = response.context["adminform"].form.errors
        assert words in str(errors.get(field)), (model, errors)
        after = model.all_tenants.count() if hasattr(model, "all_tenants") else model.objects.count()
        assert after == before, model


def test_json_nested_past_the_parser_and_plans_that_are_not_slugs_are_the_field_s_error_not_a_crash(
        world: SimpleNamespace, superuser: Client) -> None:
    """Each was a 500: JSON nested deeper than the parser goes (in any JSON field, and shown again in
    the form), and a catalog task's plans holding a list or an object."""
    from scheduling.models import Connection
    from tenants.models import TenantEntitlementOverride
    from workflows.models import TaskCatalogEntry

    deep = "[" * 5000 + "]" * 5000
    task = {"name": "team.charge", "description": "", "queue": "team", "arguments": "kwargs", "input_schema": "{}",
            "timeout_s": "", "plans": "[]", "tenants": "[]", "enabled": "on"}
    cases = [
        (Connection, {"tenant": world.a.pk, "name": "deep", "kind": "http", "config": deep}, "config", "valid JSON"),
        (TenantEntitlementOverride, {"tenant": world.a.pk, "field": "max_rules", "value": deep}, "value",
         "valid JSON"),
        (TaskCatalogEntry, {**task, "input_schema": deep}, "input_schema", "valid JSON"),
        (TaskCatalogEntry, {**task, "plans": "[[1]]"}, "plans", "list of plan slugs"),
        (TaskCatalogEntry, {**task, "plans": '[{"slug": "free"}]'}, "plans", "list of plan slugs"),
    ]
    for model, form, field, words in cases:
        before = model.all_tenants.count() if hasattr(model, "all_tenants") else model.objects.count()
        response = superuser.post(url(model, "add"), form)
        assert response.status_code == 200, (model, field, response.status_code)
        errors = response.context["adminform"].form.errors
        assert words in str(errors.get(field)), (model, errors)
        after = model.all_tenants.count() if hasattr(model, "all_tenants") else model.objects.count()
        assert after == before, model
    assert superuser.post(url(TaskCatalogEntry, "add"), {**task, "plans": '["free"]'}).status_code == 302


@pytest.mark.parametrize("number", ["2147483648", "99999999999999999999", "-2147483649"])
def test_a_routing_row_s_number_past_its_column_s_range_is_the_field_s_error_not_a_crash(
        world: SimpleNamespace, superuser: Client, staff: Client, number: str) -> None:
    """The service's write was tried before the model's checks, and failed in the database (a 500)."""
    from scheduling.models import Connection, Rule

    grant(get_user_model().objects.get(username="staff-a"), "scheduling.add_rule", "scheduling.add_connection")
    with tenant_context(world.a):
        routing.pool_create(name="main")
    cases = [
        (Rule, {"name": "big", "priority": number, "enabled": "on", "match": "{}", "action": '{"pool": "main"}'},
         "priority"),
        (Connection, {"name": "big", "kind": "http", "config": '{"base_url": "https://a.example"}',
                      "max_concurrency": number}, "max_concurrency"),
    ]
    for client, tenant in ((superuser, {"tenant": world.a.pk}), (staff, {})):
        for model, form, field in cases:
            response = client.post(url(model, "add"), {**tenant, **form})
            assert response.status_code == 200, (model, response.status_code)
            assert field in response.context["adminform"].form.errors, model
            assert not model.all_tenants.filter(name="big").exists()


@pytest.mark.parametrize("scopes", ["%00", "read,100%"])
def test_an_api_key_s_scope_holding_a_percent_sign_is_the_field_s_error_not_a_crash(
        world: SimpleNamespace, staff: Client, scopes: str) -> None:
    with tenant_context(world.a):
        before = ApiKey.objects.count()
    response = staff.post(url(ApiKey, "add"), {"name": "pct", "scopes": scopes})
    assert response.status_code == 200, response.status_code
    assert "scopes" in response.context["adminform"].form.errors
    with tenant_context(world.a):
        assert ApiKey.objects.count() == before


def test_a_plan_s_tiers_holding_a_percent_sign_are_the_field_s_error_not_a_crash(
        world: SimpleNamespace, superuser: Client) -> None:
    plan = Plan.objects.get(slug="free")
    form = {name: getattr(plan, name) for name in ("slug", "name", *LIMIT_FIELDS)}
    form = {name: "" if value is None else value for name, value in form.items()}
    response = superuser.post(url(Plan, "change", plan.pk), {**form, "allowed_tiers": "standard,100%"})
    assert response.status_code == 200, response.status_code
    assert "allowed_tiers" in response.context["adminform"].form.errors
    assert Plan.objects.get(pk=plan.pk).allowed_tiers == plan.allowed_tiers


def enrolling(world: SimpleNamespace) -> tuple[Client, Any, Any, Any]:
    """A client of A's staff who may add memberships, and three users: another tenant's, a superuser,
    and one of no tenant yet."""
    user = make_user("staff-enrol", tenant=world.a, is_staff=True)
    grant(user, "tenants.add_tenantmembership", "tenants.view_tenantmembership")
    client = Client()
    client.force_login(user)
    return client, make_user("b-user", tenant=world.b), make_user("root-2", is_superuser=True), make_user("nobody-yet")


def test_staff_cannot_enrol_a_user_of_another_tenant_or_a_superuser(world: SimpleNamespace) -> None:
    client, theirs, root, free = enrolling(world)
    before = TenantMembership.all_tenants.count()

    for other in (theirs, root):
        response = client.post(url(TenantMembership, "add"), {"user": other.pk, "role": "owner"})
        assert response.status_code == 200, response.status_code
        assert "Select a valid choice" in str(response.context["adminform"].form.errors["user"])
    assert TenantMembership.all_tenants.count() == before
    assert client.post(url(TenantMembership, "add"), {"user": free.pk, "role": "viewer"}).status_code == 302
    assert TenantMembership.all_tenants.get(user=free).tenant_id == world.a.pk


def test_staff_enrolling_a_user_learn_nothing_of_another_tenant_s_users(world: SimpleNamespace) -> None:
    """The membership form's user is an id: named, another tenant's user (or a superuser) is shown and
    refused exactly as an id that no user has, so that staff can neither read other tenants' usernames
    off the form nor tell which ids are other tenants' users."""
    client, theirs, root, free = enrolling(world)
    missing = 10**9

    def errors(user_id: Any) -> Any:
        response = client.post(url(TenantMembership, "add"), {"user": user_id, "role": "owner"})
        assert response.status_code == 200, response.status_code
        return response.context["adminform"].form.errors["user"]

    for other in (theirs, root):
        shown = client.get(url(TenantMembership, "add") + f"?user={other.pk}").content.decode()
        assert other.username not in shown
        assert errors(other.pk) == errors(missing)
    assert "nobody-yet" in client.get(url(TenantMembership, "add") + f"?user={free.pk}").content.decode()


def test_a_search_takes_its_first_ten_words(world: SimpleNamespace, superuser: Client) -> None:
    """Each word is one more condition on every search field: 1,900 of them held a web worker for seconds."""
    ten = "+".join(["a-admin-key"] * 10)
    assert len(listed(superuser, ApiKey, f"?q={ten}")) == 1
    assert len(listed(superuser, ApiKey, f"?q={ten}+no-such-key")) == 1  # the eleventh word is not taken
    assert len(listed(superuser, ApiKey, "?q=a-admin-key+no-such-key")) == 0


# --- changelists read their rows' relations with the rows ----------------------------------------


def _scoped_admins() -> list[Any]:
    return [model for model, model_admin in admin.site._registry.items()
            if isinstance(model_admin, TenantScopedAdmin) and model._meta.app_label in PROJECT_APPS]


def _foreign_keys_shown(model: Any, columns: Any) -> list[str]:
    names = {field.name for field in model._meta.concrete_fields if field.is_relation and field.many_to_one}
    return [column for column in columns if column in names]


@pytest.mark.parametrize("model", _scoped_admins(), ids=lambda model: model._meta.label)
@pytest.mark.parametrize("who", ["superuser", "staff"])
def test_a_changelist_reads_every_relation_it_shows_in_its_rows_query(
    world: SimpleNamespace, superuser: Client, staff: Client, who: str, model: Any
) -> None:
    """Each relation a list shows (a delivery's endpoint, an event's run, the superuser's tenant
    column) is joined in the list's one query, not read one query per row."""
    client = superuser if who == "superuser" else staff
    grant(get_user_model().objects.get(username="staff-a"), f"{model._meta.app_label}.view_{model._meta.model_name}")
    response = client.get(url(model))
    if who == "staff" and response.status_code == 403:  # a model for the platform's staff alone
        return
    assert response.status_code == 200, response.status_code
    changelist = response.context["cl"]
    selected = changelist.queryset.query.select_related
    for name in _foreign_keys_shown(model, changelist.list_display):
        assert selected is True or name in selected, (model._meta.label, name, selected)


def test_the_run_event_and_webhook_delivery_lists_cost_no_query_per_row(
    world: SimpleNamespace, superuser: Client
) -> None:
    def queries(model: Any) -> tuple[int, int]:
        with CaptureQueriesContext(connection) as captured:
            response = superuser.get(url(model))
        assert response.status_code == 200
        return len(response.context["cl"].result_list), len(captured.captured_queries)

    def add_rows(count: int) -> None:
        for tenant in (world.a, world.b):
            with tenant_context(tenant):
                workflow_services.workflow_put(name="flow", spec={"nodes": [{"id": "a", "type": "action",
                                                                             "action": "noop"}]})
                for _ in range(count):
                    run, _ = workflow_services.run_start(workflow="flow")
                    endpoint = WebhookEndpoint.objects.create(url="https://93.184.216.34/hook",
                                                              events=["run.failed"], secret="x")
                    WebhookDelivery.objects.create(endpoint=endpoint, run=run, type="run.failed", body={})

    add_rows(1)
    few = {model: queries(model) for model in (RunEvent, WebhookDelivery)}
    add_rows(5)
    for model, (rows, count) in few.items():
        more_rows, more_count = queries(model)
        assert more_rows > rows
        assert more_count == count, (model._meta.label, count, more_count)


def test_a_revoked_platform_key_stays_revoked_whatever_its_change_form_says(superuser: Client) -> None:
    key, _ = services.platform_key_create(name="ops")

    revoked = superuser.post(url(PlatformKey), {"action": "revoke", "_selected_action": [key.pk]})
    cleared = superuser.post(url(PlatformKey, "change", key.pk),
                             {"name": "ops", "revoked_at_0": "", "revoked_at_1": ""})

    assert revoked.status_code == cleared.status_code == 302
    assert PlatformKey.objects.get(pk=key.pk).revoked_at is not None


def test_staff_of_a_suspended_tenant_read_their_rows_and_change_none(world: SimpleNamespace, staff: Client) -> None:
    """A suspended tenant acts through the admin no more than through the API (``403
    tenant_suspended``): its staff read their rows, and add, change and delete none."""
    services.tenant_set_status(tenant=world.a, status=Tenant.Status.SUSPENDED)

    page = staff.get(url(Folder, "change", world.fa.pk))
    renamed = staff.post(url(Folder, "change", world.fa.pk), folder_form("renamed"))
    added = staff.post(url(Folder, "add"), folder_form("added"))
    key_added = staff.post(url(ApiKey, "add"), {"name": "new-key", "scopes": ["read"]})
    deleted = staff.post(url(Folder, "delete", world.fa2.pk), {"post": "yes"})

    assert page.status_code == 200
    assert not page.context["has_change_permission"]
    assert renamed.status_code == added.status_code == key_added.status_code == deleted.status_code == 403
    assert Folder.all_tenants.get(pk=world.fa.pk).name == "a-folder"
    assert Folder.all_tenants.filter(pk=world.fa2.pk).exists()
    assert not Folder.all_tenants.filter(name="added").exists()
    assert not ApiKey.all_tenants.filter(name="new-key").exists()


@pytest.mark.parametrize("who", ["viewer", "suspended"])
def test_staff_who_only_read_revoke_no_api_key(world: SimpleNamespace, who: str) -> None:
    """Revoking is a write: a viewer, or the staff of a suspended tenant, is not offered the action, and
    posting it leaves the key as it was."""
    role = TenantMembership.Role.VIEWER if who == "viewer" else TenantMembership.Role.OWNER
    user = make_user(f"{who}-keys", tenant=world.a, role=role, is_staff=True)
    grant(user, *SCOPED_PERMS)
    if who == "suspended":
        services.tenant_set_status(tenant=world.a, status=Tenant.Status.SUSPENDED)
    client = Client()
    client.force_login(user)
    key = ApiKey.all_tenants.get(name="a-admin-key")

    listing = client.get(url(ApiKey))
    posted = client.post(url(ApiKey), {"action": "revoke", "_selected_action": [key.pk]})

    assert listing.status_code == 200
    assert "revoke" not in listing.context["cl"].model_admin.get_actions(listing.wsgi_request)
    assert posted.status_code == 200  # the list again: no action of theirs ran
    assert ApiKey.all_tenants.get(pk=key.pk).revoked_at is None
