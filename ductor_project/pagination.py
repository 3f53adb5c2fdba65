"""API pagination: stable cursor pages, newest first, ties broken by id.

``page_size`` and ``cursor`` are checked on every list alike: a ``page_size``
that is not a whole number from 1 to ``max_page_size``, or a cursor that is
not one this API handed out, is ``400 invalid`` naming the parameter.
"""

from typing import Any

from rest_framework import pagination
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request


class CursorPagination(pagination.CursorPagination):
    ordering = ("-created_at", "-id")
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int | None:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return super().get_page_size(request)
        size = int(raw) if raw.isdigit() else 0
        if not 1 <= size <= self.max_page_size:
            raise ValidationError({"page_size": [f"A whole number from 1 to {self.max_page_size}."]})
        return size

    def decode_cursor(self, request: Request) -> Any:
        try:
            return super().decode_cursor(request)
        except NotFound as exc:
            raise ValidationError({"cursor": ["Not a cursor of this list: use the next or previous link."]}) from exc
