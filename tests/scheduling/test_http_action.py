"""The http.request action against a real local HTTP server (and real PostgreSQL and Redis).

Every test runs under a socket guard: a TCP connect to any address that is not
loopback is blocked before the system call and recorded, so no test can send
traffic outside the machine even if the address policy were broken, and the
refusal tests can assert that no connection was even attempted.
"""

from __future__ import annotations

import gzip
import ipaddress
import json
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from ductor_project.core.context import TenantScopeError, tenant_context
from ductor_project.core.errors import StepErrorCode
from scheduling import secrets
from scheduling.action_errors import PermanentActionError, RetryableActionError
from scheduling.circuit import breaker_key
from scheduling.http_action import http_request, refusal_reason, resolve_allowed
from scheduling.models import Connection

SECRET = "s3cret-token-value"
# 64 MiB of zeros in about 64 KiB of gzip: one piece of the network's inflates to all of it.
GZIP_BOMB = gzip.compress(bytes(64 * 1024 * 1024), compresslevel=9)
UNSPECIFIED = "0.0.0.0"  # noqa: S104 - an address the policy must refuse; nothing binds to it


class Handler(BaseHTTPRequestHandler):
    """Behaviour by path: /api/echo, /api/status/<n>, /api/refusal-long, /api/refusal-deep, /api/sleep,
    /api/drip, /api/trickle-head, /api/big, /api/gzip-bomb, /api/gzip, /api/text, /api/bad-gzip, /api/deep."""

    protocol_version = "HTTP/1.1"
    server: LocalServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append({
            "method": self.command, "path": url.path, "query": parse_qs(url.query),
            "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body.decode(),
        })
        name = url.path.removeprefix("/api/")
        try:
            if name in ("refusal-long", "refusal-deep"):  # a 400 whose JSON is large, or nested deep
                payload = list(range(10_000)) if name == "refusal-long" else json.loads("[" * 200 + "]" * 200)
                self._send(400, payload)
            elif name.startswith("status/"):
                status = int(name.split("/")[1])
                self._send(status, {"error": f"status {status}"}, extra={"Retry-After": "3"})
            elif name == "sleep":
                time.sleep(float(parse_qs(url.query).get("s", ["3"])[0]))
                self._send(200, {"slept": True})
            elif name == "drip":
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Connection", "close")
                self.end_headers()
                for _ in range(60):
                    self.wfile.write(b"x" * 10)
                    self.wfile.flush()
                    time.sleep(0.1)
            elif name == "trickle-head":  # one header line every 0.1 s until the server's trickle is set
                self.send_response(200)
                while not self.server.trickle.wait(0.1):
                    self.send_header("X-Trickle", "more")
                    self.flush_headers()
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif name in ("big", "big-declared"):
                size = int(parse_qs(url.query).get("n", ["1000000"])[0])
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                if name == "big-declared":
                    self.send_header("Content-Length", str(size))
                else:
                    self.send_header("Connection", "close")  # no length: the client must stream and stop
                self.end_headers()
                for _ in range(0, size, 65536):
                    self.wfile.write(b"y" * 65536)
            elif name in ("gzip-bomb", "gzip"):  # sent compressed whatever Accept-Encoding asked for
                data = GZIP_BOMB if name == "gzip-bomb" else gzip.compress(json.dumps({"zipped": True}).encode())
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif name == "bad-gzip":  # a body that is not what its Content-Encoding says
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
            elif name == "deep":  # JSON nested deeper than a parser's recursion goes
                self._send(200, None, raw=b"[" * 20_000 + b"]" * 20_000)
            elif name == "text":
                data = "héllo".encode("latin-1")
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; charset=latin-1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self._send(200, self.server.seen[-1], extra={"X-Reply": "yes"})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on purpose (limits), which is what those tests want

    def _send(self, status: int, payload: Any, extra: dict[str, str] | None = None, raw: bytes | None = None) -> None:
        data = json.dumps(payload).encode() if raw is None else raw
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


class LocalServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.seen: list[dict[str, Any]] = []
        self.trickle = threading.Event()

    @property
    def port(self) -> int:
        return int(self.server_address[1])


@pytest.fixture
def server() -> Iterator[LocalServer]:
    httpd = LocalServer()
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd
    httpd.trickle.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


@pytest.fixture(autouse=True)
def connect_guard(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every TCP connect of the test, in order; non-loopback ones are blocked before the syscall."""
    attempts: list[tuple[str, int]] = []

    def guard(original: Any) -> Any:
        def guarded(sock: socket.socket, address: Any) -> Any:
            if isinstance(address, tuple):
                host = str(address[0]).split("%", 1)[0]
                attempts.append((host, int(address[1])))
                if not _is_loopback(host):  # a name counts as not loopback: the socket would resolve it
                    raise ConnectionRefusedError(f"test guard: blocked a connect to {host}")
            return original(sock, address)

        return guarded

    monkeypatch.setattr(socket.socket, "connect", guard(socket.socket.connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guard(socket.socket.connect_ex))
    return attempts


@pytest.fixture
def tenant(redis_client: Any, tenant_a: Any) -> Iterator[Any]:
    with tenant_context(tenant_a[0]) as tenant:
        yield tenant


@pytest.fixture
def allow_private(settings: Any) -> None:
    settings.DUCTOR_HTTP_ALLOW_PRIVATE = True


@pytest.fixture
def deny_private(settings: Any) -> None:
    settings.DUCTOR_HTTP_ALLOW_PRIVATE = False


def make_connection(base_url: str, *, name: str = "api", secret: str = SECRET, **config: Any) -> Connection:
    return Connection.objects.create(
        name=name, kind="http", config={"base_url": base_url, **config},
        secret_token=secrets.encrypt(secret) if secret else "",
    )


@pytest.fixture
def conn(tenant: Any, server: LocalServer) -> Connection:
    return make_connection(
        f"http://127.0.0.1:{server.port}/api",
        headers={"X-Default": "from-connection", "X-Both": "connection"},
        timeout_s=1, max_response_bytes=64 * 1024,
    )


def failures(redis: Any, connection: Connection) -> int:
    return int(redis.hget(breaker_key(connection.id), "failures") or 0)


def connects_to(guard: list[tuple[str, int]], port: int) -> list[tuple[str, int]]:
    """Connects to the test server's port, or anywhere off this machine (Redis's are left out)."""
    return [a for a in guard if a[1] == port or not _is_loopback(a[0])]


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- requests that go through -------------------------------------------------------------


@pytest.mark.usefixtures("allow_private")
def test_get_sends_query_headers_and_the_secret_as_a_bearer_token(conn, server):
    result = http_request(
        {"method": "get", "path": "echo", "query": {"q": "a b", "n": 3, "flag": True, "many": ["x", "y"]},
         "headers": {"X-Step": "from-step", "X-Both": "step"}},
        conn,
    )
    assert result["status"] == 200
    assert result["headers"]["x-reply"] == "yes"
    seen = server.seen[-1]
    assert seen["method"] == "GET"
    assert seen["path"] == "/api/echo"
    assert seen["query"] == {"q": ["a b"], "n": ["3"], "flag": ["true"], "many": ["x", "y"]}
    assert seen["headers"]["authorization"] == f"Bearer {SECRET}"
    assert seen["headers"]["x-default"] == "from-connection"
    assert seen["headers"]["x-both"] == "step"  # step headers override the connection's defaults
    assert seen["headers"]["x-step"] == "from-step"
    assert seen["headers"]["host"] == f"127.0.0.1:{server.port}"
    assert result["body"]["path"] == "/api/echo"  # a JSON response is parsed


@pytest.mark.usefixtures("allow_private")
def test_post_sends_a_json_body_and_the_idempotency_key(conn, server):
    result = http_request(
        {"method": "POST", "path": "/echo", "json": {"order": 42, "items": ["a"]}}, conn,
        attempt=2, idempotency_key="run-1:step-2",
    )
    assert result["status"] == 200
    seen = server.seen[-1]
    assert json.loads(seen["body"]) == {"order": 42, "items": ["a"]}
    assert seen["headers"]["content-type"] == "application/json"
    assert seen["headers"]["idempotency-key"] == "run-1:step-2"


@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE"])
@pytest.mark.usefixtures("allow_private")
def test_every_method_is_sent_as_given(conn, server, method):
    assert http_request({"method": method, "path": "echo", "json": [1]}, conn)["status"] == 200
    assert server.seen[-1]["method"] == method


@pytest.mark.usefixtures("allow_private")
def test_head_returns_no_body(conn, server):
    result = http_request({"method": "HEAD", "path": "echo"}, conn)
    assert result["status"] == 200
    assert result["body"] is None


@pytest.mark.usefixtures("allow_private")
def test_a_text_response_is_decoded_with_its_charset(conn):
    assert http_request({"path": "text"}, conn)["body"] == "héllo"


@pytest.mark.usefixtures("allow_private")
def test_a_json_body_nested_too_deep_to_parse_is_text(conn):
    body = http_request({"path": "deep"}, conn)["body"]
    assert body == "[" * 20_000 + "]" * 20_000


@pytest.mark.usefixtures("allow_private")
def test_a_step_cannot_replace_the_secret_header(conn, server):
    http_request({"path": "echo", "headers": {"authorization": "Bearer stolen"}}, conn)
    assert server.seen[-1]["headers"]["authorization"] == f"Bearer {SECRET}"


@pytest.mark.usefixtures("allow_private")
def test_a_secret_placeholder_in_connection_headers_replaces_the_bearer_token(tenant, server):
    conn = make_connection(f"http://127.0.0.1:{server.port}/api", headers={"X-Api-Key": "key {secret}"})
    http_request({"path": "echo"}, conn)
    headers = server.seen[-1]["headers"]
    assert headers["x-api-key"] == f"key {SECRET}"
    assert "authorization" not in headers


@pytest.mark.usefixtures("allow_private")
def test_a_connection_without_secret_sends_no_authorization(tenant, server):
    conn = make_connection(f"http://127.0.0.1:{server.port}/api", secret="")
    http_request({"path": "echo"}, conn)
    assert "authorization" not in server.seen[-1]["headers"]


@pytest.mark.usefixtures("allow_private")
def test_the_secret_never_appears_in_the_log(conn, logged):
    http_request({"path": "echo"}, conn)
    with pytest.raises(PermanentActionError):
        http_request({"path": "status/404"}, conn)
    lines = [line for line in logged.lines() if "http_request" in line]
    assert len(lines) == 2
    assert not any(SECRET in line for line in lines)


@pytest.mark.usefixtures("allow_private")
def test_a_path_with_at_sign_stays_on_the_connection_host(conn, server):
    assert http_request({"path": "@evil.example/x"}, conn)["status"] == 200
    assert server.seen[-1]["path"] == "/api/@evil.example/x"
    assert server.seen[-1]["headers"]["host"] == f"127.0.0.1:{server.port}"


# --- limits and errors -------------------------------------------------------------------


@pytest.mark.usefixtures("allow_private")
def test_a_server_slower_than_the_timeout_is_a_retryable_timeout(conn, redis_client):
    started = time.monotonic()
    with pytest.raises(RetryableActionError) as caught:
        http_request({"path": "sleep", "query": {"s": 4}}, conn)  # the timeout is 1 s
    assert caught.value.code == StepErrorCode.TIMEOUT
    assert time.monotonic() - started < 3
    assert failures(redis_client, conn) == 1


@pytest.mark.usefixtures("allow_private")
def test_a_body_trickling_past_the_timeout_is_cut_off(conn):
    started = time.monotonic()
    with pytest.raises(RetryableActionError) as caught:
        http_request({"path": "drip"}, conn)  # each chunk is quick; the whole body takes 6 s
    assert caught.value.code == StepErrorCode.TIMEOUT
    assert time.monotonic() - started < 2.5


@pytest.mark.usefixtures("allow_private")
def test_a_head_that_never_ends_is_hung_up_on_at_the_timeout(conn, server, redis_client):
    """One header line every 0.1 s, each well within the timeout of a read: the call ends at its
    timeout all the same, its connection closed, rather than hold its worker as long as the
    server likes."""
    bound = threading.Timer(30, server.trickle.set)  # else a call that waits for the whole head waits forever
    bound.start()
    try:
        with pytest.raises(RetryableActionError) as caught:
            http_request({"path": "trickle-head"}, conn)  # the timeout is 1 s
        ended_before_the_head = not server.trickle.is_set()
    finally:
        bound.cancel()
    assert ended_before_the_head, "the call waited for the whole head"
    assert caught.value.code == StepErrorCode.TIMEOUT
    assert failures(redis_client, conn) == 1


@pytest.mark.usefixtures("allow_private")
def test_a_body_that_does_not_decode_as_its_content_encoding_says_is_a_retryable_transport_error(
    conn, redis_client
):
    with pytest.raises(RetryableActionError) as caught:
        http_request({"path": "bad-gzip"}, conn)
    assert caught.value.code == StepErrorCode.TRANSPORT_ERROR
    assert "DecodingError" in caught.value.message
    assert failures(redis_client, conn) == 1


@pytest.mark.usefixtures("allow_private")
def test_a_compressed_body_is_inflated_a_piece_at_a_time_and_refused_past_the_limit(conn, redis_client):
    """64 KiB of gzip that inflate to 64 MiB, sent though identity was asked for: refused as too
    large, having held about the limit in memory, not the 64 MiB httpx inflates a network piece to."""
    tracemalloc.start()
    try:
        with pytest.raises(PermanentActionError) as caught:
            http_request({"path": "gzip-bomb"}, conn)  # the limit is 64 KiB
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.code == StepErrorCode.RESPONSE_TOO_LARGE
    assert peak < 8 * 1024 * 1024, f"{peak} bytes held to read a body of at most 64 KiB"


@pytest.mark.usefixtures("allow_private")
def test_a_compressed_body_under_the_limit_is_inflated(conn):
    assert http_request({"path": "gzip"}, conn)["body"] == {"zipped": True}


@pytest.mark.parametrize("path", ["big", "big-declared"])
@pytest.mark.usefixtures("allow_private")
def test_a_response_over_the_size_limit_is_aborted(conn, redis_client, path):
    started = time.monotonic()
    with pytest.raises(PermanentActionError) as caught:
        http_request({"path": path, "query": {"n": 50_000_000}}, conn)  # the limit is 64 KiB
    assert caught.value.code == StepErrorCode.RESPONSE_TOO_LARGE
    assert time.monotonic() - started < 2  # aborted, not read to the end
    assert failures(redis_client, conn) == 0


@pytest.mark.usefixtures("allow_private")
def test_a_500_is_retryable_and_counts_as_a_breaker_failure(conn, redis_client, settings):
    settings.DUCTOR_BREAKER_FAILURES = 2
    with pytest.raises(RetryableActionError) as caught:
        http_request({"path": "status/500"}, conn)
    assert (caught.value.code, caught.value.status) == (StepErrorCode.SERVER_ERROR, 500)
    assert failures(redis_client, conn) == 1
    with pytest.raises(RetryableActionError):
        http_request({"path": "status/503"}, conn)
    assert redis_client.hget(breaker_key(conn.id), "open_until") is not None  # the breaker opened


@pytest.mark.usefixtures("allow_private")
def test_a_429_is_retryable_with_the_servers_retry_after(conn, redis_client):
    with pytest.raises(RetryableActionError) as caught:
        http_request({"path": "status/429"}, conn)
    assert caught.value.code == StepErrorCode.RATE_LIMITED
    assert caught.value.retry_after_s == 3
    assert failures(redis_client, conn) == 1


@pytest.mark.usefixtures("allow_private")
def test_a_404_is_permanent_and_does_not_fail_the_breaker(conn, redis_client):
    with pytest.raises(RetryableActionError):
        http_request({"path": "status/502"}, conn)
    assert failures(redis_client, conn) == 1
    with pytest.raises(PermanentActionError) as caught:
        http_request({"path": "status/404"}, conn)
    assert (caught.value.code, caught.value.status) == (StepErrorCode.CLIENT_ERROR, 404)
    assert caught.value.details["body"] == {"error": "status 404"}
    assert failures(redis_client, conn) == 0  # the endpoint answered: a success resets the count


@pytest.mark.parametrize("path", ["refusal-long", "refusal-deep"])
@pytest.mark.usefixtures("allow_private")
def test_a_4xx_whose_json_is_large_or_deep_is_quoted_as_its_text_cut_short(conn, path):
    """The error is kept with the step, outside the plan's payload limit: a 4xx body quoted whole
    kept up to max_response_bytes (50 MiB) per attempt, nested as deep as the server liked."""
    with pytest.raises(PermanentActionError) as caught:
        http_request({"path": path}, conn)
    quoted = caught.value.details["body"]
    assert caught.value.code == StepErrorCode.CLIENT_ERROR
    assert isinstance(quoted, str)
    assert len(quoted) <= 2000
    assert quoted.startswith("[0, 1, 2" if path == "refusal-long" else "[[[[")


@pytest.mark.usefixtures("allow_private")
def test_a_refused_connection_is_retryable(tenant, redis_client):
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conn = make_connection(f"http://127.0.0.1:{port}/", timeout_s=1)
    with pytest.raises(RetryableActionError) as caught:
        http_request({"path": "x"}, conn)
    assert caught.value.code == StepErrorCode.CONNECT_ERROR
    assert failures(redis_client, conn) == 1


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"method": "TRACE"}, "method"),
        ({"path": 7}, "path"),
        ({"url": "http://x"}, "url"),
        ({"query": {"a": {"nested": 1}}}, "query"),
        ({"headers": {"Host": "other.example"}}, "headers"),
        ({"headers": {"X-Bad": "a\r\nInjected: 1"}}, "headers"),
        ({"headers": {"bad name": "x"}}, "headers"),
        ({"headers": {"X-Name": "caf\u00e9"}}, "headers"),
        ({"json": {1, 2}}, "json"),
    ],
)
@pytest.mark.usefixtures("allow_private")
def test_bad_params_are_permanent_and_name_the_field(conn, server, connect_guard, params, field):
    with pytest.raises(PermanentActionError) as caught:
        http_request({"path": "echo", **params}, conn)
    assert caught.value.code == StepErrorCode.INVALID_PARAMS
    assert caught.value.details["field"] == field
    assert server.seen == []
    assert connects_to(connect_guard, server.port) == []


@pytest.mark.parametrize("secret", ["tok-secret\n", "tok-secret\r\nX-Injected: 1", "tok-secret\x00", "tok-s\u00e9cret"])
@pytest.mark.parametrize("placed", ["bearer", "header"])
@pytest.mark.usefixtures("allow_private")
def test_a_secret_no_header_can_carry_is_refused_before_sending_and_never_quoted(
    tenant, server, connect_guard, secret, placed
):
    """A secret pasted with its line end (or holding what a header cannot carry): the transport
    refused the header quoting its whole value, so the secret went into the step's stored error."""
    headers = {"X-Api-Key": "{secret}"} if placed == "header" else {}
    connection = make_connection(f"http://127.0.0.1:{server.port}/api", secret=secret, headers=headers)
    with pytest.raises(PermanentActionError) as caught:
        http_request({"path": "echo"}, connection)
    assert caught.value.code == StepErrorCode.INVALID_CONNECTION
    assert caught.value.details["field"] == "secret"
    assert "tok" not in json.dumps(caught.value.describe())
    assert connects_to(connect_guard, server.port) == []


@pytest.mark.usefixtures("allow_private")
def test_a_connection_header_that_is_not_ascii_is_refused_naming_it(tenant, server, connect_guard):
    connection = make_connection(f"http://127.0.0.1:{server.port}/api", headers={"X-Team": "caf\u00e9"})
    with pytest.raises(PermanentActionError) as caught:
        http_request({"path": "echo"}, connection)
    assert caught.value.code == StepErrorCode.INVALID_CONNECTION
    assert caught.value.details["field"] == "config.headers.X-Team"
    assert connects_to(connect_guard, server.port) == []


@pytest.mark.usefixtures("allow_private")
def test_a_missing_or_non_http_connection_is_permanent(tenant):
    with pytest.raises(PermanentActionError) as caught:
        http_request({"path": "x"}, None)
    assert caught.value.code == StepErrorCode.NO_CONNECTION
    python_conn = Connection.objects.create(name="py", kind="python", config={})
    with pytest.raises(PermanentActionError) as caught:
        http_request({"path": "x"}, python_conn)
    assert caught.value.code == StepErrorCode.INVALID_CONNECTION


@pytest.mark.usefixtures("allow_private")
def test_a_connection_of_another_tenant_is_refused(conn, tenant_b):
    with tenant_context(tenant_b[0]), pytest.raises(TenantScopeError):
        http_request({"path": "echo"}, conn)


# --- outbound address policy ---------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1", "localhost", "LOCALHOST", "169.254.169.254", "[::1]", "10.0.0.1", "172.16.0.1",
        "192.168.1.1", "100.64.0.1", UNSPECIFIED, "[::]", "[::ffff:127.0.0.1]", "[::ffff:169.254.169.254]",
        "[fe80::1]", "[fc00::1]", "224.0.0.1", "[ff02::1]", "240.0.0.1", "[2002:7f00:1::]",
    ],
)
@pytest.mark.usefixtures("deny_private")
def test_private_addresses_are_refused_before_any_connection(
    tenant, server, connect_guard, redis_client, host
):
    conn = make_connection(f"http://{host}:{server.port}/api")
    with pytest.raises(PermanentActionError) as caught:
        http_request({"path": "echo"}, conn)
    assert caught.value.code == StepErrorCode.ADDRESS_REFUSED
    assert connects_to(connect_guard, server.port) == []  # no connection was even attempted
    assert server.seen == []
    assert failures(redis_client, conn) == 0


@pytest.mark.parametrize("host", ["127.1", "2130706433", "0x7f000001", "0177.0.0.1", "LocalHost"])
@pytest.mark.usefixtures("deny_private")
def test_numeric_and_dotted_spellings_of_loopback_are_refused(connect_guard, host):
    # The API's URL check already refuses most of these as base_url; the policy refuses them anyway.
    with pytest.raises(PermanentActionError) as caught:
        resolve_allowed(host, 80)
    assert caught.value.code == StepErrorCode.ADDRESS_REFUSED
    assert connects_to(connect_guard, 80) == []


@pytest.mark.usefixtures("deny_private")
def test_the_refusal_does_not_quote_the_resolved_address(tenant, server):
    conn = make_connection(f"http://localhost:{server.port}/api")
    with pytest.raises(PermanentActionError) as caught:
        http_request({"path": "echo"}, conn)
    assert "loopback" in caught.value.message
    assert "127.0.0.1" not in caught.value.message


@pytest.mark.usefixtures("allow_private")
def test_the_setting_allows_the_local_server(tenant, server):
    conn = make_connection(f"http://localhost:{server.port}/api")
    assert http_request({"path": "echo"}, conn)["status"] == 200
    assert server.seen[-1]["headers"]["host"] == f"localhost:{server.port}"


@pytest.mark.parametrize(
    "path",
    [
        "http://evil.example/x", "https://evil.example", "//evil.example/x", "\\\\evil.example\\x",
        "/\\evil.example", "https:\\\\evil.example", "../../x", "a/../../x", "%2e%2e/x", "a/%2E%2e/b",
        "a/%2f/b", "x?next=http://evil.example", "x#frag", "a\r\nHost: evil.example",
    ],
)
@pytest.mark.usefixtures("allow_private")
def test_a_path_that_would_leave_the_base_url_is_refused(conn, server, connect_guard, path):
    with pytest.raises(PermanentActionError) as caught:
        http_request({"path": path}, conn)
    assert caught.value.code == StepErrorCode.INVALID_PARAMS
    assert connects_to(connect_guard, server.port) == []
    assert server.seen == []


@pytest.mark.parametrize("ip", ["8.8.8.8", "2606:4700:4700::1111", "93.184.216.34"])
def test_public_addresses_pass_the_policy(ip):
    assert refusal_reason(ipaddress.ip_address(ip)) is None  # pure check; nothing is sent


@pytest.mark.parametrize(
    ("ip", "reason"),
    [
        ("127.0.0.1", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("10.0.0.1", "private"),
        (UNSPECIFIED, "unspecified"), ("224.0.0.1", "multicast"), ("64:ff9b::a00:1", "private"),
        ("2002:a9fe:a9fe::", "link-local"), ("::ffff:10.0.0.1", "private"), ("fc00::1", "private"),
        ("100.64.0.1", "not globally routable"),
    ],
)
def test_refusal_reasons(ip, reason):
    assert refusal_reason(ipaddress.ip_address(ip)) == reason


@pytest.mark.usefixtures("allow_private")
def test_the_request_goes_to_the_address_that_was_checked(tenant, server, connect_guard, monkeypatch):
    """DNS rebinding: a second lookup would give another address; the call must not make one."""
    original = socket.getaddrinfo
    lookups: list[str] = []

    def rebinding(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "rebind.example":
            lookups.append(host)
            address = "127.0.0.1" if len(lookups) == 1 else "127.0.0.2"  # nothing listens on .2
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]
        return original(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    conn = make_connection(f"http://rebind.example:{server.port}/api")
    assert http_request({"path": "echo"}, conn)["status"] == 200
    assert lookups == ["rebind.example"]
    assert connects_to(connect_guard, server.port) == [("127.0.0.1", server.port)]
    assert server.seen[-1]["headers"]["host"] == f"rebind.example:{server.port}"


@pytest.mark.usefixtures("allow_private")
def test_the_socket_guard_blocks_what_the_policy_lets_through(tenant, connect_guard):
    """The guard the refusal tests rely on: with the policy off, the connect is attempted and blocked.

    192.0.2.1 is TEST-NET-1 (documentation only, never routed), and the guard
    stops the connect before the system call anyway.
    """
    conn = make_connection("http://192.0.2.1:9/api")
    with pytest.raises(RetryableActionError) as caught:
        http_request({"path": "echo"}, conn)
    assert caught.value.code == StepErrorCode.CONNECT_ERROR
    assert connects_to(connect_guard, 9) == [("192.0.2.1", 9)]
