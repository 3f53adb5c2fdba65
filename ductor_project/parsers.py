"""The API's request parser: JSON, refused past a nesting depth instead of crashing on it.

Python's JSON decoder recurses per level, so a 2 KB body nested a thousand times
deep would raise ``RecursionError`` (a 500) in the parser, or later in whatever
walks the value. Every body is decoded here and refused with
``400 malformed_json`` when it is nested deeper than ``DUCTOR_MAX_JSON_DEPTH``
(the check walks the value iteratively). A string or key that holds what
PostgreSQL's ``jsonb`` cannot store, a NUL character (``\\u0000``) or a lone
surrogate (``\\ud800``), is ``400 invalid`` naming where it is (``input.name``).

The URL gets the same care before any view (``NulCharacterMiddleware``): a
path with a NUL in it names nothing that can exist (``404 not_found``), and a
query parameter with such a character, in its name or its value, is ``400
invalid`` naming the parameter. Otherwise PostgreSQL would refuse the lookup's
text (a 500).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from ductor_project.core.errors import ApiError, ErrorCode, error_body, json_404
from ductor_project.core.payloads import json_depth, unstorable_char, unstorable_detail, unstorable_path


def _message(where: str, char: str) -> str:
    return f"Invalid field(s): {where}. {unstorable_detail(char)}"


class JSONParser(parsers.JSONParser):
    def parse(
        self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        limit = settings.DUCTOR_MAX_JSON_DEPTH
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError(f"JSON parse error - nested deeper than {limit} levels") from exc
        depth = json_depth(data)
        if depth > limit:
            raise ParseError(f"JSON parse error - nested {depth} levels deep; at most {limit} are accepted")
        found = unstorable_path(data)
        if found is not None:
            where, char = found
            raise ApiError(_message(where, char), code=ErrorCode.INVALID, details={where: [unstorable_detail(char)]})
        return data


class NulCharacterMiddleware:
    """Refuses a NUL character in the request's path (404), and what cannot be stored in a query
    parameter (400 naming it)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path:
            return json_404(request)
        for name, values in request.GET.lists():
            char = next(filter(None, map(unstorable_char, [name, *values])), None)
            if char is not None:
                body = error_body(ErrorCode.INVALID, _message(name, char), {name: [unstorable_detail(char)]})
                return JsonResponse(body, status=400)
        return self.get_response(request)


# How much of an unread body is read to keep the connection (a body over it still closes it).
DISCARD_MAX_BYTES = 16 * 1024 * 1024


class UnreadBodyMiddleware:
    """Reads what a request's body the answer left unread, up to ``DISCARD_MAX_BYTES``, before the
    answer goes: a ``413`` (over ``DATA_UPLOAD_MAX_MEMORY_SIZE``), or a ``401``, ``403`` or ``429``
    given before the body was looked at. The server drains a few kilobytes of such a body itself and
    otherwise closes the connection after the answer, which told the client to keep it: the client's
    next request on it then fails (``Server disconnected``). Outermost, so it sees every answer."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        # Django's own flag: nothing of the body was read (``request.body`` or a parser's ``read``).
        if not getattr(request, "_read_started", True) and request.META.get("CONTENT_LENGTH"):
            discard(request, DISCARD_MAX_BYTES)
        return response


def discard(request: HttpRequest, max_bytes: int) -> None:
    """Read and drop up to ``max_bytes`` of ``request``'s body (no further than its length)."""
    read = 0
    while read < max_bytes:
        chunk = request.read(min(64 * 1024, max_bytes - read))
        if not chunk:
            return
        read += len(chunk)
