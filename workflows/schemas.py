"""JSON Schemas that check what a tenant sends: a catalog task's input (``workflows.catalog``) and a
workflow's run input (a spec's ``input_schema``).

A schema is self-contained: its references (``$ref``) resolve within it, or to a JSON Schema
draft's own meta-schema, and nothing is ever fetched. ``integer`` is a JSON number written
without a fraction, as everywhere in Ductor's API (``2``, not ``2.0``). A value that does not
match is answered field by field (``value_problems``: each field's path and one message, the
value named as JSON), never with a crash, whatever the schema's references do.

A schema's regular expressions (``pattern``, ``patternProperties``) are a tenant's, and Python's
``re`` backtracks: ``^(a+)+$`` against thirty ``a`` and a ``!`` would hold a web worker for
minutes. They are matched by RE2 (``google-re2``), in time linear in the text; a pattern RE2
cannot run (a backreference, a lookaround: the features that need backtracking) is refused when
the schema is saved, and so is ``unevaluatedProperties`` beside ``patternProperties``, which the
library would match with ``re``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from fractions import Fraction
from functools import cache, lru_cache
from typing import Any

import jsonschema
import re2  # google-re2
import referencing.exceptions
import referencing.jsonschema
from jsonschema.exceptions import ValidationError
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
    return _reference_problem(schema) or _regex_problem(schema) or _probe_problem(schema)


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


def _subschemas(schema: Mapping[str, Any]) -> Any:
    """Every subschema of ``schema`` (itself included), as the draft it names reads them, each with
    the resolver of its place: ``(contents, resolver)``."""
    dialect = referencing.jsonschema.specification_with(str(schema.get("$schema", "")),
                                                        default=referencing.jsonschema.DRAFT202012)
    root = dialect.create_resource(schema)
    stack = [(root, META_SCHEMAS.resolver_with_root(root))]
    while stack:
        resource, resolver = stack.pop()
        if isinstance(resource.contents, Mapping):
            yield resource.contents, resolver
        stack.extend((sub, resolver.in_subresource(sub)) for sub in resource.subresources())


def _reference_problem(schema: Mapping[str, Any]) -> str | None:
    """Why a ``$ref`` of ``schema`` cannot be followed (each from the base its place in the schema
    has), or None."""
    for contents, resolver in _subschemas(schema):
        ref = contents.get("$ref")
        if isinstance(ref, str):
            try:
                resolver.lookup(ref)
            except (referencing.exceptions.Unresolvable, ValueError):  # ValueError: a base that is no URI
                return (f"is not a usable JSON Schema: its $ref '{ref[:100]}' does not resolve within it "
                        f"(references to other documents are not fetched)")
    return None


def _regex_problem(schema: Mapping[str, Any]) -> str | None:
    """Why a regular expression of ``schema`` cannot be run in linear time (RE2 refuses it), or why
    its ``unevaluatedProperties`` cannot be checked; None when neither."""
    uses = {"unevaluatedProperties": False, "patternProperties": False}
    for contents, _ in _subschemas(schema):
        patterns = [contents["pattern"]] if isinstance(contents.get("pattern"), str) else []
        if isinstance(contents.get("patternProperties"), Mapping):
            patterns.extend(contents["patternProperties"])
        for pattern in patterns:
            try:
                _regex(pattern)
            except re2.error as exc:
                return (f"is not a usable JSON Schema: its pattern {pattern[:100]!r} cannot be matched in linear "
                        f"time ({exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc}); "
                        "backreferences and lookarounds are not supported")
        for keyword in uses:
            uses[keyword] = uses[keyword] or keyword in contents
    if all(uses.values()):
        return ("is not a usable JSON Schema: unevaluatedProperties beside patternProperties is not supported "
                "(list the properties, or use additionalProperties)")
    return None


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is answered, not logged by the library


@lru_cache(maxsize=1024)
def _regex(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (``re2.error`` when it cannot be)."""
    return re2.compile(pattern, _RE2_OPTIONS)


def _matches(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text`` (JSON Schema's ``pattern``: unanchored), in
    time linear in ``text``. A pattern saved before RE2 checked it matches nothing."""
    try:
        return _regex(pattern).search(text) is not None
    except re2.error:
        return False


def _pattern(validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]) -> Any:
    if validator.is_type(instance, "string") and not _matches(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Mapping[str, Any], instance: Any,
                        schema: Mapping[str, Any]) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _matches(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: Mapping[str, Any]) -> Any:
    """``additionalProperties`` as the library checks it, with ``patternProperties`` matched by RE2."""
    if not validator.is_type(instance, "object"):
        return
    known, patterns = schema.get("properties", {}), list(schema.get("patternProperties", {}))
    extras = sorted((key for key in instance
                     if key not in known and not any(_matches(pattern, key) for pattern in patterns)), key=str)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif additional is False and extras:
        listed = ", ".join(repr(extra) if len(extra) <= 60 else repr(extra[:57] + "...") for extra in extras[:10])
        listed += f" and {len(extras) - 10} more" if len(extras) > 10 else ""
        if patterns:
            yield ValidationError(f"{listed} {'does' if len(extras) == 1 else 'do'} not match any of the regexes: "
                                  f"{', '.join(repr(pattern) for pattern in sorted(patterns))}")
        else:
            yield ValidationError(f"Additional properties are not allowed ({listed} "
                                  f"{'was' if len(extras) == 1 else 'were'} unexpected)")


def _multiple_of(validator: Any, divisor: Any, instance: Any, schema: Any) -> Any:
    """``multipleOf``, exact where floats cannot hold the quotient: an integer past a float's range
    divided by a float divisor (``2**1100`` and ``0.1``) raised ``OverflowError`` in jsonschema's."""
    if not validator.is_type(instance, "number"):
        return
    try:
        if isinstance(divisor, float):
            quotient = instance / divisor
            failed = int(quotient) != quotient
        else:
            failed = bool(instance % divisor)
    except OverflowError:
        failed = (Fraction(instance) / Fraction(divisor)).denominator != 1
    if failed:
        yield ValidationError(f"{instance!r} is not a multiple of {divisor}")


def _validator(schema: Mapping[str, Any]) -> Any:
    """A validator of ``schema`` that resolves its references within it and the drafts'
    meta-schemas only (it never fetches), and whose ``integer`` is a JSON number written without a
    fraction (``_whole_numbers``)."""
    return _whole_numbers(jsonschema.validators.validator_for(schema))(schema, registry=META_SCHEMAS)


@cache
def _whole_numbers(validator: Any) -> Any:
    """``validator`` with ``integer`` taken as Ductor's API takes a whole number: ``2``, not ``2.0``
    (which JSON Schema admits, and the task would get as a float), and its regular expressions
    matched by RE2 (``_matches``)."""
    checker = validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
    keywords = {"pattern": _pattern, "patternProperties": _pattern_properties,
                "additionalProperties": _additional_properties, "multipleOf": _multiple_of}
    return jsonschema.validators.extend(validator, validators=keywords, type_checker=checker)


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


def _field_of(error: Any) -> list[Any]:
    """The path of the field an error is about: a missing property's own (``input.sku``), one
    for each that ``required`` lists and the value lacks, where the error's path is its object's."""
    path = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, Mapping):
        missing = [name for name in error.validator_value if isinstance(name, str) and name not in error.instance]
        named = next((name for name in missing if error.message.startswith(repr(name))), None)
        if named is not None:
            path.append(named)
    return path


def _path(parts: Any) -> str:
    """A field's path as the API names it: ``items[1].sku`` ("" for the value itself)."""
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def under(prefix: str, path: str) -> str:
    """``path`` (a ``value_problems`` field) under ``prefix``: ``input``, ``input.qty``, ``input[0]``."""
    if not path:
        return prefix
    return prefix + (path if path.startswith("[") else "." + path)


# What a schema says of an object's keys alone: true whatever the values at its keys turn out to be.
KEY_KEYWORDS = frozenset({"required", "additionalProperties", "propertyNames", "minProperties", "maxProperties",
                          "dependentRequired"})


class TextHole(tuple[Any, ...]):
    """The path of a value not known yet that is a string whatever it turns out to be (a template's
    interpolation, ``"{{ $input.n }}"``): whether its type fits is known already."""

    __slots__ = ()


def _knowable(error: Any, unknown: Collection[tuple[Any, ...]]) -> bool:
    """Whether ``error`` holds whatever the values at the ``unknown`` paths turn out to be: it is about
    none of them, nor about something that holds one, unless it is about that object's keys alone."""
    path = tuple(error.absolute_path)
    for hole in unknown:
        if hole[:len(path)] == path and (len(hole) == len(path) or error.validator not in KEY_KEYWORDS):
            return False
    return True


def _of_text_hole(error: Any, unknown: Collection[tuple[Any, ...]]) -> bool:
    """Whether ``error`` is about the type of a string not known yet (``TextHole``): that, it holds."""
    path = tuple(error.absolute_path)
    return error.validator == "type" and any(isinstance(hole, TextHole) and hole == path for hole in unknown)


def value_problems(schema: Mapping[str, Any], value: Any, *, owner: str, fix: str,
                   unknown: Collection[tuple[Any, ...]] = ()) -> list[tuple[str, str]]:
    """Why ``value`` does not match ``schema``: ``(field path, message)`` for each field that does not
    (the first ``MAX_INPUT_PROBLEMS``, one message each, by path: ``items[1].sku``, "" for the value
    itself; ``under`` puts it under a field); [] when it does. The values at the ``unknown`` paths
    (templates, at a spec's save) are not known yet: only the problems they cannot change count.
    A schema that cannot check this value (a reference that does not resolve, or leads back to itself
    without end) is one problem at the root, naming ``owner`` and who must ``fix`` it."""
    problems: dict[str, str] = {}
    try:
        for error in _validator(schema).iter_errors(value):
            text_hole = bool(unknown) and _of_text_hole(error, unknown)
            if unknown and not text_hole and not _knowable(error, unknown):
                continue
            if text_hole:
                wanted = error.validator_value
                problems.setdefault(_path(_field_of(error)), (
                    f"must be of type {json.dumps(wanted)}, but {{{{ … }}}} always renders a string: give the "
                    f"reference alone (\"$input.x\", not \"{{{{ $input.x }}}}\") to pass its value as it is")[:300])
                continue
            best = jsonschema.exceptions.best_match([error]) or error  # into anyOf / oneOf
            problems.setdefault(_path(_field_of(best)), _in_json(best)[:300])
            if len(problems) == MAX_INPUT_PROBLEMS:
                break
    except (referencing.exceptions.Unresolvable, ValueError) as exc:  # stored before references were checked
        return [("", f"cannot be checked: {owner} has a reference that does not resolve ({str(exc)[:200]}); "
                     f"{fix}")]
    except RecursionError:  # a loop of references that this value, and no probe, runs into
        return [("", f"cannot be checked: {owner}'s references lead back to themselves without end here; {fix}")]
    return sorted(problems.items())
