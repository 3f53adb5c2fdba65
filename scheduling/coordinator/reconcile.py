"""Reconcilers: repair Redis from PostgreSQL, the source of truth.

The apps register theirs in ``AppConfig.ready()`` (the engine's re-enqueues
the Redis side of active runs that stopped moving); the coordinator runs them
every ``Coordinator.reconcile_every_s``.
"""

from __future__ import annotations

from collections.abc import Callable

_reconcilers: list[Callable[[], int]] = []


def register_reconciler(reconcile: Callable[[], int]) -> None:
    """``reconcile()`` repairs Redis from PostgreSQL and returns how many things it fixed.
    Registering the same function again changes nothing."""
    if reconcile not in _reconcilers:
        _reconcilers.append(reconcile)


def reconcile_all() -> int:
    """Run every registered reconciler; returns how many things they fixed together."""
    return sum(reconcile() for reconcile in _reconcilers)
