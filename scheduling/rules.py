"""Routing rules: validation and safe evaluation (no ``eval``, no regex from tenants).

A rule's ``match`` is a dict with any of:
- ``workflow``: a glob on the workflow name (``billing.*``);
- ``action``: a glob on the action name (``http.*``);
- ``tags``: tags that must all be present on the step;
- ``conditions``: ``[{"path": "customer.tier", "op": "eq", "value": "gold"}, ...]``
  on the step input, all of which must hold. Operators: ``eq``, ``ne``, ``in``,
  ``exists``, ``prefix``, ``gt``, ``lt``.

A rule's ``action`` sets any of ``pool`` (a pool name of the tenant), ``tier``
(a tier the plan allows) and ``partition_key`` (a template such as
``"customer-{input.customer.id}"``), or is ``{"deny": "reason"}`` alone.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

OPERATORS = ("eq", "ne", "in", "exists", "prefix", "gt", "lt")
MATCH_KEYS = ("workflow", "action", "tags", "conditions")
ACTION_KEYS = ("pool", "tier", "partition_key", "deny")
MAX_CONDITIONS = 20
_GLOB = re.compile(r"^[A-Za-z0-9_.:/\-*?\[\]!]{1,200}$")
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+){0,9}$")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_MISSING = object()


class RuleError(ValueError):
    """An invalid rule. ``field`` is the dotted name of the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _check_glob(name: str, value: Any) -> str:
    if not isinstance(value, str) or not _GLOB.match(value):
        raise RuleError(name, "must be a glob of letters, digits, '._-:/' and wildcards '*?[]!'")
    depth = 0
    for char in value:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise RuleError(name, "has unbalanced brackets")
    if depth:
        raise RuleError(name, "has unbalanced brackets")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def validate_condition(name: str, cond: Any) -> dict[str, Any]:
    if not isinstance(cond, Mapping):
        raise RuleError(name, "must be an object with path, op and value")
    unknown = set(cond) - {"path", "op", "value"}
    if unknown:
        raise RuleError(f"{name}.{sorted(unknown)[0]}", "unknown field")
    path, op = cond.get("path"), cond.get("op")
    if not isinstance(path, str) or not _PATH.match(path):
        raise RuleError(f"{name}.path", "must be a dotted path such as 'customer.id'")
    if op not in OPERATORS:
        raise RuleError(f"{name}.op", f"unknown operator; use one of {', '.join(OPERATORS)}")
    value = cond.get("value", _MISSING)
    if op == "exists":
        value = True if value is _MISSING else value
        if not isinstance(value, bool):
            raise RuleError(f"{name}.value", "must be true or false for 'exists'")
    elif value is _MISSING:
        raise RuleError(f"{name}.value", f"is required for '{op}'")
    elif op == "in" and not isinstance(value, list):
        raise RuleError(f"{name}.value", "must be a list for 'in'")
    elif op in ("gt", "lt") and not _is_number(value):
        raise RuleError(f"{name}.value", f"must be a number for '{op}'")
    elif op == "prefix" and not isinstance(value, str):
        raise RuleError(f"{name}.value", "must be a string for 'prefix'")
    return {"path": path, "op": op, "value": value}


def validate_match(match: Any) -> dict[str, Any]:
    """A normalized copy of ``match``; raises ``RuleError`` naming the bad field."""
    if not isinstance(match, Mapping):
        raise RuleError("match", "must be an object")
    unknown = set(match) - set(MATCH_KEYS)
    if unknown:
        raise RuleError(f"match.{sorted(unknown)[0]}", f"unknown field; use {', '.join(MATCH_KEYS)}")
    clean: dict[str, Any] = {}
    for key in ("workflow", "action"):
        if key in match:
            clean[key] = _check_glob(f"match.{key}", match[key])
    if "tags" in match:
        tags = match["tags"]
        if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
            raise RuleError("match.tags", "must be a list of non-empty strings")
        clean["tags"] = sorted(set(tags))
    if "conditions" in match:
        conditions = match["conditions"]
        if not isinstance(conditions, list) or len(conditions) > MAX_CONDITIONS:
            raise RuleError("match.conditions", f"must be a list of at most {MAX_CONDITIONS} conditions")
        clean["conditions"] = [
            validate_condition(f"match.conditions[{i}]", c) for i, c in enumerate(conditions)
        ]
    return clean


def validate_action(action: Any, *, allowed_tiers: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """A normalized copy of ``action``; raises ``RuleError`` naming the bad field.

    Checks shapes and that a tier is one the plan allows; the pool name is
    checked against the tenant's pools by the caller.
    """
    if not isinstance(action, Mapping) or not action:
        raise RuleError("action", "must be an object with pool, tier, partition_key or deny")
    unknown = set(action) - set(ACTION_KEYS)
    if unknown:
        raise RuleError(f"action.{sorted(unknown)[0]}", f"unknown field; use {', '.join(ACTION_KEYS)}")
    if "deny" in action:
        if len(action) > 1:
            raise RuleError("action.deny", "a deny rule cannot also route")
        if not isinstance(action["deny"], str) or not action["deny"].strip():
            raise RuleError("action.deny", "must be a non-empty reason")
        return {"deny": action["deny"].strip()[:500]}
    clean: dict[str, Any] = {}
    if "pool" in action:
        if not isinstance(action["pool"], str) or not action["pool"]:
            raise RuleError("action.pool", "must be a pool name")
        clean["pool"] = action["pool"]
    if "tier" in action:
        if action["tier"] not in allowed_tiers:
            raise RuleError("action.tier", f"must be a tier your plan allows: {', '.join(allowed_tiers)}")
        clean["tier"] = action["tier"]
    if "partition_key" in action:
        template = action["partition_key"]
        if not isinstance(template, str) or not template or len(template) > 200:
            raise RuleError("action.partition_key", "must be a template string of at most 200 characters")
        for placeholder in _PLACEHOLDER.findall(template):
            if placeholder not in ("workflow", "action") and not (
                placeholder.startswith("input.") and _PATH.match(placeholder[len("input."):])
            ):
                hint = "use {workflow}, {action} or {input.<path>}"
                raise RuleError("action.partition_key", f"unknown placeholder '{{{placeholder}}}'; {hint}")
        clean["partition_key"] = template
    return clean


def lookup(data: Any, path: str) -> Any:
    """The value at a dotted path of nested dicts (list indexes allowed), or ``_MISSING``."""
    node = data
    for part in path.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def condition_holds(cond: Mapping[str, Any], data: Any) -> bool:
    value = lookup(data, cond["path"])
    op, expected = cond["op"], cond["value"]
    if op == "exists":
        return (value is not _MISSING) is expected
    if value is _MISSING:
        return op == "ne"
    if op == "eq":
        return bool(value == expected)
    if op == "ne":
        return bool(value != expected)
    if op == "in":
        return value in expected
    if op == "prefix":
        return isinstance(value, str) and value.startswith(expected)
    if not _is_number(value):
        return False
    return bool(value > expected) if op == "gt" else bool(value < expected)


@dataclass(frozen=True)
class Step:
    """What routing knows of a step: its workflow, action, tags and input."""

    workflow: str
    action: str
    tags: tuple[str, ...] = ()
    input: Any = field(default_factory=dict)
    tier: str | None = None
    pool: str | None = None


def matches(match: Mapping[str, Any], step: Step) -> bool:
    """Whether a validated ``match`` fits ``step``. Pure; no I/O."""
    if "workflow" in match and not fnmatch.fnmatchcase(step.workflow, match["workflow"]):
        return False
    if "action" in match and not fnmatch.fnmatchcase(step.action, match["action"]):
        return False
    if "tags" in match and not set(match["tags"]).issubset(step.tags):
        return False
    return all(condition_holds(cond, step.input) for cond in match.get("conditions", ()))


def render_partition_key(template: str, step: Step) -> str:
    """Fill a validated partition-key template from the step (missing values become '')."""

    def fill(found: re.Match[str]) -> str:
        name = found.group(1)
        if name == "workflow":
            return step.workflow
        if name == "action":
            return step.action
        value = lookup(step.input, name[len("input."):])
        return "" if value is _MISSING else str(value)

    return _PLACEHOLDER.sub(fill, template)[:200]
