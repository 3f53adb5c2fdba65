"""Bad input answers a 4xx with a stable code naming the field, never a 5xx, on every endpoint.

Every operation of the OpenAPI schema that takes a body gets a body nested far
deeper than the API accepts, on a real object of the caller; lists get bad
``page_size`` and ``cursor`` values; names get control characters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import RequestFactory
from rest_framework.test import APIClient

from ductor_project.core.context import tenant_context
from ductor_project.core.errors import ApiError
from ductor_project.parsers import DISCARD_MAX_BYTES, UnreadBodyMiddleware
from scheduling import services as routing
from tenants import services
from tenants.models import Tenant
from tests.conftest import ROOT, api_client, error_code
from workflows import services as workflow_services
from workflows.models import TaskCatalogEntry
from workflows.triggers import events as event_services
from workflows.triggers import services as schedule_services
from workflows.triggers import webhooks

DEEP = 1000  # levels: past the parser's limit, and past Python's recursion limit
pytestmark = pytest.mark.django_db


def deep_body() -> bytes:
    return ('{"input": ' + "[" * DEEP + "]" * DEEP + "}").encode()


@pytest.fixture
def world(tenant_a: tuple[Tenant, str]) -> dict[str, str]:
    """One object of each kind for tenant A: the path parameters of every detail operation."""
    tenant = tenant_a[0]
    with tenant_context(tenant):
        connection = routing.connection_create(name="api", kind="http", config={"base_url": "https://a.example"})
        pool = routing.pool_create(name="main", members=[routing.MemberSpec("api")])
        rule = routing.rule_create(name="r", priority=1, action={"pool": "main"})
        key, _ = services.api_key_create(name="other", scopes=["read"])
        workflow_services.workflow_put(name="wf", spec={"nodes": [{"id": "a", "type": "action", "action": "noop"}]})
        run, _ = workflow_services.run_start(workflow="wf")
        schedule = schedule_services.schedule_create(name="hourly", workflow="wf", interval_s=3600)
        trigger = event_services.trigger_create(workflow="wf", event="ping")
        [(event, _)] = event_services.events_send([{"name": "pong"}])
        webhook = webhooks.webhook_create(url="https://93.184.216.34/hook", events=["run.failed"]).endpoint
        fairness_key = routing.fairness_key_create(key="customer-1", weight=2)
    TaskCatalogEntry.objects.create(name="wf", queue="q")  # {name} on the catalog's paths too
    return {"connections": str(connection.pk), "pools": str(pool.pk), "rules": str(rule.pk),
            "api-keys": str(key.pk), "runs": str(run.pk), "workflows": "wf", "schedules": str(schedule.pk),
            "triggers": str(trigger.pk), "events": str(event.pk), "webhooks": str(webhook.pk),
            "fairness-keys": str(fairness_key.pk)}


@pytest.fixture
def platform(db: None) -> APIClient:
    _, raw = services.platform_key_create(name="ops")
    return api_client(raw)


def schema(client: APIClient) -> dict[str, Any]:
    return json.loads(client.get("/api/schema/?format=json").content)


def concrete(path: str, world: dict[str, str], tenant: Tenant) -> str:
    """The schema path with the ids of real objects (tenant A's; for the platform, tenant A)."""
    collection = path.split("/")[3]
    return (path.replace("{id}", world.get(collection, "x")).replace("{name}", world["workflows"])
            .replace("{slug}", tenant.slug).replace("{field}", "max_pools"))


def test_every_body_nested_too_deep_is_400_malformed_json_on_every_operation(
    client_a: APIClient, platform: APIClient, world: dict[str, str], tenant_a: tuple[Tenant, str]
) -> None:
    checked = 0
    for path, operations in schema(client_a)["paths"].items():
        for method, operation in operations.items():
            if method not in ("post", "put", "patch") or "requestBody" not in operation:
                continue
            client = platform if any(p in path for p in ("/tenants", "/plans", "/task-catalog")) else client_a
            url = concrete(path, world, tenant_a[0])
            response = getattr(client, method)(url, deep_body(), content_type="application/json")
            assert response.status_code == 400, (method, url, response.content[:300])
            assert error_code(response) == "malformed_json", (method, url)
            assert "nested" in response.json()["error"]["message"]
            checked += 1
    assert checked >= 15


@pytest.mark.parametrize("host", ["%-", "a b", "evil.example"])
def test_a_host_the_server_does_not_serve_is_the_documented_400_on_any_operation(
    client_a: APIClient, host: str
) -> None:
    for url in ("/api/v1/runs", "/api/v1/api-keys/00000000-0000-0000-0000-000000000000"):
        response = client_a.get(url, HTTP_HOST=host)
        assert response.status_code == 400, (url, host, response.content[:300])
        assert error_code(response) == "bad_request"
    documented = schema(client_a)["paths"]["/api/v1/api-keys/{id}/"]["get"]["responses"]["400"]
    assert documented["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}


@pytest.mark.parametrize(("body", "named", "word"), [
    ('{"workflow": "w", "input": {"name": "a\\u0000b"}}', "input.name", "NUL"),
    ('{"workflow": "w", "input": {"list": [1, {"k\\u0000": 2}]}}', "input.list[1].k\x00", "NUL"),
    ('{"workflow": "w", "input": {"name": "a\\ud800b"}}', "input.name", "U+D800"),
    ('{"workflow": "w", "input": {"list": [{"\\udfff": 1}]}}', "input.list[0].\\udfff", "U+DFFF"),
])
def test_a_character_that_cannot_be_stored_anywhere_is_400_invalid_naming_where(
    client_a: APIClient, body: str, named: str, word: str
) -> None:
    response = client_a.post("/api/v1/runs", body, content_type="application/json")
    assert (response.status_code, error_code(response)) == (400, "invalid")
    assert list(response.json()["error"]["details"]) == [named]
    assert word in response.json()["error"]["message"]
    assert client_a.get("/api/v1/runs").json()["results"] == []


@pytest.mark.parametrize(("url", "body", "named"), [
    ("/api/v1/runs/bulk", '{"runs": [{"workflow": "w", "input": {"s": "\\ud800"}}]}', "runs[0].input.s"),
    ("/api/v1/events", '{"name": "e", "payload": {"s": "\\ud83d"}}', "payload.s"),
    ("/api/v1/workflows", '{"name": "w", "spec": {"nodes": [{"id": "a", "type": "action", "action": "noop", '
                          '"input": {"x": "\\ud800"}}]}}', "spec.nodes[0].input.x"),
    ("/api/v1/task-catalog", '{"name": "shop.q", "input_schema": {"x": "\\ud800"}}', "input_schema.x"),
])
def test_a_lone_surrogate_in_any_json_body_is_400_naming_it_not_a_500(
    client_a: APIClient, platform: APIClient, url: str, body: str, named: str
) -> None:
    client = platform if "task-catalog" in url else client_a
    response = client.post(url, body, content_type="application/json")
    assert (response.status_code, error_code(response)) == (400, "invalid"), response.content
    assert list(response.json()["error"]["details"]) == [named]
    assert "surrogate" in response.json()["error"]["message"]


def test_a_body_just_within_the_depth_limit_is_read(client_a: APIClient, settings: Any) -> None:
    body = {"workflow": "none", "input": {"x": json.loads("[" * 60 + "]" * 60)}}
    response = client_a.post("/api/v1/runs", body, format="json")
    assert response.status_code == 404  # parsed, then refused for the workflow it names


def test_a_pool_patch_with_a_member_missing_its_connection_names_the_field(
    client_a: APIClient, world: dict[str, str]
) -> None:
    response = client_a.patch(f"/api/v1/pools/{world['pools']}", {"members": [{}]}, format="json")
    assert response.status_code == 400
    assert error_code(response) == "invalid"
    assert list(response.json()["error"]["details"]) == ["members[0].connection"]


LISTS = ["/api/v1/api-keys", "/api/v1/connections", "/api/v1/pools", "/api/v1/rules", "/api/v1/workflows",
         "/api/v1/runs", "/api/v1/schedules"]


@pytest.mark.parametrize("url", LISTS)
@pytest.mark.parametrize(("query", "field"), [("page_size=abc", "page_size"), ("page_size=0", "page_size"),
                                              ("page_size=501", "page_size"), ("page_size=-3", "page_size"),
                                              ("page_size=%D9%A5", "page_size"),  # an Arabic-Indic 5
                                              ("page_size=%C2%B2", "page_size"),  # a superscript 2
                                              ("page_size=%205", "page_size"), ("page_size=%2B5", "page_size"),
                                              ("page_size=" + "9" * 5000, "page_size"),
                                              ("cursor=not-a-cursor", "cursor"),
                                              ("cursor=cD1ub3RhZGF0ZQ==", "cursor"),  # DRF's form of p=notadate
                                              ("cursor=cD14", "cursor"),  # p=x
                                              ("cursor=cD1hAGI=", "cursor")])  # p=a<NUL>b
def test_every_list_checks_page_size_and_cursor_alike(client_a: APIClient, url: str, query: str, field: str) -> None:
    response = client_a.get(f"{url}?{query}")
    assert response.status_code == 400, response.content[:300]
    assert error_code(response) == "invalid"
    assert field in response.json()["error"]["details"]
    assert client_a.get(f"{url}?page_size=500").status_code == 200


def test_a_cursor_is_signed_so_a_made_up_or_altered_one_is_400_and_the_links_work(
    client_a: APIClient, platform: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    with tenant_context(tenant_a[0]):
        for name in ("a", "b", "c"):
            workflow_services.workflow_put(name=name, spec={"nodes": [{"id": "x", "type": "action", "action": "noop"}]})
    first = client_a.get("/api/v1/workflows?page_size=2").json()
    second = client_a.get(first["next"]).json()
    assert [w["name"] for w in first["results"] + second["results"]] == ["a", "b", "c"]
    signed = first["next"].split("cursor=")[1].split("&")[0]
    altered = signed[:4] + ("A" if signed[4] != "A" else "B") + signed[5:]
    response = client_a.get(f"/api/v1/workflows?page_size=2&cursor={altered}")
    assert (response.status_code, error_code(response)) == (400, "invalid")
    forged = platform.get("/api/v1/tenants?cursor=cD1ub3RhZGF0ZQ==")
    assert (forged.status_code, list(forged.json()["error"]["details"])) == (400, ["cursor"])
    # A cursor of one list on another: signed, but its position (a name here) is another list's kind.
    for other in ("/api/v1/runs", "/api/v1/api-keys", "/api/v1/rules", "/api/v1/events"):
        replayed = client_a.get(f"{other}?cursor={signed}")
        assert (replayed.status_code, list(replayed.json()["error"]["details"])) == (400, ["cursor"]), other


@pytest.mark.parametrize("name", ["a\nb", "tab\there", "nul\x00", "bell\x07", "rtl\u202eevil", "zero\u200bwidth"])
def test_names_refuse_control_and_invisible_characters(client_a: APIClient, name: str) -> None:
    for url, body in (("/api/v1/api-keys", {"name": name}),
                      ("/api/v1/rules", {"name": name, "priority": 9, "action": {"tier": "batch"}})):
        response = client_a.post(url, body, format="json")
        assert response.status_code == 400, (url, response.content[:300])
        assert "name" in response.json()["error"]["details"]


def test_a_description_keeps_newlines_but_not_other_control_characters(client_a: APIClient) -> None:
    spec = {"nodes": [{"id": "a", "type": "action", "action": "noop"}]}
    ok = client_a.post("/api/v1/workflows", {"name": "d1", "description": "two\nlines", "spec": spec}, format="json")
    assert ok.status_code == 201
    bad = client_a.post("/api/v1/workflows", {"name": "d2", "description": "bell\x07", "spec": spec}, format="json")
    assert bad.status_code == 400
    assert "description" in bad.json()["error"]["details"]


@pytest.mark.parametrize("slug", ["Upper", "ACME", "with space", "-lead", "a_b", "0123456789abcdef0123456789abcdef",
                                  "01234567-89ab-cdef-0123-456789abcdef"])  # a UUID is read as an id
def test_tenant_slugs_are_lowercase_letters_digits_and_dashes(platform: APIClient, slug: str) -> None:
    response = platform.post("/api/v1/tenants", {"slug": slug}, format="json")
    assert response.status_code == 400
    assert "slug" in response.json()["error"]["details"]
    assert not Tenant.objects.filter(slug=slug).exists()
    with pytest.raises(ApiError) as refused:
        services.tenant_create(slug=slug)
    assert list(refused.value.details) == ["slug"]


def test_check_deploy_is_clean_with_the_production_settings_set(tmp_path: Any) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DUCTOR_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="ductor_project.settings",
               SECRET_KEY="a-long-random-production-secret-key-" + "x" * 40, SECURE_SSL_REDIRECT="1",
               SECURE_HSTS_SECONDS="31536000", SECURE_HSTS_INCLUDE_SUBDOMAINS="1", SECURE_HSTS_PRELOAD="1",
               SESSION_COOKIE_SECURE="1", CSRF_COOKIE_SECURE="1")
    done = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_a_nul_character_in_a_path_or_query_parameter_is_a_4xx_on_every_operation(
    client_a: APIClient, platform: APIClient, world: dict[str, str], tenant_a: tuple[Tenant, str]
) -> None:
    """PostgreSQL cannot compare text with a NUL in it: a name in the path is not found, a query
    parameter is 400 ``invalid`` naming it; nothing reaches the database, nothing is a 500."""
    paths, queries = 0, 0
    for path, operations in schema(client_a)["paths"].items():
        client = platform if any(p in path for p in ("/tenants", "/plans", "/task-catalog")) else client_a
        for method, operation in operations.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            parameters = operation.get("parameters", [])
            if "{" in path:
                url = "/".join("a%00b" if "{" in part else part for part in path.split("/"))
                response = getattr(client, method)(url, {}, format="json")
                assert response.status_code == 404, (method, url, response.content[:300])
                assert error_code(response) == "not_found"
                paths += 1
            url = concrete(path, world, tenant_a[0])
            for name in (p["name"] for p in parameters if p["in"] == "query"):
                response = getattr(client, method)(f"{url}?{name}=a%00b")
                assert response.status_code == 400, (method, url, name, response.content[:300])
                assert (error_code(response), list(response.json()["error"]["details"])) == ("invalid", [name])
                queries += 1
    assert paths >= 40, paths
    assert queries >= 20, queries
    response = client_a.get("/api/v1/runs?status=running&a%00=1")
    assert (response.status_code, error_code(response)) == (400, "invalid")


@pytest.mark.parametrize(("url", "body", "field"), [
    ("/api/v1/api-keys", {"name": 5}, "name"),
    ("/api/v1/runs", {"workflow": 5}, "workflow"),
    ("/api/v1/connections", {"name": "c", "kind": "http", "config": {"base_url": "https://a.example"},
                             "max_concurrency": "5"}, "max_concurrency"),
    ("/api/v1/connections", {"name": "c", "kind": "http", "config": {"base_url": "https://a.example"},
                             "rate_per_s": True}, "rate_per_s"),
    ("/api/v1/connections", {"name": "c", "kind": "http", "config": {"base_url": "https://a.example"},
                             "max_concurrency": 5.0}, "max_concurrency"),
    ("/api/v1/fairness-keys", {"key": 0, "weight": 2}, "key"),
    ("/api/v1/runs/bulk", {"runs": [{"workflow": "w", "tags": "nightly"}]}, "runs"),
    ("/api/v1/runs", {"workflow": "w", "tags": ["nightly", 5]}, "tags"),
])
def test_a_value_of_the_wrong_json_type_is_400_naming_its_field_and_stores_nothing(
    client_a: APIClient, url: str, body: dict[str, Any], field: str
) -> None:
    """No quiet conversions: "5" is not a number, 5 not a string, true not a number, 5.0 not a whole
    number."""
    before = client_a.get(url.removesuffix("/bulk")).json()
    response = client_a.post(url, body, format="json")
    assert (response.status_code, error_code(response)) == (400, "invalid"), response.content[:300]
    assert any(name.startswith(field) for name in response.json()["error"]["details"]), response.json()
    assert client_a.get(url.removesuffix("/bulk")).json() == before


@pytest.mark.parametrize(("url", "body", "field", "said"), [
    ("/api/v1/runs", {"workflow": "w", "tier": True}, "tier", "Must be a string, not true."),
    ("/api/v1/runs", {"workflow": "w", "tier": {"a": 1}}, "tier", 'Must be a string, not {"a": 1}.'),
    ("/api/v1/api-keys", {"name": "k", "scopes": [None, 1]}, "scopes", "Must be a string, not 1."),
    ("/api/v1/pools", {"name": "p", "strategy": ["round_robin"]}, "strategy", 'Must be a string, not ["round_robin"].'),
])
def test_a_choice_of_the_wrong_json_type_is_said_in_json_naming_its_field(
    client_a: APIClient, url: str, body: dict[str, Any], field: str, said: str
) -> None:
    """A choice said Python's form of the value it refused ("True" is not a valid choice, "{'a': 1}"):
    the message says what was sent, as JSON, as every other field's does."""
    response = client_a.post(url, body, format="json")
    assert (response.status_code, error_code(response)) == (400, "invalid"), response.content[:300]
    messages = [message for name, found in response.json()["error"]["details"].items() if name.startswith(field)
                for message in (found if isinstance(found, list) else [m for ms in found.values() for m in ms])]
    assert said in messages, response.json()


@pytest.mark.parametrize(("body", "field"), [({"name": "a.b", "enabled": 0}, "enabled"),
                                             ({"name": "a.b", "timeout_s": True}, "timeout_s"),
                                             ({"name": "a.b", "plans": "pro"}, "plans")])
def test_the_platform_api_takes_json_types_as_they_are_too(platform: APIClient, body: dict[str, Any],
                                                          field: str) -> None:
    response = platform.post("/api/v1/task-catalog", body, format="json")
    assert (response.status_code, list(response.json()["error"]["details"])) == (400, [field])
    assert not TaskCatalogEntry.objects.exists()


@pytest.mark.parametrize(("length", "left"), [(1_100_000, 0), (DISCARD_MAX_BYTES + 5, 5)])
def test_a_body_the_answer_left_unread_is_read_so_the_connection_can_be_kept(length: int, left: int) -> None:
    """A server drains only a little of a body the application did not read and then closes the
    connection its answer said to keep; the middleware reads it (up to its bound) before answering."""
    request = RequestFactory().generic("POST", "/api/v1/runs", b"x" * length, content_type="application/json")
    answered = []

    def refuse_unread(req: Any) -> HttpResponse:
        answered.append(req)
        return HttpResponse(status=413)

    response = UnreadBodyMiddleware(refuse_unread)(request)

    assert response.status_code == 413
    assert answered == [request]
    assert len(request.read()) == left


def test_a_body_the_view_read_is_not_read_again() -> None:
    request = RequestFactory().generic("POST", "/api/v1/runs", b'{"a": 1}', content_type="application/json")
    seen: list[bytes] = []

    def read_it(req: Any) -> HttpResponse:
        seen.append(req.body)
        return HttpResponse(status=201)

    UnreadBodyMiddleware(read_it)(request)

    assert seen == [b'{"a": 1}']
    assert request.body == b'{"a": 1}'  # still there for whatever reads it after


@pytest.mark.parametrize("path", ["runs/{runs}/cancel", "runs/{runs}/retry", "workflows/wf/archive",
                                  "workflows/wf/unarchive", "schedules/{schedules}/pause",
                                  "schedules/{schedules}/resume", "api-keys/{api-keys}/revoke"])
def test_an_action_that_takes_no_body_refuses_one_naming_its_fields(
    client_a: APIClient, world: dict[str, str], path: str
) -> None:
    url = "/api/v1/" + path.format_map(world)
    refused = client_a.post(url, {"bogus_field": 1, "force": True}, format="json")
    assert (refused.status_code, error_code(refused)) == (400, "unknown_field"), refused.content
    assert sorted(refused.json()["error"]["details"]) == ["bogus_field", "force"]
    listed = client_a.post(url, [1], format="json")
    assert (listed.status_code, error_code(listed)) == (400, "invalid"), listed.content
    for empty in ("[]", "null", '""', "0", "false"):
        refused = client_a.post(url, empty, content_type="application/json")
        assert (refused.status_code, error_code(refused)) == (400, "invalid"), (empty, refused.content)


@pytest.mark.parametrize("path", ["runs/{runs}/cancel", "schedules/{schedules}/pause", "api-keys/{api-keys}/revoke"])
def test_an_action_that_takes_no_body_takes_none_or_an_empty_object(
    client_a: APIClient, world: dict[str, str], path: str
) -> None:
    url = "/api/v1/" + path.format_map(world)
    assert client_a.post(url).status_code == 200
    assert client_a.post(url, "{}", content_type="application/json").status_code == 200


def test_a_platform_action_that_takes_no_body_refuses_one(platform: APIClient, tenant_a: tuple[Tenant, str]) -> None:
    for verb in ("suspend", "activate"):
        refused = platform.post(f"/api/v1/tenants/{tenant_a[0].slug}/{verb}", {"now": True}, format="json")
        assert (refused.status_code, error_code(refused)) == (400, "unknown_field"), refused.content
    assert platform.post(f"/api/v1/tenants/{tenant_a[0].slug}/suspend", {}, format="json").status_code == 200
    assert platform.post(f"/api/v1/tenants/{tenant_a[0].slug}/activate").status_code == 200


def test_an_error_repeats_at_most_a_thousand_characters_of_what_it_was_sent(client_a: APIClient) -> None:
    long = "x" * 100_000
    for response in (client_a.post("/api/v1/api-keys", {"name": "k", long: 1}, format="json"),
                     client_a.post("/api/v1/workflows", {"name": "w", "spec": {"nodes": [
                         {"id": "a", "type": "action", "action": long}]}}, format="json")):
        assert response.status_code == 400, response.content[:300]
        error = response.json()["error"]
        assert len(error["message"]) <= 1000
        assert all(len(field) <= 200 and all(len(message) <= 1000 for message in messages)
                   for field, messages in error["details"].items()), error
        assert len(response.content) < 5000


LONG_TAGS = ["t" * 1000] * 900


@pytest.mark.parametrize(("match", "action", "field"), [
    ({}, {"deny": "x" * 900_000}, "action.deny"),
    ({}, {"deny": "x" * 501}, "action.deny"),
    ({}, {"pool": "p" * 101}, "action.pool"),
    ({"tags": LONG_TAGS}, {"tier": "batch"}, "match.tags"),
    ({"tags": ["a", "b", "c", "t" * 101]}, {"tier": "batch"}, "match.tags[3]"),
    ({"tags": [f"t{i}" for i in range(51)]}, {"tier": "batch"}, "match.tags"),
    ({"conditions": [{"path": "input." + "p" * 100_000, "op": "exists"}]}, {"tier": "batch"},
     "match.conditions[0].path"),
    ({"conditions": [{"path": "input.x", "op": "in", "value": ["v" * 1000] * 800}]}, {"tier": "batch"},
     "match.conditions[0].value"),
    ({"conditions": [{"path": "input.x", "op": "in", "value": ["a", "v" * 201]}]}, {"tier": "batch"},
     "match.conditions[0].value[1]"),
    ({"conditions": [{"path": "input.x", "op": "eq", "value": {"k": ["v" * 201]}}]}, {"tier": "batch"},
     "match.conditions[0].value.k[0]"),
    ({"conditions": [{"path": "input.x", "op": "eq", "value": {f"k{i}": i for i in range(5000)}}]},
     {"tier": "batch"}, "match.conditions[0].value"),
])
def test_a_rule_field_past_its_bound_is_400_invalid_naming_it_and_stores_nothing(
    client_a: APIClient, match: dict[str, Any], action: dict[str, Any], field: str
) -> None:
    response = client_a.post("/api/v1/rules", {"name": "r", "priority": 1, "match": match, "action": action},
                             format="json")
    assert (response.status_code, error_code(response)) == (400, "invalid"), response.content[:300]
    assert list(response.json()["error"]["details"]) == [field]
    assert "at most" in response.json()["error"]["message"]
    assert client_a.get("/api/v1/rules").json()["results"] == []


def test_rule_fields_at_their_bounds_are_kept_whole(client_a: APIClient) -> None:
    match = {"tags": [f"{i:02d}" + "t" * 98 for i in range(50)],
             "conditions": [{"path": "input." + "p" * 194, "op": "in", "value": ["v" * 200] * 100}]}
    body = {"name": "r", "priority": 1, "match": match, "action": {"deny": "d" * 500}}
    response = client_a.post("/api/v1/rules", body, format="json")
    assert response.status_code == 201, response.content[:300]
    assert response.json()["action"] == {"deny": "d" * 500}
    assert response.json()["match"]["tags"] == match["tags"]
    assert response.json()["match"]["conditions"][0]["value"] == ["v" * 200] * 100


@pytest.mark.parametrize(("condition", "named"), [
    ({"path": "input." + "p" * 100_000, "op": "exists"}, "path"),
    ({"path": "input.x", "op": "in", "value": ["v" * 1000] * 800}, "value"),
    ({"path": "input.x", "op": "prefix", "value": "v" * 201}, "value"),
])
def test_a_node_when_and_a_trigger_filter_bound_their_conditions_as_rules_do(
    client_a: APIClient, condition: dict[str, Any], named: str
) -> None:
    node = {"id": "a", "type": "action", "action": "noop", "when": condition}
    response = client_a.post("/api/v1/workflows", {"name": "w", "spec": {"nodes": [node]}}, format="json")
    assert (response.status_code, error_code(response)) == (400, "invalid"), response.content[:300]
    assert list(response.json()["error"]["details"]) == [f"spec.nodes[0].when.{named}"]
    spec = {"nodes": [{"id": "a", "type": "action", "action": "noop"}]}
    assert client_a.post("/api/v1/workflows", {"name": "w", "spec": spec}, format="json").status_code == 201
    event_condition = {**condition, "path": condition["path"].replace("input.", "event.payload.")}
    response = client_a.post("/api/v1/triggers", {"workflow": "w", "event": "e", "filter": {"any": [event_condition]}},
                             format="json")
    assert (response.status_code, error_code(response)) == (400, "invalid"), response.content[:300]
    assert list(response.json()["error"]["details"]) == [f"filter.any[0].{named}"]
    assert client_a.get("/api/v1/triggers").json()["results"] == []


def test_the_schema_states_the_bounds_of_rules_and_conditions(client_a: APIClient) -> None:
    components = schema(client_a)["components"]["schemas"]
    match, deny, route = components["RuleMatch"], components["RuleDeny"], components["RuleRoute"]
    assert (match["properties"]["tags"]["maxItems"], match["properties"]["tags"]["items"]["maxLength"]) == (50, 100)
    assert deny["properties"]["deny"]["maxLength"] == 500
    assert route["properties"]["pool"]["maxLength"] == 100
    for condition in ("RuleCondition", "EventCondition", "NodeCondition"):
        assert components[condition]["properties"]["path"]["maxLength"] == 200, condition


@pytest.mark.parametrize(("body", "named"), [
    ('{"workflow": "w", "input": {"x": 1e400}}', "input.x"),
    ('{"workflow": "w", "input": {"list": [1, -2.5e999]}}', "input.list[1]"),
    ('{"workflow": "w", "input": {"x": 1' + "0" * 400 + '.5}}', "input.x"),
])
def test_a_number_too_large_to_be_finite_is_400_invalid_naming_it(client_a: APIClient, body: str, named: str) -> None:
    response = client_a.post("/api/v1/runs", body, content_type="application/json")
    assert (response.status_code, error_code(response)) == (400, "invalid"), response.content
    assert list(response.json()["error"]["details"]) == [named]
    assert "number is too large" in response.json()["error"]["message"]


@pytest.mark.parametrize("sign", ["", "-"])
def test_a_whole_number_of_too_many_digits_is_malformed_json_said_plainly(client_a: APIClient, sign: str) -> None:
    body = '{"workflow": "w", "input": {"x": ' + sign + "9" * 5000 + "}}"
    response = client_a.post("/api/v1/runs", body, content_type="application/json")
    assert (response.status_code, error_code(response)) == (400, "malformed_json"), response.content
    message = response.json()["error"]["message"]
    assert "a number has 5000 digits; at most 4300 are accepted" in message
    assert "sys." not in message
    assert "set_int_max_str_digits" not in message
    within = '{"workflow": "none", "input": {"x": ' + "9" * 4300 + "}}"
    assert client_a.post("/api/v1/runs", within, content_type="application/json").status_code == 404


@pytest.mark.parametrize("name", [".", ".."])
def test_a_workflow_named_a_dot_segment_is_refused_naming_it_as_no_url_can_name_it(
    client_a: APIClient, name: str
) -> None:
    """A client removes ``.`` and ``..`` segments from a URL (``%2E`` too, RFC 3986): a workflow of such a
    name could be made but never read, changed, archived or deleted through ``/api/v1/workflows/{name}``."""
    spec = {"nodes": [{"id": "a", "type": "action", "action": "noop"}]}
    response = client_a.post("/api/v1/workflows", {"name": name, "spec": spec}, format="json")
    assert (response.status_code, error_code(response)) == (400, "invalid"), response.content[:300]
    assert list(response.json()["error"]["details"]) == ["name"]
    assert client_a.get("/api/v1/workflows").json()["results"] == []
    assert client_a.post("/api/v1/workflows", {"name": "...", "spec": spec}, format="json").status_code == 201


@pytest.mark.parametrize("version", [2**31, 2**63, 10**30])
def test_a_run_s_version_past_the_largest_one_is_400_invalid_naming_it_as_a_schedule_s_is(
    client_a: APIClient, world: dict[str, str], version: int
) -> None:
    one = client_a.post("/api/v1/runs", {"workflow": "wf", "version": version}, format="json")
    many = client_a.post("/api/v1/runs/bulk", {"runs": [{"workflow": "wf", "version": version}]}, format="json")
    schedule = client_a.post("/api/v1/schedules", {"name": "v", "workflow": "wf", "interval_s": 60, "version": version},
                             format="json")
    for response, field in [(one, "version"), (many, "runs[0].version"), (schedule, "version")]:
        assert (response.status_code, error_code(response)) == (400, "invalid"), response.content[:300]
        assert list(response.json()["error"]["details"]) == [field]


@pytest.mark.parametrize(("body", "key"), [
    ('{"workflow": "child", "workflow": "main"}', "workflow"),
    ('{"workflow": "main", "input": {"a": 1, "b": 2, "a": 3}}', "a"),
    ('{"workflow": "main", "input": {"list": [{"k": 1, "k": 1}]}}', "k"),
])
def test_a_key_given_twice_in_an_object_is_malformed_json_naming_it_and_starts_nothing(
    client_a: APIClient, world: dict[str, str], body: str, key: str
) -> None:
    before = client_a.get("/api/v1/runs").json()
    response = client_a.post("/api/v1/runs", body, content_type="application/json")
    assert (response.status_code, error_code(response)) == (400, "malformed_json"), response.content
    assert f'duplicate key "{key}"' in response.json()["error"]["message"]
    assert client_a.get("/api/v1/runs").json() == before


def test_every_api_view_reads_its_body_with_the_one_json_parser() -> None:
    """One parser reads every body, so each refuses a repeated key, a number of too many digits and
    one too large alike: no view names parsers of its own."""
    from django.urls import URLPattern, URLResolver, get_resolver
    from rest_framework.views import APIView

    from ductor_project.parsers import JSONParser

    def views(patterns: list[Any]) -> Any:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from views(pattern.url_patterns)
            elif isinstance(pattern, URLPattern):
                view = getattr(pattern.callback, "cls", None)
                if isinstance(view, type) and issubclass(view, APIView):
                    yield view

    found = set(views(get_resolver().url_patterns))
    assert len(found) >= 20
    for view in found:
        assert list(view.parser_classes) == [JSONParser], view


@pytest.mark.parametrize(("field", "value", "bound"), [
    ("max_nesting_depth", 1_000_000, "at most 32"), ("max_nesting_depth", 33, "at most 32"),
    ("max_payload_bytes", 2**31 - 1, "at most 268435455"), ("api_rate_per_s", 1e300, "at most 1000000"),
    ("step_rate_per_s", 1_000_001, "at most 1000000"), ("event_retention_days", 36_501, "at most 36500"),
])
def test_an_override_past_its_limit_s_bound_is_400_invalid_naming_it(
    platform: APIClient, tenant_a: tuple[Tenant, str], field: str, value: Any, bound: str
) -> None:
    url = f"/api/v1/tenants/{tenant_a[0].slug}/overrides/{field}"
    response = platform.put(url, {"value": value}, format="json")
    assert (response.status_code, error_code(response)) == (400, "invalid"), response.content
    assert list(response.json()["error"]["details"]) == ["value"]
    assert field in response.json()["error"]["message"]
    assert bound in response.json()["error"]["message"]
    assert platform.get(f"/api/v1/tenants/{tenant_a[0].slug}/overrides").json() == []
    assert platform.put(url.replace(field, "max_nesting_depth"), {"value": 32}, format="json").status_code == 200


def other_forms(canonical: str) -> list[str]:
    """The texts Python's uuid.UUID reads as the same id that the API does not take."""
    bare = canonical.replace("-", "")
    return ["{" + canonical + "}", "urn:uuid:" + canonical, bare, bare[:4] + "-" + bare[4:],
            canonical + "%0A", "%20" + canonical]


def test_a_run_path_takes_its_id_in_the_canonical_form_only(client_a: APIClient, world: dict[str, str]) -> None:
    run = world["runs"]
    for form in (run, run.upper()):
        assert client_a.get(f"/api/v1/runs/{form}").status_code == 200, form
        assert client_a.get(f"/api/v1/runs/{form}/events").status_code == 200, form
    for form in other_forms(run):
        for url in (f"/api/v1/runs/{form}", f"/api/v1/runs/{form}/steps"):
            response = client_a.get(url)
            assert (response.status_code, error_code(response)) == (404, "not_found"), url
        cancelled = client_a.post(f"/api/v1/runs/{form}/cancel")
        assert cancelled.status_code == 404, form
    assert client_a.get(f"/api/v1/runs/{run}").json()["cancel_requested"] is False
    for kind in ("schedules", "rules", "api-keys"):
        assert client_a.get(f"/api/v1/{kind}/{{{world[kind]}}}").status_code == 404, kind


def test_an_id_filter_or_an_id_in_a_body_takes_the_canonical_form_only(
    client_a: APIClient, world: dict[str, str]
) -> None:
    run = world["runs"]
    for form in (run, run.upper()):
        listed = client_a.get(f"/api/v1/runs?root_run_id={form}")
        assert [r["id"] for r in listed.json()["results"]] == [run], form
    for form in other_forms(run):
        response = client_a.get(f"/api/v1/runs?root_run_id={form}")
        assert (response.status_code, error_code(response)) == (400, "invalid"), form
        assert list(response.json()["error"]["details"]) == ["root_run_id"], form
    refused = client_a.post("/api/v1/runs/cancel", {"ids": ["urn:uuid:" + run]}, format="json")
    assert (refused.status_code, error_code(refused)) == (400, "invalid"), refused.content
    assert all(name.startswith("ids") for name in refused.json()["error"]["details"])
    assert client_a.get(f"/api/v1/runs/{run}").json()["cancel_requested"] is False


PLATFORM_PATHS = ("/tenants", "/plans", "/task-catalog", "/platform/")
# A value each query parameter of the schema takes (a cursor is followed from a page's own link).
TAKEN_VALUES = {"page_size": "1", "name": "pong", "archived": "true", "status": "pending", "workflow": "wf",
                "created_after": "2000-01-01T00:00:00Z", "created_before": "2999-01-01T00:00:00Z",
                "root_run_id": "00000000-0000-0000-0000-000000000000", "tag": "x", "fairness_key": "k",
                "after": "1", "limit": "10"}


def client_for(path: str, client_a: APIClient, platform: APIClient) -> APIClient:
    return platform if any(part in path for part in PLATFORM_PATHS) else client_a


def test_every_operation_refuses_a_query_parameter_it_does_not_take_naming_it_before_doing_anything(
    client_a: APIClient, platform: APIClient, world: dict[str, str], tenant_a: tuple[Tenant, str]
) -> None:
    """Every operation of the schema, tenant and platform, list, detail and action, every method (HEAD
    as GET): an operation added later is covered without touching this test."""
    operations = [(path, method, operation) for path, ops in schema(client_a)["paths"].items()
                  for method, operation in ops.items()]
    for path, method, operation in operations:
        client, url = client_for(path, client_a, platform), concrete(path, world, tenant_a[0])
        taken = sorted(p["name"] for p in operation.get("parameters", []) if p["in"] == "query")
        query = "&".join([*(f"{name}={TAKEN_VALUES.get(name, 'x')}" for name in taken if name != "cursor"),
                          "nme=ev.x", "bogus="])
        response = getattr(client, method)(f"{url}?{query}", {}, format="json")
        assert (response.status_code, response["Content-Type"]) == (400, "application/json"), (method, url)
        error = response.json()["error"]
        assert (error["code"], error["message"], error["details"]) == (
            "unknown_field", "Unknown field(s): bogus, nme.", {"bogus": ["Unknown field."], "nme": ["Unknown field."]}
        ), (method, url, taken)
        if method == "get":
            head = client.head(f"{url}?bogus=1")
            assert head.status_code == 400, url
    assert len(operations) >= 100, len(operations)
    # Refused before the view did anything: every object is still there, as it was.
    for path in ("api-keys", "runs", "schedules", "triggers", "webhooks", "connections", "fairness-keys"):
        assert client_a.get(f"/api/v1/{path}/{world[path]}").status_code == 200, path
    assert client_a.get(f"/api/v1/api-keys/{world['api-keys']}").json()["state"] == "active"
    assert not client_a.get(f"/api/v1/runs/{world['runs']}").json()["cancel_requested"]


def test_every_query_parameter_an_operation_lists_is_taken(
    client_a: APIClient, platform: APIClient, world: dict[str, str], tenant_a: tuple[Tenant, str]
) -> None:
    checked, cursors = 0, 0
    for path, operations in schema(client_a)["paths"].items():
        client, url = client_for(path, client_a, platform), concrete(path, world, tenant_a[0])
        for method, operation in operations.items():
            for name in (p["name"] for p in operation.get("parameters", []) if p["in"] == "query"):
                if name == "cursor":  # from the page's own link, with the page size it was made for
                    first = client.get(f"{url}?page_size=1")
                    assert first.status_code == 200, (url, first.content[:300])
                    link = first.json()["next"]
                    if link is None:  # a list of one item has no other page, nor a cursor
                        continue
                    assert "cursor=" in link
                    response, cursors = client.get(link), cursors + 1
                else:
                    assert name in TAKEN_VALUES, f"give the query parameter {name!r} of {path} a value to send"
                    response = getattr(client, method)(f"{url}?{name}={TAKEN_VALUES[name]}")
                assert response.status_code == 200, (method, url, name, response.content[:300])
                checked += 1
    assert checked >= 20, checked
    assert cursors >= 1, cursors  # the lists of one item have none; events' is followed below


def test_a_query_parameter_of_one_value_given_twice_is_400_invalid_naming_it_on_every_operation(
    client_a: APIClient, platform: APIClient, world: dict[str, str], tenant_a: tuple[Tenant, str]
) -> None:
    """``?status=running&status=failed`` answered the failed runs alone, and ``?page_size=abc&page_size=5``
    a page of 5: which one was meant? Only a parameter the schema declares a list (``tag``) repeats."""
    checked = 0
    for path, operations in schema(client_a)["paths"].items():
        client, url = client_for(path, client_a, platform), concrete(path, world, tenant_a[0])
        for method, operation in operations.items():
            for parameter in (p for p in operation.get("parameters", []) if p["in"] == "query"):
                name = parameter["name"]
                value = "x" if name == "cursor" else TAKEN_VALUES[name]
                response = getattr(client, method)(f"{url}?{name}={value}&{name}={value}")
                if parameter["schema"].get("type") == "array":
                    assert response.status_code == 200, (method, url, name, response.content[:300])
                    continue
                assert (response.status_code, error_code(response)) == (400, "invalid"), (method, url, name)
                assert response.json()["error"]["details"] == {name: ["Given 2 times; give it once."]}
                checked += 1
    assert checked >= 20, checked


@pytest.mark.parametrize(("url", "name"), [
    ("/api/v1/runs", "status"), ("/api/v1/runs", "workflow"), ("/api/v1/runs", "created_after"),
    ("/api/v1/runs", "created_before"), ("/api/v1/runs", "root_run_id"), ("/api/v1/runs", "fairness_key"),
    ("/api/v1/runs", "tag"), ("/api/v1/events", "name"),
])
def test_a_filter_given_empty_is_400_invalid_naming_it_not_taken_as_no_filter(
    client_a: APIClient, world: dict[str, str], url: str, name: str
) -> None:
    """``?status=`` answered every run, where ``?page_size=`` and ``?archived=`` are refused: a client
    whose filter value came out empty got everything instead of what it meant to ask for."""
    response = client_a.get(f"{url}?{name}=")
    assert (response.status_code, error_code(response)) == (400, "invalid"), response.content[:300]
    assert list(response.json()["error"]["details"]) == [name]


def test_documented_parameters_are_taken_and_do_what_they_say(
    client_a: APIClient, world: dict[str, str], tenant_a: tuple[Tenant, str]
) -> None:
    with tenant_context(tenant_a[0]):
        event_services.events_send([{"name": "ping"}, {"name": "pong"}])  # the world has one pong
    named = client_a.get("/api/v1/events?name=pong").json()["results"]
    assert [event["name"] for event in named] == ["pong", "pong"]
    misspelled = client_a.get("/api/v1/events?nme=pong")
    assert (misspelled.status_code, misspelled.json()["error"]["details"]) == (400, {"nme": ["Unknown field."]})
    first = client_a.get("/api/v1/events?name=pong&page_size=1").json()
    second = client_a.get(first["next"]).json()  # its link keeps the filter and the page size
    assert [e["name"] for e in first["results"] + second["results"]] == ["pong", "pong"]
    assert second["next"] is None
    steps = client_a.get(f"/api/v1/runs/{world['runs']}/steps?page_size=1")
    assert steps.status_code == 200, steps.content[:300]


@pytest.mark.parametrize("url", ["/api/v1/runs", "/api/v1/events", "/api/v1/tenant", "/api/v1/entitlements"])
@pytest.mark.parametrize("value", ["json", "api", "xml"])
def test_format_is_no_parameter_of_the_api_and_is_refused_in_json_like_any_other(
    client_a: APIClient, url: str, value: str
) -> None:
    for accept in ("application/json", "text/html"):
        response = client_a.get(f"{url}?format={value}", HTTP_ACCEPT=accept)
        assert (response.status_code, response["Content-Type"]) == (400, "application/json"), (accept, response)
        assert response.json()["error"] == {"code": "unknown_field", "message": "Unknown field(s): format.",
                                            "details": {"format": ["Unknown field."]}}


def test_a_browser_gets_the_browsable_api_for_what_succeeds_and_json_for_every_error(client_a: APIClient) -> None:
    page = client_a.get("/api/v1/runs", HTTP_ACCEPT="text/html")
    assert (page.status_code, page["Content-Type"]) == (200, "text/html; charset=utf-8")
    for url in ("/api/v1/runs?bogus=1", "/api/v1/runs/00000000-0000-0000-0000-000000000000"):
        error = client_a.get(url, HTTP_ACCEPT="text/html")
        assert error["Content-Type"] == "application/json", url
        assert error.json()["error"]["code"] in ("unknown_field", "not_found")


def test_a_platform_endpoint_refuses_an_unknown_query_parameter_only_to_a_platform_caller(
    client_a: APIClient, platform: APIClient
) -> None:
    """A tenant's key learns nothing of the platform's endpoints: 404 whatever the query."""
    hidden = client_a.get("/api/v1/tenants?bogus=1")
    assert (hidden.status_code, error_code(hidden)) == (404, "not_found")
    refused = platform.get("/api/v1/tenants?bogus=1")
    assert (refused.status_code, error_code(refused)) == (400, "unknown_field")
    assert (APIClient().get("/api/v1/runs?bogus=1").status_code, APIClient().get("/api/v1/tenants?bogus=1").status_code
            ) == (401, 401)


def test_another_tenant_s_object_is_a_404_whatever_query_parameters_come_with_it(
    client_a: APIClient, tenant_b: tuple[Tenant, str]
) -> None:
    """As an id that does not exist: the refusal of a parameter would tell that the id is one."""
    from workflows import services as workflow_services

    with tenant_context(tenant_b[0]):
        workflow_services.workflow_put(name="theirs", spec={"nodes": [{"id": "a", "type": "action", "action": "noop"}]})
        run, _ = workflow_services.run_start(workflow="theirs")
    for path in (f"/api/v1/runs/{run.pk}/steps?bogus=1", f"/api/v1/runs/{run.pk}?bogus=1",
                 "/api/v1/workflows/theirs?bogus=1", f"/api/v1/runs/{run.pk}/steps?page_size=%00",
                 f"/api/v1/runs/{run.pk}?%00=1"):
        answer = client_a.get(path)
        assert (answer.status_code, error_code(answer)) == (404, "not_found"), path
    own = client_a.get("/api/v1/runs?bogus=1")
    assert (own.status_code, error_code(own)) == (400, "unknown_field")
    own = client_a.get("/api/v1/runs?tag=%00")
    assert (own.status_code, error_code(own), list(own.json()["error"]["details"])) == (400, "invalid", ["tag"])
