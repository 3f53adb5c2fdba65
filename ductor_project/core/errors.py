"""Every error code (the API's and a step's), and the API's one error shape.

``{"error": {"code": "...", "message": "...", "details": {...}}}``

Validation errors name their fields in ``message`` and list them in
``details``. Anything not mapped here is a bug: it is logged with its traceback
and answered with ``500 internal_error``. ``document_error_responses`` (a
drf-spectacular hook) puts the error answers, in this shape, in the OpenAPI schema.
"""

from __future__ import annotations

import enum
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import structlog
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import IntegrityError, InterfaceError, OperationalError, transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from redis.exceptions import ClusterDownError, SlotNotCoveredError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.settings import api_settings

from ductor_project.core.context import TenantScopeError
from ductor_project.core.payloads import json_equal

T = TypeVar("T")

log = structlog.get_logger(__name__)


class ErrorCode(enum.StrEnum):
    MALFORMED_JSON = "malformed_json"
    INVALID = "invalid"
    UNKNOWN_FIELD = "unknown_field"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    LENGTH_REQUIRED = "length_required"  # a chunked body where the server cannot read one
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    NOT_AUTHENTICATED = "not_authenticated"
    INVALID_API_KEY = "invalid_api_key"
    API_KEY_REVOKED = "api_key_revoked"
    API_KEY_EXPIRED = "api_key_expired"
    TENANT_SUSPENDED = "tenant_suspended"
    INSUFFICIENT_SCOPE = "insufficient_scope"
    PERMISSION_DENIED = "permission_denied"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    NOT_ACCEPTABLE = "not_acceptable"
    CONFLICT = "conflict"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    RATE_LIMITED = "rate_limited"
    QUOTA_EXCEEDED = "quota_exceeded"
    PLAN_LIMIT_REACHED = "plan_limit_reached"
    BAD_REQUEST = "bad_request"
    SERVICE_UNAVAILABLE = "service_unavailable"
    INTERNAL_ERROR = "internal_error"


class StepErrorCode(enum.StrEnum):
    """Why a step attempt failed: the ``code`` of its stored error. An action raises the first
    group (``scheduling.action_errors``); the engine sets the others."""

    INVALID_PARAMS = "invalid_params"
    NO_CONNECTION = "no_connection"
    INVALID_CONNECTION = "invalid_connection"
    ADDRESS_REFUSED = "address_refused"
    DNS_ERROR = "dns_error"
    CONNECT_ERROR = "connect_error"
    TIMEOUT = "timeout"  # the call's, or the step's own timeout_s
    TRANSPORT_ERROR = "transport_error"
    RATE_LIMITED = "rate_limited"
    SERVER_ERROR = "server_error"
    CLIENT_ERROR = "client_error"
    RESPONSE_TOO_LARGE = "response_too_large"
    ACTION_FAILED = "action_failed"
    # Set by the engine:
    ACTION_CRASHED = "action_crashed"  # the action raised something else than an action error
    ROUTING_DENIED = "routing_denied"  # a rule denied it, its tier or its pool is not allowed
    NESTING_TOO_DEEP = "nesting_too_deep"  # a sub-workflow past the plan's max_nesting_depth
    UNKNOWN_WORKFLOW = "unknown_workflow"  # a sub-workflow's definition or version is gone
    WORKFLOW_ARCHIVED = "workflow_archived"  # a sub-workflow whose definition is archived
    QUOTA_EXCEEDED = "quota_exceeded"  # a child or successor run past the monthly run quota
    PAYLOAD_TOO_LARGE = "payload_too_large"  # a rendered input, an output or a run output past the plan
    INVALID_PAYLOAD = "invalid_payload"  # one that holds what no payload keeps: a NUL, a lone surrogate, bytes
    CHILD_FAILED = "child_failed"
    CHILD_CANCELLED = "child_cancelled"
    WAIT_TIMED_OUT = "wait_timed_out"  # a wait_for_event's timeout_s ran out, and it has no default
    RUN_TIMED_OUT = "run_timed_out"  # the run went on past its spec's timeout_s (a run's error only)
    # Task nodes (the team's own Celery tasks):
    TASK_FAILED = "task_failed"  # the task raised (its exception's type and message kept)
    TASK_NOT_ALLOWED = "task_not_allowed"  # not in the catalog, or not for this tenant's plan
    INVALID_INPUT = "invalid_input"  # the rendered input does not match the task's input schema
    PUBLISH_FAILED = "publish_failed"  # the task could not be sent to its queue


class ApiError(exceptions.APIException):
    """An API error with a stable code. Raise a subclass, or this with ``code=``."""

    status_code: int = status.HTTP_400_BAD_REQUEST
    error_code: ErrorCode = ErrorCode.BAD_REQUEST
    default_detail = "Bad request."

    def __init__(
        self,
        message: str | None = None,
        *,
        code: ErrorCode | None = None,
        details: dict[str, Any] | None = None,
        status_code: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message or self.default_detail)
        if code is not None:
            self.error_code = code
        if status_code is not None:
            self.status_code = status_code
        self.details = details or {}
        self.headers = headers or {}


class AuthError(ApiError):
    status_code = status.HTTP_401_UNAUTHORIZED
    error_code = ErrorCode.INVALID_API_KEY
    default_detail = "Invalid API key."


class Forbidden(ApiError):
    status_code = status.HTTP_403_FORBIDDEN
    error_code = ErrorCode.PERMISSION_DENIED
    default_detail = "You do not have permission to perform this action."


class NotFound(ApiError):
    status_code = status.HTTP_404_NOT_FOUND
    error_code = ErrorCode.NOT_FOUND
    default_detail = "Not found."


class Conflict(ApiError):
    status_code = status.HTTP_409_CONFLICT
    error_code = ErrorCode.CONFLICT
    default_detail = "Conflict."


class UnknownFields(ApiError):
    error_code = ErrorCode.UNKNOWN_FIELD

    def __init__(self, fields: list[str]) -> None:
        names = ", ".join(sorted(fields))
        super().__init__(
            f"Unknown field(s): {names}.",
            details={name: ["Unknown field."] for name in sorted(fields)},
        )


def check_key_reuse(field: str, key: str, first: str, compared: Mapping[str, tuple[Any, Any]]) -> None:
    """``409 idempotency_key_reused`` naming ``field`` when a request that sends ``key`` again differs
    from the one that first used it (``first``: "run <id>") in one of ``compared``: each of its
    names maps to (the first request's value, this one's). The same request again is answered as
    the first was; another request under a used key is a client's bug, never a silent answer."""
    differs = [name for name, (was, now) in compared.items() if not json_equal(was, now)]
    if differs:
        names = ", ".join(differs)
        raise ApiError(f"Idempotency key {key!r} was first used for {first}, with another {names}. Send the "
                       "first request again as it was, or use a new key.",
                       code=ErrorCode.IDEMPOTENCY_KEY_REUSED, status_code=status.HTTP_409_CONFLICT,
                       details={field: [f"Already used for {first}, with another {names}."]})


def again_while_keys_are_taken(write: Callable[[], T], keys: int) -> T:
    """``write()``, a write under ``keys`` idempotency keys in a savepoint of its own, run again after
    each unique key's violation: a concurrent write that took one of its keys committed it, and the
    next pass finds it and answers it. Each failed pass finds one more of its keys taken, so concurrent
    writers that share keys take them one after another, and it runs at most once a key, and once more."""
    for _ in range(keys):
        try:
            return write()
        except IntegrityError:
            continue
    return write()


# The longest message, and field name, an error repeats: a value quoted in it (an unknown plan's
# name, a type) comes from the request, which may be a megabyte.
MAX_MESSAGE_CHARS, MAX_FIELD_CHARS = 1000, 200


def _clipped(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one error shape; its message and each field's messages at most ``MAX_MESSAGE_CHARS``."""
    clipped: dict[str, Any] = {}
    for field, value in (details or {}).items():
        if isinstance(value, list):
            value = [_clipped(item, MAX_MESSAGE_CHARS) if isinstance(item, str) else item for item in value]
        clipped[_clipped(str(field), MAX_FIELD_CHARS)] = value
    return {"error": {"code": str(code), "message": _clipped(message, MAX_MESSAGE_CHARS), "details": clipped}}


def flat_details(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail as one list of messages per field path, as ``message`` names them
    (``{"runs[1].tier": ["..."]}``, ``members[0].connection``); each message keeps its code."""
    if isinstance(detail, dict):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            if isinstance(key, int):
                path = f"{prefix}[{key}]"
            elif key == api_settings.NON_FIELD_ERRORS_KEY and prefix:
                path = prefix
            else:
                path = f"{prefix}.{key}" if prefix else str(key)
            for name, messages in flat_details(value, path).items():
                out.setdefault(name, []).extend(messages)
        return out
    if isinstance(detail, list) and any(isinstance(item, dict | list) for item in detail):
        out = {}
        for index, item in enumerate(detail):
            if item:
                for name, messages in flat_details(item, f"{prefix}[{index}]").items():
                    out.setdefault(name, []).extend(messages)
        return out
    items = detail if isinstance(detail, list) else [detail]
    messages = [item if isinstance(item, str) else str(item) for item in items]
    return {prefix or api_settings.NON_FIELD_ERRORS_KEY: messages}


def unknown_field_detail() -> exceptions.ErrorDetail:
    """The message of a field a nested serializer does not accept: ``400 unknown_field`` when every
    field refused is one."""
    return exceptions.ErrorDetail("Unknown field.", code=ErrorCode.UNKNOWN_FIELD.value)


def _first_message(detail: Any) -> str:
    while isinstance(detail, dict | list) and detail:
        detail = next(iter(detail.values())) if isinstance(detail, dict) else detail[0]
    return str(detail)


# How a field's message that is said of the field begins ("must be a list", "is not a usable JSON
# Schema"): the summary names the field before it.
_PREDICATES = ("is", "must", "cannot", "has", "does", "needs")


def _validation_message(detail: Any, details: dict[str, list[str]]) -> str:
    fields = [name for name in details if name != api_settings.NON_FIELD_ERRORS_KEY]
    if not fields:
        return _first_message(detail)
    first, messages = next(iter(details.items()))
    message = str(messages[0]) if messages else _first_message(detail)
    if first != api_settings.NON_FIELD_ERRORS_KEY and message.split(" ", 1)[0] in _PREDICATES:
        message = f"{first} {message}"
    return f"Invalid field(s): {', '.join(fields)}. {message}"


def _drf_to_body(exc: exceptions.APIException) -> tuple[int, dict[str, Any], dict[str, str]]:
    headers: dict[str, str] = {}
    if isinstance(exc, ApiError):
        if exc.status_code == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        body = error_body(exc.error_code, str(exc.detail), exc.details)
        return exc.status_code, body, {**headers, **exc.headers}
    if isinstance(exc, exceptions.ValidationError):
        details = flat_details(exc.detail)
        if details and all(getattr(message, "code", None) == ErrorCode.UNKNOWN_FIELD.value
                           for messages in details.values() for message in messages):
            names = ", ".join(details)
            return 400, error_body(ErrorCode.UNKNOWN_FIELD, f"Unknown field(s): {names}.", details), headers
        return 400, error_body(ErrorCode.INVALID, _validation_message(exc.detail, details), details), headers
    if isinstance(exc, exceptions.ParseError):
        return 400, error_body(ErrorCode.MALFORMED_JSON, f"Malformed request body: {exc.detail}"), headers
    if isinstance(exc, exceptions.NotAuthenticated):
        message = "Authentication required: send 'Authorization: Bearer dct_...'."
        return 401, error_body(ErrorCode.NOT_AUTHENTICATED, message), {"WWW-Authenticate": "Bearer"}
    if isinstance(exc, exceptions.AuthenticationFailed):
        return 401, error_body(ErrorCode.INVALID_API_KEY, str(exc.detail)), {"WWW-Authenticate": "Bearer"}
    if isinstance(exc, exceptions.NotFound):
        return 404, error_body(ErrorCode.NOT_FOUND, "Not found."), headers
    if isinstance(exc, exceptions.PermissionDenied):
        return 403, error_body(ErrorCode.PERMISSION_DENIED, str(exc.detail)), headers
    if isinstance(exc, exceptions.MethodNotAllowed):
        return 405, error_body(ErrorCode.METHOD_NOT_ALLOWED, str(exc.detail)), headers
    if isinstance(exc, exceptions.UnsupportedMediaType):
        return 415, error_body(ErrorCode.UNSUPPORTED_MEDIA_TYPE, str(exc.detail)), headers
    if isinstance(exc, exceptions.NotAcceptable):
        return 406, error_body(ErrorCode.NOT_ACCEPTABLE, str(exc.detail)), headers
    if isinstance(exc, exceptions.Throttled):
        wait = max(1, math.ceil(getattr(exc, "wait", None) or 1))
        body = error_body(ErrorCode.RATE_LIMITED, f"Rate limited; retry in {wait}s.", {"retry_after": wait})
        return 429, body, {"Retry-After": str(max(wait, 1))}
    return exc.status_code, error_body(ErrorCode.BAD_REQUEST, str(exc.detail)), headers


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """DRF's EXCEPTION_HANDLER: map every exception to the one error shape."""
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, RequestDataTooBig):
        body = error_body(ErrorCode.PAYLOAD_TOO_LARGE, "Request body is too large.")
        return Response(body, status=413)
    if isinstance(exc, SuspiciousOperation):
        return Response(error_body(ErrorCode.BAD_REQUEST, "Bad request."), status=400)
    if isinstance(exc, TenantScopeError):
        # A scoped lookup reached a row of another tenant: answer as if it did not exist.
        log.warning("tenant_scope_refused", error=str(exc))
        return Response(error_body(ErrorCode.NOT_FOUND, "Not found."), status=404)
    if isinstance(exc, exceptions.APIException):
        code, body, headers = _drf_to_body(exc)
        return Response(body, status=code, headers=headers)
    if (event := service_out_of_reach(exc)) is not None:
        log.error(event, error=repr(exc))
        return Response(_unavailable_body(), status=503, headers=_RETRY_SHORTLY)
    log.exception("unhandled_api_error", error=repr(exc))
    return Response(error_body(ErrorCode.INTERNAL_ERROR, "Internal server error."), status=500)


_RETRY_SHORTLY = {"Retry-After": "5"}


def _unavailable_body() -> dict[str, Any]:
    return error_body(ErrorCode.SERVICE_UNAVAILABLE, "A backing service is unavailable; retry shortly.")


def service_out_of_reach(exc: BaseException) -> str | None:
    """The event to log (``redis_unavailable``, ``database_unavailable``) when ``exc`` says Redis or
    PostgreSQL cannot be reached: a ``503`` to retry. ``None`` for any other error."""
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | ClusterDownError | SlotNotCoveredError):
        return "redis_unavailable"
    if database_unreachable(exc):
        return "database_unavailable"
    return None


class ServiceUnavailableMiddleware:
    """Outside the API (the admin and its console pages read the queue's state in Redis), a backing
    service out of reach answers as the API does, ``503 service_unavailable`` with ``Retry-After``,
    not a ``500``. The API's views answer for themselves (``exception_handler``)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        event = service_out_of_reach(exc)
        if event is None:
            return None
        log.error(event, error=repr(exc), path=request.path)
        return JsonResponse(_unavailable_body(), status=503, headers=_RETRY_SHORTLY)


# The SQLSTATEs of a server that is going or not there yet: a connection exception (class 08), an
# administrator's or a crash's shutdown, a server still starting.
_GONE_STATES = ("57P01", "57P02", "57P03")


def database_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says PostgreSQL cannot be reached (down, restarting, the connection lost), not
    that a statement failed (a deadlock, a bad query: those stay 500s)."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    state = getattr(exc.__cause__, "sqlstate", None)
    return state is None or state.startswith("08") or state in _GONE_STATES


def json_404(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(error_body(ErrorCode.NOT_FOUND, "Not found."), status=404)


def json_500(request: HttpRequest) -> JsonResponse:
    """Django's ``handler500``, called while the error is being handled. A backing service out of
    reach before any view ran (the admin's session, read by a middleware) answers as it does in a
    view: ``503`` with ``Retry-After``."""
    if (exc := sys.exc_info()[1]) is not None and service_out_of_reach(exc) is not None:
        return JsonResponse(_unavailable_body(), status=503, headers=_RETRY_SHORTLY)
    return JsonResponse(error_body(ErrorCode.INTERNAL_ERROR, "Internal server error."), status=500)


def json_400(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    if isinstance(exception, RequestDataTooBig):
        return JsonResponse(error_body(ErrorCode.PAYLOAD_TOO_LARGE, "Request body is too large."), status=413)
    return JsonResponse(error_body(ErrorCode.BAD_REQUEST, "Bad request."), status=400)


def json_403(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(error_body(ErrorCode.PERMISSION_DENIED, "Forbidden."), status=403)


# --- the error responses in the OpenAPI schema ---------------------------------------------------

ERROR_COMPONENT = "Error"
ERROR_INFO_COMPONENT = "ErrorInfo"
ERROR_CODE_COMPONENT = "ErrorCodeEnum"
_ANY_OPERATION = {
    400: "The request itself is malformed (a Host header this server does not serve, a request Django "
         "refuses as suspicious).",
    401: "Not authenticated: no key, or a malformed, unknown, revoked or expired one.",
    403: "The key lacks the scope, the tenant is suspended, the plan's limit is reached, or the caller "
         "may not use this endpoint.",
    404: "No such object for this tenant, or an endpoint the caller may not see.",
    406: "The Accept header asks for neither JSON nor HTML.",
    429: "The tenant's API rate or monthly run quota is used up; see Retry-After.",
    503: "A backing service is unavailable; retry after Retry-After.",
}
_WITH_INPUT = {400: "A parameter or a field is invalid, or the body is not valid JSON (details name them); "
                    "or the request itself is malformed (a Host header this server does not serve)."}
_WITH_BODY = {
    413: "The body, or a payload in it, is larger than allowed.",
    415: "The body is not application/json.",
}
_UNSAFE = {409: "A unique name or slug is taken, or the object cannot change this way now."}
# Answered by the web server before a request reaches the API, with a page of its own (gunicorn's,
# or a proxy's in front of it): not in the error shape.
_BY_THE_SERVER = {414: "The request line (the path and the query) is longer than the web server takes.",
                  431: "A header field (an Authorization, a cookie) is larger than the web server takes."}
_SERVER_PAGE = {"text/html": {"schema": {"type": "string"}}}
_UNSAFE_METHODS = frozenset({"post", "put", "patch", "delete"})
_BODY_METHODS = frozenset({"post", "put", "patch"})
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before trying again.",
                                "schema": {"type": "integer", "minimum": 1}}}
# The headers that come with an error status, always (``_drf_to_body``, ``exception_handler``).
_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "`Bearer`: send `Authorization: Bearer dct_...`.",
                               "schema": {"type": "string"}}},
    429: _RETRY_AFTER,
    503: _RETRY_AFTER,
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def error_components() -> dict[str, dict[str, Any]]:
    """The OpenAPI schemas of ``error_body``: ``Error`` holds an ``ErrorInfo``, which has a stable
    ``code`` (``ErrorCodeEnum``: every ``ErrorCode``), a ``message`` and ``details``."""
    return {
        ERROR_COMPONENT: {
            "type": "object",
            "description": "Every error answer of the API has this shape.",
            "required": ["error"],
            "properties": {"error": _ref(ERROR_INFO_COMPONENT)},
        },
        ERROR_INFO_COMPONENT: {
            "type": "object",
            "required": ["code", "message", "details"],
            "properties": {
                "code": _ref(ERROR_CODE_COMPONENT),
                "message": {"type": "string", "description": "For people; names the invalid fields, if any."},
                "details": {
                    "type": "object", "additionalProperties": True,
                    "description": "For `invalid` and `unknown_field`: each field's dotted path → its messages; "
                                   "for `rate_limited`: `retry_after` (seconds); for `plan_limit_reached` and "
                                   "`quota_exceeded`: the limit, the plan and the usage; otherwise often empty.",
                },
            },
        },
        ERROR_CODE_COMPONENT: {
            "type": "string",
            "description": "A stable code: clients branch on it, never on the message.",
            "enum": [code.value for code in ErrorCode],
        },
    }


def _error_statuses(method: str, operation: dict[str, Any]) -> dict[int, str]:
    """The error statuses an operation can answer: every one can refuse the caller or a malformed
    request (``json_400``: a Host header the server does not serve reaches no view); one with a
    query, a body or a path parameter that names one of a set of choices can find it invalid (a
    bad id in the path is a 404); a write can conflict; a body can be refused, also by an action
    that takes none (``tenants.api.no_body``: each field of it is ``400 unknown_field``, and a body
    too large or not JSON is refused before that)."""
    statuses = dict(_ANY_OPERATION)
    parameters = operation.get("parameters", [])
    takes_query = any(parameter.get("in") == "query" for parameter in parameters)
    names_a_choice = any(parameter.get("in") == "path" and "enum" in parameter.get("schema", {})
                         for parameter in parameters)
    sends_a_body = "requestBody" in operation or method in _BODY_METHODS
    if takes_query or names_a_choice or sends_a_body:
        statuses |= _WITH_INPUT
    if method in _UNSAFE_METHODS:
        statuses |= _UNSAFE
    if sends_a_body:
        statuses |= _WITH_BODY
    return statuses


def document_error_responses(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: every operation declares the error responses it can
    answer, each with the one error shape and the headers that come with it, and the one the web
    server answers before the API sees the request (``414``, ``431``: its own page); responses a view
    declares itself are kept."""
    result.setdefault("components", {}).setdefault("schemas", {}).update(error_components())
    content = {"application/json": {"schema": _ref(ERROR_COMPONENT)}}
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            for status_code, description in _error_statuses(method, operation).items():
                response: dict[str, Any] = {"description": description, "content": content}
                if status_code in _HEADERS:
                    response["headers"] = _HEADERS[status_code]
                responses.setdefault(str(status_code), response)
            for status_code, description in _BY_THE_SERVER.items():
                responses.setdefault(str(status_code), {"description": description, "content": _SERVER_PAGE})
            operation["responses"] = dict(sorted(responses.items()))
    return result


@contextmanager
def conflict_on_duplicate(field: str, message: str) -> Iterator[None]:
    """Turn a unique-constraint violation inside the block into ``409 conflict`` naming ``field``.

    The block runs in a savepoint, so the surrounding transaction stays usable.
    """
    try:
        with transaction.atomic():
            yield
    except IntegrityError as exc:
        raise Conflict(message, details={field: ["Already exists."]}) from exc
