"""Templates and conditions: the one language of routing rules, partition keys and node inputs.

A template is any JSON value. Only strings are special; dict keys, numbers,
booleans and null are copied as they are. A **reference** names a value of the
context it is rendered in (a small regex grammar, never ``eval``):
``$<root>`` or ``$<root>.<path>``, path segments being letters, digits, ``_``
and ``-`` (a digit segment indexes a list). The roots depend on where the
template is used (a ``Language``):

- ``ROUTING`` (rule conditions, partition keys): ``$input…`` (the step's input),
  ``$workflow``, ``$action``;
- ``NODES`` (node inputs, the run's output, ``when``): ``$input…`` (the run's
  input), ``$nodes.<id>.output…``, ``$nodes.<id>.status``, ``$run.id``,
  ``$run.root_id``.

Rendering a string:

- a string that is exactly a reference is replaced by the referenced JSON value
  (any type); a missing path renders as ``null``;
- ``{{ <reference> }}`` inside a string interpolates the value: strings as they
  are, numbers with ``str()``, and dicts, lists, booleans and null as compact
  JSON (``true``, not ``True``); a missing path interpolates as ``""``;
- ``$$`` at the start of a string escapes a literal ``$`` (``"$$5"`` renders
  ``"$5"``); the rest of the string is still interpolated;
- any other string starting with ``$`` is a malformed reference and is
  rejected by validation, as is a ``{{ … }}`` that does not hold a reference.

A **condition** is ``{"path", "op", "value"}`` (or ``{"all": [...]}`` /
``{"any": [...]}`` of them), its path a reference without its ``$``
(``input.customer.tier``, ``nodes.fetch.output.code``). Operators: ``eq``,
``ne``, ``in``, ``exists``, ``prefix``, ``gt``, ``lt``.

**Deprecated forms**, still accepted from clients and stored in the form above
(the migration ``scheduling.0002`` rewrote the stored rules):

- a partition key with single-brace placeholders, ``"c-{input.customer}"``,
  ``{workflow}``, ``{action}``: read as ``"c-{{ $input.customer }}"`` and so on;
- a rule condition whose path starts with a field of the step input rather
  than a root (``"customer.tier"``): read as ``"input.customer.tier"``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ductor_project.core.bounds import MAX_KEY_CHARS
from ductor_project.core.payloads import json_equal

NODE_ID = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
OPERATORS = ("eq", "ne", "in", "exists", "prefix", "gt", "lt")
MAX_CONDITIONS = 20
MAX_PATH_SEGMENTS = 11
# A condition's path, each string its value holds (the value itself, an item of an ``in`` list, a
# key or an item of an object or list it compares with), the items of an ``in`` list, and the whole
# value as compact JSON.
MAX_PATH_CHARS = MAX_KEY_CHARS
MAX_VALUE_CHARS = MAX_KEY_CHARS
MAX_IN_VALUES = 100
MAX_VALUE_JSON_CHARS = 32 * 1024
_REFERENCE = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)((?:\.[A-Za-z0-9_\-]+)*)$")
_SEGMENT = re.compile(r"^[A-Za-z0-9_\-]+$")
_MISSING = object()


class FieldError(ValueError):
    """A template or condition of a field is invalid; ``field`` is its dotted name."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class TemplateError(ValueError):
    """A malformed reference."""


# What follows a root, checked: the parts after it, how to name them in messages; the problem, or None.
Shape = Callable[[tuple[str, ...]], str | None]


@dataclass(frozen=True)
class Root:
    """A name a reference may start with, and what may follow it (``shape``; None: any path)."""

    name: str
    shape: Shape | None = None
    usage: str = ""  # how to write it, for messages: "$run.id or $run.root_id"


@dataclass(frozen=True)
class Language:
    """The roots a context offers, and a path of it to show in messages."""

    roots: tuple[Root, ...]
    example: str = "input.customer.id"

    def root(self, name: str) -> Root | None:
        return next((root for root in self.roots if root.name == name), None)

    @property
    def hint(self) -> str:
        """``use $input…, $nodes.<id>.output… or $run.id``: how references of this language read."""
        forms = [root.usage or f"${root.name}…" for root in self.roots]
        return "use " + (", ".join(forms[:-1]) + " or " + forms[-1] if len(forms) > 1 else forms[0])

    @property
    def path_hint(self) -> str:
        """``'input.', 'nodes.<id>.' or 'run.'``: what a condition's path may start with."""
        starts = [f"'{root.name}.'" if root.name != "nodes" else "'nodes.<id>.'" for root in self.roots]
        return ", ".join(starts[:-1]) + " or " + starts[-1] if len(starts) > 1 else starts[0]


def _node_shape(parts: tuple[str, ...]) -> str | None:
    if len(parts) < 2 or not NODE_ID.fullmatch(parts[0]) or parts[1] not in ("output", "status") or (
        parts[1] == "status" and len(parts) > 2
    ):
        return "use $nodes.<id>.output… or $nodes.<id>.status"
    return None


def _one_of(*leaves: str) -> Shape:
    def shape(parts: tuple[str, ...]) -> str | None:
        if len(parts) != 1 or parts[0] not in leaves:
            return "use " + " or ".join(leaves)
        return None

    return shape


def _bare(name: str) -> Shape:
    def shape(parts: tuple[str, ...]) -> str | None:
        return f"use ${name}" if parts else None

    return shape


def _run_shape(parts: tuple[str, ...]) -> str | None:
    problem = _one_of("id", "root_id")(parts)
    return "use $run.id or $run.root_id" if problem else None


ROUTING = Language((
    Root("input"),
    Root("workflow", _bare("workflow"), "$workflow"),
    Root("action", _bare("action"), "$action"),
))
NODES = Language((
    Root("input"),
    Root("nodes", _node_shape, "$nodes.<id>.output…, $nodes.<id>.status"),
    Root("run", _run_shape, "$run.id or $run.root_id"),
))


def _event_shape(parts: tuple[str, ...]) -> str | None:
    if parts and (parts[0] == "payload" or (parts[0] in ("name", "key") and len(parts) == 1)):
        return None
    return "use $event.name, $event.key or $event.payload…"


# An event trigger's filter: the event's name, key and payload.
EVENTS = Language((Root("event", _event_shape, "$event.name, $event.key or $event.payload…"),),
                  example="event.payload.customer.id")


# -- references -------------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def parse_reference(text: str, language: Language = NODES) -> tuple[str, ...]:
    """The context path of a reference: ``$nodes.a.output.x`` → ``("nodes", "a", "output", "x")``.

    Raises ``TemplateError`` naming what is wrong. Pure and cached.
    """
    found = _REFERENCE.fullmatch(text)
    if not found:
        raise TemplateError(f"malformed reference '{text}'; {language.hint}")
    name = found.group(1)
    parts = tuple(found.group(2).split(".")[1:])
    root = language.root(name)
    if root is None:
        raise TemplateError(f"unknown reference root '${name}'; {language.hint}")
    problem = root.shape(parts) if root.shape else None
    if problem:
        raise TemplateError(f"malformed reference '{text}'; {problem}")
    return (name, *parts)


def _references(text: str) -> list[str]:
    """The references a template string uses (whole-value or interpolated), unparsed."""
    if text.startswith("$$"):
        body = text[1:]
    elif text.startswith("$"):
        return [text]
    else:
        body = text
    return [body[start + 2:end].strip() for start, end in _interpolations(body)]


def _interpolations(text: str) -> list[tuple[int, int]]:
    """Where each ``{{ … }}`` of ``text`` is: its ``{{``'s start and its ``}}``'s, leftmost first, each
    ending at the first ``}}`` after it, within one line (what ``\\{\\{(.*?)\\}\\}`` finds). In one pass,
    linear in ``text``: the regular expression tried every ``{{`` to the end of the text, quadratic
    in a string of ``{{`` without a ``}}``."""
    found: list[tuple[int, int]] = []
    pos, close = 0, -1
    while (start := text.find("{{", pos)) >= 0:
        if close < start + 2:  # the first "}}" after this "{{" (else the one found for the last still is)
            close = text.find("}}", start + 2)
            if close < 0:
                break
        newline = text.find("\n", start + 2, close)
        if newline >= 0:  # none can start before that line's end: its first "}}" is on a later line
            pos = newline + 1
            continue
        found.append((start, close))
        pos = close + 2
    return found


def node_problem(parts: tuple[str, ...], text: str, upstream: Collection[str] | None,
                 known: Collection[str] | None) -> str | None:
    """Why a reference to a node may not be used here (unknown, or not upstream), or None."""
    if parts[0] != "nodes":
        return None
    node_id = parts[1]
    if known is not None and node_id not in known:
        return f"'{text}' names unknown node '{node_id}'"
    if upstream is not None and node_id not in upstream:
        return f"'{text}' names node '{node_id}', which is not upstream (add it to depends_on)"
    return None


def template_errors(
    value: Any,
    *,
    field: str,
    upstream: Collection[str] | None = None,
    known: Collection[str] | None = None,
    language: Language = NODES,
) -> list[tuple[str, str]]:
    """Every problem of the template ``value`` as ``(field path, message)`` pairs.

    ``field`` is the path of ``value`` itself (``input``); nested fields extend it
    (``input.headers.auth``, ``input.items[2]``). For the ``NODES`` language,
    ``upstream`` is the set of node ids the template may name (None: any) and
    ``known`` the ids that exist (None: not checked). The caller bounds the
    nesting depth; this recursion follows it.
    """
    errors: list[tuple[str, str]] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            errors.extend(template_errors(item, field=f"{field}.{key}", upstream=upstream, known=known,
                                          language=language))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            errors.extend(template_errors(item, field=f"{field}[{index}]", upstream=upstream, known=known,
                                          language=language))
    elif isinstance(value, str):
        for text in _references(value):
            try:
                parts = parse_reference(text, language)
            except TemplateError as exc:
                errors.append((field, str(exc)))
                continue
            problem = node_problem(parts, text, upstream, known)
            if problem:
                errors.append((field, problem))
    return errors


def validate_template(value: Any, *, field: str, upstream: set[str] | None = None,
                      language: Language = NODES) -> list[str]:
    """Messages (``"<field path>: <problem>"``) for every bad reference of ``value``; empty when valid."""
    return [f"{path}: {message}" for path, message in
            template_errors(value, field=field, upstream=upstream, language=language)]


# -- rendering ----------------------------------------------------------------------------------------


def lookup(context: Any, parts: tuple[str, ...]) -> Any:
    """The value at ``parts`` of nested dicts (list indexes allowed), or ``MISSING``."""
    node = context
    for part in parts:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def as_text(value: Any) -> str:
    """How an interpolated value reads in text (see the module docs); a missing one is ``""``."""
    if value is _MISSING:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


class TemplateTooLarge(Exception):
    """A template whose interpolations would build more text than its caller takes (``render``'s
    ``max_chars``). The text is never built: a template of a few kilobytes that interpolates a
    large value thousands of times would take gigabytes."""

    def __init__(self, max_chars: int) -> None:
        super().__init__(f"renders more than {max_chars} characters")
        self.max_chars = max_chars


class _Budget:
    """The characters a ``render`` call's interpolations may still build."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = self.left = max_chars

    def spend(self, text: str) -> str:
        self.left -= len(text)
        if self.left < 0:
            raise TemplateTooLarge(self.max_chars)
        return text


def _render_string(text: str, context: Mapping[str, Any], budget: _Budget | None = None) -> Any:
    value = _lookup_whole(text, context, budget)
    return None if value is _MISSING else value


def _lookup_whole(text: str, context: Mapping[str, Any], budget: _Budget | None = None) -> Any:
    """A string rendered, where a whole-value reference to a missing path is ``_MISSING``. A
    whole-value reference shares the value; an interpolation builds text, charged to ``budget``."""
    if text.startswith("$$"):
        text = text[1:]
    elif text.startswith("$"):
        return lookup(context, _parts(text))
    if "{{" not in text:
        return text
    pieces, last = [], 0
    for start, end in _interpolations(text):
        piece = as_text(lookup(context, _parts(text[start + 2:end].strip())))
        pieces += [text[last:start], budget.spend(piece) if budget is not None else piece]
        last = end + 2
    return "".join([*pieces, text[last:]])


@lru_cache(maxsize=4096)
def _parts(text: str) -> tuple[str, ...]:
    """A validated reference's path (its language was checked at validation: any root parses here)."""
    found = _REFERENCE.fullmatch(text)
    if not found:
        raise TemplateError(f"malformed reference '{text}'")
    return (found.group(1), *found.group(2).split(".")[1:])


def render(value: Any, context: Mapping[str, Any], *, max_chars: int | None = None) -> Any:
    """The template ``value`` with its references filled from ``context``.

    ``context`` holds the language's roots: ``{"input": ..., "nodes": {id: {"output",
    "status"}}, "run": {"id", "root_id"}}`` for nodes, ``{"input", "workflow",
    "action"}`` for routing. Pure: ``value`` and ``context`` are not modified, but a
    whole-value reference shares structure with ``context``. A missing path leaves out
    the key whose whole value refers to it (an optional field stays absent, as a JSON
    Schema's optional property wants it), renders as null elsewhere (a list's item, the
    whole template), and as "" in an interpolation. Expects a validated template: a
    malformed reference raises ``ValueError``. With ``max_chars``, the values its interpolations
    insert may add up to that many characters, else it raises ``TemplateTooLarge`` before building
    more (a payload limit in bytes is a bound in characters too: each takes at least one byte).
    """
    return _render(value, context, None if max_chars is None else _Budget(max_chars))


def _render(value: Any, context: Mapping[str, Any], budget: _Budget | None) -> Any:
    if isinstance(value, Mapping):
        rendered = {}
        for key, item in value.items():
            found = _lookup_whole(item, context, budget) if isinstance(item, str) else _render(item, context, budget)
            if found is not _MISSING:
                rendered[key] = found
        return rendered
    if isinstance(value, list):
        return [_render(item, context, budget) for item in value]
    if isinstance(value, str):
        return _render_string(value, context, budget)
    return value


def render_text(template: str, context: Mapping[str, Any]) -> str:
    """A template rendered as text (a partition key): a whole-value reference reads as ``as_text``."""
    rendered = render(template, context)
    return "" if rendered is None else as_text(rendered)


# -- conditions ----------------------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _path_problem(path: str, language: Language) -> str | None:
    """Why ``path`` is not a condition path of ``language``, or None."""
    parts = path.split(".")
    root = language.root(parts[0])
    if root is None:
        return f"path '{path}' must start with {language.path_hint}"
    problem = root.shape(tuple(parts[1:])) if root.shape else None
    if problem:
        return f"path '{path}' reads nothing here: {problem.replace('$', '')}"
    return None


def _check_path(field: str, path: Any, language: Language, legacy_root: str | None) -> str:
    """The condition's path, normalized; a deprecated root-less path gets ``legacy_root``, and is
    bounded as it is stored, with that root: what a rule answers can be sent back as it is."""
    if isinstance(path, str) and len(path) > MAX_PATH_CHARS:
        raise FieldError(f"{field}.path", f"must be at most {MAX_PATH_CHARS} characters, not {len(path)}")
    parts = path.split(".") if isinstance(path, str) else []
    if isinstance(path, str) and path.startswith("$"):
        raise FieldError(f"{field}.path", f"a path is written without its $: '{path[1:]}'")
    if not parts or len(parts) > MAX_PATH_SEGMENTS or not all(_SEGMENT.fullmatch(p) for p in parts):
        raise FieldError(f"{field}.path", f"must be a dotted path of at most {MAX_PATH_SEGMENTS} names (letters, "
                                          f"digits, _ or -), such as '{language.example}'")
    if legacy_root is not None and language.root(parts[0]) is None:
        path = f"{legacy_root}.{path}"  # deprecated: a path into the step input, without its root
        if len(path) > MAX_PATH_CHARS or len(parts) + 1 > MAX_PATH_SEGMENTS:
            raise FieldError(f"{field}.path", f"is read as '{legacy_root}.…', which must be at most "
                                              f"{MAX_PATH_CHARS} characters and {MAX_PATH_SEGMENTS} names, not "
                                              f"{len(path)} characters and {len(parts) + 1} names")
    problem = _path_problem(path, language)
    if problem:
        raise FieldError(f"{field}.path", problem)
    return str(path)


def _check_value(field: str, op: str, cond: Mapping[str, Any]) -> Any:
    value = cond.get("value", _MISSING)
    if op == "exists":
        value = True if value is _MISSING else value
        if not isinstance(value, bool):
            raise FieldError(f"{field}.value", "must be true or false for 'exists'")
    elif value is _MISSING:
        raise FieldError(f"{field}.value", f"is required for '{op}'")
    elif op == "in" and not isinstance(value, list):
        raise FieldError(f"{field}.value", "must be a list for 'in'")
    elif op in ("gt", "lt") and not _is_number(value):
        raise FieldError(f"{field}.value", f"must be a number for '{op}'")
    elif op == "prefix" and not isinstance(value, str):
        raise FieldError(f"{field}.value", "must be a string for 'prefix'")
    if op == "in" and len(value) > MAX_IN_VALUES:
        raise FieldError(f"{field}.value", f"must be a list of at most {MAX_IN_VALUES} values for 'in', "
                                           f"not {len(value)}")
    _check_value_size(f"{field}.value", value)
    return value


def _check_value_size(field: str, value: Any) -> None:
    """Raises ``FieldError`` naming the first string of ``value`` (a key or an item of it too) longer
    than ``MAX_VALUE_CHARS`` (``when.value[3]``), or ``field`` for a value larger than
    ``MAX_VALUE_JSON_CHARS`` as compact JSON. The caller bounds the nesting depth."""
    found = _long_string(field, value)
    if found is not None:
        where, length = found
        raise FieldError(where, f"must be a string of at most {MAX_VALUE_CHARS} characters, not {length}")
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    if size > MAX_VALUE_JSON_CHARS:
        raise FieldError(field, f"must be at most {MAX_VALUE_JSON_CHARS} characters as JSON, not {size}")


def _long_string(field: str, value: Any) -> tuple[str, int] | None:
    if isinstance(value, str):
        return (field, len(value)) if len(value) > MAX_VALUE_CHARS else None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _long_string(f"{field}[{index}]", item)
            if found is not None:
                return found
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if len(key) > MAX_VALUE_CHARS:
                return f"{field}.{key[:40]}…", len(key)
            found = _long_string(f"{field}.{key}", item)
            if found is not None:
                return found
    return None


def validate_condition(field: str, cond: Any, language: Language = NODES, *,
                       legacy_root: str | None = None) -> dict[str, Any]:
    """A normalized copy of one condition; raises ``FieldError`` naming the bad field.

    ``legacy_root``: a path that starts with no root of ``language`` is read under it
    (the deprecated form of rule conditions).
    """
    if not isinstance(cond, Mapping):
        raise FieldError(field, "must be an object with path, op and value")
    unknown = set(cond) - {"path", "op", "value"}
    if unknown:
        raise FieldError(f"{field}.{sorted(unknown)[0]}", "unknown field")
    path = _check_path(field, cond.get("path"), language, legacy_root)
    op = cond.get("op")
    if op not in OPERATORS:
        raise FieldError(f"{field}.op", f"unknown operator; use one of {', '.join(OPERATORS)}")
    return {"path": path, "op": op, "value": _check_value(field, op, cond)}


def condition_holds(cond: Mapping[str, Any], context: Any) -> bool:
    """Whether a validated condition holds on ``context`` (its paths start at the roots). Pure."""
    value = lookup(context, tuple(cond["path"].split(".")))
    op, expected = cond["op"], cond["value"]
    if op == "exists":
        return (value is not _MISSING) is expected
    if value is _MISSING:
        return op == "ne"
    if op == "eq":
        return json_equal(value, expected)
    if op == "ne":
        return not json_equal(value, expected)
    if op == "in":
        return any(json_equal(value, item) for item in expected)
    if op == "prefix":
        return isinstance(value, str) and value.startswith(expected)
    if not _is_number(value):
        return False
    return bool(value > expected) if op == "gt" else bool(value < expected)


def when_errors(
    when: Any,
    *,
    field: str,
    upstream: Collection[str] | None = None,
    known: Collection[str] | None = None,
    language: Language = NODES,
) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
    """The normalized condition (one, or ``all``/``any`` of them; None if invalid) and its problems as
    ``(field path, message)`` pairs. ``upstream`` and ``known`` as for ``template_errors``."""
    if isinstance(when, Mapping) and len(when) == 1 and next(iter(when)) in ("all", "any"):
        combinator = next(iter(when))
        items = when[combinator]
        if not isinstance(items, list) or not items or len(items) > MAX_CONDITIONS:
            return None, [(f"{field}.{combinator}", f"must be a list of 1 to {MAX_CONDITIONS} conditions")]
        errors: list[tuple[str, str]] = []
        clean: list[dict[str, Any]] = []
        for index, item in enumerate(items):
            if isinstance(item, Mapping) and len(item) == 1 and next(iter(item)) in ("all", "any"):
                errors.append((f"{field}.{combinator}[{index}]", f"'{next(iter(item))}' does not nest: {combinator} "
                                                                  "takes conditions of path, op and value"))
                continue
            one, problems = _one_condition(item, f"{field}.{combinator}[{index}]", upstream, known, language)
            errors.extend(problems)
            if one is not None:
                clean.append(one)
        return (None, errors) if errors else ({combinator: clean}, [])
    return _one_condition(when, field, upstream, known, language)


def _one_condition(
    cond: Any, field: str, upstream: Collection[str] | None, known: Collection[str] | None, language: Language
) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
    try:
        clean = validate_condition(field, cond, language)
    except FieldError as exc:
        hint = " (or {\"all\": [...]} / {\"any\": [...]})" if exc.field == field else ""
        return None, [(exc.field, exc.message + hint)]
    parts = tuple(clean["path"].split("."))
    problem = node_problem(parts, clean["path"], upstream, known)
    if problem:
        return None, [(f"{field}.path", problem)]
    return clean, []


def evaluate_when(when: Mapping[str, Any] | None, context: Mapping[str, Any]) -> bool:
    """Whether a validated condition (one, ``all`` or ``any``) holds on ``context``; None always holds.
    Pure; never evaluates code. Accepts the normalized or the submitted form (``exists`` without
    ``value``); an invalid condition raises ``FieldError``."""
    if when is None:
        return True
    if "all" in when:
        return all(_holds(cond, context) for cond in when["all"])
    if "any" in when:
        return any(_holds(cond, context) for cond in when["any"])
    return _holds(when, context)


def _holds(cond: Mapping[str, Any], context: Mapping[str, Any]) -> bool:
    # Normalizing again fills defaults (``exists`` without ``value``). The language is not
    # checked again here: what was validated at its site evaluates anywhere.
    value = cond.get("value", _MISSING)
    if cond.get("op") == "exists" and value is _MISSING:
        cond = {**cond, "value": True}
    if cond.get("op") not in OPERATORS or not isinstance(cond.get("path"), str):
        raise FieldError("when", "must be an object with path, op and value")
    return condition_holds(cond, context)


# -- the deprecated partition-key placeholders --------------------------------------------------------------

_LEGACY_PLACEHOLDER = re.compile(r"(?<!\{)\{([^{}]*)\}(?!\})")
_LEGACY_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+){0,9}$")


def upgrade_legacy_placeholders(field: str, template: str) -> str:
    """``"c-{input.customer}"`` (deprecated) → ``"c-{{ $input.customer }}"``; ``{workflow}`` and
    ``{action}`` likewise. Templates of the current form come back unchanged. Raises ``FieldError``
    for a placeholder the old form did not have."""

    def upgrade(found: re.Match[str]) -> str:
        name = found.group(1)
        legacy_input = name.startswith("input.") and _LEGACY_PATH.fullmatch(name[len("input."):])
        if name not in ("workflow", "action") and not legacy_input:
            raise FieldError(field, f"unknown placeholder '{{{name}}}'; use {{{{ $workflow }}}}, "
                                    f"{{{{ $action }}}} or {{{{ $input.<path> }}}}")
        return "{{ $" + name + " }}"

    return _LEGACY_PLACEHOLDER.sub(upgrade, template)
