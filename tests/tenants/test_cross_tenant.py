"""Cross-tenant probes: tenant B, holding A's ids, gets 404 (or 405) from every endpoint and verb.

The first tests walk the live OpenAPI schema, so an endpoint added later is
probed without touching this file; the ``test_idor_*`` tests spell out each
endpoint and verb of the tenancy API by hand.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.apps import apps
from django.utils import timezone
from rest_framework.test import APIClient

from ductor_project.core.context import tenant_context
from tenants import services
from tenants.models import ApiKey, Tenant
from tenants.scoping import TenantScopedModel
from tests.conftest import api_client
from tests.tenants.helpers import assert_error, make_user

VERBS = ["get", "head", "post", "put", "patch", "delete", "options"]
WRITE_VERBS = ["post", "put", "patch", "delete"]
PARAM = re.compile(r"\{([^}]+)\}")


@pytest.fixture
def victim(tenant_a: tuple[Tenant, str]) -> Tenant:
    """Tenant A, with a second key so that revoking "the last key" is not what is being tested."""
    tenant = tenant_a[0]
    with tenant_context(tenant):
        services.api_key_create(name="a-second", scopes=["read"])
    return tenant


@pytest.fixture
def a_key_id(victim: Tenant) -> str:
    with tenant_context(victim):
        return str(ApiKey.objects.get(name="test").pk)


def schema_paths() -> dict[str, dict[str, Any]]:
    response = api_client().get("/api/schema/?format=json")
    assert response.status_code == 200, response.content[:300]
    paths: dict[str, dict[str, Any]] = json.loads(response.content)["paths"]
    return paths


def rows_of(tenant: Tenant) -> dict[str, Any]:
    """Every row that belongs to ``tenant``: its tenant row and its rows of every scoped model."""
    snapshot: dict[str, Any] = {"tenant": Tenant.objects.filter(pk=tenant.pk).values().get()}
    for model in apps.get_models():
        if issubclass(model, TenantScopedModel):
            snapshot[model._meta.label] = list(model.all_tenants.filter(tenant=tenant).order_by("pk").values())
    return snapshot


def fill(path: str, values: Callable[[str, str], str]) -> str:
    return PARAM.sub(lambda match: values(path, match.group(1)), path)


def first_listed(client: APIClient, collection: str, name: str) -> str | None:
    """``name`` of the first object the victim itself lists at ``collection``, if any."""
    if PARAM.search(collection):
        return None
    response = client.get(collection)
    if response.status_code != 200:
        return None
    body = response.json()
    rows = body.get("results") if isinstance(body, dict) else body
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], dict) or name not in rows[0]:
        return None
    return str(rows[0][name])


def ids_of(tenant: Tenant, raw_key: str, key_id: str) -> Callable[[str, str], str]:
    """Path parameters naming ``tenant``'s objects: found through its own list endpoints when it
    has some, else its API key id (any id of it), its slug, or a valid override field."""
    own = api_client(raw_key)
    found: dict[tuple[str, str], str | None] = {}

    def value(path: str, name: str) -> str:
        collection = path[: path.index("{" + name + "}")]
        if (collection, name) not in found:
            found[(collection, name)] = first_listed(own, collection, name)
        listed = found[(collection, name)]
        if listed is not None:
            return listed
        if name == "slug":
            return tenant.slug
        if name == "field":
            return "max_pools"
        return key_id

    return value


def missing_ids(path: str, name: str) -> str:
    """Path parameters naming objects that do not exist."""
    if name == "slug":
        return "no-such-tenant"
    if name == "field":
        return "max_pools"
    return str(uuid.uuid4())


def call(client: APIClient, verb: str, path: str) -> Any:
    if verb in ("post", "put", "patch"):
        return getattr(client, verb)(path, data="{}", content_type="application/json")
    return getattr(client, verb)(path)


def probe_with(
    prober: APIClient,
    victim: Tenant,
    a_raw: str,
    a_key_id: str,
    *,
    verbs: list[str] = VERBS,
    compare_with_missing: bool = True,
) -> None:
    """``prober`` gets 404 or 405 for every path naming the victim's objects, with every verb,
    and (``compare_with_missing``) exactly the status an id that does not exist gets."""
    paths = [path for path in schema_paths() if PARAM.search(path)]
    assert {
        "/api/v1/api-keys/{id}",
        "/api/v1/api-keys/{id}/revoke",
        "/api/v1/tenants/{slug}",
        "/api/v1/tenants/{slug}/suspend",
        "/api/v1/tenants/{slug}/activate",
    } <= {p.rstrip("/") for p in paths}
    victim_ids = ids_of(victim, a_raw, a_key_id)
    targets = {path: fill(path, victim_ids) for path in paths}  # the victim's own lookups come first
    before = rows_of(victim)
    leaks: list[str] = []
    for path in paths:
        for verb in verbs:
            response = call(prober, verb, targets[path])
            if response.status_code not in (404, 405):
                leaks.append(f"{verb.upper()} {path}: {response.status_code} {response.content[:200]!r}")
                continue
            absent = call(prober, verb, fill(path, missing_ids)) if compare_with_missing else response
            if absent.status_code != response.status_code:
                leaks.append(
                    f"{verb.upper()} {path}: {response.status_code} for A's id but "
                    f"{absent.status_code} for a missing one"
                )
            if verb != "head":
                code = "not_found" if response.status_code == 404 else "method_not_allowed"
                assert_error(response, response.status_code, code)
    assert leaks == []
    assert rows_of(victim) == before


def test_every_endpoint_and_verb_with_another_tenants_ids_is_404_or_405(
    victim: Tenant, tenant_a: tuple[Tenant, str], a_key_id: str, client_b: APIClient
) -> None:
    probe_with(client_b, victim, tenant_a[1], a_key_id)


def test_every_endpoint_and_verb_with_another_tenants_ids_is_404_or_405_for_a_read_only_key(
    victim: Tenant,
    tenant_a: tuple[Tenant, str],
    a_key_id: str,
    make_tenant: Callable[..., tuple[Tenant, str]],
) -> None:
    _, raw = make_tenant("reader", scopes=["read"])
    # Safe verbs behave as for a full key (tested above); writes must not answer 403 first.
    probe_with(api_client(raw), victim, tenant_a[1], a_key_id, verbs=WRITE_VERBS, compare_with_missing=False)


def test_every_endpoint_and_verb_with_another_tenants_ids_is_404_or_405_for_a_member_session(
    victim: Tenant, tenant_a: tuple[Tenant, str], a_key_id: str, tenant_b: tuple[Tenant, str]
) -> None:
    client = APIClient()
    client.force_login(make_user("bob", tenant=tenant_b[0], is_staff=True))
    probe_with(client, victim, tenant_a[1], a_key_id, compare_with_missing=False)


@pytest.mark.parametrize("kind", ["garbage", "revoked", "expired"])
def test_every_endpoint_and_verb_with_a_bad_key_is_401(
    victim: Tenant, tenant_a: tuple[Tenant, str], a_key_id: str, tenant_b: tuple[Tenant, str], kind: str
) -> None:
    raw = "dct_garbage_garbage"
    if kind != "garbage":
        with tenant_context(tenant_b[0]):
            key, raw = services.api_key_create(name=kind, scopes=["read", "write"])
            if kind == "revoked":
                services.api_key_revoke(key=key)
            else:
                ApiKey.objects.filter(pk=key.pk).update(expires_at=timezone.now())
    client = api_client(raw)
    victim_ids = ids_of(victim, tenant_a[1], a_key_id)
    targets = {path: fill(path, victim_ids) for path in schema_paths()}
    # Authentication runs before any handler: one read and one write per path tell a known key's state.
    verbs = VERBS if kind == "garbage" else ["get", "post"]
    before = rows_of(victim)
    wrong: list[str] = []
    for path, target in targets.items():
        for verb in verbs:
            response = call(client, verb, target)
            if response.status_code != 401:
                wrong.append(f"{verb.upper()} {path}: {response.status_code}")
    assert wrong == []
    assert rows_of(victim) == before


# --- one test per endpoint and verb -----------------------------------------------------------


def assert_a_key_untouched(a_raw: str, a_key_id: str) -> None:
    key = ApiKey.all_tenants.get(pk=a_key_id)
    assert key.revoked_at is None
    assert key.name == "test"
    assert api_client(a_raw).get("/api/v1/tenant").status_code == 200


def test_idor_api_key_retrieve_from_other_tenant_is_404(
    tenant_a: tuple[Tenant, str], a_key_id: str, client_b: APIClient
) -> None:
    assert_error(client_b.get(f"/api/v1/api-keys/{a_key_id}"), 404, "not_found")
    assert_error(client_b.get(f"/api/v1/api-keys/{a_key_id}/"), 404, "not_found")
    assert client_b.head(f"/api/v1/api-keys/{a_key_id}").status_code == 404


def test_idor_api_key_revoke_from_other_tenant_is_404(
    tenant_a: tuple[Tenant, str], a_key_id: str, client_b: APIClient
) -> None:
    assert_error(client_b.post(f"/api/v1/api-keys/{a_key_id}/revoke"), 404, "not_found")
    assert_error(client_b.post(f"/api/v1/api-keys/{a_key_id}/revoke/"), 404, "not_found")
    assert_a_key_untouched(tenant_a[1], a_key_id)


def test_idor_api_key_delete_from_other_tenant_is_404(
    tenant_a: tuple[Tenant, str], a_key_id: str, client_b: APIClient
) -> None:
    assert_error(client_b.delete(f"/api/v1/api-keys/{a_key_id}"), 404, "not_found")
    assert_a_key_untouched(tenant_a[1], a_key_id)


@pytest.mark.parametrize("verb", ["put", "patch"])
def test_idor_api_key_update_from_other_tenant_is_405(
    tenant_a: tuple[Tenant, str], a_key_id: str, client_b: APIClient, verb: str
) -> None:
    response = getattr(client_b, verb)(f"/api/v1/api-keys/{a_key_id}", {"name": "pwned"}, format="json")
    assert_error(response, 405, "method_not_allowed")
    assert_a_key_untouched(tenant_a[1], a_key_id)


def test_idor_api_key_options_from_other_tenant_is_405(a_key_id: str, client_b: APIClient) -> None:
    assert_error(client_b.options(f"/api/v1/api-keys/{a_key_id}"), 405, "method_not_allowed")


def test_idor_api_key_list_from_other_tenant_never_shows_its_keys(
    tenant_a: tuple[Tenant, str], a_key_id: str, client_b: APIClient
) -> None:
    response = client_b.get("/api/v1/api-keys")
    assert response.status_code == 200
    assert [key["name"] for key in response.json()["results"]] == ["test"]
    assert a_key_id not in response.content.decode()


def test_idor_api_key_of_other_tenant_answers_exactly_like_a_missing_id(a_key_id: str, client_b: APIClient) -> None:
    missing = str(uuid.uuid4())
    for verb, suffix in (("get", ""), ("delete", ""), ("post", "/revoke")):
        theirs = getattr(client_b, verb)(f"/api/v1/api-keys/{a_key_id}{suffix}")
        nothing = getattr(client_b, verb)(f"/api/v1/api-keys/{missing}{suffix}")
        assert (theirs.status_code, theirs.content) == (nothing.status_code, nothing.content)


def test_idor_api_key_revoke_from_other_tenants_member_session_is_404(
    tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str], a_key_id: str
) -> None:
    client = APIClient()
    client.force_login(make_user("bob", tenant=tenant_b[0]))
    assert_error(client.get(f"/api/v1/api-keys/{a_key_id}"), 404, "not_found")
    assert_error(client.post(f"/api/v1/api-keys/{a_key_id}/revoke"), 404, "not_found")
    assert_error(client.delete(f"/api/v1/api-keys/{a_key_id}"), 404, "not_found")
    assert_a_key_untouched(tenant_a[1], a_key_id)


def test_idor_platform_tenant_retrieve_with_a_tenant_key_is_404(
    tenant_a: tuple[Tenant, str], client_b: APIClient
) -> None:
    assert_error(client_b.get(f"/api/v1/tenants/{tenant_a[0].slug}"), 404, "not_found")
    assert_error(client_b.get(f"/api/v1/tenants/{tenant_a[0].pk}"), 404, "not_found")


def test_idor_platform_tenant_suspend_with_a_tenant_key_is_404(
    tenant_a: tuple[Tenant, str], client_b: APIClient
) -> None:
    assert_error(client_b.post(f"/api/v1/tenants/{tenant_a[0].slug}/suspend"), 404, "not_found")
    assert Tenant.objects.get(pk=tenant_a[0].pk).status == Tenant.Status.ACTIVE
    assert api_client(tenant_a[1]).get("/api/v1/tenant").status_code == 200


def test_idor_platform_tenant_activate_with_a_tenant_key_is_404(
    tenant_a: tuple[Tenant, str], client_b: APIClient
) -> None:
    services.tenant_set_status(tenant=tenant_a[0], status=Tenant.Status.SUSPENDED)
    assert_error(client_b.post(f"/api/v1/tenants/{tenant_a[0].slug}/activate"), 404, "not_found")
    assert Tenant.objects.get(pk=tenant_a[0].pk).status == Tenant.Status.SUSPENDED


def test_idor_platform_tenant_list_and_create_with_a_tenant_key_is_404(
    tenant_a: tuple[Tenant, str], client_b: APIClient
) -> None:
    assert_error(client_b.get("/api/v1/tenants"), 404, "not_found")
    assert_error(client_b.post("/api/v1/tenants", {"slug": "evil"}, format="json"), 404, "not_found")
    assert not Tenant.objects.filter(slug="evil").exists()
