"""The errors the SDK raises: one class per kind of answer, all ``DuctorError``.

The server answers every error as
``{"error": {"code": "...", "message": "...", "details": {...}}}``; ``code`` is
stable (``ErrorCode`` in the server's ``ductor_project/core/errors.py``) and
``details`` maps each invalid field to its messages. ``field`` is the first
field ``details`` names when the error is about fields (or the body's own
``field``, if the server sends one); other errors' details hold facts such as
``retry_after`` or a plan ``limit``. ``retry_after`` is the answer's
``Retry-After`` (a 429, a 503), which the retries wait for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from ductor_sdk.models import Run


# The codes whose ``details`` map field paths (``spec.nodes[0].action``, ``members[1].weight``) to messages;
# a ``not_found`` names the field that named nothing (a start's ``workflow`` or ``version``), if any.
FIELD_CODES = frozenset({"invalid", "unknown_field", "conflict", "idempotency_key_reused", "payload_too_large",
                         "not_found"})


class DuctorError(Exception):
    """An error answered by Ductor (``status`` set) or met on the way to it (``status`` None)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str = "",
        field: str | None = None,
        details: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.field = field
        self.details: Mapping[str, Any] = details or {}
        self.retry_after = retry_after

    @property
    def fields(self) -> tuple[str, ...]:
        """Every field ``details`` names, in order (none unless the error is about fields)."""
        return tuple(self.details) if self.code in FIELD_CODES else ()

    def __str__(self) -> str:
        prefix = " ".join(part for part in (str(self.status or ""), self.code) if part)
        return f"{prefix}: {self.message}" if prefix else self.message


class BadRequest(DuctorError):
    """400 (``invalid``, ``unknown_field``, ``malformed_json``), and the other refusals of a request
    as such: 405, 406, 413, 415."""


class AuthenticationError(DuctorError):
    """401: no key, or a malformed, unknown, revoked or expired one."""


class PermissionDenied(DuctorError):
    """403: a missing scope, a suspended tenant, a plan ceiling, or the wrong kind of key."""


class NotFound(DuctorError):
    """404: no such object for this tenant (another tenant's object answers exactly this)."""


class Conflict(DuctorError):
    """409: a unique name or slug is taken, a run or a workflow is not in the state the request needs, or an
    ``idempotency_key`` already used by another request (``idempotency_key_reused``)."""


class RateLimited(DuctorError):
    """429: the API rate (``rate_limited``) or the monthly run quota (``quota_exceeded``) is used up.

    ``retry_after`` is in seconds, from ``Retry-After`` or ``details.retry_after``.
    """


class ServerError(DuctorError):
    """5xx: a bug of the server (500) or a backing service down (503, with ``retry_after``: ``Retry-After``)."""


class TransportError(DuctorError):
    """No answer: the connection failed or timed out (after the retries allowed)."""


class WaitTimeout(DuctorError, TimeoutError):
    """``runs.wait`` ran out of time; ``run`` is the run as last seen, not terminal."""

    def __init__(self, message: str, *, run: Run) -> None:
        super().__init__(message, code="wait_timeout")
        self.run = run

    def __reduce__(self) -> tuple[Any, ...]:
        # An exception is pickled as ``cls(*args)`` and its ``__dict__``, and ``run`` is a keyword: without
        # this, it failed to load in the process it was sent to (Celery's prefork pool, concurrent.futures).
        return (_wait_timeout, (self.message, self.run), self.__dict__)


def _wait_timeout(message: str, run: Run) -> WaitTimeout:
    return WaitTimeout(message, run=run)


_BY_STATUS: Mapping[int, type[DuctorError]] = {
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    429: RateLimited,
}


def error_class(status: int) -> type[DuctorError]:
    """The class of an error answer with HTTP ``status``."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ServerError if status >= 500 else BadRequest


def _retry_after(response: httpx.Response, details: Mapping[str, Any]) -> float | None:
    for value in (response.headers.get("Retry-After"), details.get("retry_after")):
        if isinstance(value, str | int | float):
            try:
                return float(value)
            except ValueError:
                continue
    return None


def from_response(response: httpx.Response) -> DuctorError:
    """The error an answer of status 400 or more stands for. A body not in the error shape (a proxy's
    page) still gives an error, coded ``http_<status>``."""
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        error = {"code": f"http_{response.status_code}", "message": response.text[:500] or response.reason_phrase}
    raw_details = error.get("details")
    details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
    code = str(error.get("code", ""))
    fields = list(details) if code in FIELD_CODES else []
    field = error.get("field") if isinstance(error.get("field"), str) else (fields[0] if fields else None)
    return error_class(response.status_code)(str(error.get("message", "")), status=response.status_code, code=code,
                                             field=field, details=details,
                                             retry_after=_retry_after(response, details))
