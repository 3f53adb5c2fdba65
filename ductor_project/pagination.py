"""API pagination: stable cursor pages, newest first, ties broken by id.

``page_size`` and ``cursor`` are checked on every list alike: a ``page_size``
that is not a whole number from 1 to ``max_page_size`` in ASCII digits (no sign,
space or other script's digit), or a cursor that is
not one this API handed out, is ``400 invalid`` naming the parameter.

A cursor is DRF's position, offset and direction, signed (Django's signing,
with the ``SECRET_KEY``): its position goes into the list's query as it is, so
one made up by a client (a date that is no date, a NUL) must not get there.
A cursor from before a change of ``SECRET_KEY`` is refused like a made-up one, and
so is one from another list: the signature covers the list's path, as each list
reads a position of its own kind (a time, a name, a priority).
"""

from typing import Any

from django.core import signing
from rest_framework import pagination
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.utils.urls import replace_query_param

_SALT = "ductor.pagination.cursor"
_NOT_OURS = "Not a cursor of this list: use the next or previous link."


class CursorPagination(pagination.CursorPagination):
    ordering = ("-created_at", "-id")
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int | None:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return super().get_page_size(request)
        # ASCII digits only: str.isdigit also takes other scripts' digits (U+0665, which int() reads as
        # 5) and superscripts (U+00B2, which it cannot read); and no more digits than a page size has.
        size = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 9 else 0
        if not 1 <= size <= self.max_page_size:
            raise ValidationError({"page_size": [f"A whole number from 1 to {self.max_page_size}."]})
        return size

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        """DRF's, with the page size's bounds and the cursor's minimum length (a blank one is no cursor
        of any list): what the schema allows, the server takes."""
        parameters: list[dict[str, Any]] = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {**parameter["schema"], "minimum": 1, "maximum": self.max_page_size}
            if parameter["name"] == self.cursor_query_param:
                parameter["schema"] = {**parameter["schema"], "minLength": 1}
        return parameters

    def _salt(self, request: Request) -> str:
        return f"{_SALT}:{request.path.rstrip('/')}"  # with or without its slash, one list

    def encode_cursor(self, cursor: pagination.Cursor) -> str:
        request: Request = self.request  # type: ignore[attr-defined]  # set by DRF's paginate_queryset
        signed = signing.dumps([cursor.offset, cursor.reverse, cursor.position], salt=self._salt(request))
        return str(replace_query_param(str(self.base_url), self.cursor_query_param, signed))

    def decode_cursor(self, request: Request) -> pagination.Cursor | None:
        signed = request.query_params.get(self.cursor_query_param)
        if signed is None:
            return None
        try:
            offset, reverse, position = signing.loads(signed, salt=self._salt(request))
        except (signing.BadSignature, TypeError, ValueError) as exc:
            raise ValidationError({"cursor": [_NOT_OURS]}) from exc
        if not isinstance(offset, int) or offset < 0 or offset > self.offset_cutoff:
            raise ValidationError({"cursor": [_NOT_OURS]})
        return pagination.Cursor(offset=offset, reverse=bool(reverse), position=position)
