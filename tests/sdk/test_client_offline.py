"""The client's parts that need no server: configuration, the retry policy, the error mapping,
the models, and the async client's likeness to the sync one."""

from __future__ import annotations

import asyncio
import inspect
import pickle
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

import httpx
import pytest
from ductor_sdk import (
    AsyncClient,
    BadRequest,
    Client,
    DuctorError,
    NotFound,
    RateLimited,
    RetryPolicy,
    ServerError,
    TransportError,
    WaitTimeout,
)
from ductor_sdk import aio as async_api
from ductor_sdk import client as sync_api
from ductor_sdk.errors import from_response
from ductor_sdk.models import Run
from ductor_sdk.transport import Call, RunWait


def _public_classes(module: ModuleType) -> dict[str, type]:
    return {name: cls for name, cls in vars(module).items()
            if inspect.isclass(cls) and cls.__module__ == module.__name__ and not name.startswith("_")}


def _methods(cls: type) -> dict[str, list[str]]:
    return {name: list(inspect.signature(fn).parameters) for name, fn in vars(cls).items()
            if inspect.isfunction(fn) and not name.startswith("_")}


def test_the_async_client_has_every_method_of_the_sync_one_with_the_same_parameters() -> None:
    sync, asynchronous = _public_classes(sync_api), _public_classes(async_api)
    asynchronous["Client"] = asynchronous.pop("AsyncClient")

    assert set(sync) == set(asynchronous)
    for name, cls in sync.items():
        assert _methods(cls) == _methods(asynchronous[name]), name


def test_the_client_reads_its_url_and_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUCTOR_URL", "https://ductor.example.com/api/v1/")
    monkeypatch.setenv("DUCTOR_API_KEY", "dct_x_y")

    with Client() as client:
        assert client.config.api_root == "https://ductor.example.com/api/v1/"
        assert client.config.api_key == "dct_x_y"
    monkeypatch.delenv("DUCTOR_API_KEY")
    with pytest.raises(ValueError, match="DUCTOR_API_KEY"):
        Client()


def test_the_config_s_repr_names_no_api_key_so_a_log_or_a_traceback_of_it_carries_no_secret() -> None:
    with Client("https://ductor.example.com", "dct_prefix_thesecretpart") as client:
        shown = [repr(client.config), str(client.config)]
    aclient = async_api.AsyncClient("https://ductor.example.com", "dct_prefix_thesecretpart")
    shown.append(repr(aclient.config))
    asyncio.run(aclient.close())
    assert all("thesecretpart" not in text for text in shown), shown
    assert "https://ductor.example.com/api/v1/" in shown[0]


def _error(status: int, body: object, headers: dict[str, str] | None = None) -> object:
    return from_response(httpx.Response(status, json=body, headers=headers))


def test_only_calls_safe_to_repeat_are_retried_and_only_after_errors_that_pass() -> None:
    policy = RetryPolicy(max_retries=2, backoff_s=0.1, max_retry_after_s=5)
    get = Call("GET", "runs", dict)
    create = Call("POST", "pools", dict)
    start = Call("POST", "runs", dict, idempotent=True)
    busy = _error(503, {"error": {"code": "service_unavailable", "message": "retry", "details": {}}})
    throttled = _error(429, {"error": {"code": "rate_limited", "message": "slow", "details": {"retry_after": 2}}},
                       {"Retry-After": "2"})
    quota = _error(429, {"error": {"code": "quota_exceeded", "message": "used up", "details": {}}},
                   {"Retry-After": "86400"})
    broken = TransportError("connection refused")

    assert isinstance(busy, ServerError)
    assert isinstance(throttled, RateLimited)
    assert throttled.retry_after == 2
    assert 0.05 <= (policy.delay(get, 0, busy) or 0) <= 0.1
    assert policy.delay(start, 0, throttled) == 2
    assert policy.delay(start, 1, broken) is not None
    assert policy.delay(start, 2, broken) is None  # out of retries
    assert policy.delay(create, 0, broken) is None  # not safe to repeat
    assert policy.delay(create, 0, busy) is None
    assert policy.delay(create, 0, throttled) == 2  # refused before it was looked at: nothing was made
    assert policy.delay(create, 0, quota) is None
    assert policy.delay(get, 0, quota) is None
    assert policy.delay(get, 0, _error(500, {"error": {"code": "internal_error", "message": "bug"}})) is None


def test_a_503_s_retry_after_is_waited_for_before_the_call_or_the_wait_s_poll_is_sent_again() -> None:
    """The API answers an outage of Redis or PostgreSQL ``503 service_unavailable`` with ``Retry-After: 5``:
    the retries, a few seconds of backoff in all, were spent before it was back."""
    policy = RetryPolicy(max_retries=3, backoff_s=0.1)
    down = _error(503, {"error": {"code": "service_unavailable", "message": "Redis is down", "details": {}}},
                  {"Retry-After": "5"})

    assert isinstance(down, ServerError)
    assert down.retry_after == 5
    assert policy.delay(Call("GET", "runs", dict), 0, down) == 5
    assert RunWait("r1", timeout=60, poll_interval=0.5, follow=True).failed(down) == 5


def test_an_answer_not_in_the_error_shape_is_still_an_error_with_its_status() -> None:
    error = from_response(httpx.Response(413, text="<html>too big</html>"))

    assert isinstance(error, BadRequest)
    assert (error.status, error.code, error.field) == (413, "http_413", None)


def test_a_model_keeps_fields_it_does_not_know_and_defaults_those_it_lacks() -> None:
    run = Run.from_json({"id": "r1", "status": "running", "created_at": "2026-01-02T03:04:05.123456Z",
                         "steps": [{"id": "s1", "node_id": "a"}], "colour": "red"})

    assert (run.id, run.status, run.output, run.tags) == ("r1", "running", None, ())
    assert run.created_at is not None
    assert run.created_at.year == 2026
    assert run.created_at.tzinfo is not None
    assert run.steps[0].node_id == "a"
    assert run.raw["colour"] == "red"
    assert not run.is_terminal


def _answers(*statuses: int) -> tuple[httpx.MockTransport, list[str]]:
    """An HTTP transport answering ``statuses`` in turn (then 200), and the methods it was sent."""
    sent: list[str] = []
    bodies = {429: {"error": {"code": "rate_limited", "message": "slow down", "details": {"retry_after": 0}}},
              503: {"error": {"code": "service_unavailable", "message": "Redis is down", "details": {}}}}

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.method)
        status = statuses[len(sent) - 1] if len(sent) <= len(statuses) else 200
        return httpx.Response(status, json=bodies.get(status, {"id": "x", "slug": "acme"}))

    return httpx.MockTransport(answer), sent


def test_the_client_sends_a_call_safe_to_repeat_again_and_another_once() -> None:
    retry = RetryPolicy(max_retries=3, backoff_s=0.001)
    transport, sent = _answers(503, 429)
    with Client("http://ductor.test", "dct_x_y", retry=retry, http_client=httpx.Client(transport=transport)) as sdk:
        assert sdk.tenant.get().slug == "acme"
    assert sent == ["GET", "GET", "GET"]

    transport, sent = _answers(503)
    with (Client("http://ductor.test", "dct_x_y", retry=retry, http_client=httpx.Client(transport=transport)) as sdk,
          pytest.raises(ServerError)):
        sdk.pools.create("main")
    assert sent == ["POST"]

    transport, sent = _answers(429, 429)
    with Client("http://ductor.test", "dct_x_y", retry=retry, http_client=httpx.Client(transport=transport)) as sdk:
        sdk.pools.create("main")  # rate limited: refused before anything was made, so sent again
    assert sent == ["POST", "POST", "POST"]

    transport, sent = _answers(503)
    with Client("http://ductor.test", "dct_x_y", retry=retry, http_client=httpx.Client(transport=transport)) as sdk:
        sdk.runs.start("greet")  # idempotent: it carries an idempotency key
    assert sent == ["POST", "POST"]


def test_an_id_of_dots_is_sent_as_itself_and_never_folded_into_another_path() -> None:
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.raw_path.decode())
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "Not found.", "details": {}}})

    http = httpx.Client(transport=httpx.MockTransport(answer))
    with Client("http://ductor.test", "dct_x_y", http_client=http) as sdk:
        for key in (".", ".."):
            with pytest.raises(NotFound):
                sdk.runs.get(key)
        with pytest.raises(NotFound):
            sdk.workflows.versions("..")
    assert sent == ["/api/v1/runs/%2E", "/api/v1/runs/%2E%2E", "/api/v1/workflows/%2E%2E/versions"]


def test_an_empty_id_or_name_is_refused_before_sending_never_read_as_the_collection() -> None:
    """``runs.get("")`` read the run list as a run, empty and ``pending`` (``wait`` polled it until its
    timeout), and ``workflows.get("")`` the workflow list as a workflow."""
    transport, sent = _answers()
    with Client("http://ductor.test", "dct_x_y", http_client=httpx.Client(transport=transport)) as sdk:
        for call in (lambda: sdk.runs.get(""), lambda: sdk.runs.cancel(""), lambda: sdk.workflows.get(""),
                     lambda: sdk.connections.delete(""), lambda: sdk.tasks.get("")):
            with pytest.raises(ValueError, match=r"^an empty id or name names nothing: "):
                call()
    assert sent == []


def test_a_number_json_has_not_is_refused_before_sending_naming_where_it_is() -> None:
    """Python writes ``nan`` as ``NaN``, which is not JSON: the server could only refuse the whole body
    as ``malformed_json``. The SDK names the field instead and sends nothing."""
    transport, sent = _answers()
    with Client("http://ductor.test", "dct_x_y", http_client=httpx.Client(transport=transport)) as sdk:
        with pytest.raises(ValueError, match=r"^input\.scores\[1\]: nan is not a JSON number"):
            sdk.runs.start("order", {"scores": [1.5, float("nan")]})
        with pytest.raises(ValueError, match=r"^runs\[0\]\.input\.limit: inf is not a JSON number"):
            sdk.runs.start_many([{"workflow": "order", "input": {"limit": float("inf")}}])
    assert sent == []


def test_a_value_json_has_not_is_refused_before_sending_naming_where_it_is() -> None:
    """Bytes or a set raised json's own TypeError ('Object of type bytes is not JSON serializable'),
    which named no field, where the README says the SDK names where it is, as for ``nan``."""
    transport, sent = _answers()
    with Client("http://ductor.test", "dct_x_y", http_client=httpx.Client(transport=transport)) as sdk:
        with pytest.raises(TypeError, match=r"^input\.scores\[1\]: bytes is not JSON"):
            sdk.runs.start("order", {"scores": [1.5, b"\x00"]})
        with pytest.raises(TypeError, match=r"^runs\[0\]\.input\.tags: set is not JSON"):
            sdk.runs.start_many([{"workflow": "order", "input": {"tags": {"a"}}}])
        with pytest.raises(TypeError, match=r"^input: a key of type tuple is not JSON"):
            sdk.runs.start("order", {("a", "b"): 1})
    assert sent == []


@pytest.mark.parametrize(("call", "message"), [
    (lambda sdk: sdk.runs.start("order", {}, tags="web"), "tags is a list of strings: tags=['web']"),
    (lambda sdk: sdk.runs.list(tags="web"), "tags is a list of strings: tags=['web']"),
    (lambda sdk: list(sdk.runs.iter(tags="web")), "tags is a list of strings: tags=['web']"),
    (lambda sdk: sdk.runs.cancel_many(tags="web"), "tags is a list of strings"),
    (lambda sdk: sdk.runs.retry_many(ids="8d4c2a96-8a53-4c9b-9d55-6cb1b1b5c3f2"), "ids is a list of strings"),
    (lambda sdk: sdk.routing.explain("order", "http.request", tags="web"), "tags is a list of strings"),
    (lambda sdk: sdk.api_keys.create("ci", scopes="read"), "scopes is a list of strings: scopes=['read']"),
    (lambda sdk: sdk.webhooks.create("https://hooks.example.com", "run.failed"), "events is a list of strings"),
    (lambda sdk: sdk.webhooks.create("https://hooks.example.com", ["run.failed"], workflows="order"),
     "workflows is a list of strings"),
    (lambda sdk: sdk.platform.task_catalog.create("billing.charge", tenants="acme"), "tenants is a list of strings"),
    (lambda sdk: sdk.platform.task_catalog.create("billing.charge", plans="pro"), "plans is a list of strings"),
])
def test_a_string_given_for_a_list_of_strings_is_refused_before_sending_not_split_into_letters(
    call: Any, message: str,
) -> None:
    """A str is a Sequence[str] to a type checker: ``tags="web"`` tagged the run 'w', 'e' and 'b'."""
    transport, sent = _answers()
    for client in (Client("http://ductor.test", "dct_x_y", http_client=httpx.Client(transport=transport)),
                   AsyncClient("http://ductor.test", "dct_x_y", http_client=httpx.AsyncClient(transport=transport))):
        with pytest.raises(TypeError) as refused:
            asyncio.run(_awaited(call(client))) if isinstance(client, AsyncClient) else call(client)
        assert message in str(refused.value)
    assert sent == []


async def _awaited(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return [item async for item in value] if hasattr(value, "__aiter__") else value


def test_a_time_without_a_timezone_is_refused_before_sending_naming_the_parameter() -> None:
    """``datetime.now()`` is the machine's local time, and the server reads a time with no zone as UTC:
    a key meant to expire in an hour east of Greenwich lived hours longer."""
    transport, sent = _answers()
    naive = datetime(2027, 1, 1, 9, 30)
    with Client("http://ductor.test", "dct_x_y", http_client=httpx.Client(transport=transport)) as sdk:
        with pytest.raises(ValueError, match=r"^expires_at: 2027-01-01 09:30:00 has no timezone"):
            sdk.api_keys.create("ci", expires_at=naive)
        with pytest.raises(ValueError, match=r"^created_after: .* has no timezone"):
            sdk.runs.list(created_after=naive)
        with pytest.raises(ValueError, match=r"^end: .* has no timezone"):
            sdk.schedules.backfill("8d4c2a96-8a53-4c9b-9d55-6cb1b1b5c3f2", naive.replace(tzinfo=UTC), naive)
        sdk.api_keys.create("ci", expires_at=naive.replace(tzinfo=UTC))
    assert sent == ["POST"]


def test_a_catalog_entry_s_name_among_its_changes_is_sent_for_the_server_to_refuse() -> None:
    """The entry is named positionally: ``name=`` in the changes is a change like any other, which the
    server refuses naming ``name``, not a ``TypeError`` of the method's own parameter."""
    bodies: list[tuple[str, bytes]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append((request.url.path, request.content))
        return httpx.Response(400, json={"error": {"code": "invalid", "message": "name cannot be changed",
                                                   "details": {"name": ["cannot be changed"]}}})

    http = httpx.Client(transport=httpx.MockTransport(answer))
    with Client("http://ductor.test", "dctp_x_y", http_client=http) as sdk, pytest.raises(BadRequest) as refused:
        sdk.platform.task_catalog.update("billing.charge", name="billing.refund")
    assert refused.value.field == "name"
    assert bodies == [("/api/v1/task-catalog/billing.charge", b'{"name":"billing.refund"}')]


def _answering(response: httpx.Response) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: response)


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_an_error_that_names_where_it_leads_not_a_crash_in_the_parser(status: int) -> None:
    """A base URL that is not the API's (``http://`` where a load balancer sends ``https://``, the
    admin's path, a login page) was answered with a redirect and an empty body, which the client
    parsed as a run: ``TypeError: argument of type 'NoneType' is not iterable``."""
    moved = httpx.Response(status, headers={"Location": "https://ductor.example.com/api/v1/tenant"})
    with Client("http://ductor.example.com", "dct_x_y",
                http_client=httpx.Client(transport=_answering(moved))) as client, pytest.raises(DuctorError) as caught:
        client.tenant.get()
    assert caught.value.status == status
    assert caught.value.code == "invalid_response"
    assert "https://ductor.example.com/api/v1/tenant" in caught.value.message


async def _get_tenant_async(response: httpx.Response) -> None:
    async with AsyncClient("http://ductor.example.com", "dct_x_y",
                           http_client=httpx.AsyncClient(transport=_answering(response))) as client:
        await client.tenant.get()


def test_the_async_client_answers_a_redirect_the_same() -> None:
    moved = httpx.Response(301, headers={"Location": "https://ductor.example.com/api/v1/tenant"})
    with pytest.raises(DuctorError, match="redirect") as caught:
        asyncio.run(_get_tenant_async(moved))
    assert caught.value.code == "invalid_response"


@pytest.mark.parametrize("body", [b"", b"null", b'"ok"', b"3"])
@pytest.mark.parametrize("read", ["a run", "a page of runs", "the tasks", "a run's history"])
def test_an_answer_that_is_not_the_json_a_call_reads_is_an_invalid_response(body: bytes, read: str) -> None:
    """A proxy's empty or odd 200 is not Ductor's answer: it is said so, not a TypeError or an
    AttributeError of the parser."""
    odd = httpx.Response(200, content=body, headers={"Content-Type": "application/json"})
    run_id = "4d0f0a43-6b8a-4b8e-9d57-0e1f6f2b6d10"
    with Client("http://ductor.example.com", "dct_x_y",
                http_client=httpx.Client(transport=_answering(odd))) as client:
        call = {"a run": lambda: client.runs.get(run_id), "a page of runs": client.runs.list,
                "the tasks": client.tasks.list, "a run's history": lambda: client.runs.events(run_id)}[read]
        with pytest.raises(DuctorError) as caught:
            call()
    assert caught.value.code == "invalid_response"
    assert caught.value.status == 200


RUN_ID = "4d0f0a43-6b8a-4b8e-9d57-0e1f6f2b6d10"


def _flaky_server(failures: list[object]) -> httpx.MockTransport:
    """Answers each GET of the run with the next of ``failures`` (an exception to raise, or a status),
    then with the run, succeeded."""

    def handle(request: httpx.Request) -> httpx.Response:
        if failures:
            failure = failures.pop(0)
            if isinstance(failure, Exception):
                raise failure
            assert isinstance(failure, int)
            return httpx.Response(failure, json={"error": {"code": "service_unavailable", "message": "down",
                                                           "details": {}}})
        return httpx.Response(200, json={"id": RUN_ID, "status": "succeeded", "output": {"ok": True}})

    return httpx.MockTransport(handle)


def _outage() -> list[object]:
    """A web server restarting: refused connections, then 503s from its load balancer, longer than
    one call's retries last."""
    return [*(httpx.ConnectError("refused") for _ in range(4)), 503, 503, 502]


def test_a_wait_goes_on_through_an_outage_shorter_than_its_timeout() -> None:
    """``runs.wait(timeout=…)`` raised the ``TransportError`` of a Ductor that restarted while it polled,
    as soon as one poll's retries ran out (a few seconds), whatever time it had been given."""
    with Client("http://ductor.example.com", "dct_x_y", retry=RetryPolicy(max_retries=1, backoff_s=0.01),
                http_client=httpx.Client(transport=_flaky_server(_outage()))) as client:
        run = client.runs.wait(RUN_ID, timeout=30, poll_interval=0.01)
    assert (run.status, run.output) == ("succeeded", {"ok": True})


async def _wait_async(failures: list[object], timeout: float) -> Run:
    async with AsyncClient("http://ductor.example.com", "dct_x_y", retry=RetryPolicy(max_retries=1, backoff_s=0.01),
                           http_client=httpx.AsyncClient(transport=_flaky_server(failures))) as client:
        return await client.runs.wait(RUN_ID, timeout=timeout, poll_interval=0.01)


def test_the_async_wait_goes_on_through_an_outage_too() -> None:
    assert asyncio.run(_wait_async(_outage(), timeout=30)).status == "succeeded"


def test_a_wait_raises_an_outage_that_outlasts_its_timeout_and_at_once_an_error_that_is_no_outage() -> None:
    down = [httpx.ConnectError("refused") for _ in range(10_000)]
    with Client("http://ductor.example.com", "dct_x_y", retry=RetryPolicy(max_retries=0),
                http_client=httpx.Client(transport=_flaky_server(down))) as client, pytest.raises(TransportError):
        client.runs.wait(RUN_ID, timeout=0.3, poll_interval=0.01)
    assert down, "it stopped polling at its timeout"

    def missing(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "Not found.", "details": {}}})

    calls: list[httpx.Request] = []
    with Client("http://ductor.example.com", "dct_x_y",
                http_client=httpx.Client(transport=httpx.MockTransport(missing))) as client, pytest.raises(NotFound):
        client.runs.wait(RUN_ID, timeout=30)
    assert len(calls) == 1
    with pytest.raises(NotFound):
        asyncio.run(_wait_async([404], timeout=30))


def test_a_url_and_a_key_read_with_a_line_end_are_taken_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key read from a secret file (``$(cat key)`` keeps its newline in some shells, a mounted secret
    often ends with one) was sent as ``Bearer dct_…\\n``: httpx refused the header, and the client raised a
    ``TransportError`` (retried as if no answer came) whose message held the whole key."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"id": "t-1", "slug": "acme"})

    monkeypatch.setenv("DUCTOR_URL", " https://ductor.example.com/\n")
    monkeypatch.setenv("DUCTOR_API_KEY", "dct_abcdefghij_" + "k" * 40 + "\n")
    with Client(http_client=httpx.Client(transport=httpx.MockTransport(answer))) as client:
        assert client.tenant.get().slug == "acme"
    assert seen[0].headers["Authorization"] == "Bearer dct_abcdefghij_" + "k" * 40
    assert str(seen[0].url) == "https://ductor.example.com/api/v1/tenant"


def test_a_key_no_header_can_carry_is_refused_when_the_client_is_made_without_showing_it() -> None:
    secret = "dct_abcdefghij_" + "s" * 40
    for bad in (secret[:20] + "\n" + secret[20:], secret + "\u00e9", f"{secret} {secret}"):
        with pytest.raises(ValueError, match="API key") as caught:
            Client("https://ductor.example.com", bad)
        assert secret[15:] not in str(caught.value)


def test_every_error_of_the_sdk_crosses_a_process_as_it_was() -> None:
    """Celery's prefork pool, multiprocessing and concurrent.futures carry an exception to another process
    by pickling it, as ``cls(*args)``: ``WaitTimeout``, whose ``run`` is a keyword, failed to load there
    (``missing 1 required keyword-only argument: 'run'``), and Celery put a stand-in in its place."""
    run = Run.from_json({"id": RUN_ID, "status": "running"})
    for error in (WaitTimeout(f"run {RUN_ID} is still running after 5s", run=run),
                  NotFound("Not found.", status=404, code="not_found"),
                  RateLimited("slow", status=429, code="rate_limited", retry_after=3)):
        back = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
        assert type(back) is type(error)
        assert (str(back), back.code, back.status) == (str(error), error.code, error.status)
    assert pickle.loads(pickle.dumps(WaitTimeout("late", run=run))).run == run  # noqa: S301 - our own bytes
