"""Base classes of every Ductor API view.

``TenantAPIView`` authenticates, enters the request's tenant context for the
whole request (permissions, throttles, the view body, serialization) and
resets it afterwards. ``StrictSerializer`` refuses unknown fields, naming them.
``StrictQueryMixin``, in every base view, refuses a query parameter the operation does
not take (``tenants.query_params``) and answers every error in JSON.

OPTIONS answers ``405``, and no ``Allow`` header offers it: DRF's metadata would describe a
detail endpoint even for an id of another tenant, and every verb on such an id must answer 404
or 405. The schema (``/api/schema/``) describes every operation.
"""

from __future__ import annotations

import copy
import json
import unicodedata
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from typing import Any, TypeVar

from django.http import HttpRequest, QueryDict
from django.http.response import HttpResponseBase
from django.utils.cache import patch_cache_control
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers, viewsets
from rest_framework.fields import empty
from rest_framework.metadata import BaseMetadata
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ductor_project.core.context import tenant_context
from ductor_project.core.errors import UnknownFields, unknown_field_detail
from ductor_project.core.ids import canonical_uuid
from ductor_project.core.times import rfc3339
from ductor_project.logs import mark_request_tenant
from ductor_project.parsers import unstorable_query
from tenants.permissions import IsPlatformAdmin, refuse_unseen_object, request_tenant
from tenants.query_params import AcceptHeaderNegotiation, refuse_unknown_query_parameters

# Every method but OPTIONS (see the module docs).
HTTP_METHODS = ["get", "post", "put", "patch", "delete", "head"]


class StrictQueryMixin:
    """Refuses a query parameter the operation does not take (``400 unknown_field``, naming it), or
    one that holds what cannot be stored (``400 invalid``), once the caller is authenticated,
    allowed and not throttled, and another tenant's object is a 404 whatever its query holds,
    before the view does anything; and
    answers every error in the one JSON error shape, whatever renderer the request asked for
    (the browsable API's HTML is for what succeeds). ``?format=`` picks no renderer."""

    content_negotiation_class: type[BaseContentNegotiation] = AcceptHeaderNegotiation
    # A tenant's view: another tenant's object is a 404 before a query parameter is refused.
    hides_foreign_objects: bool = False

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        first = refuse_unseen_object if self.hides_foreign_objects else None
        if (refused := unstorable_query(request.query_params)) is not None:  # a NUL, a lone surrogate
            if first is not None:
                first(self)
            raise refused
        refuse_unknown_query_parameters(self, first=first)  # type: ignore[arg-type]

    def finalize_response(self, request: Request, response: Response, *args: Any, **kwargs: Any) -> Response:
        """Every answer says ``Cache-Control: no-store, private``: it is one tenant's (or the
        platform's), and some carry a secret shown once (a new API key, a webhook's signing
        secret), which no cache, a browser's included, may keep."""
        finalized: Response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]
        patch_cache_control(finalized, no_store=True, private=True)
        return finalized

    def handle_exception(self, exc: Exception) -> Response:
        response: Response = super().handle_exception(exc)  # type: ignore[misc]
        request = self.request  # type: ignore[attr-defined]
        request.accepted_renderer, request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
        return response


class TenantScopeMixin:
    """Enter the tenant context as soon as the request is authenticated."""

    metadata_class: str | type[BaseMetadata] | None = None
    http_method_names: Sequence[str] = HTTP_METHODS
    hides_foreign_objects = True  # StrictQueryMixin: another tenant's object is a 404 first
    _tenant_scope: ExitStack

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        with ExitStack() as scope:
            self._tenant_scope = scope
            return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]

    def perform_authentication(self, request: Request) -> None:
        super().perform_authentication(request)  # type: ignore[misc]
        tenant = request_tenant(request)
        if tenant is None:
            return
        # Django logs a 4xx or a 5xx, and the web server its access line, once this context has
        # ended: their lines name the tenant still, a suspended tenant's refusal (`tenant_suspended`)
        # included.
        mark_request_tenant(request._request, tenant)
        if tenant.is_active:
            self._tenant_scope.enter_context(tenant_context(tenant))


class TenantAPIView(TenantScopeMixin, StrictQueryMixin, APIView):
    pass


class TenantViewSet(TenantScopeMixin, StrictQueryMixin, viewsets.GenericViewSet):
    lookup_value_regex = "[^/]+"


class PlatformAPIView(StrictQueryMixin, APIView):
    """A platform-admin endpoint: superusers and platform keys only; 404 for anyone else."""

    permission_classes = [IsPlatformAdmin]
    metadata_class = None
    http_method_names = HTTP_METHODS


class PlatformViewSet(StrictQueryMixin, viewsets.GenericViewSet):
    """Platform-admin endpoints: superusers and platform keys only; 404 for anyone else."""

    permission_classes = [IsPlatformAdmin]
    lookup_value_regex = "[^/]+"
    metadata_class = None
    http_method_names = HTTP_METHODS


# Unicode categories no name or short text may hold: control characters, format characters
# (zero-width and bidirectional overrides, which hide or reorder what a reader sees), surrogates
# and private use.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co"})


def refuse_control_characters(value: str, *, allowed: str = "") -> str:
    """``value``, or a ``ValidationError`` naming the first control or invisible character in it
    (``allowed`` lists the ones a longer text may keep, such as a newline)."""
    for char in value:
        if char not in allowed and unicodedata.category(char) in _REFUSED_CATEGORIES:
            raise serializers.ValidationError(f"Must not contain control or invisible characters (U+{ord(char):04X}).")
    return value


class NameField(serializers.CharField):
    """A name: printable characters only (no newline, tab, zero-width or bidirectional mark)."""

    def to_internal_value(self, data: Any) -> str:
        return refuse_control_characters(super().to_internal_value(data))


class CanonicalUUIDField(serializers.UUIDField):
    """A UUID sent in a body or a query, in the canonical text form only
    (``ductor_project.core.ids``): DRF's would also take ``{…}``, ``urn:uuid:…`` and the digits
    without hyphens, which a path id of the same row is not found as."""

    def to_internal_value(self, data: Any) -> Any:
        found = canonical_uuid(data)
        if found is None:
            self.fail("invalid", value=data)
        return found


class DateTimeField(serializers.DateTimeField):
    """A time in a body or a query, as RFC 3339 writes it (the schema's ``date-time``), its ``Z`` in
    either case (``ductor_project.core.times``): DRF's refuses ``…T00:00:00z``."""

    def to_internal_value(self, value: Any) -> Any:
        return super().to_internal_value(rfc3339(value) if isinstance(value, str) else value)


class PatternField(serializers.RegexField):
    """A ``RegexField`` whose refusal says what the value may hold (``rule``, also its help text),
    where DRF's says only that it "does not match the required pattern"."""

    def __init__(self, regex: Any, *, rule: str, **kwargs: Any) -> None:
        kwargs.setdefault("help_text", rule)
        kwargs["error_messages"] = {"invalid": f"Invalid value. Allowed: {rule}", **kwargs.get("error_messages", {})}
        super().__init__(regex, **kwargs)


class AnyJSONField(serializers.JSONField):
    """Any JSON value; ``null`` is taken as leaving the field out (its default, such as ``{}``), so the
    schema's "any JSON" holds for null too."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("allow_null", True)
        super().__init__(**kwargs)

    def validate_empty_values(self, data: Any) -> tuple[bool, Any]:
        if data is None:
            return True, self.get_default()
        return super().validate_empty_values(data)


def named_string(name: str, *, max_length: int) -> type[serializers.CharField]:
    """A ``CharField`` of 1 to ``max_length`` characters that the schema declares as a component of
    its own, ``name``. For a list's items: a client generator (datamodel-code-generator) names
    inline items with bounds after their list, singular (``plans`` -> ``Plan``), and so took the
    name of the API's own model, which became ``Plan1``."""

    @extend_schema_field({"type": "string", "minLength": 1, "maxLength": max_length}, component_name=name)
    class Named(serializers.CharField):
        # Blank refused here, not by allow_blank: with it, the schema would wrap the component's
        # reference in an allOf beside a minLength of its own, which a generator names again.
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(max_length=max_length, allow_blank=True, **kwargs)

        def run_validation(self, data: Any = empty) -> Any:
            if data == "" or (self.trim_whitespace and isinstance(data, str) and not data.strip()):
                self.fail("blank")
            return super().run_validation(data)

    Named.__name__ = Named.__qualname__ = f"{name}Field"
    return Named


class TextField(serializers.CharField):
    """A short text (a description, a reason): printable characters, newlines and tabs."""

    def to_internal_value(self, data: Any) -> str:
        return refuse_control_characters(super().to_internal_value(data), allowed="\n\t")


# The JSON type a field of a body takes, by field class (the first that matches): DRF would also
# take "5" for 5, 1 for true or 3 for "3", where a JSON API refuses the wrong type, naming the field.
_JSON_TYPES: tuple[tuple[type[serializers.Field], str, Any], ...] = (
    (serializers.BooleanField, "a boolean", lambda v: isinstance(v, bool)),
    (serializers.IntegerField, "a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    (serializers.FloatField, "a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    (serializers.DecimalField, "a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    (serializers.CharField, "a string", lambda v: isinstance(v, str)),
    (serializers.ChoiceField, "a string", lambda v: isinstance(v, str)),  # every choice of the API is one
    (serializers.UUIDField, "a string", lambda v: isinstance(v, str)),
    (serializers.DateTimeField, "a string", lambda v: isinstance(v, str)),
    (serializers.ListField, "a list", lambda v: isinstance(v, list)),
    (serializers.DictField, "an object", lambda v: isinstance(v, dict)),
)


def _type_errors(field: serializers.Field, value: Any) -> Any:
    """Why ``value`` is not of the JSON type ``field`` takes, as DRF words a field's errors (a list of
    messages; for a list's items, ``{index: messages}``), or None. Null is the field's to judge."""
    if value is None:
        return None
    for kind, name, fits in _JSON_TYPES:
        if isinstance(field, kind):
            if not fits(value):
                return [f"Must be {name}, not {json.dumps(value)[:40]}."]
            if isinstance(field, serializers.ListField):  # and each item of the type its child takes
                items = {i: errors for i, item in enumerate(value) if (errors := _type_errors(field.child, item))}
                return items or None
            return None
    return None


def fresh_fields(prototypes: Mapping[str, serializers.Field]) -> dict[str, serializers.Field]:
    """The fields of one serializer instance, made from its class's unbound ones. DRF deep-copies
    each, and ``Field.__deepcopy__`` builds the field again from its arguments: a fifth of the CPU
    of a run's start through the API went there. A field keeps nothing of the data it judges or
    renders, so a shallow copy serves, bound afresh by the serializer (``bind`` sets its name,
    parent, label and source on the copy alone). A nested serializer, or a related field with a
    queryset to look rows up in, is deep-copied as DRF does."""
    return {name: _fresh(field) for name, field in prototypes.items()}


def _fresh(field: serializers.Field) -> serializers.Field:
    if _deep(field):
        return copy.deepcopy(field)
    clone = object.__new__(type(field))  # as ``copy.copy`` makes it, at a third of its cost
    clone.__dict__.update(field.__dict__)
    child = getattr(field, "child", None)  # a list's or a dict's items, bound to it when it was made
    if child is not None:
        clone.child = _fresh(child)  # type: ignore[attr-defined]
        clone.child.parent = clone  # type: ignore[attr-defined]
    return clone


def _deep(field: serializers.Field) -> bool:
    """Whether ``field``, or its items' field, is one to deep-copy (``fresh_fields``): one whose
    default is a list, a dict or a set too, which a shallow copy would hand every request alike."""
    if (isinstance(field, serializers.BaseSerializer | serializers.ManyRelatedField)
            or getattr(field, "queryset", None) is not None
            or isinstance(getattr(field, "default", None), list | dict | set)):
        return True
    child = getattr(field, "child", None)
    return child is not None and (not isinstance(child, serializers.Field) or _deep(child))


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not declare (``400 unknown_field``), naming them, and, in a JSON body,
    a value of the wrong JSON type (``400 invalid`` naming the field: ``"5"`` is not a number, ``1``
    not a boolean). A serializer of a query string (``typed = False``), whose values are all
    strings, leaves them to its fields to convert; given the ``QueryDict`` itself (a parameter that
    repeats), it refuses an empty value of a field that takes no blank (``?status=``), which DRF
    would take as the field left out: a filter given empty is not no filter."""

    typed = True

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            writable = {name: field for name, field in self.fields.items() if not field.read_only}
            unknown = [str(key) for key in data if key not in writable]
            if unknown and self.parent is not None:  # nested (an item of a list): named by its path
                raise serializers.ValidationError({name: [unknown_field_detail()] for name in sorted(unknown)})
            if unknown:
                raise UnknownFields(unknown)
            if isinstance(data, QueryDict):  # which DRF reads as HTML form data: an empty value as left out
                blank = [name for name, values in data.lists()
                         if "" in values and not getattr(writable[name], "allow_blank", False)]
                if blank:
                    raise serializers.ValidationError({name: ["This field may not be blank."] for name in blank})
            if self.typed and not isinstance(data, QueryDict):
                wrong = {name: errors for name, value in data.items()
                         if (errors := _type_errors(writable[name], value))}
                if wrong:
                    raise serializers.ValidationError(wrong)
        return super().to_internal_value(data)

    def get_fields(self) -> dict[str, serializers.Field]:
        return fresh_fields(self._declared_fields)


T = TypeVar("T")


class _NoBody(StrictSerializer):
    """The body of an action that takes none: every field is unknown."""


def no_body(request: Any, *, found: T) -> T:
    """``found``, the object the action is for (looked up first: another tenant's is a 404 whatever
    the body), once the request is checked to carry no body (``POST /runs/{id}/cancel``): each field
    of one is ``400 unknown_field``, as on any other endpoint, and anything but an object is ``400
    invalid``, an empty one too (``[]``, ``null``, ``""``, ``0``, ``false``). An empty object, ``{}``
    or no body at all, is what the action takes."""
    data = request.data
    if not (isinstance(data, Mapping) and not data):
        _NoBody(data=data).is_valid(raise_exception=True)
    return found


class StrictSerializerSchema(OpenApiSerializerExtension):
    """In the OpenAPI schema, a strict serializer's request body declares ``additionalProperties:
    false``: the field it does not declare is refused (``400 unknown_field``), and a client
    generated from the schema should not offer to send one."""

    target_class = StrictSerializer
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: str) -> Any:
        schema = auto_schema._map_basic_serializer(self.target, direction)
        if direction == "request" and self.target.typed:  # a query string's is no body
            schema["additionalProperties"] = False
        return schema


class StrictModelSerializer(StrictSerializer, serializers.ModelSerializer):
    """A model serializer that refuses undeclared fields. One whose every field is read-only (a
    response's) builds its fields from the model once per class and copies them for each
    instance, as DRF copies declared fields: building them is most of a response's CPU. A
    serializer with a writable field builds them each time, as DRF does, so that what judges
    its input (a related field's queryset, its validators) is never one made for another
    request."""

    _read_only_fields: dict[type, dict[str, serializers.Field]] = {}

    def get_fields(self) -> dict[str, serializers.Field]:
        built = StrictModelSerializer._read_only_fields.get(type(self))
        if built is None:
            fields = serializers.ModelSerializer.get_fields(self)
            if not all(field.read_only for field in fields.values()):
                return fields
            built = StrictModelSerializer._read_only_fields[type(self)] = fields
        return fresh_fields(built)
