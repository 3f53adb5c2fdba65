"""The query parameters an API endpoint takes, and the refusal of any other.

An operation takes exactly the query parameters its OpenAPI operation lists: what
drf-spectacular derives from its view (``extend_schema(parameters=...)``, a filter
serializer among them, and the pagination class's ``cursor`` and ``page_size`` where
the operation answers a page). They are derived here the way the schema generator
derives them, once per operation and process, so the schema and the server cannot
disagree, and an endpoint added later refuses what it does not declare with no list
to keep. Any other parameter is ``400 unknown_field`` naming it, as a body's unknown
field is. A parameter of one value given twice (``?status=running&status=failed``) is ``400
invalid`` naming it, as a body's key given twice is refused: only one the schema declares a list
(``tag``) repeats.

``format`` is no parameter of the API: the renderer is chosen by the ``Accept``
header alone (``AcceptHeaderNegotiation``), so ``?format=`` is refused like any
other name an operation does not list.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

from django.http import QueryDict
from drf_spectacular.generators import EndpointEnumerator, SchemaGenerator
from drf_spectacular.settings import spectacular_settings
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.settings import APISettings
from rest_framework.views import APIView

from ductor_project.core.errors import ApiError, ErrorCode, UnknownFields

# An operation's route: the view class, its viewset action (None for a plain view) and the method.
Route = tuple[type, str | None, str]


class AcceptHeaderNegotiation(DefaultContentNegotiation):
    """DRF's content negotiation by the ``Accept`` header alone: ``?format=`` picks no renderer."""

    # DRF's defaults, read for this one setting only (the typed stubs know no partial settings).
    settings = APISettings(cast(Any, {"URL_FORMAT_OVERRIDE": None}))  # type: ignore[assignment]


def _route(callback: Callable[..., Any], method: str) -> Route:
    actions: dict[str, str] | None = getattr(callback, "actions", None)
    return callback.cls, (actions or {}).get(method.lower()), method.upper()  # type: ignore[attr-defined]


@functools.cache
def _endpoints() -> dict[Route, tuple[str, str, Callable[..., Any]]]:
    """Every operation of the URL configuration, by route: its path, path regex and callback."""
    found: dict[Route, tuple[str, str, Callable[..., Any]]] = {}
    for path, path_regex, method, callback in EndpointEnumerator().get_api_endpoints():
        found.setdefault(_route(callback, method), (path, path_regex, callback))
    return found


@functools.cache
def operation_query_parameters(route: Route) -> dict[str, bool] | None:
    """The names of the query parameters the operation at ``route`` lists in the OpenAPI schema,
    each with whether the schema declares it a list (which a query may repeat: ``?tag=a&tag=b``),
    made as ``SchemaGenerator.parse`` makes its operation; None for a route the schema has no
    operation for (a method the endpoint does not serve: its answer is ``405``). Cached: one
    operation is built once per process."""
    endpoint = _endpoints().get(route)
    if endpoint is None:
        return None
    path, path_regex, callback = endpoint
    method = route[2]
    generator = SchemaGenerator()
    view = generator.create_view(callback, method)
    path = generator.coerce_path(path, method, view)
    view.request = spectacular_settings.GET_MOCK_REQUEST(method, path, view, None)
    prefix = spectacular_settings.SCHEMA_PATH_PREFIX or ""
    prefix = prefix if prefix.startswith("^") else "^" + prefix
    operation = view.schema.get_operation(path, path_regex, prefix, method, generator.registry)
    if not operation:
        return None
    return {p["name"]: p.get("schema", {}).get("type") == "array"
            for p in operation.get("parameters", []) if p["in"] == "query"}


def refuse_unknown_query_parameters(view: APIView, *, first: Callable[[APIView], None] | None = None) -> None:
    """``400 unknown_field`` naming each query parameter of the view's request that its operation
    does not list (``operation_query_parameters``), then ``400 invalid`` naming each one it lists
    as one value that the query gives more than once; HEAD takes what GET takes. A view outside
    the URL configuration, or a method it does not serve, is left to answer as it does. ``first``
    runs before such a refusal: a tenant's view answers another tenant's object ``404``, whatever
    else the request holds (``permissions.refuse_unseen_object``)."""
    request = view.request
    method = "GET" if request.method == "HEAD" else str(request.method)
    taken = operation_query_parameters((type(view), getattr(view, "action", None), method))
    if taken is None:
        return
    unknown = [name for name in request.query_params if name not in taken]
    if unknown:
        if first is not None:
            first(view)
        raise UnknownFields(unknown)
    _refuse_repeated(request.query_params, taken, view=view, first=first)


def _refuse_repeated(
    query: QueryDict, taken: dict[str, bool], *, view: APIView, first: Callable[[APIView], None] | None
) -> None:
    """``400 invalid`` naming each parameter of one value (not a list of ``taken``) that ``query``
    gives more than once: which one was meant? (A view would read the last one and drop the others.)"""
    repeated = {name: len(values) for name, values in query.lists() if len(values) > 1 and not taken.get(name)}
    if repeated:
        if first is not None:
            first(view)
        raise ApiError(f"Invalid field(s): {', '.join(repeated)}. Give each once.", code=ErrorCode.INVALID,
                       details={name: [f"Given {count} times; give it once."] for name, count in repeated.items()})
