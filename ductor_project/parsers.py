"""The API's request parser: JSON, refused past a nesting depth instead of crashing on it.

Python's JSON decoder recurses per level, so a 2 KB body nested a thousand times
deep would raise ``RecursionError`` (a 500) in the parser, or later in whatever
walks the value. Every body is decoded here and refused with
``400 malformed_json`` when it is nested deeper than ``DUCTOR_MAX_JSON_DEPTH``
(the check walks the value iteratively). A string or key that holds what
PostgreSQL's ``jsonb`` cannot store, a NUL character (``\\u0000``) or a lone
surrogate (``\\ud800``), or a number too large to be finite (``1e400``, which
reads as infinity), is ``400 invalid`` naming where it is (``input.name``).

Two more things valid JSON can hold are refused as ``400 malformed_json``, saying
what is wrong in plain words: an object with a key twice (``{"workflow": "a",
"workflow": "b"}``: which one was meant? JSON leaves it open, and Python would
keep the last one silently), and a whole number with more digits than Python
converts (``sys.get_int_max_str_digits()``, 4,300).

The URL gets the same care before any view (``NulCharacterMiddleware``): a
path with a NUL in it names nothing that can exist (``404 not_found``), and a
query parameter with such a character, in its name or its value, is ``400
invalid`` naming the parameter. Otherwise PostgreSQL would refuse the lookup's
text (a 500).
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from rest_framework import parsers
from rest_framework.exceptions import ParseError
from rest_framework.parsers import get_encoding  # type: ignore[attr-defined, unused-ignore]  # in the stubs from 3.18.2 only

from ductor_project.core.errors import ApiError, ErrorCode, error_body, json_404
from ductor_project.core.payloads import json_depth, unstorable_char, unstorable_detail, unstorable_path


def _message(where: str, why: str) -> str:
    return f"Invalid field(s): {where}. {why}"


class _Refused(ValueError):
    """What valid JSON holds that a body may not: a repeated key, a number of too many digits. Its
    message is said to the client as it is."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's pairs as a dict (``object_pairs_hook``), refusing a key given twice."""
    built = dict(pairs)
    if len(built) == len(pairs):
        return built
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            shown = json.dumps(key if len(key) <= 100 else key[:100] + "…", ensure_ascii=False)
            raise _Refused(f"duplicate key {shown} in an object; give each key once")
        seen.add(key)
    raise AssertionError("unreachable: a shorter dict has a repeated key")


def _constant(name: str) -> Any:
    """``NaN``, ``Infinity``, ``-Infinity`` (``parse_constant``): not JSON, refused."""
    raise _Refused(f"{name} is not a JSON number")


# Python's refusal of a whole number of too many digits, which advises a call of Python's.
_TOO_MANY_DIGITS = re.compile(r"integer string conversion: value has (\d+) digits")


def loads(text: str) -> Any:
    """``text`` as JSON, as the API reads every body: strict about constants, refusing a key given
    twice and a whole number of more digits than ``sys.get_int_max_str_digits()`` (``ValueError``,
    saying which in plain words). Whole numbers are read by the decoder's own C code (a
    ``parse_int`` of Python's would make a body of numbers several times slower to read); its
    refusal of a long one is reworded."""
    try:
        return json.loads(text, object_pairs_hook=_object, parse_constant=_constant)
    except ValueError as exc:
        too_long = _TOO_MANY_DIGITS.search(str(exc)) if type(exc) is ValueError else None
        if too_long is None:
            raise
        limit = sys.get_int_max_str_digits()
        raise _Refused(f"a number has {too_long.group(1)} digits; at most {limit} are accepted") from exc


class JSONParser(parsers.JSONParser):
    def parse(
        self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        limit = settings.DUCTOR_MAX_JSON_DEPTH
        try:
            text = codecs.getreader(get_encoding(parser_context or {}))(stream).read()
            data = loads(text)
        except RecursionError as exc:
            raise ParseError(f"JSON parse error - nested deeper than {limit} levels") from exc
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from exc
        depth = json_depth(data)
        if depth > limit:
            raise ParseError(f"JSON parse error - nested {depth} levels deep; at most {limit} are accepted")
        found = unstorable_path(data)
        if found is not None:
            where, why = found
            raise ApiError(_message(where, why), code=ErrorCode.INVALID, details={where: [why]})
        return data


# The API's own views refuse such a query themselves, once they know the caller and the object:
# another tenant's object is a 404 whatever its query holds (``tenants.api.StrictQueryMixin``).
# The same as ``core.openapi.API_PREFIX``, which this module cannot import: that one imports DRF's
# serializers, whose settings import this module.
API_PREFIX = "/api/v1/"


def unstorable_query(query: QueryDict) -> ApiError | None:
    """The ``400 invalid`` of the first query parameter whose name or a value holds what cannot be
    stored (a NUL character, a lone surrogate), naming it; None when there is none."""
    for name, values in query.lists():
        char = next(filter(None, map(unstorable_char, [name, *values])), None)
        if char is not None:
            why = unstorable_detail(char)
            return ApiError(_message(name, why), code=ErrorCode.INVALID, details={name: [why]})
    return None


class NulCharacterMiddleware:
    """Refuses a NUL character in the request's path (404), and what cannot be stored in a query
    parameter (400 naming it) of any page but the API's, whose views refuse it (``API_PREFIX``)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path:
            return json_404(request)
        if not request.path.startswith(API_PREFIX) and (refused := unstorable_query(request.GET)) is not None:
            body = error_body(ErrorCode.INVALID, str(refused.detail), refused.details)
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
