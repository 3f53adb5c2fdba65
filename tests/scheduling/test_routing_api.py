"""The routing API: connections, pools, rules and the routing dry run.

Real PostgreSQL and Redis. Each test is named after the rule it checks.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection as db
from django.test import Client
from rest_framework.test import APIClient

from ductor_project.core import capacity
from ductor_project.core.context import across_tenants, tenant_context
from ductor_project.core.redis import get_redis
from scheduling.models import Connection, Pool, PoolMember, Rule
from scheduling.secrets import decrypt
from tenants import services as tenant_services
from tenants.models import ApiKey, Tenant
from tests.conftest import LogLines, api_client, error_code, in_threads

pytestmark = pytest.mark.usefixtures("redis_client")

SECRET = "plaintext-SECRET-4f7c9e21-do-not-leak"
NEW_SECRET = "rotated-SECRET-b81d02aa-do-not-leak"
BASE_URL = "https://api.example.com/v1"


# --- helpers ---------------------------------------------------------------------------------


def http_body(name: str = "api", **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "http", "config": {"base_url": BASE_URL}, **extra}


def create(client: APIClient, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(f"/api/v1/{kind}", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def rows(tenant: Tenant) -> dict[str, int]:
    """Every routing row of ``tenant``: what a refused request must leave as it was."""
    with tenant_context(tenant):
        return {
            "connections": Connection.objects.count(),
            "pools": Pool.objects.count(),
            "members": PoolMember.objects.count(),
            "rules": Rule.objects.count(),
        }


def assert_invalid(response: Any, field: str, code: str = "invalid") -> None:
    assert response.status_code == 400, response.content
    assert error_code(response) == code, response.content
    assert field in response.json()["error"]["details"], response.json()


def assert_taken(response: Any, field: str) -> None:
    """``409 conflict`` naming ``field``: what a value another row holds answers, everywhere in the API."""
    assert response.status_code == 409, response.content
    assert error_code(response) == "conflict", response.content
    assert field in response.json()["error"]["details"], response.json()


def stored_token(connection_id: str) -> str:
    """The stored column, read as an operator would (the maintenance role: raw SQL, no tenant)."""
    with across_tenants("a test reads the stored secret"), db.cursor() as cursor:
        cursor.execute("SELECT secret_token FROM scheduling_connection WHERE id = %s", [connection_id])
        return str(cursor.fetchone()[0])


def explain(client: APIClient, **step: Any) -> dict[str, Any]:
    response = client.post(
        "/api/v1/routing/explain", {"workflow": "billing.invoice", "action": "noop", **step}, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()


@pytest.fixture
def superuser_client(db: None) -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


# --- connections -----------------------------------------------------------------------------


def test_connection_crud_round_trip(client_a: APIClient) -> None:
    created = create(
        client_a, "connections", http_body(config={"base_url": BASE_URL, "headers": {"X-A": "1"}})
    )
    assert created["config"] == {
        "base_url": BASE_URL,
        "headers": {"X-A": "1"},
        "timeout_s": 10.0,
        "max_response_bytes": 1024 * 1024,
    }
    assert created["has_secret"] is False
    assert (created["max_concurrency"], created["rate_per_s"], created["burst"]) == (None, None, None)

    listed = client_a.get("/api/v1/connections").json()["results"]
    assert [c["id"] for c in listed] == [created["id"]]
    assert client_a.get(f"/api/v1/connections/{created['id']}").json() == created

    patched = client_a.patch(
        f"/api/v1/connections/{created['id']}", {"max_concurrency": 3, "rate_per_s": 2.5}, format="json"
    )
    assert patched.status_code == 200, patched.content
    assert (patched.json()["max_concurrency"], patched.json()["rate_per_s"], patched.json()["burst"]) == (
        3,
        2.5,
        1,
    )
    assert patched.json()["config"] == created["config"]

    put = client_a.put(
        f"/api/v1/connections/{created['id']}",
        {"name": "worker", "kind": "python", "config": {"module": "x"}},
        format="json",
    )
    assert put.status_code == 200, put.content
    body = put.json()
    assert body["id"] == created["id"]
    assert (body["name"], body["kind"], body["config"]) == ("worker", "python", {"module": "x"})
    assert (body["max_concurrency"], body["rate_per_s"], body["burst"]) == (None, None, None)  # PUT replaces

    assert client_a.delete(f"/api/v1/connections/{created['id']}").status_code == 204
    assert client_a.get(f"/api/v1/connections/{created['id']}").status_code == 404


def test_connection_paths_accept_a_trailing_slash(client_a: APIClient) -> None:
    created = create(client_a, "connections/", http_body())
    assert client_a.get(f"/api/v1/connections/{created['id']}/").status_code == 200


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({}, "config.base_url"),
        ({"base_url": "ftp://files.example.com"}, "config.base_url"),
        ({"base_url": "not a url"}, "config.base_url"),
        ({"base_url": "http://example.com@127.0.0.1:8999"}, "config.base_url"),  # credentials: the secret's
        ({"base_url": "https://user:pw@a.example"}, "config.base_url"),
        ({"base_url": "https://a.example:99999"}, "config.base_url"),  # no such port
        ({"base_url": "https://a.example:0/v1"}, "config.base_url"),
        ({"base_url": "https://xn--a.example/v1"}, "config.base_url"),  # an IDNA label that decodes to nothing
        ({"base_url": BASE_URL, "timeout_s": 0}, "config.timeout_s"),
        ({"base_url": BASE_URL, "timeout_s": 301}, "config.timeout_s"),
        ({"base_url": BASE_URL, "max_response_bytes": 0}, "config.max_response_bytes"),
        ({"base_url": BASE_URL, "max_response_bytes": 50 * 1024 * 1024 + 1}, "config.max_response_bytes"),
        ({"base_url": BASE_URL, "headers": {"X-Id": 7}}, "config.headers.X-Id"),
        ({"base_url": BASE_URL, "headers": {"X-Id": "a\r\nEvil: 1"}}, "config.headers.X-Id"),
        ({"base_url": BASE_URL, "headers": {"bad header": "x"}}, "config.headers"),
        ({"base_url": BASE_URL, "retries": 3}, "config.retries"),
        ([BASE_URL], "config"),
    ],
)
def test_http_connection_config_is_validated_naming_the_field(
    client_a: APIClient, tenant_a: tuple[Tenant, str], config: Any, field: str
) -> None:
    before = rows(tenant_a[0])
    response = client_a.post("/api/v1/connections", http_body(config=config), format="json")
    assert_invalid(response, field)
    assert rows(tenant_a[0]) == before


def test_python_connection_config_is_free_form_up_to_64_kib(
    client_a: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    config = {"anything": {"nested": [1, 2, 3]}, "blob": "x" * 1000}
    assert (
        create(client_a, "connections", {"name": "py", "kind": "python", "config": config})["config"]
        == config
    )
    response = client_a.post(
        "/api/v1/connections",
        {"name": "big", "kind": "python", "config": {"blob": "x" * 65 * 1024}},
        format="json",
    )
    assert_invalid(response, "config")
    assert rows(tenant_a[0])["connections"] == 1


def test_changing_the_kind_revalidates_the_stored_config(client_a: APIClient) -> None:
    created = create(client_a, "connections", {"name": "py", "kind": "python", "config": {}})
    response = client_a.patch(f"/api/v1/connections/{created['id']}", {"kind": "http"}, format="json")
    assert_invalid(response, "config.base_url")
    assert client_a.get(f"/api/v1/connections/{created['id']}").json()["kind"] == "python"


def test_a_burst_needs_a_rate_and_a_rate_gets_a_burst(client_a: APIClient) -> None:
    assert_invalid(client_a.post("/api/v1/connections", http_body(burst=5), format="json"), "burst")
    created = create(client_a, "connections", http_body(rate_per_s=10))
    assert created["burst"] == 1
    url = f"/api/v1/connections/{created['id']}"
    assert client_a.patch(url, {"burst": 20}, format="json").json()["burst"] == 20
    cleared = client_a.patch(url, {"rate_per_s": None}, format="json").json()
    assert (cleared["rate_per_s"], cleared["burst"]) == (None, None)
    for bad in ({"rate_per_s": 0}, {"rate_per_s": -1}, {"max_concurrency": 0}, {"burst": 0}):
        field = next(iter(bad))
        assert_invalid(client_a.patch(url, bad, format="json"), field)


# --- secrets ---------------------------------------------------------------------------------


def test_secret_never_appears_in_any_api_response(client_a: APIClient, tenant_a: tuple[Tenant, str]) -> None:
    bodies: list[str] = []

    def call(method: str, url: str, body: Any = None, expect: int = 200) -> dict[str, Any]:
        response = getattr(client_a, method)(url, body, format="json")
        assert response.status_code == expect, response.content
        bodies.append(response.content.decode())
        return response.json() if response.content else {}

    created = call("post", "/api/v1/connections", http_body(secret=SECRET), expect=201)
    url = f"/api/v1/connections/{created['id']}"
    assert created["has_secret"] is True
    assert "secret" not in created
    assert "secret_token" not in created
    call("get", "/api/v1/connections")
    call("get", url)
    call("patch", url, {"name": "renamed"})
    call("patch", url, {"secret": SECRET})
    call("put", url, http_body(name="renamed", secret=SECRET))
    rotated = call("post", f"{url}/rotate-secret", {"secret": NEW_SECRET})
    assert rotated["has_secret"] is True
    call(
        "post",
        "/api/v1/pools",
        {"name": "main", "is_default": True, "members": [{"connection": "renamed"}]},
        expect=201,
    )
    call("get", "/api/v1/pools")
    trace = call("post", "/api/v1/routing/explain", {"workflow": "w", "action": "http.request"})
    assert trace["connection"]["id"] == created["id"]
    # Refused requests do not echo it either.
    call("post", "/api/v1/connections", http_body(name="bad", config={}, secret=SECRET), expect=400)
    call("post", "/api/v1/connections", http_body(name="bad", secret=SECRET, colour="red"), expect=400)
    call("patch", url, {"secret": SECRET * 2000}, expect=400)

    token = stored_token(created["id"])
    for body in bodies:
        assert SECRET not in body
        assert NEW_SECRET not in body
        assert token not in body


@pytest.mark.parametrize("bad", [SECRET + "\n", SECRET + "\r\nX-Injected: 1", SECRET + "\u00e9"])
def test_an_http_connection_s_secret_no_header_can_carry_is_refused_naming_it_never_quoted(
    client_a: APIClient, tenant_a: tuple[Tenant, str], bad: str
) -> None:
    """A secret pasted with its line end went into the Authorization header, whose refusal at the
    call quoted it into the step's stored error. A python connection's secret is its action's (a
    PEM key has line breaks)."""
    kept = create(client_a, "connections", http_body(secret=SECRET))
    url = f"/api/v1/connections/{kept['id']}"
    before, token = rows(tenant_a[0]), stored_token(kept["id"])

    refused = [
        client_a.post("/api/v1/connections", http_body(name="pasted", secret=bad), format="json"),
        client_a.patch(url, {"secret": bad}, format="json"),
        client_a.put(url, http_body(secret=bad), format="json"),
        client_a.post(f"{url}/rotate-secret", {"secret": bad}, format="json"),
    ]

    for response in refused:
        assert_invalid(response, "secret")
        assert SECRET not in response.content.decode()
    assert rows(tenant_a[0]) == before
    assert stored_token(kept["id"]) == token
    pem = "-----BEGIN KEY-----\nabc\n-----END KEY-----\n"
    create(client_a, "connections", {"name": "py", "kind": "python", "config": {}, "secret": pem})


@pytest.mark.parametrize("bad", ["caf\u00e9", "a\x00b", "a\x1bb", "a\x7fb"])
def test_an_http_connection_s_header_no_request_can_carry_is_refused_naming_it(
    client_a: APIClient, tenant_a: tuple[Tenant, str], bad: str
) -> None:
    """A default header that is not ASCII or holds a control character was stored, and every step of
    the connection failed as invalid_connection; it is refused as its secret is."""
    kept = create(client_a, "connections", http_body())
    url = f"/api/v1/connections/{kept['id']}"
    before = rows(tenant_a[0])
    config = {"base_url": BASE_URL, "headers": {"X-Team": bad}}

    refused = [
        client_a.post("/api/v1/connections", http_body(name="other", config=config), format="json"),
        client_a.patch(url, {"config": config}, format="json"),
        client_a.put(url, http_body(config=config), format="json"),
    ]

    for response in refused:
        assert_invalid(response, "config.headers.X-Team")
    assert rows(tenant_a[0]) == before
    create(client_a, "connections", http_body(name="tabbed", config={"base_url": BASE_URL,
                                                                     "headers": {"X-Team": "a\tb"}}))


@pytest.mark.parametrize("name", ["Host", "content-length", "Transfer-Encoding", "Proxy-Authorization"])
def test_an_http_connection_s_header_the_transport_sets_is_refused_naming_it(
    client_a: APIClient, tenant_a: tuple[Tenant, str], name: str
) -> None:
    """Stored, it failed every step of the connection as invalid_connection."""
    before = rows(tenant_a[0])
    config = {"base_url": BASE_URL, "headers": {name: "x"}}
    assert_invalid(client_a.post("/api/v1/connections", http_body(config=config), format="json"),
                   f"config.headers.{name}")
    assert rows(tenant_a[0]) == before


def test_secret_is_encrypted_at_rest_and_decrypts_back(client_a: APIClient) -> None:
    created = create(client_a, "connections", http_body(secret=SECRET))
    with across_tenants("a test reads the stored row"), db.cursor() as cursor:
        cursor.execute(
            "SELECT secret_token, row_to_json(c)::text FROM scheduling_connection c WHERE id = %s",
            [created["id"]],
        )
        token, whole_row = cursor.fetchone()
    assert token
    assert SECRET not in token
    assert SECRET not in whole_row
    assert decrypt(token) == SECRET


def test_a_secret_key_that_is_not_a_fernet_key_is_told_at_start_never_shown(settings: Any) -> None:
    """Unchecked, such a key started, and the first secret saved answered 500 internal_error."""
    from cryptography.fernet import Fernet

    from scheduling.apps import check_secret_keys

    good = Fernet.generate_key().decode()
    settings.DUCTOR_SECRET_KEYS = [good, "not-a-fernet-key"]
    [error] = check_secret_keys()
    assert (error.id, error.msg) == ("ductor.E004", "DUCTOR_SECRET_KEYS: key 2 is not a Fernet key (32 url-safe "
                                                    "base64-encoded bytes, as Fernet.generate_key() makes)")
    settings.DUCTOR_SECRET_KEYS = [good, " "]
    assert check_secret_keys() == []


def test_a_generated_fernet_key_another_process_wrote_first_is_the_one_used(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes making the data dir's first key at once: the one that found no file, then
    lost the race to create it, failed on the file the other had made (or read it still empty).
    Each now uses the key written first, whole."""
    from cryptography.fernet import Fernet

    from scheduling import secrets

    settings.DUCTOR_SECRET_KEYS, settings.DUCTOR_DATA_DIR = [], tmp_path
    theirs = Fernet.generate_key()
    mkdir = Path.mkdir

    def racing(self: Path, *args: Any, **kwargs: Any) -> None:  # the other process writes its key meanwhile
        mkdir(self, *args, **kwargs)
        if self == tmp_path:
            (tmp_path / "fernet.key").write_bytes(theirs)

    monkeypatch.setattr(Path, "mkdir", racing)
    secrets._fernet.cache_clear()
    try:
        token = secrets.encrypt("shared")
    finally:
        secrets._fernet.cache_clear()
    assert Fernet(theirs).decrypt(token.encode()) == b"shared"
    assert (tmp_path / "fernet.key").read_bytes() == theirs


def test_rotating_the_secret_keeps_the_id(client_a: APIClient) -> None:
    created = create(client_a, "connections", http_body(secret=SECRET))
    pool = create(client_a, "pools", {"name": "main", "members": [{"connection": created["id"]}]})
    old_token = stored_token(created["id"])

    response = client_a.post(
        f"/api/v1/connections/{created['id']}/rotate-secret", {"secret": NEW_SECRET}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["id"] == created["id"]
    new_token = stored_token(created["id"])
    assert new_token != old_token
    assert decrypt(new_token) == NEW_SECRET
    assert client_a.get(f"/api/v1/pools/{pool['id']}").json()["members"][0]["connection"] == created["id"]

    empty = client_a.post(f"/api/v1/connections/{created['id']}/rotate-secret", {"secret": ""}, format="json")
    assert_invalid(empty, "secret")
    assert stored_token(created["id"]) == new_token


def test_an_empty_secret_on_update_removes_it(client_a: APIClient) -> None:
    created = create(client_a, "connections", http_body(secret=SECRET))
    response = client_a.patch(f"/api/v1/connections/{created['id']}", {"secret": ""}, format="json")
    assert response.json()["has_secret"] is False
    assert stored_token(created["id"]) == ""


def test_secret_never_appears_in_log_output(
    client_a: APIClient, logged: LogLines, capfd: pytest.CaptureFixture[str]
) -> None:
    logging.getLogger().setLevel(logging.DEBUG)  # the fixture's configuration ends with the test
    created = create(client_a, "connections", http_body(secret=SECRET))
    url = f"/api/v1/connections/{created['id']}"
    client_a.patch(url, {"secret": SECRET}, format="json")
    client_a.post(f"{url}/rotate-secret", {"secret": NEW_SECRET}, format="json")
    client_a.post("/api/v1/connections", http_body(name="bad", config={}, secret=SECRET), format="json")
    client_a.get(url)
    client_a.delete(url)

    out, err = capfd.readouterr()
    text = "\n".join(logged.lines()) + out + err
    assert "connection_created" in text
    assert "connection_secret_rotated" in text
    assert SECRET not in text
    assert NEW_SECRET not in text


def test_secret_never_appears_in_admin_pages(client_a: APIClient, superuser_client: Client) -> None:
    created = create(client_a, "connections", http_body(secret=SECRET))
    token = stored_token(created["id"])
    pages = [
        "/admin/scheduling/connection/",
        f"/admin/scheduling/connection/{created['id']}/change/",
        "/admin/scheduling/connection/add/",
    ]
    for page in pages:
        response = superuser_client.get(page)
        assert response.status_code == 200, page
        html = response.content.decode()
        assert SECRET not in html
        assert token not in html
    assert "api" in superuser_client.get(pages[0]).content.decode()

    # A new secret typed into the admin is stored encrypted and not shown back.
    response = superuser_client.post(
        pages[1],
        {
            "name": "api",
            "kind": "http",
            "config": json.dumps({"base_url": BASE_URL}),
            "max_concurrency": "",
            "rate_per_s": "",
            "burst": "",
            "new_secret": NEW_SECRET,
        },
    )
    assert response.status_code == 302, response.content.decode()[-3000:]
    assert decrypt(stored_token(created["id"])) == NEW_SECRET
    assert NEW_SECRET not in superuser_client.get(pages[1]).content.decode()


def test_admin_validates_connection_config(client_a: APIClient, superuser_client: Client) -> None:
    created = create(client_a, "connections", http_body(secret=SECRET))
    response = superuser_client.post(
        f"/admin/scheduling/connection/{created['id']}/change/",
        {
            "name": "api",
            "kind": "http",
            "config": json.dumps({"base_url": "ftp://x"}),
            "max_concurrency": "",
            "rate_per_s": "",
            "burst": "",
            "new_secret": SECRET,
        },
    )
    assert response.status_code == 200  # the form again, with the error
    html = response.content.decode()
    assert "config.base_url" in html
    assert SECRET not in html


# --- pools -----------------------------------------------------------------------------------


def test_pool_crud_with_members_by_id_or_name(client_a: APIClient, tenant_a: tuple[Tenant, str]) -> None:
    one = create(client_a, "connections", http_body("one"))
    two = create(client_a, "connections", http_body("two"))
    pool = create(
        client_a,
        "pools",
        {
            "name": "main",
            "strategy": "weighted",
            "max_concurrency": 10,
            "members": [
                {"connection": one["id"], "weight": 3},
                {"connection": "two", "weight": 1, "priority": 1},
            ],
        },
    )
    assert pool["strategy"] == "weighted"
    assert pool["is_default"] is False
    assert pool["members"] == [
        {"connection": one["id"], "connection_name": "one", "weight": 3, "priority": 0},
        {"connection": two["id"], "connection_name": "two", "weight": 1, "priority": 1},
    ]
    assert [p["id"] for p in client_a.get("/api/v1/pools").json()["results"]] == [pool["id"]]
    url = f"/api/v1/pools/{pool['id']}"
    assert client_a.get(url).json() == pool

    patched = client_a.patch(url, {"members": [{"connection": "two", "weight": 5}]}, format="json").json()
    assert [(m["connection_name"], m["weight"]) for m in patched["members"]] == [("two", 5)]
    assert patched["max_concurrency"] == 10
    renamed = client_a.patch(url, {"name": "primary"}, format="json").json()
    assert [m["connection_name"] for m in renamed["members"]] == ["two"]  # members untouched

    put = client_a.put(url, {"name": "primary", "strategy": "failover"}, format="json").json()
    assert (put["strategy"], put["max_concurrency"], put["members"]) == ("failover", None, [])

    assert client_a.delete(url).status_code == 204
    assert client_a.get(url).status_code == 404
    assert rows(tenant_a[0]) == {"connections": 2, "pools": 0, "members": 0, "rules": 0}


def test_deleting_a_connection_removes_it_from_its_pools(client_a: APIClient) -> None:
    one = create(client_a, "connections", http_body("one"))
    create(client_a, "connections", http_body("two"))
    pool = create(
        client_a, "pools", {"name": "main", "members": [{"connection": "one"}, {"connection": "two"}]}
    )
    assert client_a.delete(f"/api/v1/connections/{one['id']}").status_code == 204
    members = client_a.get(f"/api/v1/pools/{pool['id']}").json()["members"]
    assert [m["connection_name"] for m in members] == ["two"]


def test_setting_a_default_pool_clears_the_previous_default(client_a: APIClient) -> None:
    first = create(client_a, "pools", {"name": "first", "is_default": True})
    second = create(client_a, "pools", {"name": "second", "is_default": True})
    assert client_a.get(f"/api/v1/pools/{first['id']}").json()["is_default"] is False
    assert client_a.get(f"/api/v1/pools/{second['id']}").json()["is_default"] is True

    client_a.patch(f"/api/v1/pools/{first['id']}", {"is_default": True}, format="json")
    assert client_a.get(f"/api/v1/pools/{first['id']}").json()["is_default"] is True
    assert client_a.get(f"/api/v1/pools/{second['id']}").json()["is_default"] is False


def test_a_refused_default_switch_leaves_the_previous_default(client_a: APIClient) -> None:
    first = create(client_a, "pools", {"name": "first", "is_default": True})
    second = create(client_a, "pools", {"name": "second"})
    # The switch clears the old default before the rename fails: the whole request must roll back.
    response = client_a.patch(
        f"/api/v1/pools/{second['id']}", {"is_default": True, "name": "first"}, format="json"
    )
    assert_taken(response, "name")
    assert client_a.get(f"/api/v1/pools/{first['id']}").json()["is_default"] is True
    refused = client_a.post("/api/v1/pools", {"name": "second", "is_default": True}, format="json")
    assert_taken(refused, "name")
    assert client_a.get(f"/api/v1/pools/{first['id']}").json()["is_default"] is True


def test_pool_member_of_another_tenant_is_refused_and_never_stored(
    client_a: APIClient, client_b: APIClient, tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str]
) -> None:
    theirs = create(client_b, "connections", http_body("theirs"))
    create(client_a, "connections", http_body("mine"))
    before = rows(tenant_a[0])
    for reference in (theirs["id"], "theirs"):
        response = client_a.post(
            "/api/v1/pools",
            {
                "name": "main",
                "members": [{"connection": "mine"}, {"connection": reference}],
            },
            format="json",
        )
        assert_invalid(response, "members[1].connection")
    assert rows(tenant_a[0]) == before

    pool = create(client_a, "pools", {"name": "main", "members": [{"connection": "mine"}]})
    response = client_a.patch(
        f"/api/v1/pools/{pool['id']}", {"members": [{"connection": theirs["id"]}]}, format="json"
    )
    assert_invalid(response, "members[0].connection")
    assert [m["connection_name"] for m in client_a.get(f"/api/v1/pools/{pool['id']}").json()["members"]] == [
        "mine"
    ]
    assert rows(tenant_b[0])["members"] == 0


def test_unknown_or_repeated_member_connection_is_refused(
    client_a: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    one = create(client_a, "connections", http_body("one"))
    before = rows(tenant_a[0])
    unknown = client_a.post(
        "/api/v1/pools", {"name": "p", "members": [{"connection": "nope"}]}, format="json"
    )
    assert_invalid(unknown, "members[0].connection")
    repeated = client_a.post(
        "/api/v1/pools",
        {
            "name": "p",
            "members": [{"connection": one["id"]}, {"connection": "one"}],
        },
        format="json",
    )
    assert_invalid(repeated, "members[1].connection")
    assert rows(tenant_a[0]) == before


def test_pool_member_fields_are_checked_by_path(client_a: APIClient) -> None:
    create(client_a, "connections", http_body("one"))
    negative = client_a.post(
        "/api/v1/pools", {"name": "p", "members": [{"connection": "one", "weight": -1}]}, format="json"
    )
    assert_invalid(negative, "members[0].weight")
    unknown = client_a.post(
        "/api/v1/pools", {"name": "p", "members": [{"connection": "one", "colour": 1}]}, format="json"
    )
    assert_invalid(unknown, "members[0].colour", code="unknown_field")
    not_a_list = client_a.post("/api/v1/pools", {"name": "p", "members": "one"}, format="json")
    assert_invalid(not_a_list, "members")
    bad_strategy = client_a.post("/api/v1/pools", {"name": "p", "strategy": "random"}, format="json")
    assert_invalid(bad_strategy, "strategy")


def test_renaming_a_pool_renames_it_in_the_rules_that_route_to_it(client_a: APIClient) -> None:
    pool = create(client_a, "pools", {"name": "main"})
    rule = create(
        client_a, "rules", {"name": "r", "priority": 1, "action": {"pool": "main", "tier": "batch"}}
    )
    client_a.patch(f"/api/v1/pools/{pool['id']}", {"name": "primary"}, format="json")
    assert client_a.get(f"/api/v1/rules/{rule['id']}").json()["action"] == {
        "pool": "primary",
        "tier": "batch",
    }
    assert explain(client_a)["pool"]["name"] == "primary"


def test_a_pool_that_a_rule_routes_to_cannot_be_deleted(client_a: APIClient) -> None:
    pool = create(client_a, "pools", {"name": "main"})
    rule = create(client_a, "rules", {"name": "to-main", "priority": 1, "action": {"pool": "main"}})
    response = client_a.delete(f"/api/v1/pools/{pool['id']}")
    assert response.status_code == 409
    assert error_code(response) == "conflict"
    assert response.json()["error"]["details"] == {"rules": ["to-main"]}
    assert client_a.delete(f"/api/v1/rules/{rule['id']}").status_code == 204
    assert client_a.delete(f"/api/v1/pools/{pool['id']}").status_code == 204


# --- rules -----------------------------------------------------------------------------------


def test_rule_crud_and_list_in_priority_order(client_a: APIClient) -> None:
    create(client_a, "pools", {"name": "main"})
    late = create(client_a, "rules", {"name": "late", "priority": 20, "action": {"deny": "closed"}})
    early = create(
        client_a,
        "rules",
        {
            "name": "early",
            "priority": 10,
            "match": {
                "workflow": "billing.*",
                "tags": ["b", "a", "a"],
                "conditions": [{"path": "customer.tier", "op": "in", "value": ["gold"]}],
            },
            "action": {"pool": "main", "partition_key": "c-{input.customer.id}"},
        },
    )
    assert early["enabled"] is True
    assert early["match"]["tags"] == ["a", "b"]  # normalized
    # The deprecated forms are accepted and stored in the one template language's.
    assert early["match"]["conditions"] == [{"path": "input.customer.tier", "op": "in", "value": ["gold"]}]
    assert early["action"]["partition_key"] == "c-{{ $input.customer.id }}"
    assert late["match"] == {}
    listed = client_a.get("/api/v1/rules").json()["results"]
    assert [r["name"] for r in listed] == ["early", "late"]

    url = f"/api/v1/rules/{late['id']}"
    assert client_a.get(url).json() == late
    patched = client_a.patch(url, {"priority": 5, "enabled": False}, format="json").json()
    assert (patched["priority"], patched["enabled"], patched["action"]) == (5, False, {"deny": "closed"})
    assert [r["name"] for r in client_a.get("/api/v1/rules").json()["results"]] == ["late", "early"]
    put = client_a.put(
        url, {"name": "late", "priority": 30, "action": {"tier": "batch"}}, format="json"
    ).json()
    assert (put["enabled"], put["match"], put["action"]) == (True, {}, {"tier": "batch"})
    assert client_a.delete(url).status_code == 204
    assert client_a.get(url).status_code == 404


@pytest.mark.parametrize(
    ("match", "action", "field"),
    [
        ({"workflow": "billing["}, {"tier": "batch"}, "match.workflow"),
        ({"action": "http request"}, {"tier": "batch"}, "match.action"),
        (
            {"conditions": [{"path": "a..b", "op": "eq", "value": 1}]},
            {"tier": "batch"},
            "match.conditions[0].path",
        ),
        (
            {
                "conditions": [
                    {"path": "a", "op": "eq", "value": 1},
                    {"path": "b", "op": "regex", "value": "x"},
                ]
            },
            {"tier": "batch"},
            "match.conditions[1].op",
        ),
        (
            {"conditions": [{"path": "a", "op": "in", "value": "gold"}]},
            {"tier": "batch"},
            "match.conditions[0].value",
        ),
        (
            {"conditions": [{"path": "a", "op": "gt", "value": "3"}]},
            {"tier": "batch"},
            "match.conditions[0].value",
        ),
        ({"tags": "a"}, {"tier": "batch"}, "match.tags"),
        ({"labels": ["a"]}, {"tier": "batch"}, "match.labels"),
        ({}, {}, "action"),
        ({}, {"queue": "x"}, "action.queue"),
        ({}, {"deny": "no", "tier": "batch"}, "action.deny"),
        ({}, {"tier": "gold"}, "action.tier"),
        ({}, {"partition_key": "{secret}"}, "action.partition_key"),
        ({}, {"pool": "nope"}, "action.pool"),
    ],
)
def test_bad_rule_input_is_refused_naming_the_field(
    client_a: APIClient, tenant_a: tuple[Tenant, str], match: Any, action: Any, field: str
) -> None:
    before = rows(tenant_a[0])
    response = client_a.post(
        "/api/v1/rules", {"name": "r", "priority": 1, "match": match, "action": action}, format="json"
    )
    assert_invalid(response, field)
    assert field in response.json()["error"]["message"]
    assert rows(tenant_a[0]) == before


def test_rule_update_is_validated_like_create(client_a: APIClient) -> None:
    rule = create(client_a, "rules", {"name": "r", "priority": 1, "action": {"tier": "batch"}})
    url = f"/api/v1/rules/{rule['id']}"
    assert_invalid(client_a.patch(url, {"match": {"workflow": "billing["}}, format="json"), "match.workflow")
    assert_invalid(client_a.patch(url, {"action": {"pool": "nope"}}, format="json"), "action.pool")
    assert client_a.get(url).json() == rule


def test_rule_action_pool_of_another_tenant_is_refused(
    client_a: APIClient, client_b: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    create(client_b, "pools", {"name": "theirs"})
    before = rows(tenant_a[0])
    response = client_a.post(
        "/api/v1/rules", {"name": "r", "priority": 1, "action": {"pool": "theirs"}}, format="json"
    )
    assert_invalid(response, "action.pool")
    assert rows(tenant_a[0]) == before


def test_rule_tier_must_be_allowed_by_the_plan(make_tenant: Any) -> None:
    tenant, key = make_tenant("free-tenant", plan="free")  # allowed tiers: standard, batch
    client = api_client(key)
    response = client.post(
        "/api/v1/rules", {"name": "fast", "priority": 1, "action": {"tier": "interactive"}}, format="json"
    )
    assert_invalid(response, "action.tier")
    assert rows(tenant)["rules"] == 0
    assert create(client, "rules", {"name": "slow", "priority": 1, "action": {"tier": "batch"}})


def test_duplicate_rule_priority_is_refused(client_a: APIClient, tenant_a: tuple[Tenant, str]) -> None:
    create(client_a, "rules", {"name": "one", "priority": 1, "action": {"tier": "batch"}})
    two = create(client_a, "rules", {"name": "two", "priority": 2, "action": {"tier": "batch"}})
    before = rows(tenant_a[0])
    duplicate = client_a.post(
        "/api/v1/rules", {"name": "three", "priority": 1, "action": {"tier": "batch"}}, format="json"
    )
    assert_taken(duplicate, "priority")
    assert_taken(client_a.patch(f"/api/v1/rules/{two['id']}", {"priority": 1}, format="json"), "priority")
    assert rows(tenant_a[0]) == before
    assert client_a.get(f"/api/v1/rules/{two['id']}").json()["priority"] == 2


def test_duplicate_connection_or_pool_name_is_refused(
    client_a: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    create(client_a, "connections", http_body("api"))
    other = create(client_a, "connections", http_body("other"))
    create(client_a, "pools", {"name": "main"})
    spare = create(client_a, "pools", {"name": "spare"})
    before = rows(tenant_a[0])
    assert_taken(client_a.post("/api/v1/connections", http_body("api"), format="json"), "name")
    assert_taken(client_a.patch(f"/api/v1/connections/{other['id']}", {"name": "api"}, format="json"), "name")
    assert_taken(client_a.post("/api/v1/pools", {"name": "main"}, format="json"), "name")
    assert_taken(client_a.patch(f"/api/v1/pools/{spare['id']}", {"name": "main"}, format="json"), "name")
    assert rows(tenant_a[0]) == before


def test_names_of_connections_and_pools_are_identifiers(client_a: APIClient) -> None:
    assert_invalid(client_a.post("/api/v1/connections", http_body("has space"), format="json"), "name")
    assert_invalid(client_a.post("/api/v1/pools", {"name": ""}, format="json"), "name")
    assert_invalid(client_a.post("/api/v1/pools", {"name": "x" * 101}, format="json"), "name")


@pytest.mark.parametrize("kind", ["connections", "pools", "rules"])
def test_unknown_fields_are_refused(client_a: APIClient, tenant_a: tuple[Tenant, str], kind: str) -> None:
    bodies = {
        "connections": http_body(),
        "pools": {"name": "p"},
        "rules": {"name": "r", "priority": 1, "action": {"tier": "batch"}},
    }
    before = rows(tenant_a[0])
    for extra in ({"colour": "red"}, {"id": "00000000-0000-0000-0000-000000000000"}, {"created_at": "x"}):
        response = client_a.post(f"/api/v1/{kind}", {**bodies[kind], **extra}, format="json")
        assert_invalid(response, next(iter(extra)), code="unknown_field")
    assert rows(tenant_a[0]) == before
    created = create(client_a, kind, bodies[kind])
    response = client_a.patch(f"/api/v1/{kind}/{created['id']}", {"colour": "red"}, format="json")
    assert_invalid(response, "colour", code="unknown_field")


@pytest.mark.parametrize("path", ["connections", "pools", "rules", "routing/explain"])
def test_malformed_json_is_refused(client_a: APIClient, tenant_a: tuple[Tenant, str], path: str) -> None:
    before = rows(tenant_a[0])
    response = client_a.post(f"/api/v1/{path}", '{"name": "x",', content_type="application/json")
    assert response.status_code == 400
    assert error_code(response) == "malformed_json"
    not_an_object = client_a.post(f"/api/v1/{path}", "[1, 2]", content_type="application/json")
    assert not_an_object.status_code == 400
    assert rows(tenant_a[0]) == before


# --- concurrency ---------------------------------------------------------------------------


# Transactional tests flush every table afterwards; conftest re-seeds the plans after each one.
transactional = pytest.mark.django_db(transaction=True)


@transactional
def test_concurrent_default_switches_leave_exactly_one_default(tenant_a: tuple[Tenant, str]) -> None:
    client = api_client(tenant_a[1])
    pools = [create(client, "pools", {"name": f"p{i}"}) for i in range(6)]

    def make_default(index: int) -> int:
        url = f"/api/v1/pools/{pools[index]['id']}"
        return int(api_client(tenant_a[1]).patch(url, {"is_default": True}, format="json").status_code)

    assert in_threads(len(pools), make_default) == [200] * len(pools)
    listed = client.get("/api/v1/pools").json()["results"]
    assert sum(p["is_default"] for p in listed) == 1


@transactional
def test_concurrent_creates_of_one_name_store_one_and_refuse_the_rest_with_409(
    tenant_a: tuple[Tenant, str],
) -> None:
    def create_api(index: int) -> tuple[int, str]:
        response = api_client(tenant_a[1]).post("/api/v1/connections", http_body("api"), format="json")
        return response.status_code, error_code(response) if response.status_code != 201 else ""

    results = in_threads(6, create_api)
    assert sorted(results) == [(201, "")] + [(409, "conflict")] * 5
    assert rows(tenant_a[0])["connections"] == 1


# --- plan ceilings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "field", "bodies"),
    [
        ("connections", "max_connections", [http_body("one"), http_body("two")]),
        ("pools", "max_pools", [{"name": "one"}, {"name": "two"}]),
        (
            "rules",
            "max_rules",
            [
                {"name": "one", "priority": 1, "action": {"tier": "batch"}},
                {"name": "two", "priority": 2, "action": {"tier": "batch"}},
            ],
        ),
    ],
)
def test_plan_ceiling_refuses_one_object_too_many(
    client_a: APIClient, tenant_a: tuple[Tenant, str], kind: str, field: str, bodies: list[dict[str, Any]]
) -> None:
    tenant_services.override_set(tenant=tenant_a[0], field=field, value=1)
    create(client_a, kind, bodies[0])
    before = rows(tenant_a[0])
    response = client_a.post(f"/api/v1/{kind}", bodies[1], format="json")
    assert response.status_code == 403, response.content
    assert error_code(response) == "plan_limit_reached"
    assert response.json()["error"]["details"]["limit"] == field
    assert rows(tenant_a[0]) == before


# --- cross-tenant ----------------------------------------------------------------------------


def _a_objects(client_a: APIClient) -> dict[str, dict[str, Any]]:
    connection = create(client_a, "connections", http_body("api", secret=SECRET))
    pool = create(client_a, "pools", {"name": "main", "members": [{"connection": "api"}]})
    rule = create(client_a, "rules", {"name": "r", "priority": 1, "action": {"pool": "main"}})
    return {"connections": connection, "pools": pool, "rules": rule}


VALID_BODIES: dict[str, dict[str, Any]] = {
    "connections": http_body("stolen"),
    "pools": {"name": "stolen"},
    "rules": {"name": "stolen", "priority": 99, "action": {"tier": "batch"}},
}


@pytest.mark.parametrize(
    ("kind", "verb"),
    [
        *[
            (kind, verb)
            for kind in ("connections", "pools", "rules")
            for verb in ("get", "put", "patch", "delete")
        ],
        ("connections", "rotate-secret"),
    ],
)
def test_idor_object_of_another_tenant_is_404_on_every_verb(
    client_a: APIClient, client_b: APIClient, tenant_a: tuple[Tenant, str], kind: str, verb: str
) -> None:
    target = _a_objects(client_a)[kind]
    url = f"/api/v1/{kind}/{target['id']}"
    before = client_a.get(url).json()
    token = stored_token(target["id"]) if kind == "connections" else None
    rows_before = rows(tenant_a[0])

    if verb == "rotate-secret":
        response = client_b.post(f"{url}/rotate-secret", {"secret": NEW_SECRET}, format="json")
    elif verb in ("put", "patch"):
        response = getattr(client_b, verb)(url, VALID_BODIES[kind], format="json")
    else:
        response = getattr(client_b, verb)(url)
    assert response.status_code == 404, response.content
    assert error_code(response) == "not_found"

    assert client_a.get(url).json() == before
    assert rows(tenant_a[0]) == rows_before
    if token is not None:
        assert stored_token(target["id"]) == token


@pytest.mark.parametrize("kind", ["connections", "pools", "rules"])
def test_malformed_or_unknown_ids_are_404(client_a: APIClient, kind: str) -> None:
    for ident in ("not-a-uuid", "00000000-0000-0000-0000-000000000000", "1"):
        assert client_a.get(f"/api/v1/{kind}/{ident}").status_code == 404
        assert client_a.patch(f"/api/v1/{kind}/{ident}", {}, format="json").status_code == 404
        assert client_a.delete(f"/api/v1/{kind}/{ident}").status_code == 404


def test_lists_show_only_the_tenants_own_objects(client_a: APIClient, client_b: APIClient) -> None:
    _a_objects(client_a)
    for kind in ("connections", "pools", "rules"):
        assert client_b.get(f"/api/v1/{kind}").json()["results"] == []
        assert len(client_a.get(f"/api/v1/{kind}").json()["results"]) == 1


# --- routing dry run -------------------------------------------------------------------------


def test_explain_returns_the_decision_and_trace_and_takes_no_capacity(
    client_a: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    one = create(client_a, "connections", http_body("one", max_concurrency=1, rate_per_s=1))
    create(client_a, "connections", http_body("two"))
    pool = create(
        client_a,
        "pools",
        {
            "name": "main",
            "strategy": "failover",
            "rate_per_s": 1,
            "members": [
                {"connection": "one", "priority": 0},
                {"connection": "two", "priority": 1},
            ],
        },
    )
    rule = create(
        client_a,
        "rules",
        {
            "name": "billing",
            "priority": 1,
            "match": {"workflow": "billing.*"},
            "action": {"pool": "main", "partition_key": "c-{input.customer}"},
        },
    )

    for _ in range(3):  # a real admission would fill connection "one" (limit 1) at once
        trace = explain(client_a, input={"customer": 42})
        assert trace["allowed"] is True
        assert trace["rule"] == {"id": rule["id"], "name": "billing", "priority": 1}
        assert trace["pool"] == {"id": pool["id"], "name": "main", "strategy": "failover"}
        assert trace["partition_key"] == "c-42"
        assert trace["tier"] == "standard"
        assert trace["connection"] == {"id": one["id"], "name": "one"}
        assert [(c["name"], c["eligible"], c["in_flight"]) for c in trace["candidates"]] == [
            ("one", True, 0),
            ("two", True, 0),
        ]
        assert trace["admission"]["admitted"] is True
        assert trace["admission"]["why"] == "failover: first available by priority (0)"
        assert "a connection is chosen when a slot is free" in trace["reason"]

    with tenant_context(tenant_a[0]):
        assert capacity.tenant_in_flight() == 0
        assert capacity.in_flight(capacity.connection_scope(one["id"], 1)) == 0
        assert capacity.in_flight(capacity.pool_scope(pool["id"], 1)) == 0
        assert not get_redis().exists(capacity.rate_key("steps"))  # no rate taken either


def test_explain_without_a_matching_rule_uses_the_default_pool(client_a: APIClient) -> None:
    create(client_a, "connections", http_body("one"))
    create(client_a, "pools", {"name": "fallback", "is_default": True, "members": [{"connection": "one"}]})
    create(
        client_a,
        "rules",
        {
            "name": "billing",
            "priority": 1,
            "match": {"workflow": "billing.*"},
            "action": {"deny": "billing is closed"},
        },
    )
    trace = explain(client_a, workflow="reports.daily")
    assert trace["rule"] == "default"
    assert trace["pool"]["name"] == "fallback"
    assert "tenant default" in trace["reason"]
    denied = explain(client_a, workflow="billing.invoice")
    assert denied["allowed"] is False
    assert "billing is closed" in denied["reason"]


def test_explain_matches_tags_as_sent_as_a_rule_and_a_node_keep_them(client_a: APIClient) -> None:
    """A rule's and a node's tags are kept as written, spaces too: so are explain's, or it would
    route a step that names " crm " elsewhere than the step itself goes."""
    create(client_a, "connections", http_body("one"))
    create(client_a, "pools", {"name": "spaced", "members": [{"connection": "one"}]})
    create(client_a, "rules", {"name": "crm", "priority": 1, "match": {"tags": [" crm "]},
                               "action": {"pool": "spaced"}})

    assert explain(client_a, tags=[" crm "])["rule"]["name"] == "crm"
    assert explain(client_a, tags=["crm"])["rule"] == "default"


def test_explain_follows_a_rule_edited_through_the_api(client_a: APIClient) -> None:
    create(client_a, "connections", http_body("one"))
    create(client_a, "connections", http_body("two"))
    create(client_a, "pools", {"name": "p1", "members": [{"connection": "one"}]})
    create(client_a, "pools", {"name": "p2", "members": [{"connection": "two"}]})
    rule = create(
        client_a,
        "rules",
        {"name": "billing", "priority": 1, "match": {"workflow": "billing.*"}, "action": {"pool": "p1"}},
    )
    assert explain(client_a)["connection"]["name"] == "one"

    client_a.patch(f"/api/v1/rules/{rule['id']}", {"action": {"pool": "p2"}}, format="json")
    assert explain(client_a)["connection"]["name"] == "two"

    client_a.patch(f"/api/v1/rules/{rule['id']}", {"match": {"workflow": "reports.*"}}, format="json")
    assert explain(client_a)["rule"] == "default"

    client_a.patch(f"/api/v1/rules/{rule['id']}", {"match": {}, "enabled": False}, format="json")
    assert explain(client_a)["rule"] == "default"
    client_a.patch(f"/api/v1/rules/{rule['id']}", {"enabled": True}, format="json")
    assert explain(client_a)["rule"]["name"] == "billing"

    client_a.delete(f"/api/v1/rules/{rule['id']}")
    assert explain(client_a)["rule"] == "default"


def test_explain_follows_pool_membership_edited_through_the_api(client_a: APIClient) -> None:
    create(client_a, "connections", http_body("one"))
    create(client_a, "connections", http_body("two"))
    pool = create(
        client_a,
        "pools",
        {
            "name": "main",
            "is_default": True,
            "strategy": "failover",
            "members": [{"connection": "one"}, {"connection": "two", "priority": 1}],
        },
    )
    assert explain(client_a)["connection"]["name"] == "one"
    client_a.patch(f"/api/v1/pools/{pool['id']}", {"members": [{"connection": "two"}]}, format="json")
    assert explain(client_a)["connection"]["name"] == "two"


def test_explain_reports_a_tier_the_plan_does_not_allow(make_tenant: Any) -> None:
    _, key = make_tenant("free-tenant", plan="free")
    trace = explain(api_client(key), tier="interactive")
    assert trace["allowed"] is False
    assert "interactive" in trace["reason"]


def test_explain_needs_only_the_read_scope(make_tenant: Any) -> None:
    _, key = make_tenant("reader", scopes=[ApiKey.Scope.READ])
    reader = api_client(key)
    assert explain(reader)["allowed"] is True
    refused = reader.post(
        "/api/v1/rules", {"name": "r", "priority": 1, "action": {"tier": "batch"}}, format="json"
    )
    assert refused.status_code == 403
    assert error_code(refused) == "insufficient_scope"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "noop"}, "workflow"),
        ({"workflow": "w"}, "action"),
        ({"workflow": "w", "action": "noop", "tier": "gold"}, "tier"),
        ({"workflow": "w", "action": "noop", "tags": "a"}, "tags"),
        ({"workflow": "w", "action": "noop", "tags": ["a", 7, {"x": 1}]}, "tags[1]"),  # 7 is no string either
        ({"workflow": "w", "action": "noop", "tags": ["a", "b", {"x": 1}]}, "tags[2]"),
        ({"workflow": "w", "action": "noop", "colour": "red"}, "colour"),
    ],
)
def test_explain_input_is_validated(client_a: APIClient, body: dict[str, Any], field: str) -> None:
    response = client_a.post("/api/v1/routing/explain", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["details"], response.json()


def test_routing_endpoints_need_an_api_key(db: None) -> None:
    anonymous = APIClient()
    for path in ("connections", "pools", "rules"):
        assert anonymous.get(f"/api/v1/{path}").status_code == 401
    assert anonymous.post("/api/v1/routing/explain", {}, format="json").status_code == 401


# --- admin and schema ------------------------------------------------------------------------


def test_admin_shows_pools_with_members_and_rules_in_priority_order(
    client_a: APIClient, superuser_client: Client
) -> None:
    objects = _a_objects(client_a)
    create(client_a, "rules", {"name": "zz-first", "priority": 0, "action": {"tier": "batch"}})
    create(client_a, "rules", {"name": "aa-last", "priority": 50, "action": {"tier": "batch"}})
    html = superuser_client.get("/admin/scheduling/rule/").content.decode()
    assert html.index("zz-first") < html.index(">r<") < html.index("aa-last")
    pool_page = superuser_client.get(f"/admin/scheduling/pool/{objects['pools']['id']}/change/")
    assert pool_page.status_code == 200
    html = pool_page.content.decode()
    assert 'name="members-TOTAL_FORMS" value="1"' in html
    assert "selected>api (http)</option>" in html


def test_admin_pool_members_are_edited_inline_and_routing_follows(
    client_a: APIClient, superuser_client: Client
) -> None:
    one = create(client_a, "connections", http_body("one"))
    two = create(client_a, "connections", http_body("two"))
    pool = create(
        client_a,
        "pools",
        {"name": "main", "is_default": True, "strategy": "failover", "members": [{"connection": "one"}]},
    )
    assert explain(client_a)["connection"]["name"] == "one"
    with tenant_context(Tenant.objects.get(slug="tenant-a")):
        member_id = PoolMember.objects.get().pk
    response = superuser_client.post(
        f"/admin/scheduling/pool/{pool['id']}/change/",
        {
            "name": "main",
            "strategy": "failover",
            "is_default": "on",
            "max_concurrency": "",
            "rate_per_s": "",
            "burst": "",
            "members-TOTAL_FORMS": "2",
            "members-INITIAL_FORMS": "1",
            "members-MIN_NUM_FORMS": "0",
            "members-MAX_NUM_FORMS": "1000",
            "members-0-id": str(member_id),
            "members-0-pool": pool["id"],
            "members-0-connection": one["id"],
            "members-0-weight": "1",
            "members-0-priority": "5",
            "members-1-id": "",
            "members-1-pool": pool["id"],
            "members-1-connection": two["id"],
            "members-1-weight": "1",
            "members-1-priority": "0",
        },
    )
    assert response.status_code == 302, response.content.decode()[-3000:]
    members = client_a.get(f"/api/v1/pools/{pool['id']}").json()["members"]
    assert [(m["connection_name"], m["priority"]) for m in members] == [("two", 0), ("one", 5)]
    assert explain(client_a)["connection"]["name"] == "two"  # the admin edit invalidated the routing cache


def test_admin_add_pages_render_for_a_superuser(superuser_client: Client) -> None:
    for model in ("connection", "pool", "rule"):
        assert superuser_client.get(f"/admin/scheduling/{model}/add/").status_code == 200, model


def test_admin_refuses_a_rule_that_routing_could_not_evaluate(
    client_a: APIClient, superuser_client: Client
) -> None:
    rule = _a_objects(client_a)["rules"]
    response = superuser_client.post(
        f"/admin/scheduling/rule/{rule['id']}/change/",
        {
            "name": "r",
            "priority": "1",
            "enabled": "on",
            "match": json.dumps({"conditions": [{"path": "a", "op": "regex", "value": "x"}]}),
            "action": json.dumps({"pool": "main"}),
        },
    )
    assert response.status_code == 200
    assert "match.conditions[0].op" in response.content.decode()
    assert client_a.get(f"/api/v1/rules/{rule['id']}").json()["match"] == {}


def _admin_post(client: Client, model: str, path: str, fields: dict[str, Any]) -> Any:
    inline = {"members-TOTAL_FORMS": "0", "members-INITIAL_FORMS": "0"} if model == "pool" else {}
    return client.post(f"/admin/scheduling/{model}/{path}", {**inline, **fields})


def test_admin_adds_a_second_default_pool_as_the_api_does_unsetting_the_first(
    client_a: APIClient, superuser_client: Client
) -> None:
    first = create(client_a, "pools", {"name": "first", "is_default": True})
    tenant = Tenant.objects.get(slug="tenant-a")

    response = _admin_post(superuser_client, "pool", "add/",
                           {"tenant": str(tenant.pk), "name": "second", "strategy": "round_robin", "is_default": "on"})

    assert response.status_code == 302, response.context["adminform"].form.errors
    assert client_a.get(f"/api/v1/pools/{first['id']}").json()["is_default"] is False
    assert [pool["name"] for pool in client_a.get("/api/v1/pools").json()["results"] if pool["is_default"]] == [
        "second"]


def test_admin_refuses_what_the_routing_services_refuse_and_stores_nothing(
    client_a: APIClient, superuser_client: Client
) -> None:
    tenant = Tenant.objects.get(slug="tenant-a")
    create(client_a, "pools", {"name": "only"})
    tenant_services.override_set(tenant=tenant, field="max_pools", value=1)
    before = rows(tenant)

    a_burst_without_rate = _admin_post(superuser_client, "connection", "add/", {
        "tenant": str(tenant.pk), "name": "c", "kind": "http", "config": json.dumps({"base_url": BASE_URL}),
        "burst": "5"})
    past_the_plan = _admin_post(superuser_client, "pool", "add/",
                                {"tenant": str(tenant.pk), "name": "two", "strategy": "round_robin"})

    assert a_burst_without_rate.status_code == past_the_plan.status_code == 200
    assert "A burst needs rate_per_s." in a_burst_without_rate.content.decode()
    assert past_the_plan.context["adminform"].form.non_field_errors()
    assert rows(tenant) == before


def test_admin_renaming_a_pool_renames_it_in_the_rules_that_route_to_it(
    client_a: APIClient, superuser_client: Client
) -> None:
    pool = create(client_a, "pools", {"name": "old"})
    rule = create(client_a, "rules", {"name": "r", "priority": 1, "action": {"pool": "old"}})

    response = _admin_post(superuser_client, "pool", f"{pool['id']}/change/",
                           {"name": "new", "strategy": "round_robin"})

    assert response.status_code == 302
    assert client_a.get(f"/api/v1/rules/{rule['id']}").json()["action"] == {"pool": "new"}


def test_admin_refuses_to_delete_a_pool_a_rule_routes_to_as_the_api_does(
    client_a: APIClient, superuser_client: Client
) -> None:
    pool = create(client_a, "pools", {"name": "used"})
    create(client_a, "rules", {"name": "to-used", "priority": 1, "action": {"pool": "used"}})

    page = superuser_client.post(f"/admin/scheduling/pool/{pool['id']}/delete/", {"post": "yes"})
    action = superuser_client.post("/admin/scheduling/pool/",
                                   {"action": "delete_selected", "_selected_action": [pool["id"]], "post": "yes"})

    assert page.status_code == action.status_code == 200
    assert "to-used" in page.content.decode()
    assert client_a.get(f"/api/v1/pools/{pool['id']}").status_code == 200


def test_openapi_schema_documents_the_routing_endpoints(client_a: APIClient) -> None:
    response = client_a.get("/api/schema/?format=json")
    assert response.status_code == 200
    paths = json.loads(response.content)["paths"]
    for path in ("/api/v1/connections", "/api/v1/pools", "/api/v1/rules", "/api/v1/routing/explain"):
        assert any(p.startswith(path) for p in paths), path
    assert any("rotate-secret" in p for p in paths)


@transactional
@pytest.mark.parametrize("switch", ["create", "update"])
def test_a_new_default_pool_and_a_change_of_the_old_defaults_members_at_once_both_go_through(
    tenant_a: tuple[Tenant, str], monkeypatch: Any, switch: str
) -> None:
    """A pool made the default (created so, or changed) unsets the previous default and locks its
    members' connections; a change of the previous default's members locks that pool, then the
    connections. The default switch takes the pools first too: before, it locked the connections
    first, and the two at once each waited for the other (PostgreSQL aborted one as a deadlock)."""
    import threading

    from scheduling import services
    from tests.waiting import in_a_thread, until_another_waits_on_a_lock

    tenant = tenant_a[0]
    with tenant_context(tenant):
        shared = services.connection_create(name="shared", kind="http", config={"base_url": BASE_URL})
        old = services.pool_create(name="old", is_default=True)
        new = services.pool_create(name="new") if switch == "update" else None
    reached, resolve = threading.Event(), services._resolve_members

    def resolve_once_another_waits(members: Any) -> Any:
        resolved = resolve(members)
        if not reached.is_set():  # the default switch's: the change of the old default's members comes now
            reached.set()
            until_another_waits_on_a_lock()
        return resolved

    monkeypatch.setattr(services, "_resolve_members", resolve_once_another_waits)
    results: dict[str, Any] = {}

    def make_default() -> str:
        with tenant_context(tenant):
            members = [services.MemberSpec(connection="shared")]
            if new is None:
                services.pool_create(name="new", is_default=True, members=members)
            else:
                services.pool_update(pool=new, is_default=True, members=members)
        return "switched"

    switching = in_a_thread(results, "default", make_default)
    assert reached.wait(15)
    try:
        with tenant_context(tenant):
            services.pool_update(pool=old, members=[services.MemberSpec(connection="shared", weight=2)])
    finally:
        switching.join(30)

    assert results["default"] == "switched"
    with tenant_context(tenant):
        assert list(Pool.objects.filter(is_default=True).values_list("name", flat=True)) == ["new"]
        assert sorted(PoolMember.objects.filter(connection=shared).values_list("pool__name", "weight")) == [
            ("new", 1), ("old", 2)]


@transactional
@pytest.mark.parametrize("switch", ["create", "update"])
def test_a_new_default_pool_while_the_old_default_is_deleted_goes_through(
    tenant_a: tuple[Tenant, str], monkeypatch: Any, switch: str
) -> None:
    """A default switch unsets the previous default; a deletion of that pool at the same moment holds
    its row. The switch locks the pools it unsets, so it waits for the deletion and then leaves the
    deleted pool alone: before, it found the pool, then its write, which waited for the deletion,
    changed no row, and the request failed (a 500)."""
    import threading

    from scheduling import selectors, services
    from tests.waiting import in_a_thread, until_another_waits_on_a_lock

    tenant = tenant_a[0]
    with tenant_context(tenant):
        old = services.pool_create(name="old", is_default=True)
        new = services.pool_create(name="new") if switch == "update" else None
    reached, using = threading.Event(), selectors.rules_using_pool

    def rules_once_another_waits(name: str) -> Any:
        reached.set()
        until_another_waits_on_a_lock()  # the default switch, waiting for the pool this deletion holds
        return using(name)

    monkeypatch.setattr(selectors, "rules_using_pool", rules_once_another_waits)
    results: dict[str, Any] = {}

    def delete() -> str:
        with tenant_context(tenant):
            services.pool_delete(pool=old)
        return "deleted"

    deleting = in_a_thread(results, "delete", delete)
    assert reached.wait(15)
    try:
        with tenant_context(tenant):
            if new is None:
                services.pool_create(name="new", is_default=True)
            else:
                services.pool_update(pool=new, is_default=True)
    finally:
        deleting.join(30)

    assert results["delete"] == "deleted"
    with tenant_context(tenant):
        assert list(Pool.objects.values_list("name", "is_default")) == [("new", True)]
