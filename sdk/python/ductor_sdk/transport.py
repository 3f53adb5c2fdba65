"""How a request reaches Ductor: configuration, the retry policy, and the senders.

A request is described once, as a ``Call`` (method, path, body, how to read the
answer, whether it may be sent twice); ``SyncSender`` and ``AsyncSender`` send
it with httpx and the same ``RetryPolicy``. Only a call that is safe to repeat
is retried: GET, PUT and DELETE, and the POSTs that the server makes idempotent
(a run start with its idempotency key, a cancel, a revoke, a dry run).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qs, quote, urlsplit

import httpx

from ductor_sdk.errors import DuctorError, RateLimited, ServerError, TransportError, WaitTimeout, from_response
from ductor_sdk.models import Run, UnexpectedAnswer
from ductor_sdk.version import __version__

T = TypeVar("T")

NO_BODY: Any = object()
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE"})
RETRIED_STATUSES = frozenset({502, 503, 504})
API_PREFIX = "/api/v1"


def path(*segments: str) -> str:
    """A path under ``/api/v1/`` with each segment quoted (an id is never read as a path).

    ``quote`` leaves dots alone, and an HTTP client folds a segment of ``.`` or ``..`` away before
    sending: ``runs.get(".")`` would read the run list as a run, empty and ``pending``. Such a
    segment is sent percent-encoded, which names nothing: the server answers ``NotFound``. An empty
    one would address the collection itself (``runs.get("")`` read the run list as a run): it raises
    ``ValueError``, and nothing is sent."""
    if "" in segments:
        raise ValueError(f"an empty id or name names nothing: {'/'.join(segments)}")
    return "/".join(_segment(str(segment)) for segment in segments)


def _segment(segment: str) -> str:
    quoted = quote(segment, safe="")
    return quoted.replace(".", "%2E") if quoted in {".", ".."} else quoted


@dataclasses.dataclass(frozen=True)
class Call(Generic[T]):
    """One API request and how to read its answer. ``idempotent`` None: decided by the method."""

    method: str
    path: str
    parse: Callable[[Any], T]
    params: Mapping[str, Any] | None = None
    body: Any = NO_BODY
    idempotent: bool | None = None
    # A start's answer: 201 for a run it created, 200 for the run its idempotency key had started,
    # told to the model as ``created``.
    tells_created: bool = False

    @property
    def safe_to_repeat(self) -> bool:
        if self.idempotent is not None:
            return self.idempotent
        return self.method in IDEMPOTENT_METHODS

    def following(self, link: str) -> Call[T]:
        """This list call for the page that ``link`` (a ``next`` link) points at: its query string
        (cursor, page size, filters, a repeated one's every value) on this call's own path, whatever
        host the server named."""
        return dataclasses.replace(self, params=parse_qs(urlsplit(link).query, keep_blank_values=True))


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Retries of calls safe to repeat, after a transport error, a 429 ``rate_limited`` or a 502/503/504;
    and of any call after a 429 ``rate_limited``, which the server answers before it looks at the
    request (nothing was done: a create is not made twice).

    The wait before retry ``n`` (from 1) is ``min(backoff_s * 2**(n-1), max_backoff_s)``, drawn
    uniformly from its upper half, and at least the server's ``Retry-After``. A ``Retry-After``
    longer than ``max_retry_after_s`` is not waited for: the error is raised. A used-up monthly
    quota (``quota_exceeded``) is never retried.
    """

    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_retry_after_s: float = 60.0

    def delay(self, call: Call[Any], retries_done: int, error: DuctorError) -> float | None:
        """Seconds to wait before sending ``call`` again after ``error``, or None: raise it."""
        if retries_done >= self.max_retries or not _retryable(error):
            return None
        if not (call.safe_to_repeat or _refused_unseen(error)):
            return None
        wait = min(self.backoff_s * 2.0**retries_done, self.max_backoff_s) * random.uniform(0.5, 1.0)
        if error.retry_after is not None:
            if error.retry_after > self.max_retry_after_s:
                return None
            wait = max(wait, error.retry_after)
        return wait


def _refused_unseen(error: DuctorError) -> bool:
    """Whether the server refused the request before looking at it (its rate limit), so that sending
    it again cannot do anything twice."""
    return isinstance(error, RateLimited) and error.code == "rate_limited"


class RunWait:
    """What ``runs.wait`` (sync and async) does after each poll: the client's loop only gets the run
    (of ``run_id``, which a chain's ContinueAsNew moves on when ``follow``) and sleeps. An outage of
    the API (no answer, 429 ``rate_limited``, 502/503/504: Ductor restarting, say) is polled through
    until the timeout, then raised; any other error is raised at once."""

    def __init__(self, run_id: str, *, timeout: float, poll_interval: float, follow: bool) -> None:
        self.run_id = run_id
        self.timeout, self.poll_interval, self.follow = timeout, poll_interval, follow
        self.deadline = time.monotonic() + timeout

    def failed(self, error: DuctorError) -> float:
        """The seconds to sleep before polling again after ``error``; raises it when it is no passing
        outage, or the time is up."""
        left = self.deadline - time.monotonic()
        if not _retryable(error) or left <= 0:
            raise error
        pause = error.retry_after if error.retry_after is not None else 0.5
        return min(max(self.poll_interval, pause), left)

    def polled(self, run: Run) -> Run | float:
        """``run`` when the wait is over (it ended), else the seconds to sleep before polling again (0:
        at once, the chain's next run); ``WaitTimeout`` when the time is up."""
        if self.follow and run.status == "continued" and run.continued_as:
            self.run_id = run.continued_as
            return 0.0
        if run.is_terminal:
            return run
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(f"run {self.run_id} is still {run.status} after {self.timeout:g}s", run=run)
        return min(self.poll_interval, left)


def _retryable(error: DuctorError) -> bool:
    if isinstance(error, TransportError):
        return True
    if isinstance(error, RateLimited):
        return error.code == "rate_limited"
    return isinstance(error, ServerError) and error.status in RETRIED_STATUSES


@dataclasses.dataclass(frozen=True)
class Config:
    """Where the API is and how to call it. ``api_root`` ends with ``/api/v1/``. Its repr leaves the
    key out: a config logged, or shown among a traceback's locals, carries no secret."""

    api_root: str
    api_key: str = dataclasses.field(repr=False)
    timeout: float | httpx.Timeout = 30.0
    retry: RetryPolicy = RetryPolicy()

    @classmethod
    def resolve(
        cls, base_url: str | None, api_key: str | None, timeout: float | httpx.Timeout, retry: RetryPolicy
    ) -> Config:
        """The config from the arguments, else from ``DUCTOR_URL`` and ``DUCTOR_API_KEY``.

        ``base_url`` is the server's root (``https://ductor.example.com``); a URL that already
        ends with ``/api/v1`` is accepted as well. Raises ``ValueError`` when either is missing.
        """
        # Neither has spaces of its own: those around them are a secret file's line end, say.
        url = (base_url or os.environ.get("DUCTOR_URL", "")).strip()
        key = (api_key or os.environ.get("DUCTOR_API_KEY", "")).strip()
        if not url:
            raise ValueError("No Ductor URL: pass base_url= or set DUCTOR_URL.")
        if not key:
            raise ValueError("No API key: pass api_key= or set DUCTOR_API_KEY.")
        if not (key.isascii() and key.isprintable()) or any(char.isspace() for char in key):
            # Not quoted: the error would carry the secret into logs.
            raise ValueError("The API key holds a space, a line break or a character that is not ASCII, which "
                             "no key has (dct_… or dctp_…): check how it was read (a file, an environment variable).")
        root = url.rstrip("/").removesuffix(API_PREFIX)
        return cls(api_root=f"{root}{API_PREFIX}/", api_key=key, timeout=timeout, retry=retry)

    @property
    def headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.api_key}",
            "Accept": "application/json",
            "User-Agent": f"ductor-sdk-python/{__version__}",
        }

    def request_args(self, call: Call[Any]) -> dict[str, Any]:
        """The keyword arguments of ``httpx.Client.request`` for ``call``."""
        args: dict[str, Any] = {
            "method": call.method, "url": self.api_root + call.path, "headers": self.headers,
            "params": call.params, "timeout": self.timeout,
        }
        if call.body is not NO_BODY:
            args["content"] = json_body(call.body)
            args["headers"] = {**self.headers, "Content-Type": "application/json"}
        return args


def json_body(body: Any) -> bytes:
    """``body`` as compact UTF-8 JSON; with a lone surrogate in a string (a file name decoded with
    ``surrogateescape``, say), which UTF-8 cannot carry, as ASCII with it escaped: the server then
    answers ``BadRequest`` naming the field, where encoding it would raise ``UnicodeEncodeError`` here.

    A float that is not finite (``nan``, ``inf``) raises ``ValueError`` naming where it is
    (``input.ratio``): Python would write it as ``NaN``, which is not JSON, and the server could
    only refuse the whole body as ``malformed_json``, naming no field. A value JSON has no type for
    (bytes, a set) raises ``TypeError`` naming where it is too."""
    try:
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except TypeError as exc:
        unknown = _not_json(body, "")
        if unknown is None:
            raise
        raise TypeError(f"{unknown[0] or 'the body'}: {unknown[1]} is not JSON; send a JSON value (a dict with "
                        f"string keys, a list, a string, a number, a boolean or None)") from exc
    except ValueError as exc:
        found = _not_finite(body, "")
        if found is None:
            raise
        where, number = found
        raise ValueError(f"{where or 'the body'}: {number!r} is not a JSON number (JSON has no NaN or "
                         f"Infinity); send a finite number, a string or null") from exc
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(body, separators=(",", ":")).encode()


_JSON_SCALARS = (str, int, float, bool, type(None))
_JSON_KEYS = (str, int, float, bool, type(None))  # what json.dumps takes as a key (it writes them as strings)


def _not_json(value: Any, where: str) -> tuple[str, str] | None:
    """Where the first value (or key) of ``value`` that JSON has no type for is (as the API names fields:
    ``input.a[2]``), and what it is (``bytes``, ``a key of type tuple``); None when there is none."""
    if isinstance(value, _JSON_SCALARS):
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, _JSON_KEYS):
                return where, f"a key of type {type(key).__name__}"
            found = _not_json(item, f"{where}.{key}" if where else str(key))
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        return next((found for index, item in enumerate(value)
                     if (found := _not_json(item, f"{where}[{index}]")) is not None), None)
    return where, type(value).__name__


def _not_finite(value: Any, where: str) -> tuple[str, float] | None:
    """The first float in ``value`` that is not finite, with its path (``input.a[2]``, as the API
    names fields), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (where, value)
    if isinstance(value, Mapping):
        items: Any = ((f"{where}.{key}" if where else str(key), item) for key, item in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{where}[{index}]", item) for index, item in enumerate(value))
    else:
        return None
    return next((found for at, item in items if (found := _not_finite(item, at)) is not None), None)


def read(call: Call[T], response: httpx.Response) -> T:
    """The answer of ``call`` parsed, or the ``DuctorError`` it stands for raised."""
    if response.status_code >= 400:
        raise from_response(response)
    if response.status_code >= 300:  # the API never redirects: the base URL is not where it is served
        where = response.headers.get("Location")
        raise DuctorError(
            f"{call.method} {response.request.url}: answered with a redirect ({response.status_code}"
            f"{' to ' + where if where else ''}), which Ductor's API never does: the client's base URL "
            "(base_url, or DUCTOR_URL) is not where the API is served (http:// for https://, another host or "
            "path); give that URL instead",
            status=response.status_code, code="invalid_response")
    try:
        body = response.json() if response.content else None
    except ValueError as exc:  # a proxy's page, say: not Ductor's answer
        raise DuctorError(f"{call.method} {call.path}: the answer is not JSON", status=response.status_code,
                          code="invalid_response") from exc
    if call.tells_created and isinstance(body, dict):
        body = {**body, "created": response.status_code == 201}
    try:
        return call.parse(body)
    except UnexpectedAnswer as exc:  # an empty or odd answer of a proxy: not Ductor's either
        raise DuctorError(f"{call.method} {call.path}: the answer is not Ductor's: {exc}",
                          status=response.status_code, code="invalid_response") from exc


def _transport_error(call: Call[Any], exc: httpx.TransportError) -> TransportError:
    return TransportError(f"{call.method} {call.path}: {type(exc).__name__}: {exc}", code="transport_error")


class SyncSender:
    """Sends calls with an ``httpx.Client`` (its own unless one is given), retrying as the policy says."""

    def __init__(self, config: Config, http: httpx.Client | None = None) -> None:
        self.config = config
        self._http = http or httpx.Client()
        self._owns_http = http is None

    def send(self, call: Call[T]) -> T:
        retries = 0
        while True:
            try:
                try:
                    response = self._http.request(**self.config.request_args(call))
                except httpx.TransportError as exc:
                    raise _transport_error(call, exc) from exc
                return read(call, response)
            except DuctorError as error:
                wait = self.config.retry.delay(call, retries, error)
                if wait is None:
                    raise
            time.sleep(wait)
            retries += 1

    def close(self) -> None:
        if self._owns_http:
            self._http.close()


class AsyncSender:
    """``SyncSender`` for ``httpx.AsyncClient``."""

    def __init__(self, config: Config, http: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self._http = http or httpx.AsyncClient()
        self._owns_http = http is None

    async def send(self, call: Call[T]) -> T:
        retries = 0
        while True:
            try:
                try:
                    response = await self._http.request(**self.config.request_args(call))
                except httpx.TransportError as exc:
                    raise _transport_error(call, exc) from exc
                return read(call, response)
            except DuctorError as error:
                wait = self.config.retry.delay(call, retries, error)
                if wait is None:
                    raise
            await asyncio.sleep(wait)
            retries += 1

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()
