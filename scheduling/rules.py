"""Routing rules: validation and safe evaluation (no ``eval``, no regex from tenants).

A rule's ``match`` is a dict with any of:
- ``workflow``: a glob on the workflow name (``billing.*``);
- ``action``: a glob on the action name (``http.*``);
- ``tags``: tags that must all be present on the step;
- ``conditions``: ``[{"path": "input.customer.tier", "op": "eq", "value": "gold"}, ...]``,
  conditions of ``scheduling.templates`` on the step (``input.…``, ``workflow``,
  ``action``), all of which must hold.

A rule's ``action`` sets any of ``pool`` (a pool name of the tenant), ``tier``
(a tier the plan allows), ``partition_key`` (a template of
``scheduling.templates`` such as ``"customer-{{ $input.customer.id }}"``) and
``fairness_key`` (a template too: the step's fairness key inside the tenant,
the fair queue's second level), or is ``{"deny": "reason"}`` alone. Both are stored normalized: the deprecated forms
``templates`` accepts (a condition path without its ``input.`` root, a
partition key with ``{input.x}`` placeholders) are stored in the current form.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ductor_project.core.bounds import MAX_KEY_CHARS, MAX_NAME_CHARS, MAX_REASON_CHARS, MAX_TAG_CHARS, MAX_TAGS
from scheduling.templates import (
    MAX_CONDITIONS,
    ROUTING,
    FieldError,
    condition_holds,
    render_text,
    template_errors,
    upgrade_legacy_placeholders,
    validate_condition,
)

MATCH_KEYS = ("workflow", "action", "tags", "conditions")
ACTION_KEYS = ("pool", "tier", "partition_key", "fairness_key", "deny")
# The key templates of an action: a step's partition (its serialization domain) and its fairness key.
KEY_TEMPLATES = ("partition_key", "fairness_key")
MAX_PARTITION_KEY = MAX_KEY_CHARS
MAX_GLOB_CHARS = MAX_KEY_CHARS
_GLOB = re.compile(rf"^[A-Za-z0-9_.:/\-*?\[\]!]{{1,{MAX_GLOB_CHARS}}}$")


def _check_glob(name: str, value: Any) -> str:
    if not isinstance(value, str) or not _GLOB.match(value):
        raise FieldError(name, "must be a glob of letters, digits, '._-:/' and wildcards '*?[]!'")
    depth = 0
    for char in value:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise FieldError(name, "has unbalanced brackets")
    if depth:
        raise FieldError(name, "has unbalanced brackets")
    return value


def _check_conditions(conditions: Any) -> list[dict[str, Any]]:
    if not isinstance(conditions, list) or len(conditions) > MAX_CONDITIONS:
        raise FieldError("match.conditions", f"must be a list of at most {MAX_CONDITIONS} conditions")
    return [validate_condition(f"match.conditions[{i}]", cond, ROUTING, legacy_root="input")
            for i, cond in enumerate(conditions)]


def _check_tags(tags: Any) -> list[str]:
    if not isinstance(tags, list) or len(tags) > MAX_TAGS:
        raise FieldError("match.tags", f"must be a list of at most {MAX_TAGS} tags")
    for index, tag in enumerate(tags):
        if not isinstance(tag, str) or not tag or len(tag) > MAX_TAG_CHARS:
            raise FieldError(f"match.tags[{index}]", f"must be a non-empty string of at most {MAX_TAG_CHARS} "
                                                     "characters")
    return sorted(set(tags))


def validate_match(match: Any) -> dict[str, Any]:
    """A normalized copy of ``match``; raises ``FieldError`` naming the bad field."""
    if not isinstance(match, Mapping):
        raise FieldError("match", "must be an object")
    unknown = set(match) - set(MATCH_KEYS)
    if unknown:
        raise FieldError(f"match.{sorted(unknown)[0]}", f"unknown field; use {', '.join(MATCH_KEYS)}")
    clean: dict[str, Any] = {}
    for key in ("workflow", "action"):
        if key in match:
            clean[key] = _check_glob(f"match.{key}", match[key])
    if "tags" in match:
        clean["tags"] = _check_tags(match["tags"])
    if "conditions" in match:
        clean["conditions"] = _check_conditions(match["conditions"])
    return clean


def validate_partition_key(template: Any, field: str = "partition_key") -> str:
    """A key template of the routing language (``action.partition_key`` or ``action.fairness_key``),
    normalized; raises ``FieldError``. Bounded as it is stored, its deprecated placeholders rewritten:
    what a rule answers can be sent back as it is."""
    name = f"action.{field}"
    if not isinstance(template, str) or not template.strip() or len(template) > MAX_PARTITION_KEY:
        raise FieldError(name, f"must be a template string of at most {MAX_PARTITION_KEY} characters")
    template = upgrade_legacy_placeholders(name, template)
    if len(template) > MAX_PARTITION_KEY:
        raise FieldError(name, f"is stored with each {{…}} placeholder as {{{{ $… }}}}, which must be at most "
                               f"{MAX_PARTITION_KEY} characters, not {len(template)}")
    errors = template_errors(template, field=name, language=ROUTING)
    if errors:
        raise FieldError(name, errors[0][1])
    return template


def validate_action(action: Any, *, allowed_tiers: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """A normalized copy of ``action``; raises ``FieldError`` naming the bad field.

    Checks shapes and that a tier is one the plan allows; the pool name is
    checked against the tenant's pools by the caller.
    """
    if not isinstance(action, Mapping) or not action:
        raise FieldError("action", "must be an object with pool, tier, partition_key, fairness_key or deny")
    unknown = set(action) - set(ACTION_KEYS)
    if unknown:
        raise FieldError(f"action.{sorted(unknown)[0]}", f"unknown field; use {', '.join(ACTION_KEYS)}")
    if "deny" in action:
        if len(action) > 1:
            raise FieldError("action.deny", "a deny rule cannot also route")
        reason = action["deny"].strip() if isinstance(action["deny"], str) else ""
        if not reason or len(reason) > MAX_REASON_CHARS:
            raise FieldError("action.deny", f"must be a non-empty reason of at most {MAX_REASON_CHARS} characters")
        return {"deny": reason}
    clean: dict[str, Any] = {}
    if "pool" in action:
        pool = action["pool"]
        if not isinstance(pool, str) or not pool or len(pool) > MAX_NAME_CHARS:
            raise FieldError("action.pool", f"must be a pool name (at most {MAX_NAME_CHARS} characters)")
        clean["pool"] = action["pool"]
    if "tier" in action:
        if action["tier"] not in allowed_tiers:
            raise FieldError("action.tier", f"must be a tier your plan allows: {', '.join(allowed_tiers)}")
        clean["tier"] = action["tier"]
    for name in KEY_TEMPLATES:
        if name in action:
            clean[name] = validate_partition_key(action[name], name)
    return clean


@dataclass(frozen=True)
class Step:
    """What routing knows of a step: its workflow, action, tags and input."""

    workflow: str
    action: str
    tags: tuple[str, ...] = ()
    input: Any = field(default_factory=dict)
    tier: str | None = None
    pool: str | None = None

    def context(self) -> dict[str, Any]:
        """What the routing language's references read: ``input``, ``workflow``, ``action``."""
        return {"input": self.input, "workflow": self.workflow, "action": self.action}


def matches(match: Mapping[str, Any], step: Step) -> bool:
    """Whether a validated ``match`` fits ``step``. Pure; no I/O."""
    if "workflow" in match and not fnmatch.fnmatchcase(step.workflow, match["workflow"]):
        return False
    if "action" in match and not fnmatch.fnmatchcase(step.action, match["action"]):
        return False
    if "tags" in match and not set(match["tags"]).issubset(step.tags):
        return False
    conditions = match.get("conditions", ())
    if not conditions:
        return True
    context = step.context()
    return all(condition_holds(cond, context) for cond in conditions)


def render_partition_key(template: str, step: Step) -> str:
    """Fill a validated key template from the step (missing values become '')."""
    return render_text(template, step.context())[:MAX_PARTITION_KEY]
