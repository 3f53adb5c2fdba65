"""What runs a fair-queue item: one handler per item kind.

The apps register their kinds in ``AppConfig.ready()`` (the engine: ``tick``
and ``step``; the coordinator: ``wakeup``), so every process that loads Django
knows them and importing a module registers nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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


Handler = Callable[[ItemContext, dict[str, Any]], None]
_handlers: dict[str, Handler] = {}


def register_handler(kind: str, handler: Handler) -> None:
    """Route fair-queue items whose payload has ``kind`` to ``handler``. Registering a kind
    again replaces its handler (a test may stand in for one)."""
    _handlers[kind] = handler


def handler_for(kind: str) -> Handler | None:
    """The handler of ``kind``, or None when no app registered one."""
    return _handlers.get(kind)
