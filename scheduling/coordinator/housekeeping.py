"""Housekeepers: the coordinator's bounded clean-ups of what PostgreSQL keeps only for a while.

The apps register theirs in ``AppConfig.ready()`` (the events' retention); the
coordinator runs them after its reconcilers, every
``Coordinator.reconcile_every_s``. Each call does a bounded amount of work (a
batch of deletes, a few tenants) and returns how many rows it removed, so a
large backlog is worked off over many passes without long locks or long
transactions.
"""

from __future__ import annotations

from collections.abc import Callable

Housekeeper = Callable[[], int]
_housekeepers: list[Housekeeper] = []


def register_housekeeper(housekeeper: Housekeeper) -> None:
    """Have the coordinator call ``housekeeper()`` every pass. Registering it again changes nothing."""
    if housekeeper not in _housekeepers:
        _housekeepers.append(housekeeper)


def housekeep_all() -> int:
    """Run every registered housekeeper once; returns how many rows they removed together."""
    return sum(housekeeper() for housekeeper in _housekeepers)
