"""What runs a fair-queue item: one handler per item kind, or a publisher.

The apps register their kinds in ``AppConfig.ready()`` (the engine: ``tick``
and ``step``; the coordinator: ``wakeup``), so every process that loads Django
knows them and importing a module registers nothing.

A kind with a *publisher* (the engine's ``task``: a team's own Celery task) is
not run by a Ductor worker: the dispatcher hands the items it dequeued of that
kind to the publisher, which sends them on (to the team's queue) and keeps them
leased until their outcome comes back. They use no dispatch credit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from scheduling.fair_queue import Dequeued

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ItemContext:
    """What a handler is told about the item it runs.

    ``connection_id`` is the connection its admission chose ("" when it needs
    none), and ``admitted`` says why that one.
    """

    tenant_id: str
    item_id: str
    tier: str
    partition: str
    delivery: int
    waited_ms: int
    connection_id: str = ""
    admitted: str = ""


@dataclass(frozen=True)
class Failed:
    """What a handler returns when the work its item carried failed though the item is done: a step
    whose action failed, which the engine recorded, so the item is acked rather than put back.
    Celery's tools then show the item's task failed, with ``error`` (``task_events``)."""

    error: str


# A handler returns None, or ``Failed``; one that raises has its item put back (``delivery``).
Handler = Callable[[ItemContext, dict[str, Any]], Failed | None]
_handlers: dict[str, Handler] = {}


def register_handler(kind: str, handler: Handler) -> None:
    """Route fair-queue items whose payload has ``kind`` to ``handler``. Registering a kind
    again replaces its handler (a test may stand in for one)."""
    _handlers[kind] = handler


def handler_for(kind: str) -> Handler | None:
    """The handler of ``kind``, or None when no app registered one."""
    return _handlers.get(kind)


Publisher = Callable[[list[Dequeued]], None]
_publishers: dict[str, Publisher] = {}


def register_publisher(kind: str, publisher: Publisher) -> None:
    """Have the dispatcher pass the items of ``kind`` it dequeued to ``publisher`` (in dequeue
    order, a list per round) instead of a Ductor worker."""
    if not kind or "," in kind:  # the queue's dequeue takes the publishers' kinds comma-separated
        raise ValueError(f"a publisher's kind is a non-empty name without a comma, not {kind!r}")
    _publishers[kind] = publisher


def publisher_kinds() -> frozenset[str]:
    """The kinds of item a publisher takes (task nodes'): they need no Ductor worker."""
    return frozenset(_publishers)


def kind_of(item: Dequeued) -> str:
    """The kind an item's payload names ("" when none)."""
    return str(item.payload.get("kind", "")) if isinstance(item.payload, dict) else ""


def hand_to_publishers(items: list[Dequeued]) -> list[Dequeued]:
    """Pass the items of kinds with a publisher to it (per kind, in order); the others are left,
    to run on Ductor's workers. What a dispatcher and a handoff both do with the items they take.
    A publisher that fails is logged: its items stay leased and come back after their lease."""
    left: list[Dequeued] = []
    theirs: dict[str, list[Dequeued]] = {}
    for item in items:
        kind = kind_of(item)
        if kind in _publishers:
            theirs.setdefault(kind, []).append(item)
        else:
            left.append(item)
    for kind, group in theirs.items():
        try:
            _publishers[kind](group)
        except Exception:
            log.exception("publisher_failed", kind=kind, items=len(group))
    return left
