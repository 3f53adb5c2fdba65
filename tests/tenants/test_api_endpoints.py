"""The tenancy endpoints under /api/v1/, the one error shape, and the OpenAPI schema."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from ductor_project.core.context import tenant_context
from tenants import services
from tenants.models import ApiKey, Tenant
from tests.conftest import api_client
from tests.tenants.helpers import assert_error, key_rows, make_user, tenant_rows

MakeTenant = Callable[..., tuple[Tenant, str]]
KEY_FIELDS = {
    "id",
    "name",
    "display",
    "scopes",
    "state",
    "created_at",
    "last_used_at",
    "expires_at",
    "revoked_at",
}


@pytest.fixture
def superuser_client(db: None) -> APIClient:
    client = APIClient()
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def platform_client(db: None) -> APIClient:
    _, raw = services.platform_key_create(name="ops")
    return api_client(raw)


def post_json(client: APIClient, path: str, body: Any) -> Any:
    return client.post(path, data=json.dumps(body), content_type="application/json")


# --- GET /api/v1/tenant -------------------------------------------------------------


def test_current_tenant_is_the_tenant_of_the_key(tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str]) -> None:
    for tenant, raw in (tenant_a, tenant_b):
        body = api_client(raw).get("/api/v1/tenant").json()
        assert body["id"] == str(tenant.pk)
        assert body["slug"] == tenant.slug
        assert body["status"] == "active"


# --- /api/v1/api-keys ---------------------------------------------------------------


def test_api_key_list_shows_own_keys_without_secrets(tenant_a: tuple[Tenant, str], client_a: APIClient) -> None:
    response = client_a.get("/api/v1/api-keys")
    assert response.status_code == 200
    results = response.json()["results"]
    assert [key["name"] for key in results] == ["test"]
    assert set(results[0]) == KEY_FIELDS
    assert results[0]["state"] == "active"
    assert results[0]["display"].startswith("dct_")
    assert results[0]["display"].endswith("…")
    assert tenant_a[1] not in response.content.decode()
    assert tenant_a[1].split("_")[2] not in response.content.decode()


def test_api_key_create_returns_the_secret_once(client_a: APIClient) -> None:
    response = post_json(client_a, "/api/v1/api-keys", {"name": "ci", "scopes": ["read"]})
    assert response.status_code == 201
    created = response.json()
    raw = created["api_key"]
    assert raw.startswith("dct_")
    assert created["scopes"] == ["read"]
    assert created["state"] == "active"
    secret = raw.split("_")[2]
    listed = client_a.get("/api/v1/api-keys")
    retrieved = client_a.get(f"/api/v1/api-keys/{created['id']}")
    assert retrieved.status_code == 200
    assert set(retrieved.json()) == KEY_FIELDS
    for response in (listed, retrieved):
        assert secret not in response.content.decode()
        assert "api_key" not in response.content.decode()
    new_client = api_client(raw)
    assert new_client.get("/api/v1/tenant").status_code == 200
    assert_error(post_json(new_client, "/api/v1/api-keys", {"name": "x"}), 403, "insufficient_scope")


def test_api_key_create_defaults_to_read_and_write(client_a: APIClient) -> None:
    created = post_json(client_a, "/api/v1/api-keys", {"name": "full"}).json()
    assert created["scopes"] == ["read", "write"]
    assert post_json(api_client(created["api_key"]), "/api/v1/api-keys", {"name": "child"}).status_code == 201


def test_api_key_create_with_expiry_records_it(client_a: APIClient) -> None:
    expires = (timezone.now() + timedelta(days=1)).replace(microsecond=0)
    created = post_json(client_a, "/api/v1/api-keys", {"name": "temp", "expires_at": expires.isoformat()}).json()
    assert created["expires_at"] is not None
    assert api_client(created["api_key"]).get("/api/v1/tenant").status_code == 200


def test_api_key_create_with_a_duplicate_name_is_409_conflict(client_a: APIClient) -> None:
    before = key_rows()
    error = assert_error(post_json(client_a, "/api/v1/api-keys", {"name": "test"}), 409, "conflict")
    assert "name" in error["details"]
    assert key_rows() == before


def test_api_key_create_with_an_expiry_in_the_past_is_400(client_a: APIClient) -> None:
    before = key_rows()
    past = (timezone.now() - timedelta(minutes=1)).isoformat()
    error = assert_error(post_json(client_a, "/api/v1/api-keys", {"name": "x", "expires_at": past}), 400, "invalid")
    assert "expires_at" in error["message"]
    assert key_rows() == before


def test_api_key_retrieve_unknown_or_malformed_id_is_404(client_a: APIClient) -> None:
    assert_error(client_a.get(f"/api/v1/api-keys/{uuid.uuid4()}"), 404, "not_found")
    assert_error(client_a.get("/api/v1/api-keys/not-a-uuid"), 404, "not_found")


@pytest.mark.parametrize("how", ["post-revoke", "delete"])
def test_api_key_revoke_is_idempotent_and_the_key_stops_working(make_tenant: MakeTenant, how: str) -> None:
    tenant, raw = make_tenant("revoker")
    with tenant_context(tenant):
        victim, victim_raw = services.api_key_create(name="victim", scopes=["read"])
    client = api_client(raw)

    def revoke() -> Any:
        if how == "delete":
            return client.delete(f"/api/v1/api-keys/{victim.pk}")
        return client.post(f"/api/v1/api-keys/{victim.pk}/revoke")

    first = revoke()
    assert first.status_code == 200
    assert first.json()["state"] == "revoked"
    second = revoke()
    assert second.status_code == 200
    assert second.json()["revoked_at"] == first.json()["revoked_at"]
    assert_error(api_client(victim_raw).get("/api/v1/tenant"), 401, "api_key_revoked")
    assert client.get("/api/v1/tenant").status_code == 200
    listed = {key["name"]: key["state"] for key in client.get("/api/v1/api-keys").json()["results"]}
    assert listed == {"test": "active", "victim": "revoked"}


def test_api_key_list_is_paginated_newest_first(tenant_a: tuple[Tenant, str], client_a: APIClient) -> None:
    with tenant_context(tenant_a[0]):
        for index in range(3):
            services.api_key_create(name=f"k{index}", scopes=["read"])
    first = client_a.get("/api/v1/api-keys?page_size=2").json()
    assert [key["name"] for key in first["results"]] == ["k2", "k1"]
    second = client_a.get(first["next"]).json()
    assert [key["name"] for key in second["results"]] == ["k0", "test"]


# --- platform-admin /api/v1/tenants ----------------------------------------------------


@pytest.mark.parametrize("who", ["superuser", "platform-key"])
def test_platform_admin_creates_lists_retrieves_suspends_and_activates_tenants(
    db: None, who: str, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue("superuser_client" if who == "superuser" else "platform_client")
    created = post_json(client, "/api/v1/tenants", {"slug": "acme", "name": "Acme", "create_api_key": True})
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["slug"] == "acme"
    assert body["status"] == "active"
    acme_client = api_client(body["api_key"])
    assert acme_client.get("/api/v1/tenant").json()["slug"] == "acme"

    plain = post_json(client, "/api/v1/tenants", {"slug": "plain"})
    assert plain.status_code == 201
    assert "api_key" not in plain.json()

    listed = client.get("/api/v1/tenants")
    assert listed.status_code == 200
    slugs = [tenant["slug"] for tenant in listed.json()["results"]]
    assert set(slugs) == {"acme", "plain"}
    assert "system" not in slugs

    assert client.get("/api/v1/tenants/acme").json()["id"] == body["id"]
    assert client.get(f"/api/v1/tenants/{body['id']}").json()["slug"] == "acme"

    suspended = client.post("/api/v1/tenants/acme/suspend")
    assert suspended.status_code == 200
    assert suspended.json()["status"] == "suspended"
    assert_error(acme_client.get("/api/v1/tenant"), 403, "tenant_suspended")
    assert client.post("/api/v1/tenants/acme/suspend").json()["status"] == "suspended"

    activated = client.post("/api/v1/tenants/acme/activate")
    assert activated.status_code == 200
    assert activated.json()["status"] == "active"
    assert acme_client.get("/api/v1/tenant").status_code == 200


def test_platform_admin_cannot_see_or_change_the_system_tenant(superuser_client: APIClient) -> None:
    before = tenant_rows()
    assert_error(superuser_client.get("/api/v1/tenants/system"), 404, "not_found")
    assert_error(superuser_client.post("/api/v1/tenants/system/suspend"), 404, "not_found")
    assert_error(post_json(superuser_client, "/api/v1/tenants", {"slug": "system"}), 409, "conflict")
    assert tenant_rows() == before


def test_platform_tenant_create_with_a_taken_slug_is_409(
    superuser_client: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    before = tenant_rows()
    error = assert_error(post_json(superuser_client, "/api/v1/tenants", {"slug": tenant_a[0].slug}), 409, "conflict")
    assert "slug" in error["details"]
    assert tenant_rows() == before


def test_platform_endpoints_with_a_tenant_key_are_404(tenant_a: tuple[Tenant, str], client_b: APIClient) -> None:
    before = tenant_rows()
    slug = tenant_a[0].slug
    assert_error(client_b.get("/api/v1/tenants"), 404, "not_found")
    assert_error(post_json(client_b, "/api/v1/tenants", {"slug": "evil"}), 404, "not_found")
    assert_error(client_b.get(f"/api/v1/tenants/{slug}"), 404, "not_found")
    assert_error(client_b.post(f"/api/v1/tenants/{slug}/suspend"), 404, "not_found")
    assert tenant_rows() == before


def test_platform_endpoints_for_staff_without_superuser_are_404(tenant_a: tuple[Tenant, str]) -> None:
    client = APIClient()
    client.force_login(make_user("staff", tenant=tenant_a[0], is_staff=True))
    assert_error(client.get("/api/v1/tenants"), 404, "not_found")
    assert_error(client.post(f"/api/v1/tenants/{tenant_a[0].slug}/suspend"), 404, "not_found")


def test_platform_endpoints_without_credentials_are_401(db: None) -> None:
    assert_error(api_client().get("/api/v1/tenants"), 401, "not_authenticated")


# --- the error shape ---------------------------------------------------------------------


@pytest.mark.parametrize("body", ['{"name": ', "{'name': 'x'}", "not json", '{"name": "x"}}'])
def test_malformed_json_is_400_malformed_json(client_a: APIClient, body: str) -> None:
    before = key_rows()
    assert_error(client_a.post("/api/v1/api-keys", data=body, content_type="application/json"), 400, "malformed_json")
    assert key_rows() == before


def test_malformed_json_on_a_platform_endpoint_is_400_malformed_json(superuser_client: APIClient) -> None:
    before = tenant_rows()
    response = superuser_client.post("/api/v1/tenants", data="{", content_type="application/json")
    assert_error(response, 400, "malformed_json")
    assert tenant_rows() == before


def test_unknown_field_is_400_unknown_field_naming_it(client_a: APIClient, superuser_client: APIClient) -> None:
    before = (key_rows(), tenant_rows())
    error = assert_error(
        post_json(client_a, "/api/v1/api-keys", {"name": "x", "tenant": "other", "is_admin": True}),
        400,
        "unknown_field",
    )
    assert "is_admin" in error["message"]
    assert "tenant" in error["message"]
    assert set(error["details"]) == {"is_admin", "tenant"}
    error = assert_error(
        post_json(superuser_client, "/api/v1/tenants", {"slug": "new", "status": "x"}), 400, "unknown_field"
    )
    assert "status" in error["message"]
    assert (key_rows(), tenant_rows()) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": ["x"]}, "name"),
        ({"name": {"nested": 1}}, "name"),
        ({"name": None}, "name"),
        ({"name": ""}, "name"),
        ({"name": "x" * 101}, "name"),
        ({"name": "x", "scopes": "read"}, "scopes"),
        ({"name": "x", "scopes": []}, "scopes"),
        ({"name": "x", "scopes": ["admin"]}, "scopes[0]"),  # the item, by its index
        ({"name": "x", "expires_at": "tomorrow"}, "expires_at"),
        ({"name": "x", "expires_at": 12}, "expires_at"),
        ({}, "name"),
    ],
    ids=[
        "name-list",
        "name-object",
        "name-null",
        "name-empty",
        "name-too-long",
        "scopes-string",
        "scopes-empty",
        "scopes-unknown",
        "expires-text",
        "expires-number",
        "name-missing",
    ],
)
def test_wrong_types_are_400_invalid_naming_the_field(client_a: APIClient, body: dict[str, Any], field: str) -> None:
    before = key_rows()
    error = assert_error(post_json(client_a, "/api/v1/api-keys", body), 400, "invalid")
    assert field in error["message"]
    assert field in error["details"]
    assert key_rows() == before


@pytest.mark.parametrize("body", [[1, 2], "a string", 42, None, True])
def test_a_body_that_is_not_an_object_is_400_invalid(client_a: APIClient, body: Any) -> None:
    before = key_rows()
    assert_error(post_json(client_a, "/api/v1/api-keys", body), 400, "invalid")
    assert key_rows() == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"slug": "Not A Slug!"}, "slug"),
        ({"slug": ["acme"]}, "slug"),
        ({"slug": "acme", "create_api_key": "maybe"}, "create_api_key"),
        ({"slug": "acme", "name": 5 * ["x"]}, "name"),
    ],
    ids=["slug-invalid", "slug-list", "create-key-not-bool", "name-list"],
)
def test_platform_tenant_create_with_wrong_types_is_400_invalid_naming_the_field(
    superuser_client: APIClient, body: dict[str, Any], field: str
) -> None:
    before = tenant_rows()
    error = assert_error(post_json(superuser_client, "/api/v1/tenants", body), 400, "invalid")
    assert field in error["message"]
    assert tenant_rows() == before


def test_a_slug_refused_by_its_pattern_or_as_a_uuid_is_refused_in_the_same_words(superuser_client: APIClient) -> None:
    refusals = [assert_error(post_json(superuser_client, "/api/v1/tenants", {"slug": slug}), 400, "invalid")
                for slug in ("Team-C", str(uuid.uuid4()))]
    assert refusals[0]["details"] == refusals[1]["details"]
    assert "not in the form of a UUID" in str(refusals[0]["details"]["slug"])


def test_oversized_body_is_413_payload_too_large(client_a: APIClient, superuser_client: APIClient) -> None:
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE == 1024 * 1024
    huge = json.dumps({"name": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)})
    before = (key_rows(), tenant_rows())
    assert_error(
        client_a.post("/api/v1/api-keys", data=huge, content_type="application/json"),
        413,
        "payload_too_large",
    )
    huge_tenant = json.dumps({"slug": "huge", "name": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)})
    assert_error(
        superuser_client.post("/api/v1/tenants", data=huge_tenant, content_type="application/json"),
        413,
        "payload_too_large",
    )
    assert (key_rows(), tenant_rows()) == before


def test_form_encoded_body_is_415_unsupported_media_type(client_a: APIClient) -> None:
    before = key_rows()
    response = client_a.post("/api/v1/api-keys", data="name=x", content_type="application/x-www-form-urlencoded")
    assert_error(response, 415, "unsupported_media_type")
    assert key_rows() == before


def test_unknown_url_is_404_in_the_error_shape(client_a: APIClient) -> None:
    assert_error(client_a.get("/api/v1/no-such-thing"), 404, "not_found")
    assert_error(api_client().get("/nowhere"), 404, "not_found")


@pytest.mark.parametrize("method", ["put", "patch"])
def test_unsupported_verb_is_405_in_the_error_shape(
    tenant_a: tuple[Tenant, str], client_a: APIClient, method: str
) -> None:
    with tenant_context(tenant_a[0]):
        key_id = ApiKey.objects.get().pk
    before = key_rows()
    response = getattr(client_a, method)(f"/api/v1/api-keys/{key_id}", data={"name": "renamed"}, format="json")
    assert_error(response, 405, "method_not_allowed")
    assert_error(getattr(client_a, method)("/api/v1/tenant", data={}, format="json"), 405, "method_not_allowed")
    assert key_rows() == before


def test_options_is_405_in_the_error_shape_and_no_allow_header_offers_it(
    tenant_a: tuple[Tenant, str], client_a: APIClient
) -> None:
    with tenant_context(tenant_a[0]):
        key_id = ApiKey.objects.get().pk
    platform = api_client(services.platform_key_create(name="ops")[1])
    for client, path in ((client_a, f"/api/v1/api-keys/{key_id}"), (client_a, "/api/v1/api-keys"),
                         (client_a, "/api/v1/runs"), (client_a, "/api/v1/fairness-keys"),
                         (platform, "/api/v1/tenants"), (platform, "/api/v1/plans")):
        response = client.options(path)
        assert_error(response, 405, "method_not_allowed")
        assert "GET" in response["Allow"], path
        assert "OPTIONS" not in response["Allow"], path


# --- OpenAPI -----------------------------------------------------------------------------


@pytest.mark.parametrize("client_kind", ["anonymous", "tenant-key"])
def test_openapi_schema_is_served(client_kind: str, client_a: APIClient) -> None:
    client = api_client() if client_kind == "anonymous" else client_a
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200, response.content[:300]
    schema = json.loads(response.content)
    assert schema["openapi"].startswith("3.")
    paths = {path.rstrip("/") for path in schema["paths"]}
    assert {
        "/api/v1/tenant",
        "/api/v1/api-keys",
        "/api/v1/api-keys/{id}",
        "/api/v1/api-keys/{id}/revoke",
        "/api/v1/tenants",
        "/api/v1/tenants/{slug}",
        "/api/v1/tenants/{slug}/suspend",
        "/api/v1/tenants/{slug}/activate",
    } <= paths
    assert "ApiKey" in schema["components"]["securitySchemes"]
    assert client.get("/api/schema/").status_code == 200


def test_swagger_ui_is_served(db: None) -> None:
    response = api_client().get("/api/docs/")
    assert response.status_code == 200
    assert b"swagger" in response.content.lower()
