"""Sizes of JSON payloads, measured as the limits count them: nesting depth and compact UTF-8 bytes.

Both are iterative (no recursion): safe on hostile input, however deep.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def json_depth(value: Any) -> int:
    """Nesting depth of containers: a scalar is 0, a flat object or list is 1."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def json_size(value: Any) -> int:
    """Compact UTF-8 JSON size in bytes, as a plan's ``max_payload_bytes`` counts it (dates and
    other objects as their text). ``value`` must be no deeper than what ``json`` can encode: the
    API refuses deeper bodies before anything measures them."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode())
