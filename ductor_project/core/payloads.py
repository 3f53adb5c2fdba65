"""Sizes of JSON payloads, measured as the limits count them: nesting depth and compact UTF-8 bytes.

Both are iterative (no recursion): safe on hostile input, however deep.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
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


# What PostgreSQL's text and ``jsonb`` cannot store: the NUL character, and the UTF-16 surrogates,
# which JSON's ``\\ud800`` escapes can spell but no UTF-8 text holds (Python would not encode them).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable_char(text: str) -> str | None:
    """The first character of ``text`` that cannot be stored (``_UNSTORABLE``), or None."""
    found = _UNSTORABLE.search(text)
    return found.group() if found else None


def unstorable_detail(char: str) -> str:
    """Why ``char`` (an ``unstorable_char``) cannot be stored, as an error names it."""
    if char == "\x00":
        return "A NUL character (\\u0000) cannot be stored."
    return f"A lone surrogate (U+{ord(char):04X}) is not a character and cannot be stored."


def nonfinite_detail(number: float) -> str:
    """Why ``number`` (not finite: what a JSON number too large to be a double parses as) cannot be
    stored, as an error names it."""
    if math.isnan(number):
        return "Not a number (NaN) cannot be stored."
    return "This number is too large: it is past the largest a double holds (about 1.8e308) and reads as infinity."


def _leaves(value: Any) -> Iterator[tuple[str, Any]]:
    """Each key (as text) and each value that is not an object or an array, anywhere in ``value``,
    with its path (``input.name``, ``nodes[2]``; ``""`` for ``value`` itself). Iterative."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, Mapping):
            for key, child in item.items():
                shown = str(key).encode("utf-8", "backslashreplace").decode()  # a surrogate as its escape
                where = f"{path}.{shown}" if path else shown
                yield where, str(key)
                stack.append((child, where))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{path}[{index}]") for index, child in enumerate(item))
        else:
            yield path, item


def _flaw(leaf: Any) -> str | None:
    """Why a leaf (``_leaves``) cannot be stored in ``jsonb``: a character of its text, or a number
    that is not finite (``1e400`` parses as infinity, which neither ``jsonb`` nor JSON holds)."""
    if isinstance(leaf, str):
        char = unstorable_char(leaf)
        return unstorable_detail(char) if char is not None else None
    if isinstance(leaf, float) and not math.isfinite(leaf):
        return nonfinite_detail(leaf)
    return None


def unstorable_path(value: Any) -> tuple[str, str] | None:
    """The path (``input.name``, ``nodes[2]``; ``(the body)`` for ``value`` itself) of the first
    string or key of ``value`` that holds a character that cannot be stored, or of the first number
    that is not finite, with why it cannot be stored (a message); None when there is none. Iterative."""
    for path, leaf in _leaves(value):
        if (why := _flaw(leaf)) is not None:
            return path or "(the body)", why
    return None


def unkeepable(value: Any) -> tuple[str, str] | None:
    """Where ``value`` (a result, an output) holds what no payload keeps, and why, or None: what
    cannot be stored (``unstorable_path``), or bytes, which JSON has no type for (Celery's JSON
    carries them; kept as text, they would be Python's ``b'...'``). The path is ``""`` for
    ``value`` itself."""
    for path, leaf in _leaves(value):
        if (why := _flaw(leaf)) is not None:
            return path, why
        if isinstance(leaf, bytes | bytearray | memoryview):
            return path, "Bytes are not JSON: give text (decoded, or in base64)."
    return None


def storable(value: Any) -> Any:
    """``value`` (an error: its message, its details, a few levels deep) with each character that
    cannot be stored, in its strings and keys, replaced by U+FFFD, and each number that is not
    finite as its text (``Infinity``, ``NaN``): text that describes, kept whatever it quoted."""
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value)
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return {storable(key): storable(child) for key, child in value.items()}
    if isinstance(value, list | tuple):
        return [storable(child) for child in value]
    return value


def describable(value: Any) -> Any:
    """``value`` (an error an action raised, whatever its details hold) as it can be stored: what JSON
    has no type for as its text (``json_text``: a date in ISO 8601, bytes as their repr), then
    ``storable``."""
    return storable(json.loads(json.dumps(value, default=json_text, allow_nan=True)))


def json_text(value: Any) -> str:
    """What a payload holds for a value JSON has no type for (``json.dumps``'s ``default``): a date,
    a time or a datetime in ISO 8601 (``2026-12-05T07:59:19.438558+00:00``), anything else its text
    (a UUID, a ``Decimal``)."""
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    return str(value)


def json_size(value: Any) -> int:
    """Compact UTF-8 JSON size in bytes, as a plan's ``max_payload_bytes`` counts it (dates and
    other objects as their text). ``value`` must be no deeper than what ``json`` can encode: the
    API refuses deeper bodies before anything measures them. A lone surrogate, which no payload
    keeps (``unkeepable``), counts as the three bytes it would take."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=json_text)
    return len(text.encode("utf-8", "surrogatepass"))


# How far past a payload limit ``payload_excess`` measures a value exactly: beyond, it says "more than".
EXACT_SIZE_FACTOR = 2


def json_size_floor(value: Any, *, stop_above: int) -> tuple[int, int]:
    """At most ``value``'s compact UTF-8 JSON size in bytes, counting each character of its strings
    and keys as one byte (the least it takes) and each bracket, quote, colon and comma, without
    encoding anything, and the deepest nesting of containers seen; the count stops as soon as it
    passes ``stop_above``. So a value that holds one large string or object many times (a
    template's references share it) is measured in as many steps as it has parts, at most
    ``stop_above``, not in as many bytes as its JSON would take. Iterative."""
    floor = deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack and floor <= stop_above:
        item, depth = stack.pop()
        if isinstance(item, str):
            floor += len(item) + 2
        elif isinstance(item, Mapping):
            floor += 2 + max(0, 2 * len(item) - 1) + sum(len(str(key)) + 2 for key in item)
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list | tuple):
            floor += 2 + max(0, len(item) - 1)
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in item)
        else:
            floor += 1
    return floor, deepest


def payload_excess(value: Any, *, max_bytes: int, max_depth: int) -> str | None:
    """Why ``value`` may not be kept as a payload, or None: nested deeper than ``max_depth``, or
    larger than ``max_bytes`` as compact JSON. The depth is checked first, so a value too deep for
    ``json`` is refused before anything encodes it; a value that is surely more than
    ``EXACT_SIZE_FACTOR`` times ``max_bytes`` (``json_size_floor``) is refused as that, unencoded:
    its JSON could take gigabytes."""
    ceiling = EXACT_SIZE_FACTOR * max_bytes
    floor, deepest = json_size_floor(value, stop_above=ceiling)
    if floor > ceiling:
        if deepest > max_depth:
            return f"nested at least {deepest} levels deep, over the limit of {max_depth}"
        return f"more than {ceiling} bytes, over the plan's max_payload_bytes ({max_bytes})"
    if deepest > max_depth:  # the walk saw it all: the depth is exact
        return f"nested {deepest} levels deep, over the limit of {max_depth}"
    size = json_size(value)
    if size > max_bytes:
        return f"{size} bytes, over the plan's max_payload_bytes ({max_bytes})"
    return None


def json_equal(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal as JSON: ``true`` is not ``1`` nor ``false`` ``0`` (as
    Python's ``==`` has them), inside objects and lists too; ``1`` and ``1.0`` are one number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
