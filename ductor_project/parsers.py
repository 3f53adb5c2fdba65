"""The API's request parser: JSON, refused past a nesting depth instead of crashing on it.

Python's JSON decoder recurses per level, so a 2 KB body nested a thousand times
deep would raise ``RecursionError`` (a 500) in the parser, or later in whatever
walks the value. Every body is decoded here and refused with
``400 malformed_json`` when it is nested deeper than ``DUCTOR_MAX_JSON_DEPTH``
(the check walks the value iteratively). A string or key that holds a NUL
character (``\\u0000``), which PostgreSQL's ``jsonb`` cannot store, is
``400 invalid`` naming where it is (``input.name``).

The URL gets the same care before any view (``NulCharacterMiddleware``): a
path with a NUL in it names nothing that can exist (``404 not_found``), and a
query parameter with one, in its name or its value, is ``400 invalid`` naming
the parameter. Otherwise PostgreSQL would refuse the lookup's text (a 500).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from ductor_project.core.errors import ApiError, ErrorCode, error_body, json_404
from ductor_project.core.payloads import json_depth, nul_path

NUL_DETAIL = "A NUL character (\\u0000) cannot be stored."


def _nul_message(where: str) -> str:
    return f"Invalid field(s): {where}. It holds a NUL character (\\u0000), which cannot be stored."


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
        where = nul_path(data)
        if where is not None:
            raise ApiError(_nul_message(where), code=ErrorCode.INVALID, details={where: [NUL_DETAIL]})
        return data


class NulCharacterMiddleware:
    """Refuses a NUL character in the request's path (404) or in a query parameter (400 naming it)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path:
            return json_404(request)
        for name, values in request.GET.lists():
            if "\x00" in name or any("\x00" in value for value in values):
                body = error_body(ErrorCode.INVALID, _nul_message(name), {name: [NUL_DETAIL]})
                return JsonResponse(body, status=400)
        return self.get_response(request)
