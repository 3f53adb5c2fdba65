"""The workflow spec's JSON Schema, as OpenAPI 3.0 components: the format ``workflows.spec`` parses.

``spec_components()`` returns ``WorkflowSpec`` and every schema it refers to: one per node type
(``ActionNode``, ``TaskNode``, ``SleepNode``, ``WaitForEventNode``, ``SubworkflowNode``,
``ContinueAsNewNode``),
combined in ``WorkflowNode`` with ``oneOf`` and a ``discriminator`` on ``type``, and the parts
they share (``NodeRetry``, ``NodeWhen`` and its conditions). ``SpecField`` is the serializer field
whose schema it is.

The bounds are the parser's own constants, so the two cannot drift apart by a number. The
schema refuses no spec the parser accepts, so a stored spec is valid against it (but for one
quirk of the parser: its ``$``-anchored patterns let a newline stand before a dot of a ``when`` path).
The parser checks more than a JSON Schema can say, and answers ``400 invalid`` naming the field:
unique ids, ``depends_on`` naming other nodes without a cycle, at most one ``continue_as_new``
and only as a sink, ``max_backoff_s`` at least ``backoff_s``, references to upstream nodes only,
an action that is registered, a task the tenant's plan may call, and the size and depth limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings

from ductor_project.core.openapi import ComponentJSONField, component_ref
from scheduling.serializers import PATH_SEGMENT, condition_tree
from scheduling.templates import MAX_PATH_SEGMENTS, NODE_ID
from workflows import catalog
from workflows.spec import (
    EVENT_NAME,
    FAILURE_NAME,
    MAX_ATTEMPTS,
    MAX_DELAY_S,
    MAX_LOOKBACK_S,
    MAX_NAME_LENGTH,
    MAX_NON_RETRYABLE,
    MAX_SLEEP_S,
    MAX_TIMEOUT_S,
)

SPEC = "WorkflowSpec"
NODE = "WorkflowNode"
NODE_SCHEMAS: Mapping[str, str] = {
    "action": "ActionNode",
    "task": "TaskNode",
    "sleep": "SleepNode",
    "wait_for_event": "WaitForEventNode",
    "subworkflow": "SubworkflowNode",
    "continue_as_new": "ContinueAsNewNode",
}
RETRY = "NodeRetry"
WHEN = "NodeWhen"
WHEN_ALL = "NodeWhenAll"
WHEN_ANY = "NodeWhenAny"
CONDITION = "NodeCondition"

_ID = NODE_ID.pattern.removeprefix("^").removesuffix("$")
# A condition's path: a reference of the nodes' language without its "$" (scheduling.templates).
_WHEN_PATH = (
    rf"^(?:input(?:\.{PATH_SEGMENT}){{0,{MAX_PATH_SEGMENTS - 1}}}"
    rf"|nodes\.{_ID}\.(?:status|output(?:\.{PATH_SEGMENT}){{0,{MAX_PATH_SEGMENTS - 3}}})"
    r"|run\.(?:id|root_id))$"
)
_TEMPLATE_HELP = (
    "A template: any JSON value. A string that is exactly a reference (`$input.x`, "
    "`$nodes.<id>.output.x`, `$nodes.<id>.status`, `$run.id`, `$run.root_id`) is replaced by "
    "the value it names; `{{ <reference> }}` inside a string is interpolated; `$$` escapes a "
    "leading `$`. A node may only name nodes upstream of it."
)


def _seconds(limit: float, description: str) -> dict[str, Any]:
    return {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": limit, "description": description}


def _name(description: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": MAX_NAME_LENGTH, "description": description}


def _template(description: str) -> dict[str, Any]:
    return {"description": f"{description} {_TEMPLATE_HELP}"}


def _common_properties() -> dict[str, dict[str, Any]]:
    """The fields every node has (``workflows.spec.COMMON_FIELDS``) but ``type``, which each node type sets."""
    properties: dict[str, dict[str, Any]] = {
        "id": {"type": "string", "pattern": NODE_ID.pattern, "description": "Unique in the spec."},
        "depends_on": {
            "type": "array", "items": {"type": "string", "pattern": NODE_ID.pattern}, "uniqueItems": True,
            "default": [], "description": "Ids of other nodes that must finish (succeeded or skipped) first; no cycle.",
        },
        "when": component_ref(WHEN),
        "retry": component_ref(RETRY),
        "timeout_s": _seconds(MAX_TIMEOUT_S, "Seconds an attempt may take."),
        "tags": {
            "type": "array", "items": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_LENGTH},
            "default": [], "description": "Tags routing rules can match; repeats are dropped.",
        },
        "pool": _name("The pool to route the node's steps to, unless a routing rule decides."),
    }
    return properties


def _type_properties() -> dict[str, dict[str, dict[str, Any]]]:
    """The fields of each node type (``workflows.spec.TYPE_FIELDS``)."""
    return {
        "action": {
            "action": {"type": "string", "minLength": 1, "description": "The name of a registered action."},
            "input": _template("The action's input (default `{}`)."),
        },
        "task": {
            "task": {
                "type": "string", "pattern": catalog.TASK_NAME.pattern, "maxLength": catalog.MAX_TASK_NAME,
                "description": "A Celery task of the task catalog that the tenant may call (`GET /api/v1/tasks`).",
            },
            "input": _template("The task's input (default `{}`); a literal one must match the entry's input schema."),
            "heartbeat_s": _seconds(MAX_TIMEOUT_S, "Once the task started, the most seconds between two of its "
                                    "heartbeats (`ductor_sdk.worker.heartbeat`), at most `timeout_s`: past it the "
                                    "attempt times out. Default: no heartbeat is required."),
        },
        "sleep": {
            "duration_s": _seconds(MAX_SLEEP_S, "Seconds to sleep."),
            "until": {"type": "string", "format": "date-time",
                      "description": "When to wake: an ISO 8601 time with a timezone."},
        },
        "wait_for_event": {
            "event": {"type": "string", "pattern": EVENT_NAME.pattern, "maxLength": 200,
                      "description": "The name of the event (or the signal) it waits for."},
            "key": {"type": "string", "maxLength": MAX_NAME_LENGTH,
                    "description": f"The correlation key an event must carry (default: any key). {_TEMPLATE_HELP}"},
            "lookback_s": {"type": "number", "minimum": 0, "maximum": MAX_LOOKBACK_S,
                           "description": "An event up to this many seconds older than the wait counts too "
                                          "(default 0)."},
            "default": _template("The node's output if `timeout_s` runs out first; without it the node fails "
                                 "with `wait_timed_out`."),
            "timeout_s": _seconds(MAX_SLEEP_S, "Seconds to wait at most (default: until the run ends)."),
        },
        "subworkflow": {
            "workflow": _name("The name of a workflow definition of the tenant."),
            "version": {"type": "integer", "minimum": 1, "description": "The version to run (default: the latest)."},
            "input": _template("The child run's input (default `{}`)."),
            "wait": {"type": "boolean", "default": True, "description": "Whether the node waits for the child run."},
        },
        "continue_as_new": {
            "input": _template("The successor run's input (default `{}`)."),
        },
    }


_REQUIRED: Mapping[str, tuple[str, ...]] = {"action": ("action",), "task": ("task",), "wait_for_event": ("event",),
                                             "subworkflow": ("workflow",)}
_DESCRIPTIONS: Mapping[str, str] = {
    "action": "Runs a registered action with its rendered input.",
    "task": "Calls a Celery task of the task catalog with its rendered input.",
    "sleep": "Waits `duration_s` seconds, or until `until`: exactly one of the two.",
    "wait_for_event": "Waits, holding no worker, for an event of its name and correlation key (its payload is the "
                      "output), or a signal of its name sent to the run, or its timeout.",
    "subworkflow": "Starts a run of another workflow (a child run), and waits for it unless `wait` is false.",
    "continue_as_new": "Ends the run and starts a successor run of the same workflow. At most one per spec, "
                       "and no node may depend on it.",
}


def _node(node_type: str, common: dict[str, dict[str, Any]], own: dict[str, dict[str, Any]]) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "description": _DESCRIPTIONS[node_type],
        "required": ["id", "type", *_REQUIRED.get(node_type, ())],
        "properties": {"id": common["id"], "type": {"type": "string", "enum": [node_type]},
                       **{name: value for name, value in common.items() if name != "id"}, **own},
        "additionalProperties": False,
    }
    if node_type == "sleep":
        # Exactly one of the two, said as "not both, nor neither": a ``oneOf`` here would make
        # client generators read the node as a union of two untyped objects.
        either = {"anyOf": [{"required": ["duration_s"]}, {"required": ["until"]}]}
        schema["not"] = {"anyOf": [{"required": ["duration_s", "until"]}, {"not": either}]}
    return schema


def _retry() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "How failed attempts are retried: exponential backoff from `backoff_s`, capped at "
                       "`max_backoff_s`; with `jitter`, each delay is drawn from its upper half.",
        "properties": {
            "max_attempts": {"type": "integer", "minimum": 1, "maximum": MAX_ATTEMPTS, "default": 1},
            "backoff_s": _seconds(MAX_DELAY_S, "The first delay, in seconds (default 1)."),
            "max_backoff_s": _seconds(MAX_DELAY_S, "The longest delay, in seconds: at least `backoff_s` "
                                                   "(default 300, or `backoff_s` if larger)."),
            "jitter": {"type": "boolean", "default": True},
            "non_retryable": {
                "type": "array", "maxItems": MAX_NON_RETRYABLE, "default": [],
                "items": {"type": "string", "pattern": FAILURE_NAME.pattern, "maxLength": MAX_NAME_LENGTH},
                "description": "Failures that are not tried again, whatever `max_attempts`: an error code "
                               "(`timeout`, `server_error`), or a task's exception type, alone "
                               "(`CardDeclined`) or with its module (`billing.errors.CardDeclined`).",
            },
        },
        "additionalProperties": False,
    }


def _when() -> dict[str, dict[str, Any]]:
    """``NodeWhen`` (one condition, or ``all`` / ``any`` of a list of them) and its parts."""
    return condition_tree(
        (WHEN, WHEN_ALL, WHEN_ANY, CONDITION),
        "A condition, or `all` or `any` of a list of them; when it is false the node is skipped, and so is "
        "everything downstream of it.",
        {"type": "string", "pattern": _WHEN_PATH,
         "description": "A reference without its `$`: `input.<path>`, `nodes.<id>.output.<path>`, "
                        "`nodes.<id>.status`, `run.id` or `run.root_id`."})


def spec_components() -> dict[str, dict[str, Any]]:
    """``WorkflowSpec`` and the component schemas it refers to, by name. Reads the spec
    settings (``DUCTOR_MAX_SPEC_NODES``) when called; pure otherwise."""
    common, by_type = _common_properties(), _type_properties()
    components: dict[str, dict[str, Any]] = {
        SPEC: {
            "type": "object",
            "description": "A workflow: its nodes (a DAG) and its output. Unknown fields are refused, here and "
                           f"in every node; the spec is nested at most {settings.DUCTOR_MAX_SPEC_DEPTH} levels "
                           "deep and no larger than the plan's payload limit.",
            "required": ["nodes"],
            "properties": {
                "nodes": {"type": "array", "items": component_ref(NODE), "minItems": 1,
                          "maxItems": settings.DUCTOR_MAX_SPEC_NODES},
                "output": _template("The run's output (null when absent)."),
                "input_schema": {
                    "type": "object",
                    "description": "A JSON Schema (draft 2020-12 unless its `$schema` names 2019-09, 7 or 6; "
                                   "self-contained: its `$ref`s resolve within it) every run's input must match. "
                                   "A start, a rerun or a bulk item whose input does not is a 400 naming each "
                                   "field (`input.qty`); a sub-workflow or ContinueAsNew step fails with "
                                   "`invalid_input`. Absent: any input.",
                    "additionalProperties": True,
                },
                "timeout_s": _seconds(MAX_SLEEP_S, "How long a run may take, from its start (or its retry): one "
                                                   "still going then fails with `run_timed_out`, its active steps "
                                                   "and child runs cancelled. Absent: no bound."),
            },
            "additionalProperties": False,
        },
        NODE: {
            "description": "A node of the workflow, by its `type`.",
            "oneOf": [component_ref(name) for name in NODE_SCHEMAS.values()],
            "discriminator": {
                "propertyName": "type",
                "mapping": {kind: component_ref(name)["$ref"] for kind, name in NODE_SCHEMAS.items()},
            },
        },
        RETRY: _retry(),
        **_when(),
    }
    for node_type, name in NODE_SCHEMAS.items():
        components[name] = _node(node_type, common, by_type[node_type])
    return components


class SpecField(ComponentJSONField):
    """A workflow spec: a ``JSONField`` whose schema is ``WorkflowSpec``."""

    component = SPEC

    @classmethod
    def components(cls) -> dict[str, dict[str, Any]]:
        return spec_components()
