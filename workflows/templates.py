"""Templates and ``when`` conditions of workflow specs: validation and safe rendering.

A template is any JSON value. Only strings are special; dict keys, numbers,
booleans and null are copied as they are.

References (a small regex grammar, never ``eval``):

- ``$input`` and ``$input.a.b`` — the run input, or a path into it;
- ``$nodes.<id>.output`` and ``$nodes.<id>.output.a.0.b`` — an upstream node's
  output, or a path into it (a digit segment indexes a list);
- ``$nodes.<id>.status`` — an upstream node's status (``succeeded``, ``skipped``);
- ``$run.id`` and ``$run.root_id`` — the run and the root of its lineage.

Path segments are letters, digits, ``_`` and ``-``; a key with other characters
cannot be referenced.

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

Node references must name a node upstream of the node that uses them
(transitively through ``depends_on``); the run's ``output`` may name any node.

A ``when`` is a condition of ``scheduling.rules`` (``{"path", "op", "value"}``)
or ``{"all": [conditions]}`` / ``{"any": [conditions]}``. Its paths are dotted
paths into ``{"input": ..., "nodes": {id: {"output": ..., "status": ...}}}``;
a path under ``nodes.<id>`` must name an upstream node and then ``output`` or
``status``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from functools import lru_cache
from typing import Any

from scheduling.rules import MAX_CONDITIONS, RuleError, condition_holds, validate_condition

NODE_ID = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_REFERENCE = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)((?:\.[A-Za-z0-9_\-]+)*)$")
_INTERPOLATION = re.compile(r"\{\{(.*?)\}\}")
_ROOTS_HINT = "use $input…, $nodes.<id>.output…, $nodes.<id>.status, $run.id or $run.root_id"
_MISSING = object()


class TemplateError(ValueError):
    """A malformed template reference."""


@lru_cache(maxsize=4096)
def parse_reference(text: str) -> tuple[str, ...]:
    """The context path of a reference such as ``$nodes.a.output.x`` → ``("nodes", "a", "output", "x")``.

    Raises ``ValueError`` naming what is wrong. Pure and cached.
    """
    found = _REFERENCE.match(text)
    if not found:
        raise TemplateError(f"malformed reference '{text}'; {_ROOTS_HINT}")
    root = found.group(1)
    parts = tuple(found.group(2).split(".")[1:])
    if root == "input":
        return ("input", *parts)
    if root == "nodes":
        if len(parts) < 2 or not NODE_ID.match(parts[0]) or parts[1] not in ("output", "status") or (
            parts[1] == "status" and len(parts) > 2
        ):
            raise TemplateError(f"malformed reference '{text}'; use $nodes.<id>.output… or $nodes.<id>.status")
        return ("nodes", *parts)
    if root == "run":
        if len(parts) != 1 or parts[0] not in ("id", "root_id"):
            raise TemplateError(f"malformed reference '{text}'; use $run.id or $run.root_id")
        return ("run", parts[0])
    raise TemplateError(f"unknown reference root '${root}'; {_ROOTS_HINT}")


def _references(text: str) -> list[str]:
    """The references a template string uses (whole-value or interpolated), unparsed."""
    if text.startswith("$$"):
        body = text[1:]
    elif text.startswith("$"):
        return [text]
    else:
        body = text
    return [inner.strip() for inner in _INTERPOLATION.findall(body)]


def _check_node(
    parts: tuple[str, ...], text: str, upstream: Collection[str] | None, known: Collection[str] | None
) -> str | None:
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
    upstream: Collection[str] | None,
    known: Collection[str] | None = None,
) -> list[tuple[str, str]]:
    """Every problem of the template ``value`` as ``(field path, message)`` pairs.

    ``field`` is the path of ``value`` itself (``input``); nested fields extend it
    (``input.headers.auth``, ``input.items[2]``). ``upstream`` is the set of node
    ids the template may name (None: any); ``known`` the ids that exist (None:
    not checked). The caller bounds the nesting depth; this recursion follows it.
    """
    errors: list[tuple[str, str]] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            errors.extend(template_errors(item, field=f"{field}.{key}", upstream=upstream, known=known))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            errors.extend(template_errors(item, field=f"{field}[{index}]", upstream=upstream, known=known))
    elif isinstance(value, str):
        for text in _references(value):
            try:
                parts = parse_reference(text)
            except TemplateError as exc:
                errors.append((field, str(exc)))
                continue
            problem = _check_node(parts, text, upstream, known)
            if problem:
                errors.append((field, problem))
    return errors


def validate_template(value: Any, *, field: str, upstream: set[str] | None) -> list[str]:
    """Messages (``"<field path>: <problem>"``) for every bad reference of ``value``; empty when valid.

    ``upstream`` is the set of node ids the template may name, or None for any.
    """
    return [f"{path}: {message}" for path, message in template_errors(value, field=field, upstream=upstream)]


# -- rendering ----------------------------------------------------------------------------------


def _resolve(context: Any, parts: tuple[str, ...]) -> Any:
    node = context
    for part in parts:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _as_text(value: Any) -> str:
    if value is _MISSING:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def _render_string(text: str, context: Mapping[str, Any]) -> Any:
    if text.startswith("$$"):
        text = text[1:]
    elif text.startswith("$"):
        value = _resolve(context, parse_reference(text))
        return None if value is _MISSING else value
    if "{{" not in text:
        return text
    return _INTERPOLATION.sub(lambda found: _as_text(_resolve(context, parse_reference(found.group(1).strip()))), text)


def render(value: Any, context: Mapping[str, Any]) -> Any:
    """The template ``value`` with its references filled from ``context``.

    ``context`` is ``{"input": ..., "nodes": {id: {"output": ..., "status": ...}},
    "run": {"id": ..., "root_id": ...}}``. Pure: ``value`` and ``context`` are not
    modified, but a whole-value reference shares structure with ``context``.
    Missing paths render as null (whole value) or "" (interpolation). Expects a
    validated template: a malformed reference raises ``ValueError``.
    """
    if isinstance(value, Mapping):
        return {key: render(item, context) for key, item in value.items()}
    if isinstance(value, list):
        return [render(item, context) for item in value]
    if isinstance(value, str):
        return _render_string(value, context)
    return value


# -- when ---------------------------------------------------------------------------------------


def _check_condition_path(path: str, upstream: Collection[str] | None, known: Collection[str] | None) -> str | None:
    parts = path.split(".")
    if parts[0] == "input":
        return None
    if parts[0] != "nodes":
        return f"path '{path}' must start with 'input.' or 'nodes.<id>.'"
    if len(parts) < 3 or parts[2] not in ("output", "status") or (parts[2] == "status" and len(parts) > 3):
        return f"path '{path}' must be nodes.<id>.output… or nodes.<id>.status"
    return _check_node(("nodes", parts[1]), path, upstream, known)


def when_errors(
    when: Any,
    *,
    field: str,
    upstream: Collection[str] | None,
    known: Collection[str] | None = None,
) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
    """The normalized ``when`` (None if invalid) and its problems as ``(field path, message)`` pairs."""
    if isinstance(when, Mapping) and len(when) == 1 and next(iter(when)) in ("all", "any"):
        combinator = next(iter(when))
        items = when[combinator]
        if not isinstance(items, list) or not items or len(items) > MAX_CONDITIONS:
            return None, [(f"{field}.{combinator}", f"must be a list of 1 to {MAX_CONDITIONS} conditions")]
        errors: list[tuple[str, str]] = []
        clean: list[dict[str, Any]] = []
        for index, item in enumerate(items):
            one, problems = _one_condition(item, f"{field}.{combinator}[{index}]", upstream, known)
            errors.extend(problems)
            if one is not None:
                clean.append(one)
        return (None, errors) if errors else ({combinator: clean}, [])
    return _one_condition(when, field, upstream, known)


def _one_condition(
    cond: Any, field: str, upstream: Collection[str] | None, known: Collection[str] | None
) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
    try:
        clean = validate_condition(field, cond)
    except RuleError as exc:
        hint = " (or {\"all\": [...]} / {\"any\": [...]})" if exc.field == field else ""
        return None, [(exc.field, exc.message + hint)]
    problem = _check_condition_path(clean["path"], upstream, known)
    if problem:
        return None, [(f"{field}.path", problem)]
    return clean, []


def _holds(cond: Mapping[str, Any], context: Mapping[str, Any]) -> bool:
    # Normalizing again fills defaults (``exists`` without ``value``), so a ``when``
    # taken from the submitted spec works as well as one from ``Spec``/``to_dict()``.
    return condition_holds(validate_condition("when", cond), context)


def evaluate_when(when: Mapping[str, Any] | None, context: Mapping[str, Any]) -> bool:
    """Whether a validated ``when`` holds on ``context`` (None always holds). Pure; never evaluates code.

    Accepts the normalized or the submitted form; an invalid condition raises ``RuleError``.
    """
    if when is None:
        return True
    if "all" in when:
        return all(_holds(cond, context) for cond in when["all"])
    if "any" in when:
        return any(_holds(cond, context) for cond in when["any"])
    return _holds(when, context)
