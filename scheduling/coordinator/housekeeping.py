"""Housekeepers: the coordinator's bounded clean-ups of what PostgreSQL keeps only for a while.

The apps register theirs in ``AppConfig.ready()`` (the events' retention); the
coordinator runs them after its reconcilers, every
``Coordinator.reconcile_every_s``. Each call does a bounded amount of work (a
batch of deletes, a few tenants) and returns how many rows it removed, so a
large backlog is worked off over many passes without long locks or long
transactions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import structlog

from tenants.models import Tenant

log = structlog.get_logger(__name__)

T = TypeVar("T")

Housekeeper = Callable[[], int]
_housekeepers: list[Housekeeper] = []


def register_housekeeper(housekeeper: Housekeeper) -> None:
    """Have the coordinator call ``housekeeper()`` every pass. Registering it again changes nothing."""
    if housekeeper not in _housekeepers:
        _housekeepers.append(housekeeper)


def in_rounds(waiting: Iterable[T], batch: Callable[[T], tuple[int, bool, float]], *, budget_s: float,
              rest: float) -> int:
    """One batch of each of ``waiting`` in turn, then another of each that has more, round after round
    while ``budget_s`` lasts (one round at least), resting ``rest`` times as long as each batch took
    after it, so that the hot path finds the database between two batches; how many rows they removed
    together. ``batch(item)`` removes one bounded batch of ``item``'s and answers how many rows,
    whether it has more, and how many seconds it took: a tenant (or an endpoint) whose backlog grows
    faster than one batch a pass still gets through it, and the pass stays short."""
    deadline = time.monotonic() + budget_s
    removed, turn = 0, list(waiting)
    while turn:
        more = []
        for item in turn:
            count, has_more, seconds = batch(item)
            removed += count
            if has_more:
                more.append(item)
            time.sleep(seconds * rest)
        turn = more if time.monotonic() < deadline else []
    return removed


class TenantRound:
    """The tenants a housekeeper looks at, a few per pass: by id, on from where its previous pass
    stopped, round and round (a housekeeper's own; the coordinator's process keeps it)."""

    def __init__(self) -> None:
        self.after: Any = None

    def next(self, count: int) -> list[Tenant]:
        """The next ``count`` tenants (fewer at the end of a round, which then starts again)."""
        tenants = Tenant.objects.order_by("pk")
        if self.after is not None:
            tenants = tenants.filter(pk__gt=self.after)
        chosen = list(tenants[:count])
        self.after = chosen[-1].pk if len(chosen) == count else None
        return chosen


def housekeep_all() -> int:
    """Run every registered housekeeper once; returns how many rows they removed together. One that
    raises is logged (``housekeeper_failed``) and the others run: they are independent, and one
    failing on every pass (a row it cannot delete, a shard that is down) skipped those after it for
    good, and failed the coordinator's pass."""
    removed = 0
    for housekeeper in _housekeepers:
        try:
            removed += housekeeper()
        except Exception:
            log.exception("housekeeper_failed", housekeeper=f"{housekeeper.__module__}.{housekeeper.__qualname__}")
    return removed
