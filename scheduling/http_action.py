"""The ``http.request`` action: one HTTP call through a tenant's ``http`` connection.

A step gives the method, a ``path`` relative to the connection's ``base_url``,
headers, a JSON body and query parameters; the connection gives the base URL,
default headers, the secret, the timeout and the response size limit.

Tenants must not reach the platform's internals, so before any socket is
opened the host is resolved and every address it resolves to is checked:
loopback, private, link-local, multicast, reserved, unspecified and other
non-global addresses (IPv4 and IPv6, including IPv4-mapped, 6to4, Teredo and
NAT64 forms of them) are refused unless ``settings.DUCTOR_HTTP_ALLOW_PRIVATE``
is on. The request then goes to the very address that was checked (the URL
carries the IP; the ``Host`` header, and for https the TLS SNI name and the
certificate check, carry the original host name), so a DNS answer that changes
between the check and the connection (DNS rebinding) cannot redirect it.
Redirects are not followed and proxy settings from the environment are
ignored, for the same reason.

Errors are ``RetryableActionError`` (timeouts, connection errors, 429, 5xx)
or ``PermanentActionError`` (bad parameters or connection config, refused
addresses, other 4xx, responses over the size limit); see
``scheduling.action_errors``. The connection's circuit breaker records a
failure for transport errors, 429 and 5xx, and a success for any other complete
response; refused calls and oversized responses record nothing.
"""

from __future__ import annotations

import contextlib
import email.utils
import ipaddress
import json
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import structlog
from django.conf import settings

from ductor_project.core.context import TenantScopeError, peek_tenant
from ductor_project.core.errors import StepErrorCode
from ductor_project.core.payloads import json_size_floor
from scheduling import circuit
from scheduling.action_errors import PermanentActionError, RetryableActionError
from scheduling.connection_config import RESERVED_HEADERS, ConfigError, unsendable_header_value, validate_config
from scheduling.response_body import iter_decoded
from scheduling.secrets import SecretError

if TYPE_CHECKING:
    from scheduling.models import Connection
    from tenants.models import Tenant

log = structlog.get_logger(__name__)

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")
PARAM_KEYS = ("method", "path", "headers", "json", "query")
# In a connection's default header values, replaced by the connection's secret.
SECRET_PLACEHOLDER = "{secret}"  # noqa: S105 - a placeholder, not a secret
MAX_URL_CHARS = 2000
# The most of a 4xx answer a step's error quotes.
MAX_QUOTED_CHARS = 2000
MAX_HEADERS = 50
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_ABSOLUTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:(//|\\)")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class _Config:
    base_url: httpx.URL
    headers: dict[str, str]
    timeout_s: float
    max_response_bytes: int


def _config(connection: Connection) -> _Config:
    """The connection's config (``scheduling.connection_config``) plus the call-time checks."""

    def bad(field: str, message: str) -> PermanentActionError:
        return PermanentActionError(
            f"connection '{connection.name}': {field}: {message}", code=StepErrorCode.INVALID_CONNECTION,
            details={"field": field},
        )

    if connection.kind != "http":
        raise bad("kind", f"is '{connection.kind}'; http.request needs an http connection")
    try:
        config = validate_config("http", connection.config)
    except ConfigError as exc:
        raise bad(exc.field, exc.message) from None
    base_url = httpx.URL(config["base_url"])
    if base_url.userinfo:
        raise bad("config.base_url", "must not carry credentials; use the connection secret")
    for name, value in config["headers"].items():
        if name.lower() in RESERVED_HEADERS:
            raise bad(f"config.headers.{name}", "is set by the platform and cannot be given")
        if unsendable_header_value(value):
            raise bad(f"config.headers.{name}", "holds a control character or a character that is not ASCII")
    return _Config(
        base_url=base_url.copy_with(fragment=None), headers=config["headers"],
        timeout_s=config["timeout_s"], max_response_bytes=config["max_response_bytes"],
    )


def _invalid(message: str, **details: Any) -> PermanentActionError:
    return PermanentActionError(message, code=StepErrorCode.INVALID_PARAMS, details=details)


def _join_path(base: httpx.URL, path: Any) -> str:
    """``path`` under the base URL's path; refuses anything that could leave it."""
    if not isinstance(path, str) or len(path) > MAX_URL_CHARS:
        raise _invalid(f"params.path must be a string of at most {MAX_URL_CHARS} characters", field="path")
    if _ABSOLUTE.match(path) or path.startswith(("//", "\\\\", "/\\", "\\/")):
        raise _invalid("params.path must be relative to the connection's base_url, not a URL", field="path")
    if "\\" in path or _BAD_VALUE.search(path) or "\t" in path:
        raise _invalid("params.path must not contain backslashes or control characters", field="path")
    if "?" in path or "#" in path:
        raise _invalid(
            "params.path must not contain '?' or '#'; put parameters in params.query", field="path"
        )
    for segment in path.split("/"):
        decoded = segment.replace("%2e", ".").replace("%2E", ".")
        if decoded in (".", ".."):
            raise _invalid("params.path must not contain '.' or '..' segments", field="path")
        if "%2f" in segment.lower() or "%5c" in segment.lower():
            raise _invalid("params.path must not contain encoded slashes", field="path")
    base_path = base.path.rstrip("/")
    relative = path.lstrip("/")
    return f"{base_path}/{relative}" if relative else (base.path or "/")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise _invalid("params.query values must be strings, numbers, booleans or lists of them", field="query")


def _query(query: Any) -> list[tuple[str, str]]:
    if not isinstance(query, Mapping):
        raise _invalid("params.query must be an object", field="query")
    items: list[tuple[str, str]] = []
    for key, value in query.items():
        if not isinstance(key, str) or not key:
            raise _invalid("params.query keys must be non-empty strings", field="query")
        for one in value if isinstance(value, list) else [value]:
            items.append((key, _scalar(one)))
    return items


def _put(headers: dict[str, str], name: str, value: str) -> None:
    """Set a header, replacing any of the same name in another case."""
    for existing in [k for k in headers if k.lower() == name.lower()]:
        del headers[existing]
    headers[name] = value


def _step_headers(headers: Any) -> dict[str, str]:
    if not isinstance(headers, Mapping) or len(headers) > MAX_HEADERS:
        raise _invalid(f"params.headers must be an object of at most {MAX_HEADERS} headers", field="headers")
    for name, value in headers.items():
        if not isinstance(name, str) or not _TOKEN.match(name):
            raise _invalid(f"params.headers: invalid header name {str(name)[:100]!r}", field="headers")
        if name.lower() in RESERVED_HEADERS:
            raise _invalid(f"params.headers.{name} is set by the platform", field="headers")
        if not isinstance(value, str) or len(value) > 8192 or unsendable_header_value(value):
            raise _invalid(f"params.headers.{name} must be a string of ASCII characters without line breaks",
                           field="headers")
    return dict(headers)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[IPAddress]:
    """The IPv4 addresses ``ip`` carries: IPv4-mapped, 6to4, Teredo (server, client) and NAT64, in that order."""
    embedded: list[IPAddress] = []
    if ip.ipv4_mapped is not None:
        embedded.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        embedded.append(ip.sixtofour)
    if ip.teredo is not None:
        embedded.extend(ip.teredo)
    if ip in _NAT64:
        embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return embedded


def _own_refusal_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` itself, ignoring any address embedded in it, may not be called (``None`` if it is global)."""
    for reason in ("unspecified", "loopback", "link_local", "multicast", "private", "reserved"):
        if getattr(ip, f"is_{reason}"):
            return reason.replace("_", "-")
    return None if ip.is_global else "not globally routable"


def refusal_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` may not be called (``None`` when it is a public unicast address).

    Addresses embedded in IPv6 forms (IPv4-mapped, 6to4, Teredo, NAT64) are
    checked as well, so ``::ffff:127.0.0.1`` is loopback.
    """
    candidates: list[IPAddress] = [*_embedded_ipv4(ip), ip] if isinstance(ip, ipaddress.IPv6Address) else [ip]
    for one in candidates:
        reason = _own_refusal_reason(one)
        if reason is not None:
            return reason
    return None


def _resolve(host: str, port: int) -> list[IPAddress]:
    """The distinct addresses ``host`` resolves to, in the resolver's order and without scope ids; never empty.

    Raises ``RetryableActionError`` (``dns_error``) if the name does not resolve.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise RetryableActionError(
            f"cannot resolve host '{host}': {exc}", code=StepErrorCode.DNS_ERROR
        ) from None
    found: list[IPAddress] = []
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if ip not in found:
            found.append(ip)
    if not found:
        raise RetryableActionError(f"host '{host}' resolves to no address", code=StepErrorCode.DNS_ERROR)
    return found


def _refuse_non_public(host: str, addresses: list[IPAddress]) -> None:
    """Raises ``PermanentActionError`` (``address_refused``) if any address is refused by the policy.

    Does nothing when ``settings.DUCTOR_HTTP_ALLOW_PRIVATE`` is on.
    """
    if settings.DUCTOR_HTTP_ALLOW_PRIVATE:
        return
    for ip in addresses:
        reason = refusal_reason(ip)
        if reason is not None:
            # The address itself is not quoted: it would map the platform's network for a tenant.
            raise PermanentActionError(
                f"host '{host}' resolves to a {reason} address; only public addresses may be called",
                code=StepErrorCode.ADDRESS_REFUSED, details={"host": host, "reason": reason},
            )


def refuse_literal(host: str) -> None:
    """Refuse, without resolving anything, a ``host`` that is a non-public IP literal or a loopback
    name (``localhost``, ``*.localhost``): ``PermanentActionError`` (``address_refused``). A DNS
    name is left to ``resolve_allowed`` when it is called: its answer can change meanwhile anyway.
    Does nothing when ``settings.DUCTOR_HTTP_ALLOW_PRIVATE`` is on."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        _refuse_non_public(host, [ipaddress.ip_address("127.0.0.1")])
        return
    try:
        literal = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        legacy = _legacy_ipv4(name)
        if legacy is None:
            return
        literal = legacy
    _refuse_non_public(host, [literal])


def _legacy_ipv4(name: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a resolver reads ``name`` as without asking DNS, in the forms ``inet_aton``
    takes beside the dotted quad (``127.1``, ``2130706433``, ``0x7f000001``, ``0177.0.0.1``), else
    None."""
    if not name or not all(char in "0123456789abcdefx." for char in name):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(name))
    except OSError:
        return None


def resolve_allowed(host: str, port: int) -> list[IPAddress]:
    """The addresses ``host`` resolves to, in the resolver's order, each allowed by the policy.

    Raises ``PermanentActionError`` (``address_refused``) if any of them is refused
    and ``RetryableActionError`` (``dns_error``) if the name does not resolve.
    """
    found = _resolve(host, port)
    _refuse_non_public(host, found)
    return found


def _breaker_tenant(connection: Connection) -> Tenant | None:
    """The tenant to record the breaker under: the context's (None) or, outside any, the connection's."""
    in_context = peek_tenant()
    if in_context is None:
        return connection.tenant
    if in_context.pk != connection.tenant_id:
        raise TenantScopeError("a connection of another tenant used inside a tenant context")
    return None


def parse_retry_after(value: str | None) -> float | None:
    """The seconds a ``Retry-After`` value asks to wait (a number, or an HTTP date), at least 0;
    None when it is absent or unreadable."""
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    with contextlib.suppress(TypeError, ValueError, IndexError):
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    return None


def _read_limited(response: httpx.Response, limit: int, deadline: float) -> bytes:
    """The decoded body (``iter_decoded``: a compressed one is inflated a piece at a time), aborting
    past ``limit`` bytes or the call's deadline; a body that ends at or after the deadline is refused
    as well, since the hang-up ends it as the server would."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PermanentActionError(
            f"response of {declared} bytes is over the connection's limit of {limit}",
            code=StepErrorCode.RESPONSE_TOO_LARGE, status=response.status_code,
        )
    chunks: list[bytes] = []
    size = 0
    for chunk in iter_decoded(response):
        size += len(chunk)
        if size > limit:
            raise PermanentActionError(
                f"response is over the connection's limit of {limit} bytes",
                code=StepErrorCode.RESPONSE_TOO_LARGE, status=response.status_code,
            )
        _refuse_late(deadline)
        chunks.append(chunk)
    _refuse_late(deadline)  # an end at the deadline may be the hang-up's, the body cut short
    return b"".join(chunks)


def _refuse_late(deadline: float) -> None:
    """Raises ``RetryableActionError`` (``timeout``) once ``deadline`` has passed."""
    if time.monotonic() >= deadline:
        raise RetryableActionError("response took longer than the timeout", code=StepErrorCode.TIMEOUT)


def _parse_body(response: httpx.Response, raw: bytes) -> Any:
    if not raw:
        return None
    content_type = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type == "application/json" or content_type.endswith("+json"):
        # What does not parse, malformed or nested deeper than the parser goes, is kept as text.
        with contextlib.suppress(ValueError, RecursionError):
            return json.loads(raw)
    encoding = response.charset_encoding or "utf-8"
    try:
        return raw.decode(encoding, errors="replace")
    except LookupError:
        return raw.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class _Call:
    method: str
    url: httpx.URL
    host: str
    netloc: str
    headers: dict[str, str]
    query: tuple[tuple[str, str], ...]
    body: bytes | None


def _auth_headers(connection: Connection, config: _Config) -> dict[str, str]:
    """The headers that carry the secret: connection headers with ``{secret}``, else a bearer token."""
    templated = {k: v for k, v in config.headers.items() if SECRET_PLACEHOLDER in v}
    try:
        secret = connection.secret()
    except SecretError as exc:
        raise PermanentActionError(
            f"connection '{connection.name}': {exc}", code=StepErrorCode.INVALID_CONNECTION
        ) from None
    if secret and unsendable_header_value(secret):
        # Not quoted, nor left to the transport, whose refusal quotes the whole header.
        raise PermanentActionError(
            f"connection '{connection.name}': secret: holds a line break, another control character or a "
            "character that is not ASCII, which no header can carry; set it again",
            code=StepErrorCode.INVALID_CONNECTION, details={"field": "secret"},
        )
    if templated and not secret:
        raise PermanentActionError(
            f"connection '{connection.name}': config.headers use {SECRET_PLACEHOLDER} but no secret is set",
            code=StepErrorCode.INVALID_CONNECTION, details={"field": "config.headers"},
        )
    if templated:
        return {k: v.replace(SECRET_PLACEHOLDER, secret) for k, v in templated.items()}
    return {"Authorization": f"Bearer {secret}"} if secret else {}


def _checked_params(params: Any) -> Mapping[str, Any]:
    """``params`` as a mapping of known keys only; raises ``PermanentActionError`` (``invalid_params``) otherwise."""
    if not isinstance(params, Mapping):
        raise _invalid("params must be an object")
    unknown = set(params) - set(PARAM_KEYS)
    if unknown:
        field = sorted(unknown)[0]
        raise _invalid(f"params.{field}: unknown field; use {', '.join(PARAM_KEYS)}", field=field)
    return params


def _method(method: Any) -> str:
    """``method`` upper-cased, guaranteed to be one of ``METHODS``."""
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise _invalid(f"params.method must be one of {', '.join(METHODS)}", field="method")
    return method.upper()


def _url(base: httpx.URL, path: Any) -> httpx.URL:
    """The URL of ``path`` under ``base``, guaranteed to keep the base's scheme, host and port."""
    url = base.copy_with(path=_join_path(base, path))
    if url.scheme != base.scheme or url.raw_host != base.raw_host or url.port != base.port:
        raise _invalid("params.path must stay on the connection's host", field="path")
    return url


def _plain_headers(config: _Config, step_headers: Any) -> dict[str, str]:
    """The connection's headers without ``{secret}`` ones, overridden by the step's (names compared without case).

    Adds ``Accept-Encoding: identity`` unless one is given.
    """
    headers = {k: v for k, v in config.headers.items() if SECRET_PLACEHOLDER not in v}
    for name, value in _step_headers(step_headers).items():
        _put(headers, name, value)
    if not any(name.lower() == "accept-encoding" for name in headers):
        # A compressed body is inflated a chunk at a time before the size check sees it.
        headers["Accept-Encoding"] = "identity"
    return headers


def _json_body(value: Any) -> bytes:
    """``value`` as compact JSON; NaN, infinities and anything not JSON-serializable are refused."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise _invalid(f"params.json is not JSON-serializable: {exc}", field="json") from None


def _checked_idempotency_key(key: str) -> str:
    """``key``, guaranteed a non-empty string without control characters (safe as a header value)."""
    if not isinstance(key, str) or not key or _BAD_VALUE.search(key):
        raise _invalid("idempotency_key must be a non-empty string without control characters")
    return key


def _prepare(params: Any, connection: Connection, idempotency_key: str | None) -> tuple[_Call, _Config]:
    """The checked call and the connection's config; every refusal is raised here, before any network use.

    Headers, lowest precedence first: the connection's, the step's, the JSON
    content type, the secret ones, the idempotency key.
    """
    checked = _checked_params(params)
    config = _config(connection)
    method = _method(checked.get("method", "GET"))
    url = _url(config.base_url, checked.get("path", ""))
    headers = _plain_headers(config, checked.get("headers", {}))
    body: bytes | None = None
    if "json" in checked:
        body = _json_body(checked["json"])
        _put(headers, "Content-Type", "application/json")
    for name, value in _auth_headers(connection, config).items():
        _put(headers, name, value)
    if idempotency_key is not None:
        _put(headers, "Idempotency-Key", _checked_idempotency_key(idempotency_key))
    base = config.base_url
    call = _Call(
        method=method, url=url, host=base.raw_host.decode("ascii"), netloc=base.netloc.decode("ascii"),
        headers=headers, query=tuple(_query(checked.get("query", {}))), body=body,
    )
    return call, config


def _transport_error(
    exc: httpx.TransportError | httpx.DecodingError, host: str, config: _Config, *, hung_up: bool
) -> RetryableActionError:
    """The retryable error of ``exc``; a timeout when ``hung_up`` (the call's deadline closed its connection)."""
    if isinstance(exc, httpx.TimeoutException) or hung_up:
        message = f"timed out after {config.timeout_s:g} s calling '{host}' ({type(exc).__name__})"
        return RetryableActionError(message, code=StepErrorCode.TIMEOUT)
    if isinstance(exc, httpx.ConnectError):
        return RetryableActionError(f"cannot connect to '{host}': {exc}", code=StepErrorCode.CONNECT_ERROR)
    message = f"transport error calling '{host}': {type(exc).__name__}: {exc}"
    return RetryableActionError(message, code=StepErrorCode.TRANSPORT_ERROR)


@contextlib.contextmanager
def _pinned_response(
    client: httpx.Client, call: _Call, addresses: list[IPAddress], extensions: Mapping[str, Any] | None = None
) -> Iterator[httpx.Response]:
    """Send ``call`` to the first of ``addresses`` that accepts a connection, never to any other.

    The URL names the checked IP; ``Host`` (and the TLS SNI name, which the
    certificate is verified against) name the original host. ``extensions`` go with the request.
    """
    extensions = {**(extensions or {}), **({"sni_hostname": call.host} if call.url.scheme == "https" else {})}
    last: httpx.ConnectError | None = None
    for ip in addresses:
        request = client.build_request(
            call.method, call.url.copy_with(host=str(ip)), params=call.query,
            headers={**call.headers, "Host": call.netloc}, content=call.body, extensions=extensions,
        )
        try:
            response = client.send(request, stream=True)
        except httpx.ConnectError as exc:
            last = exc
            continue
        try:
            yield response
        finally:
            response.close()
        return
    raise last or httpx.ConnectError("no address to connect to")


@dataclass(frozen=True)
class _Breaker:
    """The connection's circuit breaker, under the tenant ``_breaker_tenant`` chose."""

    connection_id: object
    tenant: Tenant | None

    def success(self) -> None:
        """Records a complete response that was neither a 429 nor a 5xx."""
        circuit.record_success(self.connection_id, tenant=self.tenant)

    def failure(self) -> None:
        """Records a transport error, a 429 or a 5xx."""
        circuit.record_failure(self.connection_id, tenant=self.tenant)


@dataclass
class _Progress:
    """How far one call got, for its log line; ``outcome`` is ``refused`` until a response is accepted for reading."""

    started: float
    deadline: float
    outcome: str = "refused"
    status: int | None = None

    @classmethod
    def start(cls, timeout_s: float) -> _Progress:
        """Starts the clock now; the body must be read by ``timeout_s`` from now."""
        started = time.monotonic()
        return cls(started=started, deadline=started + timeout_s)


def _port(url: httpx.URL) -> int:
    """The URL's port, or the scheme's default (443 for https, else 80)."""
    return url.port or (443 if url.scheme == "https" else 80)


def _refuse_overload(response: httpx.Response, host: str) -> None:
    """Raises ``RetryableActionError`` for a 429 (``rate_limited``) or 5xx (``server_error``), with its Retry-After."""
    status = response.status_code
    if status == 429 or status >= 500:
        code = StepErrorCode.RATE_LIMITED if status == 429 else StepErrorCode.SERVER_ERROR
        raise RetryableActionError(
            f"HTTP {status} from '{host}'", code=code, status=status,
            retry_after_s=parse_retry_after(response.headers.get("retry-after")),
        )


def _quoted(body: Any, raw: bytes) -> Any:
    """The answer as a refusal quotes it: its JSON while that is small (``MAX_QUOTED_CHARS`` at
    most, nested no deeper than ``DUCTOR_MAX_JSON_DEPTH``), else its text cut at ``MAX_QUOTED_CHARS``.
    The step keeps its error outside the plan's payload limit, so a body quoted whole kept up to
    ``max_response_bytes`` for every attempt."""
    if isinstance(body, dict | list):
        size, depth = json_size_floor(body, stop_above=MAX_QUOTED_CHARS)
        if size <= MAX_QUOTED_CHARS and depth <= settings.DUCTOR_MAX_JSON_DEPTH:
            return body
        return raw[:4 * MAX_QUOTED_CHARS].decode("utf-8", errors="replace")[:MAX_QUOTED_CHARS]
    return str(body or "")[:MAX_QUOTED_CHARS]


def _refuse_client_error(status: int, body: Any, raw: bytes, host: str) -> None:
    """Raises ``PermanentActionError`` (``client_error``) for a 4xx, quoting the body (``_quoted``)."""
    if status >= 400:
        shown = _quoted(body, raw)
        raise PermanentActionError(
            f"HTTP {status} from '{host}'", code=StepErrorCode.CLIENT_ERROR, status=status,
            details={"body": shown},
        )


@contextlib.contextmanager
def _checked_response(
    call: _Call, timeout_s: float, extensions: Mapping[str, Any] | None = None
) -> Iterator[httpx.Response]:
    """Resolve and check the host (``resolve_allowed``), then send ``call`` to a checked address
    (``_pinned_response``), without redirects or proxies from the environment."""
    addresses = resolve_allowed(call.host, _port(call.url))
    with (
        httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False) as client,
        _pinned_response(client, call, addresses, extensions) as response,
    ):
        yield response


@contextlib.contextmanager
def _hanging_up_at(deadline: float) -> Iterator[dict[str, Any]]:
    """Request extensions that close the request's connection at ``deadline`` (``time.monotonic()``),
    whatever it is waiting for then. A phase's timeout bounds one wait only: a peer that sends a
    byte of its answer within each would hold the request as long as it liked. The socket is shut
    down from a timer's thread (its reads then end at once, and httpx raises a ``TransportError``);
    one connected after the deadline is shut down as it connects."""
    lock, sockets, over = threading.Lock(), [], threading.Event()

    def hang_up(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def connected(event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            sock = info["return_value"].get_extra_info("socket")
            with lock:
                sockets.append(sock)
            if over.is_set():
                hang_up(sock)

    def at_deadline() -> None:
        over.set()
        with lock:
            for sock in sockets:
                hang_up(sock)

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), at_deadline)
    timer.daemon = True
    timer.start()
    try:
        yield {"trace": connected}
    finally:
        timer.cancel()


@contextlib.contextmanager
def checked_request(
    method: str, url: httpx.URL, *, headers: Mapping[str, str], body: bytes | None, timeout_s: float
) -> Iterator[httpx.Response]:
    """Send one request to ``url`` under the address policy of ``http_request``, and stream its answer.

    Guarantees what ``http_request`` does of the network: no socket is opened to a refused
    address, the connection goes to the address that was checked (``Host`` and the TLS SNI name
    carry the URL's host), redirects are returned, not followed, each network phase takes at
    most ``timeout_s``, and the connection is closed once ``timeout_s`` has passed since the call
    began, whatever it waits for then (``_hanging_up_at``). Reading the body, and how much of it, is
    the caller's. Raises ``PermanentActionError`` (``address_refused``), ``RetryableActionError``
    (``dns_error``) and ``httpx.TransportError``.
    """
    call = _Call(method=method, url=url, host=url.raw_host.decode("ascii"), netloc=url.netloc.decode("ascii"),
                 headers=dict(headers), query=(), body=body)
    with (
        _hanging_up_at(time.monotonic() + timeout_s) as extensions,
        _checked_response(call, timeout_s, extensions) as response,
    ):
        yield response


def _exchange(call: _Call, config: _Config, breaker: _Breaker, progress: _Progress) -> dict[str, Any]:
    """Resolve and check the host, send ``call`` to a checked address and read the answer, hanging
    up at ``progress.deadline`` (a head sent a line at a time would otherwise hold the worker).

    ``progress`` follows each phase. A 429 or 5xx raises before the body is
    read; any other complete response records a breaker success, then a 4xx
    raises. Failures are left to the caller to record.
    """
    with (
        _hanging_up_at(progress.deadline) as extensions,
        _checked_response(call, config.timeout_s, extensions) as response,
    ):
        progress.status = status = response.status_code
        _refuse_overload(response, call.host)
        progress.outcome = "too_large"
        raw = _read_limited(response, config.max_response_bytes, progress.deadline)
        progress.outcome = "ok" if status < 400 else "client_error"
        breaker.success()
        body = _parse_body(response, raw)
        _refuse_client_error(status, body, raw, call.host)
        return {"status": status, "headers": dict(response.headers.items()), "body": body}


def _log_call(connection: Connection, call: _Call, progress: _Progress, attempt: int) -> None:
    """The call's one log line: method, host, status and outcome, never the path, headers or secret."""
    log.info(
        "http_request", connection_id=str(connection.id), method=call.method, host=call.host,
        status=progress.status, outcome=progress.outcome, attempt=attempt,
        duration_ms=round((time.monotonic() - progress.started) * 1000, 1),
    )


def http_request(
    params: dict[str, Any],
    connection: Connection | None,
    *,
    attempt: int = 1,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Make one HTTP call through ``connection``; returns ``{"status", "headers", "body"}``.

    ``params``: ``method`` (default GET), ``path`` (relative to ``base_url``),
    ``headers``, ``json`` (the body) and ``query``. The body is parsed JSON for
    a JSON content type, else text (``None`` when empty). Guarantees: no
    socket is opened to a refused address, and the connection goes to the
    address that was checked; each network phase takes at most ``timeout_s``
    and the connection is closed once the call has run longer than that,
    whatever it waits for then (``_hanging_up_at``); the body is at most ``max_response_bytes``; redirects
    are returned, not followed. Raises ``RetryableActionError`` or
    ``PermanentActionError`` (see the module docstring), and ``TenantScopeError``
    for a connection of another tenant than the one in context.
    """
    if connection is None:
        raise PermanentActionError("http.request needs a connection: route the step to a pool",
                                   code=StepErrorCode.NO_CONNECTION)
    breaker = _Breaker(connection.id, _breaker_tenant(connection))
    call, config = _prepare(params, connection, idempotency_key)
    progress = _Progress.start(config.timeout_s)
    try:
        return _exchange(call, config, breaker, progress)
    # A body that does not decode as its Content-Encoding says is the server's, as a broken transfer is.
    except (httpx.TransportError, httpx.DecodingError, RetryableActionError) as exc:
        error = exc if isinstance(exc, RetryableActionError) else _transport_error(
            exc, call.host, config, hung_up=time.monotonic() >= progress.deadline)
        progress.outcome = str(error.code)
        breaker.failure()
        raise error from None
    finally:
        _log_call(connection, call, progress, attempt)
