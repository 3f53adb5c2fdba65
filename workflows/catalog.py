"""The task catalog: which of the team's Celery tasks tenants may call as ``task`` nodes.

The platform keeps it (``TaskCatalogEntry``: the API's ``/task-catalog``, the
admin); a tenant sees and calls only the entries its plan or slug is allowed
(``/tasks``). A spec whose ``task`` node names anything else is refused at
validation, with the node and field named, and with the same words whether the
task is not in the catalog at all or only not open to this tenant (a tenant
learns nothing of the tasks of others); so is a literal input that does not
match the entry's input JSON Schema (each field that does not, up to
``schemas.MAX_INPUT_PROBLEMS``). A templated input is checked once rendered,
when its attempt starts (the step fails with ``invalid_input``), and every start
checks the entry again: a task taken out of the catalog, or away from a plan,
is not called any more by workflows written before.

Ductor's own tasks (``ductor.*``) and Celery's (``celery.*``) are never in the
catalog. What the API answers (``/tasks``, a spec's validation) is read from the
database, so a change applies there at once; an attempt's start reads the entry
as its process cached it, at most ``CACHE_TTL_S`` before (a change made in that
process applies at once).

An input schema is self-contained (``workflows.schemas``): its references
(``$ref``) resolve within it, or to a JSON Schema draft's own meta-schema, and
nothing is ever fetched (an entry whose references do not resolve is refused;
one stored before that rule refuses every input, with the reason).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from ductor_project.core.context import current_tenant
from tenants.entitlements import effective_entitlements
from workflows.models import TaskCatalogEntry
from workflows.schemas import TextHole, value_problems

# A Celery task name: dotted identifiers (``billing.tasks.charge``).
TASK_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MAX_TASK_NAME = 200
RESERVED_PREFIXES = ("ductor.", "celery.")
CACHE_TTL_S = 2.0

_cache: TTLCache[str, TaskCatalogEntry | None] = TTLCache(maxsize=4096, ttl=CACHE_TTL_S)
_queues: TTLCache[str, tuple[TaskCatalogEntry, ...]] = TTLCache(maxsize=1024, ttl=CACHE_TTL_S)
_lock = threading.Lock()


def name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be a catalog task's name, or None."""
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name) or len(name) > MAX_TASK_NAME:
        return f"must be a Celery task name: dotted identifiers, at most {MAX_TASK_NAME} characters"
    if name.startswith(RESERVED_PREFIXES):
        return "names an internal task (ductor.*, celery.*), which is never callable"
    return None


def entry(name: str, *, fresh: bool = False) -> TaskCatalogEntry | None:
    """The catalog entry ``name`` (enabled or not), as this process read it at most
    ``CACHE_TTL_S`` ago; with ``fresh``, as the database has it now."""
    with _lock:
        if name in _cache and not fresh:
            return _cache[name]
    found = TaskCatalogEntry.objects.filter(name=name).first()
    with _lock:
        _cache[name] = found
    return found


@receiver([post_save, post_delete], sender=TaskCatalogEntry)
def _entry_changed(sender: Any, instance: TaskCatalogEntry, **kwargs: Any) -> None:
    with _lock:
        _cache.pop(instance.name, None)
        _queues.clear()  # its queue may have been another


def _allowed(found: TaskCatalogEntry) -> bool:
    tenant = current_tenant()
    return found.allows(plan=effective_entitlements(tenant).plan, slug=tenant.slug)


def visible() -> list[TaskCatalogEntry]:
    """The enabled entries the tenant in context may call, by name."""
    return [found for found in TaskCatalogEntry.objects.filter(enabled=True).order_by("name") if _allowed(found)]


def kept_for_others(queue: str) -> bool:
    """Whether the team's ``queue`` (on Ductor's own broker) is kept for other tenants: enabled
    catalog entries send their tasks there, and the tenant in context may call none of them. A
    tenant's celery connection may name any other queue; this one takes none of its tasks, which
    would run on workers the platform keeps for the tenants those entries are open to. Read as
    ``entry`` is (at most ``CACHE_TTL_S`` old)."""
    with _lock:
        found = _queues.get(queue)
    if found is None:
        found = tuple(TaskCatalogEntry.objects.filter(queue=queue, enabled=True))
        with _lock:
            _queues[queue] = found
    return bool(found) and not any(_allowed(entry) for entry in found)


@dataclass(frozen=True)
class TaskCheck:
    """A task the tenant in context may call now, or why not (``problem``)."""

    entry: TaskCatalogEntry | None
    problem: str = ""


def callable_task(name: str, *, fresh: bool = False) -> TaskCheck:
    """Whether the tenant in context may call the task ``name``: its entry, or the problem (``fresh``:
    as ``entry``)."""
    problem = name_problem(name)
    if problem:
        return TaskCheck(None, problem)
    found = entry(name, fresh=fresh)
    if found is None or not _allowed(found):  # in words that do not tell whether it exists
        return TaskCheck(None, f"task '{name}' is not in the task catalog (GET /api/v1/tasks lists those "
                               f"this tenant may call)")
    return TaskCheck(found)


def is_reference(value: Any) -> bool:
    """Whether a template's string refers to something (it does not render as itself)."""
    return isinstance(value, str) and ((value.startswith("$") and not value.startswith("$$")) or "{{" in value)


def known_part(value: Any, path: tuple[str | int, ...] = ()) -> tuple[Any, list[tuple[str | int, ...]]]:
    """A template with each of its references as null (an interpolated string as ``""``), and their
    paths (``("order",)``; ``()``: the template is one), in order; an interpolated string's is a
    ``TextHole``, as what it renders is a string whatever it holds."""
    if is_reference(value):
        if value.startswith("$") and not value.startswith("$$"):
            return None, [path]
        return "", [TextHole(path)]
    holes: list[tuple[str | int, ...]] = []
    if isinstance(value, Mapping):
        known: dict[str, Any] = {}
        for key, item in value.items():
            known[key], found = known_part(item, (*path, key))
            holes += found
        return known, holes
    if isinstance(value, list):
        items = []
        for index, item in enumerate(value):
            part, found = known_part(item, (*path, index))
            items.append(part)
            holes += found
        return items, holes
    return value, holes


def input_problems(found: TaskCatalogEntry, value: Any,
                   unknown: Collection[tuple[str | int, ...]] = ()) -> list[tuple[str, str]]:
    """Why ``value`` cannot be the task's input: ``(field path under input, message)`` for each field
    that does not match (the first ``MAX_INPUT_PROBLEMS``, one message each); [] when it can. The
    values at the ``unknown`` paths are not known yet (templates): only what they cannot change counts."""
    if found.arguments == TaskCatalogEntry.Arguments.KWARGS and not isinstance(value, Mapping):
        return [("", "must be an object: the task takes it as keyword arguments")]
    if not found.input_schema:
        return []
    return value_problems(found.input_schema, value, owner="the task's input schema",
                          fix="the platform must fix its catalog entry", unknown=unknown)


def timeout_s(found: TaskCatalogEntry | None, node_timeout: float | None, default: float) -> float:
    """A task step's timeout (its lease): the node's, else the entry's, else ``default``."""
    if node_timeout:
        return float(node_timeout)
    if found is not None and found.timeout_s:
        return float(found.timeout_s)
    return default
