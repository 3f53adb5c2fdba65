"""Workflow specs: the JSON format, its validation, and the parsed DAG the engine walks.

A spec is a JSON object::

    {
      "nodes": [
        {"id": "fetch", "type": "action", "action": "http.request",
         "input": {"path": "/users/{{ $input.user_id }}", "method": "GET"},
         "depends_on": [], "when": {"path": "input.enabled", "op": "eq", "value": true},
         "retry": {"max_attempts": 3, "backoff_s": 1.0, "max_backoff_s": 60, "jitter": true},
         "timeout_s": 30, "tags": ["crm"], "pool": "main"},
        {"id": "pause", "type": "sleep", "depends_on": ["fetch"], "duration_s": 10},
        {"id": "until", "type": "sleep", "until": "2027-01-01T00:00:00Z"},
        {"id": "child", "type": "subworkflow", "depends_on": ["fetch"], "workflow": "enrich",
         "version": 2, "input": {"user": "$nodes.fetch.output.body"}, "wait": true},
        {"id": "paid", "type": "wait_for_event", "depends_on": ["fetch"], "event": "order.paid",
         "key": "$input.order_id", "timeout_s": 86400, "default": {"paid": false}},
        {"id": "again", "type": "continue_as_new", "depends_on": ["child"],
         "input": {"cursor": "$nodes.child.output.next"}}
      ],
      "output": {"user": "$nodes.fetch.output.body", "done": true}
    }

Top level: ``nodes`` (required, 1 to ``DUCTOR_MAX_SPEC_NODES``), ``output``
(optional template; the run's output, null when absent), ``input_schema``
(optional JSON Schema, ``workflows.schemas``: every run's input must match it,
or its start is refused naming the field) and ``timeout_s`` (optional, 0 < x ≤
366 days: a run still going that long after its start fails with
``run_timed_out``).

Every node:

- ``id``: unique, ``^[a-z][a-z0-9_]{0,62}$``; ``type``: ``action``, ``task``,
  ``sleep``, ``wait_for_event``, ``subworkflow`` or ``continue_as_new``;
- ``depends_on``: ids of other nodes (default ``[]``; no self, no repeats, no cycle);
- ``when``: optional condition (see ``workflows.templates``); false skips the node;
- ``retry``: ``max_attempts`` 1..100 (default 1), ``backoff_s`` > 0 (default 1),
  ``max_backoff_s`` ≥ ``backoff_s`` (default 300, or ``backoff_s`` if larger),
  ``jitter`` (default true); delays up to 86400 s; ``non_retryable``: error codes
  or exception types whose failures are not tried again (default none);
- ``timeout_s``: optional, 0 < x ≤ 86400; ``tags``: list of strings; ``pool``: a pool name.

By type:

- ``action``: ``action`` (a name registered in ``workflows.actions``) and
  ``input`` (template, default ``{}``);
- ``task``: ``task`` (a Celery task of the team's, named in the task catalog
  and available to the tenant: ``workflows.catalog``), ``input`` (template,
  default ``{}``; a literal one must match the entry's input schema) and
  ``heartbeat_s`` (optional, ``MIN_HEARTBEAT_S`` ≤ x ≤ the node's ``timeout_s``: once
  the task started, it fails as timed out when no heartbeat came within that long);
- ``sleep``: exactly one of ``duration_s`` (0 < x ≤ 366 days) or ``until``
  (ISO 8601 with a timezone); no ``input``;
- ``wait_for_event``: ``event`` (the event or signal name it waits for), ``key``
  (optional template rendering the correlation key; none: any key), ``lookback_s``
  (optional, an event up to this much older than the wait also counts; 0 ≤ x ≤ 30
  days) and ``default`` (optional template: the output when ``timeout_s`` runs
  out, which otherwise fails the node). Its ``timeout_s`` may be up to 366 days;
  no ``input``;
- ``subworkflow``: ``workflow`` (a definition name), ``version`` (optional int ≥ 1,
  default the latest), ``input`` (template, default ``{}``), ``wait`` (default true);
- ``continue_as_new``: ``input`` (template for the successor's input, default
  ``{}``). At most one per spec, and it must be a sink: no node depends on it.

Unknown fields anywhere are rejected. A spec may be at most ``max_bytes`` long
(compact UTF-8 JSON) and nested at most ``DUCTOR_MAX_SPEC_DEPTH`` deep.

Execution semantics the engine follows (``Spec.ready_nodes``): a node is ready
when all its dependencies finished as ``succeeded`` or ``skipped``. A ready
node with a skipped dependency is skipped too (``Spec.skip_cause``): skips
propagate downstream. A failed node (after its retries) fails the run, so
nothing downstream of it starts.

Errors are collected into ``SpecError.errors``: field path → messages, e.g.
``{"nodes[1].depends_on": ["node 'b': depends_on: unknown node 'x'"]}``. All
per-node field errors are reported together; graph errors (cycles) and
template references follow when the ids are sound.
"""

from __future__ import annotations

import heapq
import json
import math
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Protocol

from django.conf import settings

from ductor_project.core.payloads import json_depth
from ductor_project.core.times import rfc3339
from scheduling import templates
from scheduling.models import Connection
from scheduling.templates import NODE_ID, template_errors, when_errors
from workflows import actions, catalog, schemas

NODE_TYPES = ("action", "task", "sleep", "wait_for_event", "subworkflow", "continue_as_new")
COMMON_FIELDS = ("id", "type", "depends_on", "when", "retry", "timeout_s", "tags", "pool")
TYPE_FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "action": ("action", "input"),
    "task": ("task", "input", "heartbeat_s"),
    "sleep": ("duration_s", "until"),
    "wait_for_event": ("event", "key", "lookback_s", "default"),
    "subworkflow": ("workflow", "version", "input", "wait"),
    "continue_as_new": ("input",),
})
RETRY_FIELDS = ("max_attempts", "backoff_s", "max_backoff_s", "jitter", "non_retryable")
# What ``retry.non_retryable`` names: an error code, or an exception's type (``CardDeclined``, or with
# its module, ``billing.errors.CardDeclined``).
FAILURE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MAX_NON_RETRYABLE = 50
TOP_FIELDS = ("nodes", "output", "input_schema", "timeout_s")
MAX_ATTEMPTS = 100
MAX_DELAY_S = 86_400.0
MAX_TIMEOUT_S = 86_400.0
# The shortest ``heartbeat_s``: a task sends its heartbeats at most once per third of it, each a
# message on ``ductor.results``, the Celery queue every tenant's task outcomes share outside the
# fair queue. Shorter, it let a tenant lift the SDK's bound on a task's heartbeats (a task that
# calls ``heartbeat()`` for each chunk of its work sent one per call), and its tasks' heartbeats
# held up the outcomes of every other tenant's tasks behind them.
MIN_HEARTBEAT_S = 1.0
MAX_SLEEP_S = 366 * 86_400.0
MAX_LOOKBACK_S = 30 * 86_400.0
# An event name: what ``POST /api/v1/events`` takes.
EVENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}$")
MAX_NAME_LENGTH = 200

PENDING, SUCCEEDED, SKIPPED, FAILED = "pending", "succeeded", "skipped", "failed"
FINISHED_OK = frozenset({SUCCEEDED, SKIPPED})


def _in_utc_range(moment: datetime) -> bool:
    """Whether the aware ``moment`` is a time in UTC that a ``datetime`` holds (and PostgreSQL gives
    back): ``9999-12-31T23:59:59-14:00`` is in the year 10000 there."""
    try:
        moment.astimezone(UTC)
    except OverflowError:
        return False
    return True


class SpecError(ValueError):
    """An invalid spec. ``errors`` maps field paths (``nodes[2].depends_on``, ``output``, ``spec``) to messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        messages = [message for group in errors.values() for message in group]
        more = f" (and {len(messages) - 1} more)" if len(messages) > 1 else ""
        super().__init__(f"{messages[0]}{more}" if messages else "invalid spec")


class CycleError(ValueError):
    """The graph has a cycle; ``cycle`` lists it in execution order, first node repeated at the end."""

    def __init__(self, cycle: list[str]) -> None:
        self.cycle = cycle
        super().__init__("cycle: " + " → ".join(cycle))


@dataclass(frozen=True)
class Retry:
    max_attempts: int = 1
    backoff_s: float = 1.0
    max_backoff_s: float = 300.0
    jitter: bool = True
    non_retryable: tuple[str, ...] = ()  # failures no attempt is tried again after (``retries``)

    def retries(self, error: Mapping[str, Any] | None) -> bool:
        """Whether a failed attempt's ``error`` may be tried again: it says it is retryable, and
        ``non_retryable`` names neither its code nor its exception's type (with or without its
        module). The number of attempts left is for the caller to count."""
        error = error or {}
        if not error.get("retryable"):
            return False
        found = error.get("exception")
        exception: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        kind, module = str(exception.get("type") or ""), str(exception.get("module") or "")
        names = {str(error.get("code") or ""), kind, f"{module}.{kind}" if module and kind else ""} - {""}
        return not names & set(self.non_retryable)


@dataclass(frozen=True)
class Node:
    """A validated node with defaults filled. Templates (``input``) are plain JSON: treat them as read-only."""

    id: str
    type: str
    index: int  # position in the submitted ``nodes`` list, for error messages
    depends_on: tuple[str, ...] = ()
    input: Any = None  # a template; None only for sleep and wait_for_event
    when: Mapping[str, Any] | None = None
    retry: Retry = field(default_factory=Retry)
    timeout_s: float | None = None
    tags: tuple[str, ...] = ()
    pool: str | None = None
    action: str | None = None
    task: str | None = None
    heartbeat_s: float | None = None
    duration_s: float | None = None
    until: datetime | None = None
    workflow: str | None = None
    version: int | None = None
    wait: bool = True
    event: str | None = None
    key: Any = None  # a template
    lookback_s: float | None = None
    default: Any = None  # a template
    has_default: bool = False
    upstream: frozenset[str] = frozenset()  # transitive dependencies
    dependents: tuple[str, ...] = ()  # direct dependents, in topological order

    def to_dict(self) -> dict[str, Any]:
        """The normalized JSON form of this node (defaults filled)."""
        data: dict[str, Any] = {"id": self.id, "type": self.type, "depends_on": list(self.depends_on)}
        if self.when is not None:
            data["when"] = self.when
        data["retry"] = {
            "max_attempts": self.retry.max_attempts,
            "backoff_s": self.retry.backoff_s,
            "max_backoff_s": self.retry.max_backoff_s,
            "jitter": self.retry.jitter,
        }
        if self.retry.non_retryable:
            data["retry"]["non_retryable"] = list(self.retry.non_retryable)
        if self.timeout_s is not None:
            data["timeout_s"] = self.timeout_s
        data["tags"] = list(self.tags)
        if self.pool is not None:
            data["pool"] = self.pool
        if self.type == "action":
            data["action"] = self.action
        if self.type == "task":
            data["task"] = self.task
            if self.heartbeat_s is not None:
                data["heartbeat_s"] = self.heartbeat_s
        if self.type == "sleep":
            if self.duration_s is not None:
                data["duration_s"] = self.duration_s
            if self.until is not None:
                data["until"] = self.until.isoformat()
        if self.type == "subworkflow":
            data["workflow"] = self.workflow
            if self.version is not None:
                data["version"] = self.version
            data["wait"] = self.wait
        if self.type == "wait_for_event":
            data["event"] = self.event
            if self.key is not None:
                data["key"] = self.key
            if self.lookback_s is not None:
                data["lookback_s"] = self.lookback_s
            if self.has_default:
                data["default"] = self.default
        if self.type not in ("sleep", "wait_for_event"):
            data["input"] = self.input
        return data


@dataclass(frozen=True)
class Spec:
    """A validated spec: nodes in topological order (ties keep the submitted order)."""

    nodes: tuple[Node, ...]
    output: Any = None  # a template; None when the spec has none
    input_schema: Mapping[str, Any] | None = None  # what a run's input must match; None: anything
    timeout_s: float | None = None  # how long a run may take, from its start; None: no bound
    sinks: tuple[str, ...] = ()  # nodes nothing depends on, in topological order
    continue_as_new: str | None = None  # the id of the continue_as_new node, if any
    size_bytes: int = field(default=0, compare=False)  # compact JSON size of the submitted spec
    by_id: Mapping[str, Node] = field(default_factory=dict, repr=False, compare=False)

    def node(self, node_id: str) -> Node:
        """The node ``node_id``; ``KeyError`` if there is none."""
        return self.by_id[node_id]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(node.id for node in self.nodes)

    def ready_nodes(self, statuses: Mapping[str, str]) -> list[str]:
        """Nodes not started yet (absent from ``statuses`` or ``pending``) whose dependencies all
        ``succeeded`` or were ``skipped``, in topological order. Pure.

        The caller then skips a ready node with a skipped dependency (``skip_cause``) or a
        false ``when``, and starts the others.
        """
        return [
            node.id
            for node in self.nodes
            if statuses.get(node.id, PENDING) == PENDING
            and all(statuses.get(dep) in FINISHED_OK for dep in node.depends_on)
        ]

    def skip_cause(self, node_id: str, statuses: Mapping[str, str]) -> str | None:
        """The first dependency of ``node_id`` that was skipped or failed (so it must be skipped), or None."""
        for dep in self.by_id[node_id].depends_on:
            if statuses.get(dep) in (SKIPPED, FAILED):
                return dep
        return None

    def downstream(self, node_id: str) -> tuple[str, ...]:
        """Every node that depends on ``node_id``, directly or transitively, in topological order."""
        self.by_id[node_id]
        return tuple(node.id for node in self.nodes if node_id in node.upstream)

    def is_finished(self, statuses: Mapping[str, str]) -> bool:
        """Whether every node succeeded or was skipped."""
        return all(statuses.get(node.id) in FINISHED_OK for node in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        """The normalized JSON form (nodes in topological order, defaults filled); it validates to an equal Spec."""
        data: dict[str, Any] = {"nodes": [node.to_dict() for node in self.nodes]}
        if self.output is not None:
            data["output"] = self.output
        if self.input_schema is not None:
            data["input_schema"] = self.input_schema
        if self.timeout_s is not None:
            data["timeout_s"] = self.timeout_s
        return data


class _Uniform(Protocol):
    def uniform(self, a: float, b: float, /) -> float: ...


def backoff_delay(retry: Retry | Mapping[str, Any], attempt: int, *, rng: _Uniform = random) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based) before the next one.

    Exponential: ``backoff_s * 2**(attempt - 1)`` capped at ``max_backoff_s``. With
    ``jitter`` the delay is drawn uniformly from ``[delay / 2, delay]`` ("equal
    jitter"): it spreads retries of many runs apart like full jitter does, but keeps a
    floor of half the delay so a retry never fires at once. Never exceeds ``max_backoff_s``.
    """
    if isinstance(retry, Mapping):
        retry = Retry(**{key: retry[key] for key in RETRY_FIELDS if key in retry})
    exponent = min(max(attempt, 1) - 1, 64)
    delay = min(float(retry.backoff_s) * 2.0**exponent, float(retry.max_backoff_s))
    if not retry.jitter:
        return delay
    return min(max(rng.uniform(delay / 2, delay), delay / 2), delay)


# -- graph --------------------------------------------------------------------------------------


def topological_order(dependencies: Mapping[str, Iterable[str]]) -> list[str]:
    """The ids of ``dependencies`` (id → ids it depends on) so each comes after its dependencies.

    Stable: among ready nodes the mapping's order wins. Dependencies that are not keys are
    ignored. Raises ``CycleError`` naming one real cycle. O(nodes + edges).
    """
    order_of = {node_id: index for index, node_id in enumerate(dependencies)}
    deps = {node_id: [d for d in dict.fromkeys(ds) if d in order_of] for node_id, ds in dependencies.items()}
    dependents: dict[str, list[str]] = {node_id: [] for node_id in deps}
    missing = {node_id: len(ds) for node_id, ds in deps.items()}
    for node_id, ds in deps.items():
        for dep in ds:
            dependents[dep].append(node_id)
    heap = [order_of[node_id] for node_id, count in missing.items() if count == 0]
    heapq.heapify(heap)
    ids = list(order_of)
    order: list[str] = []
    while heap:
        node_id = ids[heapq.heappop(heap)]
        order.append(node_id)
        for child in dependents[node_id]:
            missing[child] -= 1
            if missing[child] == 0:
                heapq.heappush(heap, order_of[child])
    if len(order) < len(ids):
        raise CycleError(_find_cycle({n for n, count in missing.items() if count > 0}, deps, order_of))
    return order


def _find_cycle(stuck: set[str], deps: Mapping[str, list[str]], order_of: Mapping[str, int]) -> list[str]:
    # Every stuck node has a stuck dependency, so walking dependencies backwards must loop.
    current = min(stuck, key=order_of.__getitem__)
    seen: dict[str, int] = {}
    walk: list[str] = []
    while current not in seen:
        seen[current] = len(walk)
        walk.append(current)
        current = next(dep for dep in deps[current] if dep in stuck)
    loop = walk[seen[current]:]
    loop.reverse()  # execution order: dependency → dependent
    start = min(range(len(loop)), key=lambda i: order_of[loop[i]])
    loop = loop[start:] + loop[:start]
    return [*loop, loop[0]]


# -- validation ---------------------------------------------------------------------------------


class _Errors:
    """Collects messages by field path, in the order they were found."""

    def __init__(self) -> None:
        self.items: dict[str, list[str]] = {}

    def add(self, key: str, message: str) -> None:
        self.items.setdefault(key, []).append(message)

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            raise SpecError(self.items)


def _is_number(value: Any) -> bool:
    """A finite number, not a boolean. A whole number past what a float holds (``10**400``, which
    JSON can spell) is none: no limit or float conversion could take it."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def seconds_text(value: float) -> str:
    """A number of seconds as the docs write it: ``31622400``, ``0.5``; never ``3.16224e+07``."""
    return str(int(value)) if float(value).is_integer() else f"{value:.15g}"


def _label(fields: Mapping[str, Any]) -> str:
    """How messages name a parsed node: ``node 'id'``, or ``nodes[i]`` when its id is invalid."""
    return f"node '{fields['id']}'" if fields["id"] else f"nodes[{fields['index']}]"


class _NodeParser:
    """Checks one node's own fields; the graph and templates are checked afterwards."""

    def __init__(self, raw: Mapping[str, Any], index: int, errors: _Errors) -> None:
        self.raw, self.index, self.errors = raw, index, errors
        node_id = raw.get("id")
        self.id = node_id if isinstance(node_id, str) and NODE_ID.fullmatch(node_id) else None
        self.label = f"node '{self.id}'" if self.id else f"nodes[{index}]"

    def error(self, name: str, message: str) -> None:
        key = f"nodes[{self.index}].{name}" if name else f"nodes[{self.index}]"
        self.errors.add(key, f"{self.label}: {name}: {message}" if name else f"{self.label}: {message}")

    def wanted(self, name: str, what: str) -> None:
        """The field ``name`` is missing ("is required: ``what``") or is not ``what`` ("must be")."""
        self.error(name, f"{'is required' if self.raw.get(name) is None else 'must be'}: {what}")

    def parse(self) -> dict[str, Any]:
        """The node's fields with defaults filled; every problem found goes to ``errors``, in field order."""
        raw = self.raw
        if self.id is None:
            self.wanted("id", "a slug of a-z, 0-9 and _ starting with a letter, at most 63 long")
        node_type = raw.get("type")
        self._check_field_names(node_type, self._allowed_fields(node_type))
        fields: dict[str, Any] = {"index": self.index, "id": self.id, "type": node_type}
        fields["depends_on"] = self._depends_on()
        if "when" in raw:
            fields["when"] = raw["when"]  # checked with the templates, once upstream sets are known
        fields["retry"] = self._retry()
        if "timeout_s" in raw:
            longest = MAX_SLEEP_S if node_type == "wait_for_event" else MAX_TIMEOUT_S
            fields["timeout_s"] = self._seconds("timeout_s", longest)
        fields["tags"] = self._tags()
        if "pool" in raw:
            fields["pool"] = self._name("pool")
        fields.update(self._type_fields(node_type))
        return fields

    def _allowed_fields(self, node_type: Any) -> tuple[str, ...]:
        """Checks ``type`` is one of NODE_TYPES; the fields allowed on it (any type's fields if it is unknown)."""
        if node_type in NODE_TYPES:
            return COMMON_FIELDS + TYPE_FIELDS[node_type]
        shown = f"'{node_type}'" if isinstance(node_type, str) else "missing"
        self.error("type", f"unknown type {shown}; use one of {', '.join(NODE_TYPES)}")
        return COMMON_FIELDS + tuple(f for fs in TYPE_FIELDS.values() for f in fs)

    def _check_field_names(self, node_type: Any, allowed: tuple[str, ...]) -> None:
        """Every field is in ``allowed``; another type's field is named as such, anything else is unknown."""
        for name in self.raw:
            if name not in allowed:
                if isinstance(node_type, str) and any(name in fs for fs in TYPE_FIELDS.values()):
                    self.error(str(name), f"is not allowed on a '{node_type}' node")
                else:
                    self.error(str(name), "unknown field")

    def _type_fields(self, node_type: Any) -> dict[str, Any]:
        """Checks the fields that only ``node_type`` has; ``input`` is kept for the template check."""
        fields: dict[str, Any] = {}
        if node_type == "action":
            fields["action"] = self._action()
        elif node_type == "task":
            fields["task"] = self._task()
            if "heartbeat_s" in self.raw:
                fields["heartbeat_s"] = self._heartbeat_s()
        elif node_type == "sleep":
            fields.update(self._sleep())
        elif node_type == "subworkflow":
            fields.update(self._subworkflow())
        elif node_type == "wait_for_event":
            fields.update(self._wait())
        if node_type in ("action", "task", "subworkflow", "continue_as_new"):
            fields["input"] = self.raw.get("input", {})
        return fields

    def _depends_on(self) -> tuple[str, ...]:
        """``depends_on`` is a list of strings without repeats; the graph checks resolve the ids later."""
        deps = self.raw.get("depends_on", [])
        if not isinstance(deps, list) or not all(isinstance(dep, str) for dep in deps):
            self.error("depends_on", "must be a list of node ids")
            return ()
        for dep in {dep for dep in deps if deps.count(dep) > 1}:
            self.error("depends_on", f"lists '{dep}' more than once")
        return tuple(dict.fromkeys(deps))

    def _retry(self) -> Retry:
        """``retry`` is an object of known fields, each in range; a bad field falls back to its default."""
        raw = self.raw.get("retry", {})
        if not isinstance(raw, Mapping):
            self.error("retry", "must be an object with max_attempts, backoff_s, max_backoff_s, jitter, "
                                "non_retryable")
            return Retry()
        for name in raw:
            if name not in RETRY_FIELDS:
                self.error(f"retry.{name}", "unknown field")
        attempts = raw.get("max_attempts", 1)
        if not isinstance(attempts, int) or isinstance(attempts, bool) or not 1 <= attempts <= MAX_ATTEMPTS:
            self.error("retry.max_attempts", f"must be an integer from 1 to {MAX_ATTEMPTS}")
            attempts = 1
        backoff = raw.get("backoff_s", 1.0)
        if not _is_number(backoff) or not 0 < backoff <= MAX_DELAY_S:
            self.error("retry.backoff_s", f"must be a number of seconds, 0 < x ≤ {seconds_text(MAX_DELAY_S)}")
            backoff = 1.0
        cap = raw.get("max_backoff_s", max(300.0, float(backoff)))
        if not _is_number(cap) or not backoff <= cap <= MAX_DELAY_S:
            self.error("retry.max_backoff_s",
                       f"must be a number of seconds, backoff_s ≤ x ≤ {seconds_text(MAX_DELAY_S)}")
            cap = max(300.0, float(backoff))
        jitter = raw.get("jitter", True)
        if not isinstance(jitter, bool):
            self.error("retry.jitter", "must be true or false")
            jitter = True
        return Retry(max_attempts=attempts, backoff_s=float(backoff), max_backoff_s=float(cap), jitter=jitter,
                     non_retryable=self._non_retryable(raw.get("non_retryable", [])))

    def _non_retryable(self, names: Any) -> tuple[str, ...]:
        """``retry.non_retryable`` is a list of at most MAX_NON_RETRYABLE error codes or exception
        types; repeats are dropped."""
        what = (f"must be a list of at most {MAX_NON_RETRYABLE} error codes or exception types "
                f"(timeout, CardDeclined, billing.errors.CardDeclined)")
        if not isinstance(names, list) or len(names) > MAX_NON_RETRYABLE:
            self.error("retry.non_retryable", what)
            return ()
        for index, name in enumerate(names):
            if not isinstance(name, str) or len(name) > MAX_NAME_LENGTH or not FAILURE_NAME.fullmatch(name):
                self.error(f"retry.non_retryable[{index}]", "must be an error code or an exception's type, "
                                                            "optionally with its module (billing.errors.CardDeclined)")
                return ()
        return tuple(dict.fromkeys(names))

    def _seconds(self, name: str, limit: float) -> float | None:
        """Field ``name`` is a finite number of seconds, 0 < x ≤ ``limit``."""
        value = self.raw[name]
        if not _is_number(value) or not 0 < value <= limit:
            self.error(name, f"must be a number of seconds, 0 < x ≤ {seconds_text(limit)}")
            return None
        return float(value)

    def _tags(self) -> tuple[str, ...]:
        """``tags`` is a list of non-empty strings of at most MAX_NAME_LENGTH; repeats are dropped."""
        tags = self.raw.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) and 0 < len(t) <= MAX_NAME_LENGTH for t in tags):
            self.error("tags", f"must be a list of non-empty strings of at most {MAX_NAME_LENGTH} characters")
            return ()
        return tuple(dict.fromkeys(tags))

    def _name(self, name: str) -> str | None:
        """Field ``name`` is a non-blank string of at most MAX_NAME_LENGTH."""
        value = self.raw.get(name)
        if not isinstance(value, str) or not value.strip() or len(value) > MAX_NAME_LENGTH:
            self.error(name, f"must be a non-empty name of at most {MAX_NAME_LENGTH} characters")
            return None
        return value

    def _action(self) -> str | None:
        """``action`` names an action registered in ``workflows.actions``."""
        name = self.raw.get("action")
        if not isinstance(name, str) or not name:
            self.wanted("action", "the name of a registered action")
            return None
        if not actions.is_registered(name):
            known = actions.registered_names()
            listed = ", ".join(known[:20]) + (", …" if len(known) > 20 else "")
            self.error("action", f"unknown action '{name[:100]}'; registered: {listed}")
            return None
        return name

    def _task(self) -> str | None:
        """``task`` names a catalog task the tenant may call; a literal ``input`` matches its schema."""
        name = self.raw.get("task")
        if not isinstance(name, str) or not name:
            self.wanted("task", "the name of a task in the task catalog")
            return None
        check = catalog.callable_task(name, fresh=True)  # a change of the catalog applies at once
        if check.entry is None:
            self.error("task", check.problem)
            return None
        if not check.entry.queue and not Connection.objects.filter(kind=Connection.Kind.CELERY).exists():
            self.error("task", f"task '{name}' has no queue: its catalog entry names none, and this tenant has "
                               f"no celery connection for routing to send it to")
            return None
        # What the input's templates cannot change is checked now: its literal values, and its keys.
        known, unknown = catalog.known_part(self.raw.get("input", {}))
        if () not in unknown:  # not one template as a whole
            for path, message in catalog.input_problems(check.entry, templates.render(known, {}), unknown):
                self.error(schemas.under("input", path), message)
        return name

    def _heartbeat_s(self) -> float | None:
        """``heartbeat_s`` is a number of seconds within the node's ``timeout_s`` (when it names one: the
        catalog's default timeout applies otherwise, and the heartbeat check is bounded by it anyway)."""
        heartbeat_s = self._seconds("heartbeat_s", MAX_TIMEOUT_S)
        if heartbeat_s is not None and heartbeat_s < MIN_HEARTBEAT_S:
            self.error("heartbeat_s", f"must be at least {seconds_text(MIN_HEARTBEAT_S)} s")
            return None
        timeout_s = float(self.raw["timeout_s"]) if _is_number(self.raw.get("timeout_s")) else None
        if heartbeat_s is not None and timeout_s is not None and heartbeat_s > timeout_s:
            self.error("heartbeat_s", f"must be at most the node's timeout_s ({seconds_text(timeout_s)} s)")
            return None
        return heartbeat_s

    def _sleep(self) -> dict[str, Any]:
        """A sleep has exactly one of ``duration_s`` (seconds) or ``until`` (ISO 8601 with a timezone)."""
        has_duration, has_until = "duration_s" in self.raw, "until" in self.raw
        if has_duration and has_until:
            self.error("until", "give either duration_s or until, not both")
            return {}
        if not has_duration and not has_until:
            self.error("duration_s", "a sleep node needs duration_s (seconds) or until (an ISO 8601 time)")
            return {}
        if has_duration:
            return {"duration_s": self._seconds("duration_s", MAX_SLEEP_S)}
        until = self.raw["until"]
        try:
            moment = datetime.fromisoformat(rfc3339(until)) if isinstance(until, str) else None
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None:
            self.error("until", "must be an ISO 8601 time with a timezone, such as 2027-01-01T00:00:00Z")
        elif not _in_utc_range(moment):
            self.error("until", "must fall within the years 1 to 9999 in UTC")
            moment = None
        return {"until": moment}

    def _wait(self) -> dict[str, Any]:
        """A wait names its ``event``; ``key`` and ``default`` are templates (checked with the
        others); ``lookback_s`` is a number of seconds, 0 ≤ x ≤ MAX_LOOKBACK_S."""
        fields: dict[str, Any] = {}
        name = self.raw.get("event")
        if not isinstance(name, str) or not EVENT_NAME.fullmatch(name):
            self.wanted("event", "an event name of letters, digits and _.:/-, starting with a letter "
                                 "or digit, at most 200 long")
        fields["event"] = name if isinstance(name, str) else None
        if "key" in self.raw:
            key = self.raw["key"]
            if not isinstance(key, str) or len(key) > MAX_NAME_LENGTH:
                self.error("key", f"must be a string (a template) of at most {MAX_NAME_LENGTH} characters")
            fields["key"] = key
        if "lookback_s" in self.raw:
            lookback = self.raw["lookback_s"]
            if not _is_number(lookback) or not 0 <= lookback <= MAX_LOOKBACK_S:
                self.error("lookback_s", f"must be a number of seconds, 0 ≤ x ≤ {seconds_text(MAX_LOOKBACK_S)}")
                lookback = None
            fields["lookback_s"] = None if lookback is None else float(lookback)
        if "default" in self.raw:
            fields["default"], fields["has_default"] = self.raw["default"], True
        return fields

    def _subworkflow(self) -> dict[str, Any]:
        """A subworkflow names its ``workflow``; ``version`` is an integer ≥ 1 if given; ``wait`` is a bool."""
        fields: dict[str, Any] = {"workflow": self._name("workflow")}
        if "version" in self.raw:
            version = self.raw["version"]
            if not isinstance(version, int) or isinstance(version, bool) or version < 1:
                self.error("version", "must be an integer ≥ 1")
            fields["version"] = version
        wait = self.raw.get("wait", True)
        if not isinstance(wait, bool):
            self.error("wait", "must be true or false")
        fields["wait"] = wait
        return fields


def _check_envelope(spec: Any, *, max_bytes: int) -> int:
    """Checks ``spec`` is a JSON object within the depth and size limits; its compact UTF-8 size.

    Raises ``SpecError`` at the first failure: nothing else is worth checking then.
    """
    if not isinstance(spec, Mapping):
        raise SpecError({"spec": ["spec: must be a JSON object with 'nodes'"]})
    max_depth = settings.DUCTOR_MAX_SPEC_DEPTH
    depth = json_depth(spec)
    if depth > max_depth:
        raise SpecError({"spec": [f"spec: is nested {depth} levels deep; the limit is {max_depth}"]})
    try:
        size = len(json.dumps(spec, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        raise SpecError({"spec": [f"spec: is not valid JSON: {exc}"]}) from exc
    if size > max_bytes:
        raise SpecError({"spec": [f"spec: is {size} bytes; the limit is {max_bytes}"]})
    return size


class _SpecChecker:
    """One pass over a spec that passed ``_check_envelope``: named checks, run in order by ``run``.

    Each step adds to ``errors``; later steps read what earlier ones parsed. The order of the
    steps is the order of the messages in ``SpecError.errors``.
    """

    def __init__(self, spec: Mapping[str, Any], size: int) -> None:
        self.spec, self.size = spec, size
        self.errors = _Errors()
        self.parsed: list[dict[str, Any]] = []  # the nodes that are objects, in submitted order
        self.by_id: dict[str, dict[str, Any]] = {}  # valid id → parsed fields (the last one, if repeated)
        self.order: list[str] = []
        self.upstream: dict[str, frozenset[str]] | None = None  # None when the graph could not be ordered

    def run(self) -> Spec:
        """The validated Spec; raises ``SpecError`` with everything found."""
        raw_nodes = self._check_top_level()
        self._parse_nodes(raw_nodes)
        ids_sound = self._ids_sound(len(raw_nodes))
        self.by_id = {fields["id"]: fields for fields in self.parsed if fields["id"] is not None}
        self._check_dependencies()
        self._check_continuations()
        if ids_sound:
            self._order_and_upstream()
        self._check_templates_and_when()
        self._check_output()
        self._check_input_schema()
        timeout_s = self._check_timeout()
        self.errors.raise_if_any()
        assert self.upstream is not None  # unsound ids always left an error
        return _build(self.parsed, self.order, self.upstream, self.spec.get("output"), self.size,
                      self.spec.get("input_schema"), timeout_s)

    def _check_top_level(self) -> list[Any]:
        """Only ``nodes``, ``output``, ``input_schema`` and ``timeout_s`` at the top; ``nodes`` is a
        non-empty list within the limit (else raises)."""
        for name in self.spec:
            if name not in TOP_FIELDS:
                self.errors.add(str(name), f"{name}: unknown field; use nodes, output, input_schema and timeout_s")
        raw_nodes = self.spec.get("nodes")
        max_nodes = settings.DUCTOR_MAX_SPEC_NODES
        if not isinstance(raw_nodes, list) or not raw_nodes:
            wanted = "is required" if raw_nodes is None else "must be"
            self.errors.add("nodes", f"nodes: {wanted}: a non-empty list of nodes")
            raise SpecError(self.errors.items)
        if len(raw_nodes) > max_nodes:
            self.errors.add("nodes", f"nodes: has {len(raw_nodes)} nodes; the limit is {max_nodes}")
            raise SpecError(self.errors.items)
        return raw_nodes

    def _parse_nodes(self, raw_nodes: list[Any]) -> None:
        """Each node is an object with valid fields (``_NodeParser``) and an id not used before it."""
        first_index: dict[str, int] = {}
        for index, raw in enumerate(raw_nodes):
            if not isinstance(raw, Mapping):
                self.errors.add(f"nodes[{index}]", f"nodes[{index}]: must be an object")
                continue
            fields = _NodeParser(raw, index, self.errors).parse()
            self._check_duplicate(fields, first_index)
            self.parsed.append(fields)

    def _check_duplicate(self, fields: Mapping[str, Any], first_index: dict[str, int]) -> None:
        """The node's id is not taken by an earlier node (``first_index``: id → index of its first use)."""
        node_id = fields["id"]
        if node_id is None:
            return
        if node_id in first_index:
            self.errors.add(
                f"nodes[{fields['index']}].id",
                f"node '{node_id}': id: duplicate id (also nodes[{first_index[node_id]}])",
            )
        else:
            first_index[node_id] = fields["index"]

    def _ids_sound(self, submitted: int) -> bool:
        """Whether every submitted node parsed with a valid, unique id: the graph can only be ordered then."""
        return (
            all(fields["id"] is not None for fields in self.parsed)
            and len(self.parsed) == submitted
            and not any(key.endswith("].id") for key in self.errors.items)
        )

    def _check_dependencies(self) -> None:
        """Each dependency names another node, and not a continue_as_new node (which must be a sink)."""
        for fields in self.parsed:
            label, key = _label(fields), f"nodes[{fields['index']}].depends_on"
            for dep in fields["depends_on"]:
                if dep == fields["id"]:
                    self.errors.add(key, f"{label}: depends_on: a node cannot depend on itself")
                elif dep not in self.by_id:
                    self.errors.add(key, f"{label}: depends_on: unknown node '{dep}'")
                elif self.by_id[dep]["type"] == "continue_as_new":
                    self.errors.add(
                        key, f"{label}: depends_on: '{dep}' is a continue_as_new node, which must be a sink"
                    )

    def _check_continuations(self) -> None:
        """At most one continue_as_new node; each extra one is reported against the first."""
        continuations = [fields for fields in self.parsed if fields["type"] == "continue_as_new"]
        for extra in continuations[1:]:
            self.errors.add(
                f"nodes[{extra['index']}].type",
                f"node '{extra['id']}': type: a spec has at most one continue_as_new node "
                f"(also '{continuations[0]['id']}')",
            )

    def _order_and_upstream(self) -> None:
        """The graph has no cycle; sets ``order`` (topological) and ``upstream`` (transitive dependencies)."""
        graph = {fields["id"]: [d for d in fields["depends_on"] if d != fields["id"]] for fields in self.parsed}
        try:
            self.order = topological_order(graph)
        except CycleError as exc:
            start = self.by_id[exc.cycle[0]]
            self.errors.add(f"nodes[{start['index']}].depends_on", f"node '{start['id']}': depends_on: {exc}")
            return
        upstream: dict[str, frozenset[str]] = {}
        for node_id in self.order:
            ups: set[str] = set()
            for dep in graph[node_id]:
                if dep in self.by_id:
                    ups.add(dep)
                    ups |= upstream[dep]
            upstream[node_id] = frozenset(ups)
        self.upstream = upstream

    def _check_templates_and_when(self) -> None:
        """Each node's ``when`` and ``input`` are valid and refer only to known nodes upstream of it.

        Stores the parsed ``when``. Without an ordered graph, references are checked against all ids.
        """
        known = set(self.by_id)
        for fields in self.parsed:
            prefix, label = f"nodes[{fields['index']}]", _label(fields)
            allowed = self.upstream.get(fields["id"]) if self.upstream is not None and fields["id"] else None
            if "when" in fields:
                when, problems = when_errors(fields["when"], field="when", upstream=allowed, known=known)
                fields["when"] = when
                for path, message in problems:
                    self.errors.add(f"{prefix}.{path}", f"{label}: {path}: {message}")
            for name in ("input", "key", "default"):
                if name not in fields or (name == "key" and not isinstance(fields[name], str)):
                    continue
                for path, message in template_errors(fields[name], field=name, upstream=allowed, known=known):
                    self.errors.add(f"{prefix}.{path}", f"{label}: {path}: {message}")

    def _check_timeout(self) -> float | None:
        """The spec's ``timeout_s``, if any, is a number of seconds, 0 < x ≤ MAX_SLEEP_S (366 days)."""
        if "timeout_s" not in self.spec:
            return None
        value = self.spec["timeout_s"]
        if not _is_number(value) or not 0 < value <= MAX_SLEEP_S:
            self.errors.add("timeout_s", f"timeout_s: must be a number of seconds, 0 < x ≤ {seconds_text(MAX_SLEEP_S)}")
            return None
        return float(value)

    def _check_input_schema(self) -> None:
        """The spec's ``input_schema``, if any, is a usable, self-contained JSON Schema."""
        if "input_schema" in self.spec:
            problem = schemas.schema_problem(self.spec["input_schema"])
            if problem:
                self.errors.add("input_schema", f"input_schema: {problem}")

    def _check_output(self) -> None:
        """The spec's ``output`` is a valid template that refers only to known nodes."""
        output = self.spec.get("output")
        for path, message in template_errors(output, field="output", upstream=None, known=set(self.by_id)):
            self.errors.add(path, f"{path}: {message}")


def validate_spec(spec: Any, *, max_bytes: int) -> Spec:
    """Validate ``spec`` (parsed JSON) and return it parsed, normalized and frozen.

    ``max_bytes`` is the plan's payload limit, compared with the compact UTF-8 JSON size.
    Raises ``SpecError`` with every error found (see the module docstring). Pure apart
    from reading settings and the actions registry.
    """
    size = _check_envelope(spec, max_bytes=max_bytes)
    return _SpecChecker(spec, size).run()


def _build(
    parsed: list[dict[str, Any]],
    order: list[str],
    upstream: Mapping[str, frozenset[str]],
    output: Any,
    size: int,
    input_schema: Mapping[str, Any] | None = None,
    timeout_s: float | None = None,
) -> Spec:
    by_id = {fields["id"]: fields for fields in parsed}
    position = {node_id: i for i, node_id in enumerate(order)}
    dependents: dict[str, list[str]] = {node_id: [] for node_id in order}
    for fields in parsed:
        for dep in fields["depends_on"]:
            dependents[dep].append(fields["id"])
    nodes = tuple(
        Node(
            **{
                **by_id[node_id],
                "depends_on": tuple(by_id[node_id]["depends_on"]),
                "upstream": upstream[node_id],
                "dependents": tuple(sorted(dependents[node_id], key=position.__getitem__)),
            }
        )
        for node_id in order
    )
    continuation = next((node.id for node in nodes if node.type == "continue_as_new"), None)
    return Spec(
        nodes=nodes,
        output=output,
        input_schema=input_schema,
        timeout_s=timeout_s,
        sinks=tuple(node.id for node in nodes if not node.dependents),
        continue_as_new=continuation,
        size_bytes=size,
        by_id=MappingProxyType({node.id: node for node in nodes}),
    )
