"""What the admin's lists of the big tables (runs, steps, run events, events, deliveries) read.

Each page of such a list reads its rows and nothing that grows with the table: its count stops at
``COUNT_CAP`` rows, and its filters offer a fixed set of values (the node types, the event types, the
tenant's workflows) instead of reading every distinct value of a column of the table, with no index
to serve it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cached_property
from typing import Any, ClassVar

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest

COUNT_CAP = 10_000


class BoundedCountPaginator(Paginator):
    """A paginator whose count reads at most ``COUNT_CAP + 1`` rows: a list shows at most that many."""

    @cached_property
    def count(self) -> int:
        return int(self.object_list.order_by()[: COUNT_CAP + 1].count())  # type: ignore[attr-defined]


def choices_filter(
    field: str, title: str, choices: Callable[[HttpRequest], Iterable[str]]
) -> type[admin.SimpleListFilter]:
    """A list filter on ``field`` offering ``choices(request)``: read from somewhere small, never from
    the listed table."""

    class ChoicesFilter(admin.SimpleListFilter):
        parameter_name = field

        def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
            return [(value, value) for value in choices(request)]

        def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
            value = self.value()
            return queryset.filter(**{field: value}) if value else queryset

    ChoicesFilter.title = title
    ChoicesFilter.__name__ = f"{field.title().replace('_', '')}Filter"
    return ChoicesFilter


class BigTableListMixin:
    """A list of a big table: its count is bounded, and no second count of the whole table is shown,
    nor a count of each filter's values (facets: one more count of the table, even asked for in the URL)."""

    paginator: ClassVar[type] = BoundedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
