"""Reconcilers: repair Redis from PostgreSQL, the source of truth.

The apps register theirs in ``AppConfig.ready()`` (the engine's re-enqueues
the Redis side of active runs that stopped moving); the coordinator runs them
every ``Coordinator.reconcile_every_s``, and with ``full=True`` at once when
Redis lost its data (``epoch.RedisWatch``): then everything is repaired, not
only what looks stale.
"""

from __future__ import annotations

from collections.abc import Callable

Reconciler = Callable[..., int]
_reconcilers: list[Reconciler] = []


def register_reconciler(reconcile: Reconciler) -> None:
    """``reconcile(full=...)`` repairs Redis from PostgreSQL and returns how many things it
    fixed: what looks stale, or with ``full`` everything. Registering it again changes nothing."""
    if reconcile not in _reconcilers:
        _reconcilers.append(reconcile)


def reconcile_all(*, full: bool = False) -> int:
    """Run every registered reconciler; returns how many things they fixed together."""
    return sum(reconcile(full=full) for reconcile in _reconcilers)
