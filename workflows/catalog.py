"""The task catalog: which of the team's Celery tasks tenants may call as ``task`` nodes.

The platform keeps it (``TaskCatalogEntry``: the API's ``/task-catalog``, the
admin); a tenant sees and calls only the entries its plan or slug is allowed
(``/tasks``). A spec whose ``task`` node names anything else is refused at
validation, with the node and field named, and with the same words whether the
task is not in the catalog at all or only not open to this tenant (a tenant
learns nothing of the tasks of others); so is a literal input that does not
match the entry's input JSON Schema (each field that does not, up to
``MAX_INPUT_PROBLEMS``). A templated input is checked once rendered,
when its attempt starts (the step fails with ``invalid_input``), and every start
checks the entry again: a task taken out of the catalog, or away from a plan,
is not called any more by workflows written before.

Ductor's own tasks (``ductor.*``) and Celery's (``celery.*``) are never in the
catalog. Entries are cached per process for ``CACHE_TTL_S``.

An input schema is self-contained: its references (``$ref``) resolve within it,
or to a JSON Schema draft's own meta-schema, and nothing is ever fetched (an
entry whose references do not resolve is refused; one stored before that rule
refuses every input, with the reason).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import jsonschema
import referencing.exceptions
import referencing.jsonschema
from cachetools import TTLCache
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from jsonschema_specifications import REGISTRY as META_SCHEMAS

from ductor_project.core.context import current_tenant
from tenants.entitlements import effective_entitlements
from workflows.models import TaskCatalogEntry

# A Celery task name: dotted identifiers (``billing.tasks.charge``).
TASK_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MAX_TASK_NAME = 200
RESERVED_PREFIXES = ("ductor.", "celery.")
CACHE_TTL_S = 2.0
MAX_INPUT_PROBLEMS = 20  # fields of one input reported, at most
# The drafts an input schema may name in ``$schema`` (without it: the latest).
DRAFTS = tuple(f"https://json-schema.org/draft/{year}/schema" for year in ("2020-12", "2019-09")) + tuple(
    f"http://json-schema.org/draft-0{n}/schema" for n in (7, 6))
DEFAULT_DRAFT = DRAFTS[0]

_cache: TTLCache[str, TaskCatalogEntry | None] = TTLCache(maxsize=4096, ttl=CACHE_TTL_S)
_lock = threading.Lock()


def name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be a catalog task's name, or None."""
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name) or len(name) > MAX_TASK_NAME:
        return f"must be a Celery task name: dotted identifiers, at most {MAX_TASK_NAME} characters"
    if name.startswith(RESERVED_PREFIXES):
        return "names an internal task (ductor.*, celery.*), which is never callable"
    return None


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


def entry(name: str) -> TaskCatalogEntry | None:
    """The catalog entry ``name`` (enabled or not), as this process read it at most
    ``CACHE_TTL_S`` ago."""
    with _lock:
        if name in _cache:
            return _cache[name]
    found = TaskCatalogEntry.objects.filter(name=name).first()
    with _lock:
        _cache[name] = found
    return found


@receiver([post_save, post_delete], sender=TaskCatalogEntry)
def _entry_changed(sender: Any, instance: TaskCatalogEntry, **kwargs: Any) -> None:
    with _lock:
        _cache.pop(instance.name, None)


def _allowed(found: TaskCatalogEntry) -> bool:
    tenant = current_tenant()
    return found.allows(plan=effective_entitlements(tenant).plan, slug=tenant.slug)


def visible() -> list[TaskCatalogEntry]:
    """The enabled entries the tenant in context may call, by name."""
    return [found for found in TaskCatalogEntry.objects.filter(enabled=True).order_by("name") if _allowed(found)]


@dataclass(frozen=True)
class TaskCheck:
    """A task the tenant in context may call now, or why not (``problem``)."""

    entry: TaskCatalogEntry | None
    problem: str = ""


def callable_task(name: str) -> TaskCheck:
    """Whether the tenant in context may call the task ``name``: its entry, or the problem."""
    problem = name_problem(name)
    if problem:
        return TaskCheck(None, problem)
    found = entry(name)
    if found is None or not _allowed(found):  # in words that do not tell whether it exists
        return TaskCheck(None, f"task '{name}' is not in the task catalog (GET /api/v1/tasks lists those "
                               f"this tenant may call)")
    return TaskCheck(found)


def is_literal(value: Any) -> bool:
    """Whether a template holds no reference (it renders as itself, ``$$`` escapes aside)."""
    if isinstance(value, str):
        return not value.startswith("$") and "{{" not in value
    if isinstance(value, Mapping):
        return all(is_literal(v) for v in value.values())
    if isinstance(value, list):
        return all(is_literal(v) for v in value)
    return True


def input_problems(found: TaskCatalogEntry, value: Any) -> list[tuple[str, str]]:
    """Why ``value`` cannot be the task's input: ``(field path under input, message)`` for each field
    that does not match (the first ``MAX_INPUT_PROBLEMS``, one message each); [] when it can."""
    if found.arguments == TaskCatalogEntry.Arguments.KWARGS and not isinstance(value, Mapping):
        return [("", "must be an object: the task takes it as keyword arguments")]
    if not found.input_schema:
        return []
    problems: dict[str, str] = {}
    try:
        for error in _validator(found.input_schema).iter_errors(value):
            best = jsonschema.exceptions.best_match([error]) or error  # into anyOf / oneOf
            problems.setdefault(".".join(str(part) for part in best.absolute_path), _in_json(best)[:300])
            if len(problems) == MAX_INPUT_PROBLEMS:
                break
    except (referencing.exceptions.Unresolvable, ValueError) as exc:  # stored before references were checked
        return [("", f"cannot be checked: the task's input schema has a reference that does not resolve "
                     f"({str(exc)[:200]}); the platform must fix its catalog entry")]
    except RecursionError:  # a loop of references that this input, and no probe, runs into
        return [("", "cannot be checked: the task's input schema's references lead back to themselves "
                     "without end here; the platform must fix its catalog entry")]
    return sorted(problems.items())


def timeout_s(found: TaskCatalogEntry | None, node_timeout: float | None, default: float) -> float:
    """A task step's timeout (its lease): the node's, else the entry's, else ``default``."""
    if node_timeout:
        return float(node_timeout)
    if found is not None and found.timeout_s:
        return float(found.timeout_s)
    return default
