"""A spec in the normalized form the server stores, to tell whether two specs are the same workflow.

The server stores a valid spec with its defaults filled and its nodes in
topological order, ties kept in the order given (``Spec.to_dict`` in the
server's ``workflows/spec.py``). ``normalized`` computes that form on the
client, so ``workflows.apply`` can compare the spec it holds with the stored
one. It validates nothing: an invalid spec is the server's to refuse. Should
the two forms ever disagree on a field, the comparison only errs towards a
new version, never towards a missed change.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from datetime import datetime
from typing import Any

_TYPE_FIELDS = {
    "action": ("action", "input"),
    "task": ("task", "input", "heartbeat_s"),
    "sleep": ("duration_s", "until"),
    "wait_for_event": ("event", "key", "lookback_s", "default"),
    "subworkflow": ("workflow", "version", "input", "wait"),
    "continue_as_new": ("input",),
}
_COMMON = ("id", "type", "depends_on", "when", "retry", "timeout_s", "tags", "pool")


def _retry(raw: Any) -> Any:
    if not isinstance(raw, Mapping):
        return raw
    backoff = raw.get("backoff_s", 1.0)
    retry = {
        "max_attempts": raw.get("max_attempts", 1),
        "backoff_s": backoff,
        "max_backoff_s": raw.get("max_backoff_s", max(300.0, backoff) if isinstance(backoff, int | float) else 300.0),
        "jitter": raw.get("jitter", True),
    }
    if raw.get("non_retryable"):
        retry["non_retryable"] = _deduplicated(raw["non_retryable"])
    return retry


def _condition(raw: Any) -> Any:
    if isinstance(raw, Mapping) and len(raw) == 1 and next(iter(raw)) in ("all", "any"):
        combinator, items = next(iter(raw.items()))
        return {combinator: [_condition(item) for item in items]} if isinstance(items, list) else raw
    if isinstance(raw, Mapping) and raw.get("op") == "exists" and "value" not in raw:
        return {**raw, "value": True}
    return raw


def _instant(value: Any) -> Any:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else value
    except ValueError:
        return value


def _deduplicated(value: Any) -> Any:
    return list(dict.fromkeys(value)) if isinstance(value, list) else value


def normalized_node(raw: Mapping[str, Any]) -> dict[str, Any]:
    """One node with the server's defaults filled (``until`` as a ``datetime``, to compare instants)."""
    node_type = raw.get("type")
    node: dict[str, Any] = {"id": raw.get("id"), "type": node_type,
                            "depends_on": _deduplicated(raw.get("depends_on", []))}
    if raw.get("when") is not None:
        node["when"] = _condition(raw["when"])
    node["retry"] = _retry(raw.get("retry", {}))
    if raw.get("timeout_s") is not None:
        node["timeout_s"] = raw["timeout_s"]
    node["tags"] = _deduplicated(raw.get("tags", []))
    if raw.get("pool") is not None:
        node["pool"] = raw["pool"]
    known = _TYPE_FIELDS.get(str(node_type))
    extra = known if known is not None else tuple(name for name in raw if name not in _COMMON)
    for name in extra:
        if name in raw:
            node[name] = _instant(raw[name]) if name == "until" else raw[name]
    if node_type == "subworkflow":
        node.setdefault("wait", True)
    if node_type not in ("sleep", "wait_for_event"):
        node.setdefault("input", {})
    return node


def _topological(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``nodes`` so that each follows its dependencies, ties in the given order; as given on a cycle."""
    index = {node["id"]: i for i, node in enumerate(nodes) if isinstance(node["id"], str)}
    if len(index) != len(nodes):
        return nodes
    missing = [sum(1 for dep in node["depends_on"] if dep in index) for node in nodes]
    dependents: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        for dep in node["depends_on"]:
            if dep in index:
                dependents[index[dep]].append(i)
    ready = [i for i, count in enumerate(missing) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for child in dependents[i]:
            missing[child] -= 1
            if missing[child] == 0:
                heapq.heappush(ready, child)
    return [nodes[i] for i in order] if len(order) == len(nodes) else nodes


def normalized(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` as the server would store it: nodes normalized, in topological order, ``output``,
    ``input_schema`` and ``timeout_s``."""
    nodes = [normalized_node(node) if isinstance(node, Mapping) else node for node in spec.get("nodes", [])]
    if all(isinstance(node, dict) for node in nodes):
        nodes = _topological(nodes)
    result: dict[str, Any] = {"nodes": nodes}
    if spec.get("output") is not None:
        result["output"] = spec["output"]
    if spec.get("input_schema") is not None:
        result["input_schema"] = spec["input_schema"]
    if spec.get("timeout_s") is not None:
        result["timeout_s"] = spec["timeout_s"]
    return result


def same_spec(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two specs normalize to the same workflow (``1`` and ``1.0`` are the same number; ``true``
    and ``1`` are not, as JSON has them)."""
    return same_json(normalized(a), normalized(b))


def same_json(a: Any, b: Any) -> bool:
    """``a == b`` as JSON values: a boolean equals a boolean alone (Python's ``True == 1`` does not
    hold here), numbers by their value, lists item by item, objects key by key."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_json(a[key], b[key]) for key in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
