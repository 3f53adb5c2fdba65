"""The task catalog: which of the team's Celery tasks tenants may call as ``task`` nodes.

The platform keeps it (``TaskCatalogEntry``: the API's ``/task-catalog``, the
admin); a tenant sees and calls only the entries its plan or slug is allowed
(``/tasks``). A spec whose ``task`` node names anything else is refused at
validation, with the node and field named; so is a literal input that does not
match the entry's input JSON Schema. A templated input is checked once rendered,
when its attempt starts (the step fails with ``invalid_input``), and every start
checks the entry again: a task taken out of the catalog, or away from a plan,
is not called any more by workflows written before.

Ductor's own tasks (``ductor.*``) and Celery's (``celery.*``) are never in the
catalog. Entries are cached per process for ``CACHE_TTL_S``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
from cachetools import TTLCache
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from ductor_project.core.context import current_tenant
from tenants.entitlements import effective_entitlements
from workflows.models import TaskCatalogEntry

# A Celery task name: dotted identifiers (``billing.tasks.charge``).
TASK_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MAX_TASK_NAME = 200
RESERVED_PREFIXES = ("ductor.", "celery.")
CACHE_TTL_S = 2.0

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
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"is not a valid JSON Schema: {exc.message}"
    return None


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
    if found is None or not found.enabled:
        return TaskCheck(None, f"task '{name}' is not in the task catalog")
    if not _allowed(found):
        plan = effective_entitlements(current_tenant()).plan
        return TaskCheck(None, f"task '{name}' is not available to this tenant (plan '{plan}')")
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


def input_problem(found: TaskCatalogEntry, value: Any) -> tuple[str, str] | None:
    """Why ``value`` cannot be the task's input: ``(field path under input, message)``, or None."""
    if found.arguments == TaskCatalogEntry.Arguments.KWARGS and not isinstance(value, Mapping):
        return "", "must be an object: the task takes it as keyword arguments"
    if not found.input_schema:
        return None
    validator = jsonschema.validators.validator_for(found.input_schema)(found.input_schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    path = ".".join(str(part) for part in error.absolute_path)
    return path, error.message[:300]


def timeout_s(found: TaskCatalogEntry | None, node_timeout: float | None, default: float) -> float:
    """A task step's timeout (its lease): the node's, else the entry's, else ``default``."""
    if node_timeout:
        return float(node_timeout)
    if found is not None and found.timeout_s:
        return float(found.timeout_s)
    return default
