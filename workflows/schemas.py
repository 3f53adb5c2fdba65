"""JSON Schemas that check what a tenant sends: a catalog task's input (``workflows.catalog``) and a
workflow's run input (a spec's ``input_schema``).

A schema is self-contained: its references (``$ref``) resolve within it, or to a JSON Schema
draft's own meta-schema, and nothing is ever fetched. ``integer`` is a JSON number written
without a fraction, as everywhere in Ductor's API (``2``, not ``2.0``). A value that does not
match is answered field by field (``value_problems``: each field's path and one message, the
value named as JSON), never with a crash, whatever the schema's references do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from typing import Any

import jsonschema
import referencing.exceptions
import referencing.jsonschema
from jsonschema_specifications import REGISTRY as META_SCHEMAS

MAX_INPUT_PROBLEMS = 20  # fields of one value reported, at most
# The drafts a schema may name in ``$schema`` (without it: the latest).
DRAFTS = tuple(f"https://json-schema.org/draft/{year}/schema" for year in ("2020-12", "2019-09")) + tuple(
    f"http://json-schema.org/draft-0{n}/schema" for n in (7, 6))
DEFAULT_DRAFT = DRAFTS[0]


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` is not a usable JSON Schema, or None."""
    if not isinstance(schema, Mapping):
        return "must be a JSON Schema object"
    dialect = schema.get("$schema", DEFAULT_DRAFT)
    if not isinstance(dialect, str) or dialect.rstrip("#") not in DRAFTS:
        return f"is not a usable JSON Schema: its $schema must name one of the drafts {', '.join(DRAFTS)}"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"is not a valid JSON Schema: {exc.message}"
    return _reference_problem(schema) or _probe_problem(schema)


def _probe_problem(schema: Mapping[str, Any]) -> str | None:
    """Why ``schema`` cannot check anything (its references lead back to themselves without end, or
    to nothing), as far as a few plain inputs show; an input that finds what they miss is refused
    (``input_problems``), never a crash."""
    validator = _validator(schema)
    try:
        probes: tuple[Any, ...] = ({}, [], "", 0, None)
        for probe in probes:
            next(iter(validator.iter_errors(probe)), None)
    except RecursionError:
        return "is not a usable JSON Schema: its references lead back to themselves without end"
    except (referencing.exceptions.Unresolvable, ValueError) as exc:
        return f"is not a usable JSON Schema: a reference of it does not resolve ({str(exc)[:200]})"
    return None


def _reference_problem(schema: Mapping[str, Any]) -> str | None:
    """Why a ``$ref`` of ``schema`` cannot be followed (each from the base its place in the schema
    has), or None."""
    dialect = referencing.jsonschema.specification_with(str(schema.get("$schema", "")),
                                                        default=referencing.jsonschema.DRAFT202012)
    root = dialect.create_resource(schema)
    stack = [(root, META_SCHEMAS.resolver_with_root(root))]
    while stack:
        resource, resolver = stack.pop()
        ref = resource.contents.get("$ref") if isinstance(resource.contents, Mapping) else None
        if isinstance(ref, str):
            try:
                resolver.lookup(ref)
            except (referencing.exceptions.Unresolvable, ValueError):  # ValueError: a base that is no URI
                return (f"is not a usable JSON Schema: its $ref '{ref[:100]}' does not resolve within it "
                        f"(references to other documents are not fetched)")
        stack.extend((sub, resolver.in_subresource(sub)) for sub in resource.subresources())
    return None


def _validator(schema: Mapping[str, Any]) -> Any:
    """A validator of ``schema`` that resolves its references within it and the drafts'
    meta-schemas only (it never fetches), and whose ``integer`` is a JSON number written without a
    fraction (``_whole_numbers``)."""
    return _whole_numbers(jsonschema.validators.validator_for(schema))(schema, registry=META_SCHEMAS)


@cache
def _whole_numbers(validator: Any) -> Any:
    """``validator`` with ``integer`` taken as Ductor's API takes a whole number: ``2``, not ``2.0``
    (which JSON Schema admits, and the task would get as a float)."""
    checker = validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
    return jsonschema.validators.extend(validator, type_checker=checker)


def _in_json(error: Any) -> str:
    """The error's message with the value it names written as JSON (``null``, ``true``), not as
    Python writes it (``None``, ``True``)."""
    shown = repr(error.instance)
    if not error.message.startswith(shown):
        return str(error.message)
    try:
        value = json.dumps(error.instance, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(error.message)
    return (value if len(value) <= 100 else value[:97] + "...") + error.message[len(shown):]


def value_problems(schema: Mapping[str, Any], value: Any, *, owner: str, fix: str) -> list[tuple[str, str]]:
    """Why ``value`` does not match ``schema``: ``(field path, message)`` for each field that does not
    (the first ``MAX_INPUT_PROBLEMS``, one message each, by path); [] when it does. A schema that
    cannot check this value (a reference that does not resolve, or leads back to itself without end)
    is one problem at the root, naming ``owner`` and who must ``fix`` it."""
    problems: dict[str, str] = {}
    try:
        for error in _validator(schema).iter_errors(value):
            best = jsonschema.exceptions.best_match([error]) or error  # into anyOf / oneOf
            problems.setdefault(".".join(str(part) for part in best.absolute_path), _in_json(best)[:300])
            if len(problems) == MAX_INPUT_PROBLEMS:
                break
    except (referencing.exceptions.Unresolvable, ValueError) as exc:  # stored before references were checked
        return [("", f"cannot be checked: {owner} has a reference that does not resolve ({str(exc)[:200]}); "
                     f"{fix}")]
    except RecursionError:  # a loop of references that this value, and no probe, runs into
        return [("", f"cannot be checked: {owner}'s references lead back to themselves without end here; {fix}")]
    return sorted(problems.items())
