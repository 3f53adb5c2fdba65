"""API authentication: ``Authorization: Bearer dct_…`` and the stable 401/403 codes."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from ductor_project.core.context import across_tenants, tenant_context
from tenants import services
from tenants.models import ApiKey, PlatformKey, Tenant, system_context
from tests.conftest import api_client
from tests.tenants.helpers import assert_error, key_rows, make_user

MakeTenant = Callable[..., tuple[Tenant, str]]


def bearer(value: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=value)
    return client


def test_missing_authorization_header_is_401_not_authenticated(db: None) -> None:
    response = api_client().get("/api/v1/tenant")
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "header",
    [
        "Bearer garbage",
        "Bearer dct_",
        "Bearer dct_onlyprefix",
        "Bearer xyz_AAAAAAAAAA_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB",
        "Bearer",
        "Bearer two tokens",
        "Basic dXNlcjpwYXNz",
        "Token dct_AAAAAAAAAA_BBBB",
        "Bearer dct_AAAAAAAAAA_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB",
        "Bearer dctp_AAAAAAAAAA_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB",
        "Bearer dct_\u00e9\u00e9_\u00e9",
    ],
    ids=[
        "garbage",
        "empty-key",
        "no-secret",
        "wrong-kind",
        "no-token",
        "two-tokens",
        "basic-scheme",
        "token-scheme",
        "unknown-key",
        "unknown-platform-key",
        "non-ascii",
    ],
)
def test_garbage_malformed_or_unknown_key_is_401_invalid_api_key(db: None, header: str) -> None:
    assert_error(bearer(header).get("/api/v1/tenant"), 401, "invalid_api_key")
    assert_error(bearer(header).post("/api/v1/api-keys", {"name": "x"}, format="json"), 401, "invalid_api_key")


@pytest.mark.parametrize(("raw", "form"), [("dct_onlyprefix", "'dct_<prefix>_<secret>'"),
                                           ("dctp_onlyprefix", "'dctp_<prefix>_<secret>'")])
def test_a_malformed_key_is_told_the_form_of_its_own_kind(db: None, raw: str, form: str) -> None:
    response = bearer(f"Bearer {raw}").get("/api/v1/tenant")
    assert_error(response, 401, "invalid_api_key")
    assert form in response.json()["error"]["message"]


def test_known_prefix_with_a_wrong_secret_is_401_invalid_api_key(tenant_a: tuple[Tenant, str]) -> None:
    raw = tenant_a[1]
    kind, prefix, secret = raw.split("_")
    forged = f"{kind}_{prefix}_{secret[::-1]}"
    assert_error(bearer(f"Bearer {forged}").get("/api/v1/tenant"), 401, "invalid_api_key")
    with tenant_context(tenant_a[0]):
        assert ApiKey.objects.get().last_used_at is None


def test_revoked_key_is_401_api_key_revoked(tenant_a: tuple[Tenant, str]) -> None:
    tenant, raw = tenant_a
    with tenant_context(tenant):
        services.api_key_revoke(key=ApiKey.objects.get())
    assert_error(api_client(raw).get("/api/v1/tenant"), 401, "api_key_revoked")


def test_expired_key_is_401_api_key_expired(tenant_a: tuple[Tenant, str]) -> None:
    with tenant_context(tenant_a[0]):
        _, raw = services.api_key_create(name="old", scopes=["read"], expires_at=timezone.now() - timedelta(seconds=1))
    assert_error(api_client(raw).get("/api/v1/tenant"), 401, "api_key_expired")


def test_key_that_has_not_expired_yet_works(tenant_a: tuple[Tenant, str]) -> None:
    with tenant_context(tenant_a[0]):
        _, raw = services.api_key_create(name="fresh", scopes=["read"], expires_at=timezone.now() + timedelta(hours=1))
    assert api_client(raw).get("/api/v1/tenant").status_code == 200


def test_system_tenant_can_never_authenticate(db: None) -> None:
    with system_context():
        _, raw = services.api_key_create(name="sneaky", scopes=["read", "write"])
    client = api_client(raw)
    assert_error(client.get("/api/v1/tenant"), 401, "invalid_api_key")
    assert_error(client.get("/api/v1/api-keys"), 401, "invalid_api_key")
    assert_error(client.post("/api/v1/api-keys", {"name": "more"}, format="json"), 401, "invalid_api_key")
    with system_context():
        assert list(ApiKey.objects.values_list("name", flat=True)) == ["sneaky"]


def test_suspended_tenant_is_403_tenant_suspended(tenant_a: tuple[Tenant, str]) -> None:
    tenant, raw = tenant_a
    services.tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)
    client = api_client(raw)
    before = key_rows()
    assert_error(client.get("/api/v1/tenant"), 403, "tenant_suspended")
    assert_error(client.get("/api/v1/api-keys"), 403, "tenant_suspended")
    assert_error(client.post("/api/v1/api-keys", {"name": "new"}, format="json"), 403, "tenant_suspended")
    with tenant_context(tenant):
        key_id = ApiKey.objects.get().pk
    assert_error(client.post(f"/api/v1/api-keys/{key_id}/revoke"), 403, "tenant_suspended")
    assert key_rows() == before


def test_read_only_key_can_get_but_cannot_write(make_tenant: MakeTenant) -> None:
    tenant, raw = make_tenant("reader", scopes=["read"])
    client = api_client(raw)
    with tenant_context(tenant):
        key_id = ApiKey.objects.get().pk
    assert client.get("/api/v1/tenant").status_code == 200
    assert client.get("/api/v1/api-keys").status_code == 200
    assert client.get(f"/api/v1/api-keys/{key_id}").status_code == 200
    before = key_rows()
    assert_error(client.post("/api/v1/api-keys", {"name": "new"}, format="json"), 403, "insufficient_scope")
    assert_error(client.post(f"/api/v1/api-keys/{key_id}/revoke"), 403, "insufficient_scope")
    assert_error(client.delete(f"/api/v1/api-keys/{key_id}"), 403, "insufficient_scope")
    assert key_rows() == before


def test_write_scope_also_allows_reads(make_tenant: MakeTenant) -> None:
    _, raw = make_tenant("writer", scopes=["write"])
    assert api_client(raw).get("/api/v1/api-keys").status_code == 200


def test_successful_request_sets_last_used_at(tenant_a: tuple[Tenant, str]) -> None:
    tenant, raw = tenant_a
    with tenant_context(tenant):
        assert ApiKey.objects.get().last_used_at is None
    started = timezone.now()
    assert api_client(raw).get("/api/v1/tenant").status_code == 200
    with tenant_context(tenant):
        last_used = ApiKey.objects.get().last_used_at
    assert last_used is not None
    assert last_used >= started


def test_api_key_has_the_documented_form_and_is_stored_only_hashed(tenant_a: tuple[Tenant, str]) -> None:
    tenant, raw = tenant_a
    assert re.fullmatch(r"dct_[A-Za-z0-9]{10}_[A-Za-z0-9]{40}", raw)
    secret = raw.split("_")[2]
    with across_tenants("a test reads the stored row"), connection.cursor() as cursor:
        cursor.execute("SELECT * FROM tenants_apikey WHERE tenant_id = %s", [tenant.pk])
        rows = cursor.fetchall()
    assert len(rows) == 1
    stored_text = " ".join(str(value) for value in rows[0])
    assert secret not in stored_text
    assert raw not in stored_text
    with tenant_context(tenant):
        key = ApiKey.objects.get()
    assert key.secret_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert raw.split("_")[1] == key.prefix


def test_answers_carrying_a_new_key_or_any_tenant_data_may_be_stored_by_no_cache(
    tenant_a: tuple[Tenant, str], db: None
) -> None:
    client = api_client(tenant_a[1])
    created = client.post("/api/v1/api-keys", {"name": "ci", "scopes": ["read"]}, format="json")
    listed = client.get("/api/v1/api-keys")
    refused = bearer("Bearer dct_nope_nope").get("/api/v1/tenant")
    _, platform_raw = services.platform_key_create(name="ops")
    platform = api_client(platform_raw).get("/api/v1/tenants")

    assert (created.status_code, listed.status_code, refused.status_code, platform.status_code) == (
        201, 200, 401, 200)
    assert created.json()["api_key"].startswith("dct_")
    for response in (created, listed, refused, platform):
        assert {"no-store", "private"} <= {part.strip() for part in response["Cache-Control"].split(",")}


def test_platform_key_cannot_act_for_a_tenant(db: None) -> None:
    _, raw = services.platform_key_create(name="ops")
    client = api_client(raw)
    assert_error(client.get("/api/v1/tenant"), 403, "permission_denied")
    assert_error(client.post("/api/v1/api-keys", {"name": "x"}, format="json"), 403, "permission_denied")
    assert PlatformKey.objects.get().last_used_at is not None


def test_revoked_platform_key_is_401_api_key_revoked(db: None) -> None:
    key, raw = services.platform_key_create(name="ops")
    key.revoked_at = timezone.now()
    key.save()
    assert_error(api_client(raw).get("/api/v1/tenants"), 401, "api_key_revoked")


def test_session_member_acts_for_their_tenant(tenant_a: tuple[Tenant, str]) -> None:
    client = APIClient()
    client.force_login(make_user("alice", tenant=tenant_a[0]))
    response = client.get("/api/v1/tenant")
    assert response.status_code == 200
    assert response.json()["slug"] == tenant_a[0].slug
    assert client.post("/api/v1/api-keys", {"name": "by-alice"}, format="json").status_code == 201


def test_session_viewer_cannot_write(tenant_a: tuple[Tenant, str]) -> None:
    client = APIClient()
    client.force_login(make_user("victor", tenant=tenant_a[0], role="viewer"))
    assert client.get("/api/v1/api-keys").status_code == 200
    before = key_rows()
    assert_error(client.post("/api/v1/api-keys", {"name": "x"}, format="json"), 403, "insufficient_scope")
    assert key_rows() == before


def test_session_user_without_membership_gets_no_tenant(db: None) -> None:
    client = APIClient()
    client.force_login(make_user("nobody"))
    assert_error(client.get("/api/v1/tenant"), 403, "permission_denied")
    assert_error(client.get("/api/v1/api-keys"), 403, "permission_denied")


def test_a_read_only_key_writing_to_its_own_objects_is_403_and_another_tenant_s_key_404(
    make_tenant: MakeTenant, redis_client: object
) -> None:
    """Each family's detail writes: the tenant's own object is there (403 naming the scope), another
    tenant's is not (404). Views whose reads go through selectors declared an empty queryset for
    the schema, so their own objects were a 404 to a read-only key."""
    from workflows import services as workflows
    from workflows.triggers import events, webhooks
    from workflows.triggers import services as schedules_services

    tenant, _ = make_tenant("owner")
    _, other_raw = make_tenant("stranger", scopes=["read"])
    with tenant_context(tenant):
        _, reader_raw = services.api_key_create(name="reader", scopes=["read"])
        workflows.workflow_put(name="w", spec={"nodes": [{"id": "a", "type": "action", "action": "noop"}]})
        run, _ = workflows.run_start(workflow="w")
        schedule = schedules_services.schedule_create(name="s", workflow="w", interval_s=3600)
        trigger = events.trigger_create(workflow="w", event="order.paid")
        hook = webhooks.webhook_create(url="https://93.184.216.34/hook", events=["run.failed"]).endpoint
    writes = [("delete", "/api/v1/workflows/w"), ("post", "/api/v1/workflows/w/archive"),
              ("post", f"/api/v1/runs/{run.pk}/cancel"), ("post", f"/api/v1/runs/{run.pk}/retry"),
              ("delete", f"/api/v1/schedules/{schedule.pk}"), ("post", f"/api/v1/schedules/{schedule.pk}/pause"),
              ("delete", f"/api/v1/triggers/{trigger.pk}"), ("delete", f"/api/v1/webhooks/{hook.pk}"),
              ("post", f"/api/v1/webhooks/{hook.pk}/rotate")]
    reader, stranger = api_client(reader_raw), api_client(other_raw)
    for method, path in writes:
        assert_error(getattr(reader, method)(path), 403, "insufficient_scope")
        assert_error(getattr(stranger, method)(path), 404, "not_found")
