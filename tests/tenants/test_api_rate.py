"""The API rate limit: a DRF throttle per tenant on the GCRA limiter in real Redis.

With ``api_rate_per_s=1`` and ``api_burst=3`` an idle tenant gets exactly three
requests at once; the next one inside the same second is refused. Requests
made here take milliseconds, far inside that second.
"""

from __future__ import annotations

from typing import Any

import pytest

from ductor_project.core.capacity import rate_key
from tenants import services
from tenants.models import ApiKey, Tenant
from tests.conftest import api_client, error_code

URL = "/api/v1/tenant"


def throttle(tenant: Tenant, rate: float = 1, burst: int = 3) -> None:
    services.override_set(tenant=tenant, field="api_rate_per_s", value=rate)
    services.override_set(tenant=tenant, field="api_burst", value=burst)


@pytest.fixture
def a(tenant_a, redis_client) -> tuple[Tenant, Any]:
    throttle(tenant_a[0])
    return tenant_a[0], api_client(tenant_a[1])


def test_the_request_after_the_burst_gets_429_rate_limited_with_retry_after(a):
    _, client = a
    assert [client.get(URL).status_code for _ in range(3)] == [200, 200, 200]

    response = client.get(URL)

    assert response.status_code == 429
    assert error_code(response) == "rate_limited"
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    retry_after = int(response["Retry-After"])
    assert retry_after >= 1
    assert body["error"]["details"] == {"retry_after": retry_after}
    assert f"{retry_after}s" in body["error"]["message"]


def test_every_request_past_the_burst_is_refused_while_the_limiter_is_full(a):
    _, client = a
    statuses = [client.get(URL).status_code for _ in range(8)]
    assert statuses[:3] == [200, 200, 200]
    assert statuses[3] == 429
    assert statuses.count(200) <= 4  # at most one more token can accrue within a second


def test_one_tenants_flood_never_throttles_another_tenant(a, tenant_b):
    _, client_a = a
    b, raw_b = tenant_b
    client_b = api_client(raw_b)
    # B's own burst covers its 10 requests, not A's 10 too: a shared limiter would throttle B.
    throttle(b, burst=12)

    flood = []
    for _ in range(10):
        flood.append(client_a.get(URL).status_code)
        assert client_b.get(URL).status_code == 200
    assert 429 in flood


def test_each_tenant_has_its_own_limiter_key(a, tenant_b, redis_client):
    tenant, client = a
    b = tenant_b[0]
    client.get(URL)
    assert redis_client.exists(rate_key("api", tenant=tenant)) == 1
    assert redis_client.exists(rate_key("api", tenant=b)) == 0


def test_a_throttled_request_changes_nothing(a):
    tenant, client = a
    for _ in range(3):
        client.get(URL)
    keys_before = ApiKey.all_tenants.filter(tenant=tenant).count()

    response = client.post("/api/v1/api-keys", {"name": "made-while-throttled"}, format="json")

    assert response.status_code == 429
    assert error_code(response) == "rate_limited"
    assert ApiKey.all_tenants.filter(tenant=tenant).count() == keys_before
    assert not ApiKey.all_tenants.filter(name="made-while-throttled").exists()


def test_the_api_rate_follows_the_tenants_entitlements(tenant_a, redis_client):
    tenant, raw = tenant_a
    client = api_client(raw)
    throttle(tenant, burst=2)
    assert [client.get(URL).status_code for _ in range(3)] == [200, 200, 429]


def test_platform_requests_are_not_charged_to_a_tenants_limiter(a, redis_client):
    tenant, client = a
    _, raw = services.platform_key_create(name="ops")
    platform = api_client(raw)

    for _ in range(6):
        assert platform.get(f"/api/v1/tenants/{tenant.slug}/entitlements").status_code == 200

    assert redis_client.exists(rate_key("api", tenant=tenant)) == 0
    assert [client.get(URL).status_code for _ in range(3)] == [200, 200, 200]
