"""The OpenAPI schema's project-wide rules: tags, Markdown descriptions, typed JSON fields.

drf-spectacular builds the schema from the views; this module holds what holds for every
operation, in one place, so no view module has to repeat it:

- ``tag_operations`` (a postprocessing hook) gives every operation exactly one tag. A view
  whose permission classes include ``tenants.permissions.IsPlatformAdmin`` is a platform
  operation, tagged ``platform: <collection>``; any other is a tenant operation, tagged by
  its collection (``TENANT_TAGS`` groups some collections under one tag). The collection is
  the first segment of the path after ``/api/v1/`` (and after ``platform/``), so an
  endpoint added later is tagged without touching this module.
- ``AutoSchema`` (``DEFAULT_SCHEMA_CLASS``) gives every create, read, update, delete and list
  operation of a collection its summary (``List connections``, ``Delete a pool``: ``summary_for``);
  any other operation says its own, with ``extend_schema(summary=...)`` on its view.
- ``name_enums`` (a postprocessing hook) makes one set of enum values one component, wherever it
  is declared (a parameter's, an array's items, another component's copy).
- ``patch_bodies_without_defaults`` (a postprocessing hook): a partial update's fields declare no
  default, which a generated client would send for every field left out.
- ``type_path_ids`` (a postprocessing hook): an ``{id}`` that is a UUID primary key is a ``uuid``.
- ``render_descriptions`` (a postprocessing hook) turns the reStructuredText of docstrings
  into Markdown (``rst_to_markdown``), which Swagger UI and Redoc render.
- ``ComponentJSONField``: a ``JSONField`` whose schema is a named component (a workflow
  spec, a routing rule's ``match``), so a JSON field can be typed without a serializer.
- ``JSONValueField``: a ``JSONField`` that refuses null, typed so (drf-spectacular's ``{}`` takes null too).
- ``doc_excluded_bases`` (``GET_LIB_DOC_EXCLUDES``): the project's base serializers' own
  docstrings describe the base class, not each schema that inherits them.

This layer imports no app: the permission class and the base serializers are named by
their dotted path.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from typing import Any, ClassVar

from django.db import models
from django.utils.module_loading import import_string
from drf_spectacular.drainage import warn
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.plumbing import ResolvedComponent, get_lib_doc_excludes
from drf_spectacular.settings import spectacular_settings
from rest_framework import serializers

PLATFORM_PERMISSION = "tenants.permissions.IsPlatformAdmin"
API_PREFIX = "/api/v1/"
PLATFORM_SEGMENT = "platform"  # /api/v1/platform/queue: a platform view of the collection "queue"
PLATFORM_TAG_PREFIX = "platform: "
# Tenant collections that share a tag; any other collection is tagged by its own name.
TENANT_TAGS: Mapping[str, str] = {
    "api-keys": "tenant",
    "entitlements": "tenant",
    "connections": "routing",
    "pools": "routing",
    "rules": "routing",
    "events": "triggers",
    "triggers": "triggers",
    "schedules": "triggers",
    "webhooks": "triggers",
    "fairness-keys": "queue",
}
TAG_GROUPS = (("Tenant API", False), ("Platform API", True))  # x-tagGroups: name, holds platform tags
# Base serializers whose docstrings say how the base behaves: a schema that inherits one
# gets no description rather than the base's.
UNDOCUMENTED_BASES = ("tenants.api.StrictSerializer", "tenants.api.StrictModelSerializer")
_PATH_PARAMETER = re.compile(r"\{[^}]*\}")


# --- tags ------------------------------------------------------------------------------------


def collection_of(path: str) -> str:
    """The collection a path belongs to: ``runs`` for ``/api/v1/runs/{id}/events/``, ``queue`` for
    ``/api/v1/platform/queue/``; ``""`` for a path outside the API."""
    if not path.startswith(API_PREFIX):
        return ""
    segments = [segment for segment in path.removeprefix(API_PREFIX).split("/") if segment]
    if segments[:1] == [PLATFORM_SEGMENT] and len(segments) > 1:
        segments = segments[1:]
    return segments[0] if segments else ""


def tag_for(path: str, *, platform: bool) -> str:
    """The one tag of an operation on ``path``. Pure.

    Platform operations: ``platform: <collection>`` with dashes read as spaces
    (``/api/v1/task-catalog`` → ``platform: task catalog``); tenant operations: the
    collection's entry in ``TENANT_TAGS``, else the collection (``/api/v1/tasks`` → ``tasks``).
    """
    collection = collection_of(path) or "other"
    if platform:
        return PLATFORM_TAG_PREFIX + collection.replace("-", " ")
    return TENANT_TAGS.get(collection, collection)


def is_platform_view(permission_classes: Iterable[Any]) -> bool:
    """Whether any of ``permission_classes`` is ``PLATFORM_PERMISSION`` or a subclass of it."""
    return any(
        f"{base.__module__}.{base.__qualname__}" == PLATFORM_PERMISSION
        for permission in permission_classes
        for base in getattr(permission, "__mro__", ())
    )


def _path_key(path: str) -> str:
    # The generator renames path parameters ({pk} → {id}); their positions are what identify a route.
    return _PATH_PARAMETER.sub("{}", path.rstrip("/"))


def _platform_routes(generator: Any) -> dict[tuple[str, str], bool]:
    """(path key, method) → whether the view behind it is a platform view, for every route."""
    routes: dict[tuple[str, str], bool] = {}
    for path, _regex, method, callback in generator.endpoints or ():
        # An @action's own permission_classes travel in the callback's initkwargs.
        classes = callback.initkwargs.get("permission_classes", callback.cls.permission_classes)
        routes[_path_key(path), method.lower()] = is_platform_view(classes)
    return routes


def _operations(result: Mapping[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if isinstance(operation, dict) and "responses" in operation:
                yield path, method, operation


def tag_operations(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: every operation gets exactly one tag (``tag_for``).

    The schema's ``tags`` keeps the described tags (``SPECTACULAR_SETTINGS["TAGS"]``) that
    some operation uses, in their order, tenant tags first; ``x-tagGroups`` sorts them into
    the tenant API and the platform API (Redoc shows those groups). A tag that no entry
    describes is a warning, and so is an operation no route explains.
    """
    routes = _platform_routes(generator)
    used: dict[str, bool] = {}
    for path, method, operation in _operations(result):
        platform = routes.get((_path_key(path), method))
        if platform is None:
            warn(f"no view found for {method.upper()} {path}: it is tagged as a tenant operation")
        tag = tag_for(path, platform=bool(platform))
        operation["tags"] = [tag]
        used.setdefault(tag, tag.startswith(PLATFORM_TAG_PREFIX))
    described = {entry["name"]: entry for entry in result.get("tags", [])}
    for tag in used.keys() - described.keys():
        warn(f'the tag "{tag}" has no description: add it to SPECTACULAR_SETTINGS["TAGS"]')
    order = [*described, *sorted(used.keys() - described.keys())]
    tags = [tag for tag in order if tag in used]
    tags.sort(key=lambda tag: used[tag])  # stable: tenant tags first, each group in its order
    result["tags"] = [described.get(tag, {"name": tag}) for tag in tags]
    result["x-tagGroups"] = [
        {"name": name, "tags": [tag for tag in tags if used[tag] is platform]}
        for name, platform in TAG_GROUPS
        if any(used[tag] is platform for tag in tags)
    ]
    return result


# --- enums -----------------------------------------------------------------------------------

_ENUM_SHAPE = frozenset({"type", "enum", "minLength", "maxLength"})  # what an enum's own schema says


def _enum_key(schema: Mapping[str, Any]) -> frozenset[str] | None:
    values = schema.get("enum")
    if not isinstance(values, list) or not values or any(not isinstance(value, str) for value in values):
        return None
    return frozenset(values)


def _enum_names(result: Mapping[str, Any]) -> tuple[dict[frozenset[str], str], dict[str, str]]:
    """(each set of values → the one enum component named for it, each other enum component of that
    set → that one). The name kept is the one ``ENUM_NAME_OVERRIDES`` gives, else the shortest."""
    named = set(spectacular_settings.ENUM_NAME_OVERRIDES)
    by_values: dict[frozenset[str], list[str]] = {}
    for name, schema in result.get("components", {}).get("schemas", {}).items():
        key = _enum_key(schema)
        if key is not None:
            by_values.setdefault(key, []).append(name)
    kept = {key: min(names, key=lambda name: (name not in named, len(name), name)) for key, names in by_values.items()}
    merged = {name: kept[key] for key, names in by_values.items() for name in names if name != kept[key]}
    return kept, merged


def _use_enum_components(node: Any, kept: Mapping[frozenset[str], str], merged: Mapping[str, str]) -> Any:
    if isinstance(node, list):
        return [_use_enum_components(item, kept, merged) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.rsplit("/", 1)[-1] in merged:
        return {**node, "$ref": component_ref(merged[ref.rsplit("/", 1)[-1]])["$ref"]}
    key = _enum_key(node)
    if key is not None and key in kept:
        rest = {name: value for name, value in node.items() if name not in _ENUM_SHAPE}
        return {"allOf": [component_ref(kept[key])], **rest} if rest else component_ref(kept[key])
    return {name: _use_enum_components(value, kept, merged) for name, value in node.items()}


def name_enums(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook (after ``postprocess_schema_enums``): one set of values is
    one enum component, wherever it is used.

    Two enum components of the same values become one (``ENUM_NAME_OVERRIDES``' name, else the
    shorter), and an enum declared inline (a query or path parameter's, an array's items) whose
    values are a component's refers to it: a generated client has one class for run statuses, not
    one more for the run list's filter and another for a lineage's runs.
    """
    kept, merged = _enum_names(result)
    schemas = result.get("components", {}).get("schemas", {})
    for name in merged:
        del schemas[name]
    for name, schema in schemas.items():
        if _enum_key(schema) is None:
            schemas[name] = _use_enum_components(schema, kept, merged)
    result["paths"] = _use_enum_components(result.get("paths", {}), kept, merged)
    return result


# --- partial updates -------------------------------------------------------------------------


def _body_components(result: Mapping[str, Any], method: str) -> set[str]:
    """The names of the components that ``method``'s operations take as their body."""
    names = set()
    for _path, operation_method, operation in _operations(result):
        if operation_method != method:
            continue
        for media in operation.get("requestBody", {}).get("content", {}).values():
            ref = media.get("schema", {}).get("$ref", "")
            if ref:
                names.add(ref.rsplit("/", 1)[-1])
    return names


def patch_bodies_without_defaults(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: a ``PATCH`` body's fields declare no ``default``.

    A field a partial update leaves out keeps its value; it does not take the create's default. A
    generated client fills each field that declares a default with it, so a ``PATCH`` of one
    field of a schedule would also send ``paused: false`` and ``timezone: "UTC"``, resuming the
    schedule and moving it to UTC. A component that another method also takes is a warning.
    """
    schemas = result.get("components", {}).get("schemas", {})
    shared = _body_components(result, "patch") & (_body_components(result, "post") | _body_components(result, "put"))
    for name in sorted(shared):
        warn(f"the PATCH body {name} is also a POST or PUT body: its fields' defaults are kept")
    for name in _body_components(result, "patch") - shared:
        for field in schemas.get(name, {}).get("properties", {}).values():
            field.pop("default", None)
    return result


# --- path ids --------------------------------------------------------------------------------

PK_PARAMETER = "id"  # drf-spectacular names a view's {pk} so (SCHEMA_COERCE_PATH_PK)


def _uuid_keyed_routes(generator: Any) -> set[str]:
    """The path keys whose ``{pk}`` is the primary key of a model keyed by a UUID."""
    keyed = set()
    for path, _regex, _method, callback in generator.endpoints or ():
        model = getattr(getattr(callback.cls, "queryset", None), "model", None)
        if "{pk}" in path and model is not None and isinstance(model._meta.pk, models.UUIDField):
            keyed.add(_path_key(path))
    return keyed


def type_path_ids(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: an ``{id}`` that is a UUID primary key is declared a UUID.

    The views take any segment (``lookup_value_regex``) so that an id in another form is a ``404
    not_found`` in the error shape, and drf-spectacular then declares the segment's pattern, a
    string, so a generated client took any string for ``/runs/{id}``. It is the run's UUID.
    """
    keyed = _uuid_keyed_routes(generator)
    for path, _method, operation in _operations(result):
        if _path_key(path) not in keyed:
            continue
        for parameter in operation.get("parameters", []):
            if parameter.get("in") == "path" and parameter.get("name") == PK_PARAMETER:
                parameter["schema"] = {"type": "string", "format": "uuid"}
    return result


# --- summaries -------------------------------------------------------------------------------

# A collection's thing, where it is not the collection's name less its "s": (one, several).
NOUNS = {
    "api-keys": ("API key", "API keys"),
    "rules": ("routing rule", "routing rules"),
    "task-catalog": ("catalog entry", "catalog entries"),
    "triggers": ("event trigger", "event triggers"),
    "webhooks": ("webhook endpoint", "webhook endpoints"),
}
# A view's standard action → its summary, of the thing ("{one}", with its article) or things.
ACTION_SUMMARIES = {
    "list": "List {several}",
    "create": "Create {one}",
    "retrieve": "Get {one}",
    "update": "Replace {one}",
    "partial_update": "Update {one}",
    "destroy": "Delete {one}",
}


def summary_for(action: str, path: str) -> str | None:
    """The summary of a collection's standard ``action`` (``ACTION_SUMMARIES``) on ``path``, None
    for any other action. Pure: ``summary_for("destroy", "/api/v1/pools/{id}/")`` is ``Delete a
    pool``."""
    template = ACTION_SUMMARIES.get(action)
    collection = collection_of(path)
    if template is None or not collection:
        return None
    name = collection.replace("-", " ")
    one, several = NOUNS.get(collection, (name.removesuffix("s"), name))
    article = "an" if one[0].lower() in "aeiou" else "a"
    return template.format(one=f"{article} {one}", several=several)


class AutoSchema(SpectacularAutoSchema):
    """drf-spectacular's schema of a view, with a summary for each operation: the view's own
    (``extend_schema(summary=...)``), else its standard action's (``summary_for``)."""

    def get_summary(self) -> str | None:
        action = getattr(self.view, "action", None)
        return summary_for(action, self.path) if isinstance(action, str) else None


# --- descriptions ----------------------------------------------------------------------------

_ROLE = re.compile(r":(?:[A-Za-z][\w-]*:)?[A-Za-z][\w-]*:`([^`]+)`")
_LINK = re.compile(r"`([^`<]+?)\s*<([^`>]+)>`__?")
_LITERAL = re.compile(r"``(.+?)``")
_CODE_DIRECTIVE = re.compile(r"^\s*\.\.\s+(?:code-block|code|sourcecode)::\s*(\S*)\s*$")
_NOT_PROSE = frozenset({"example", "examples", "default", "enum"})


def _role(found: re.Match[str]) -> str:
    """``:class:`~a.B``` → `B`; ``:ref:`Title <target>``` → `Title`; ``:func:`a.b``` → `a.b`."""
    text = found.group(1)
    titled = re.fullmatch(r"(.+?)\s*<[^>]+>", text)
    if titled:
        text = titled.group(1)
    elif text.startswith("~"):
        text = text[1:].rsplit(".", 1)[-1]
    return f"`{text}`"


def _literal(found: re.Match[str]) -> str:
    text = found.group(1)
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _inline(line: str) -> str:
    return _LITERAL.sub(_literal, _LINK.sub(r"[\1](\2)", _ROLE.sub(_role, line)))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _indented_block(lines: list[str], start: int, base: int) -> tuple[list[str], int]:
    """The lines from ``start`` indented deeper than ``base`` (blank ones inside kept), dedented;
    and the index of the first line after them."""
    end = start
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > base):
        end += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    block = textwrap.dedent("\n".join(lines[start:end])).strip("\n")
    return (block.split("\n") if block else []), end


def _fence_end(lines: list[str], start: int) -> int:
    """The index after the Markdown fence opened at ``start`` (or the end of the text)."""
    for index in range(start + 1, len(lines)):
        if lines[index].lstrip().startswith("```"):
            return index + 1
    return len(lines)


def rst_to_markdown(text: str) -> str:
    """The reStructuredText of a docstring as Markdown. Pure; Markdown passes through unchanged.

    ````x```` → `` `x` ``; roles (``:class:`~a.B```, ``:func:`f```) → `` `B` ``, `` `f` ``;
    ```text <url>`_`` → ``[text](url)``; a paragraph ending in ``::`` and the indented block
    after it → the paragraph ending in ``:`` and a fenced code block, as does a
    ``.. code-block:: lang`` directive (with its language). Existing fences are kept as they are.
    """
    lines = text.split("\n")
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.lstrip().startswith("```"):
            end = _fence_end(lines, index)
            out.extend(lines[index:end])
            index = end
            continue
        directive = _CODE_DIRECTIVE.match(line)
        if not directive and not line.rstrip().endswith("::"):
            out.append(_inline(line))
            index += 1
            continue
        block, index = _indented_block(lines, index + 1, _indent(line))
        if directive:
            language = directive.group(1)
        else:
            language = ""
            lead = line.rstrip()[:-2]
            lead = lead.rstrip() if lead.endswith((" ", "\t")) or not lead.strip() else lead + ":"
            if lead.strip():
                out.append(_inline(lead))
        if block:
            if out and out[-1].strip():
                out.append("")
            out.extend([" " * _indent(line) + "```" + language, *block, " " * _indent(line) + "```"])
            if index < len(lines) and lines[index].strip():
                out.append("")
    return "\n".join(out)


def _render(node: Any) -> None:
    """Every ``description`` of the schema, converted in place (examples and defaults are data, not prose)."""
    if isinstance(node, list):
        for item in node:
            _render(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                node[key] = rst_to_markdown(value)
            elif key not in _NOT_PROSE:
                _render(value)


def render_descriptions(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: every description in Markdown (``rst_to_markdown``)."""
    _render(result)
    return result


@cache
def doc_excluded_bases() -> list[type]:
    """drf-spectacular's ``GET_LIB_DOC_EXCLUDES``: its own list, and ``UNDOCUMENTED_BASES``."""
    return [*get_lib_doc_excludes(), *(import_string(name) for name in UNDOCUMENTED_BASES)]


# --- JSON fields with a schema ---------------------------------------------------------------


class ComponentJSONField(serializers.JSONField):
    """A ``JSONField`` (it parses and renders exactly like one) whose OpenAPI schema is the
    component named ``component``."""

    component: ClassVar[str] = ""

    @classmethod
    def components(cls) -> Mapping[str, dict[str, Any]]:
        """The component ``component`` and every component it refers to, by name."""
        raise NotImplementedError


def component_ref(name: str) -> dict[str, str]:
    """A ``$ref`` to the schema component ``name``."""
    return {"$ref": f"#/components/{ResolvedComponent.SCHEMA}/{name}"}


class ComponentJSONFieldSchema(OpenApiSerializerFieldExtension):
    """Registers a ``ComponentJSONField``'s components (once per schema); the field is a ``$ref``."""

    target_class = ComponentJSONField
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        field = type(self.target)
        for name, schema in field.components().items():
            auto_schema.registry.register_on_missing(
                ResolvedComponent(name=name, type=ResolvedComponent.SCHEMA, object=name, schema=schema)
            )
        return component_ref(field.component)


class JSONValueField(ComponentJSONField):
    """A ``JSONField`` that refuses null (DRF's "may not be null"): its schema is ``JSONValue``, any JSON
    value but null, where drf-spectacular's ``{}`` reads as taking null too."""

    component = "JSONValue"

    @classmethod
    def components(cls) -> dict[str, dict[str, Any]]:
        return {cls.component: {
            "description": "Any JSON value but null.",
            "anyOf": [{"type": "object", "additionalProperties": True}, {"type": "array", "items": {}},
                      {"type": "string"}, {"type": "number"}, {"type": "boolean"}],
        }}
