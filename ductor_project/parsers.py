"""The API's request parser: JSON, refused past a nesting depth instead of crashing on it.

Python's JSON decoder recurses per level, so a 2 KB body nested a thousand times
deep would raise ``RecursionError`` (a 500) in the parser, or later in whatever
walks the value. Every body is decoded here and refused with
``400 malformed_json`` when it is nested deeper than ``DUCTOR_MAX_JSON_DEPTH``
(the check walks the value iteratively). A string or key that holds a NUL
character (``\\u0000``), which PostgreSQL's ``jsonb`` cannot store, is
``400 invalid`` naming where it is (``input.name``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from ductor_project.core.errors import ApiError, ErrorCode
from ductor_project.core.payloads import json_depth, nul_path


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
            raise ApiError(f"Invalid field(s): {where}. It holds a NUL character (\\u0000), which cannot be stored.",
                           code=ErrorCode.INVALID, details={where: ["A NUL character (\\u0000) cannot be stored."]})
        return data
