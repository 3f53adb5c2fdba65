"""Workflows as code: a builder that compiles to the JSON spec of ``workflows/spec.py``.

    wf = Workflow("order", description="Charge, then confirm")
    charge = wf.task("charge", task="billing.tasks.charge", input={"order": Input["order_id"]},
                     retry=Retry(max_attempts=3))
    wf.action("confirm", "http.request", depends_on=[charge],
              input={"method": "POST", "path": "/confirm", "json": {"charge": charge.output["id"]}},
              when=Input["notify"].eq(True))
    wf.output({"charge": charge.output})
    spec = wf.to_spec()

A reference (``Input["x"]``, ``step.output["a"]["b"]``) is the template string
``$input.x`` or ``$nodes.<id>.output.a.b``; ``ref.interpolated`` is the
``{{ … }}`` form for use inside a longer string, and ``ref.eq(…)`` and the
like build ``when`` conditions. Nothing is implied: a reference in an input
adds no dependency, so ``depends_on`` is always written out (a ``StepRef`` or
an id). The builder checks nothing that the server checks; the server's
validation of the compiled spec is the same as of a spec written by hand.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypedDict, Unpack

_SEGMENT = re.compile(r"^[A-Za-z0-9_\-]+$")
_UNSET: Any = object()

Condition = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Ref:
    """A reference of the template language, by its segments: ``Ref(("input", "a"))`` is ``$input.a``."""

    segments: tuple[str, ...]

    def __getitem__(self, key: str | int) -> Ref:
        """The reference one level down: a key of an object, or (an int) an index of a list."""
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise TypeError(f"a reference segment is a str or an int, not {type(key).__name__}")
        segment = str(key)
        if not _SEGMENT.fullmatch(segment):
            raise ValueError(f"cannot reference {segment!r}: segments are letters, digits, '_' and '-'")
        return Ref((*self.segments, segment))

    def __str__(self) -> str:
        return "$" + ".".join(self.segments)

    @property
    def path(self) -> str:
        """The reference without its ``$``, as a ``when`` condition names it."""
        return ".".join(self.segments)

    @property
    def interpolated(self) -> str:
        """``{{ $… }}``: the value inserted into a longer string (``f"Order {ref.interpolated}"``)."""
        return f"{{{{ {self} }}}}"

    def _condition(self, op: str, value: Any) -> Condition:
        return {"path": self.path, "op": op, "value": value}

    def eq(self, value: Any) -> Condition:
        return self._condition("eq", value)

    def ne(self, value: Any) -> Condition:
        return self._condition("ne", value)

    def in_(self, values: Sequence[Any]) -> Condition:
        return self._condition("in", list(values))

    def exists(self, present: bool = True) -> Condition:
        return self._condition("exists", present)

    def prefix(self, value: str) -> Condition:
        return self._condition("prefix", value)

    def gt(self, value: float) -> Condition:
        return self._condition("gt", value)

    def lt(self, value: float) -> Condition:
        return self._condition("lt", value)


Input = Ref(("input",))
RunId = Ref(("run", "id"))
RootRunId = Ref(("run", "root_id"))


def all_of(*conditions: Condition) -> Condition:
    """A ``when`` that holds when every condition does (1 to 20; they do not nest)."""
    return {"all": list(conditions)}


def any_of(*conditions: Condition) -> Condition:
    """A ``when`` that holds when one of the conditions does (1 to 20; they do not nest)."""
    return {"any": list(conditions)}


@dataclasses.dataclass(frozen=True)
class StepRef:
    """A node of a workflow being built; ``output`` and ``status`` are references to it."""

    id: str

    @property
    def output(self) -> Ref:
        return Ref(("nodes", self.id, "output"))

    @property
    def status(self) -> Ref:
        return Ref(("nodes", self.id, "status"))


@dataclasses.dataclass(frozen=True)
class Retry:
    """A node's retry policy. ``max_backoff_s`` None: the server's default (300, or ``backoff_s`` if larger).
    ``non_retryable``: error codes (``timeout``) or exception types (``CardDeclined``, or with its module,
    ``billing.errors.CardDeclined``) whose failures are not tried again."""

    max_attempts: int = 1
    backoff_s: float = 1.0
    max_backoff_s: float | None = None
    jitter: bool = True
    non_retryable: Sequence[str] = ()

    def __post_init__(self) -> None:
        if isinstance(self.non_retryable, str):  # a Sequence[str] to a type checker, split into letters
            raise TypeError(f"non_retryable is a list of names: non_retryable={[self.non_retryable]!r}")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"max_attempts": self.max_attempts, "backoff_s": self.backoff_s, "jitter": self.jitter}
        if self.max_backoff_s is not None:
            data["max_backoff_s"] = self.max_backoff_s
        if self.non_retryable:
            data["non_retryable"] = list(self.non_retryable)
        return data


class NodeOptions(TypedDict, total=False):
    """The fields every node type takes; None (as not given) leaves one to the server's default."""

    depends_on: Sequence[str | StepRef] | None
    when: Mapping[str, Any] | None
    retry: Retry | Mapping[str, Any] | None
    timeout_s: float | None
    tags: Sequence[str] | None
    pool: str | None


# Every keyword a node method takes, for the guess at a mistyped one.
_KEYWORDS = (*NodeOptions.__annotations__, "input", "duration_s", "until", "event", "key", "default", "lookback_s",
             "workflow", "version", "wait")


def _with_guess(name: str) -> str:
    """``name``, quoted, with the keyword it most likely means."""
    close = difflib.get_close_matches(name, _KEYWORDS, n=1)
    return f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else
                          f" (every node takes {', '.join(NodeOptions.__annotations__)})")


def to_json(value: Any) -> Any:
    """``value`` as plain JSON: references become their strings, tuples lists, mappings dicts."""
    if isinstance(value, Ref):
        return str(value)
    if isinstance(value, StepRef):
        raise TypeError(f"a step is not a value: use {value.id!r}'s .output (or .status)")
    if isinstance(value, Retry):
        return value.to_json()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(key): to_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    return value


class Workflow:
    """A workflow definition built in Python; ``to_spec()`` is its JSON spec.

    Each node method returns the node's ``StepRef``. Nodes keep the order they are added
    in, which the server uses to break ties between nodes ready at the same time.
    """

    input = Input

    def __init__(self, name: str, *, description: str = "", input_schema: Mapping[str, Any] | None = None,
                 timeout_s: float | None = None) -> None:
        """``input_schema``: a JSON Schema every run's input must match (a start that does not raises
        ``BadRequest`` naming the field: ``input.qty``); None: any input. ``timeout_s``: how long a run
        may take from its start (then it fails with ``run_timed_out``); None: no bound."""
        self.name = name
        self.description = description
        self.input_schema = input_schema
        self.timeout_s = timeout_s
        self._nodes: list[dict[str, Any]] = []
        self._output: Any = _UNSET

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, nodes={[node['id'] for node in self._nodes]})"

    def _add(self, node_id: str, node_type: str, fields: Mapping[str, Any], options: NodeOptions) -> StepRef:
        unknown = sorted(set(options) - set(NodeOptions.__annotations__))
        if unknown:  # a typo the type checker would flag, caught for untyped callers too
            raise TypeError(f"node {node_id!r}: unknown option {_with_guess(unknown[0])}")
        if isinstance(options.get("depends_on"), str):  # a Sequence[str] to a type checker, split into letters
            raise TypeError(f"node {node_id!r}: depends_on is a list of ids or steps: "
                            f"depends_on={[options.get('depends_on')]!r}")
        node: dict[str, Any] = {"id": node_id, "type": node_type, **fields}
        node["depends_on"] = [dep.id if isinstance(dep, StepRef) else dep for dep in options.get("depends_on") or ()]
        given: dict[str, Any] = dict(options)
        node.update((name, given[name]) for name in ("when", "retry", "timeout_s", "tags", "pool")
                    if given.get(name) is not None)
        self._nodes.append(node)
        return StepRef(node_id)

    def action(self, id: str, action: str, *, input: Any = None, **options: Unpack[NodeOptions]) -> StepRef:
        """A node that runs the registered action ``action`` with ``input`` (a template)."""
        return self._add(id, "action", {"action": action, "input": {} if input is None else input}, options)

    def task(self, id: str, *, task: str, input: Any = None, heartbeat_s: float | None = None,
             **options: Unpack[NodeOptions]) -> StepRef:
        """A node that runs the Celery task ``task`` of the tenant's task catalog with ``input``. With
        ``heartbeat_s``, once the task started it times out when no heartbeat came within that many
        seconds (``ductor_sdk.worker.heartbeat``)."""
        fields: dict[str, Any] = {"task": task, "input": {} if input is None else input}
        if heartbeat_s is not None:
            fields["heartbeat_s"] = heartbeat_s
        return self._add(id, "task", fields, options)

    def sleep(
        self, id: str, *, duration_s: float | None = None, until: datetime | str | None = None,
        **options: Unpack[NodeOptions],
    ) -> StepRef:
        """A timer: ``duration_s`` seconds, or ``until`` a time with a timezone (give exactly one)."""
        fields = {name: value for name, value in (("duration_s", duration_s), ("until", until)) if value is not None}
        return self._add(id, "sleep", fields, options)

    def wait_for_event(
        self, id: str, *, event: str, key: Any = None, default: Any = _UNSET, lookback_s: float | None = None,
        **options: Unpack[NodeOptions],
    ) -> StepRef:
        """Wait, holding no worker, for an event ``event`` whose key is ``key`` (a template; None: any key),
        or a signal ``event`` sent to the run: its payload is the node's output. After ``timeout_s`` the
        output is ``default``, or without one the node fails (``wait_timed_out``). ``lookback_s``: an event
        up to this much older than the wait counts too."""
        fields: dict[str, Any] = {"event": event}
        for name, value in (("key", key), ("lookback_s", lookback_s)):
            if value is not None:
                fields[name] = value
        if default is not _UNSET:
            fields["default"] = default
        return self._add(id, "wait_for_event", fields, options)

    def subworkflow(
        self, id: str, *, workflow: str | Workflow, version: int | None = None, input: Any = None,
        wait: bool = True, **options: Unpack[NodeOptions],
    ) -> StepRef:
        """A child run of ``workflow`` (its latest version unless ``version``); with ``wait`` the node
        finishes with the child's output."""
        fields: dict[str, Any] = {"workflow": workflow.name if isinstance(workflow, Workflow) else workflow}
        if version is not None:
            fields["version"] = version
        fields.update(input={} if input is None else input, wait=wait)
        return self._add(id, "subworkflow", fields, options)

    def continue_as_new(self, id: str, *, input: Any = None, **options: Unpack[NodeOptions]) -> StepRef:
        """End the run as ``continued`` and start a successor with ``input``. At most one, as a sink."""
        return self._add(id, "continue_as_new", {"input": {} if input is None else input}, options)

    def output(self, value: Any = _UNSET, /, **fields: Any) -> None:
        """The run's output template: one value, or its fields as keywords."""
        if value is not _UNSET and fields:
            raise TypeError("give the output as one value or as keywords, not both")
        self._output = fields if value is _UNSET else value

    def to_spec(self) -> dict[str, Any]:
        """The JSON spec (a new dict each time), as ``POST /api/v1/workflows`` takes it."""
        spec: dict[str, Any] = {"nodes": to_json(self._nodes)}
        if self._output is not _UNSET:
            spec["output"] = to_json(self._output)
        if self.input_schema is not None:
            spec["input_schema"] = dict(self.input_schema)
        if self.timeout_s is not None:
            spec["timeout_s"] = self.timeout_s
        return spec
