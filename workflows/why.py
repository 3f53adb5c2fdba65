"""Why is it waiting? For each waiting step of a run, what holds it now.

``why_waiting(run)`` reads the step rows, the step's fair-queue item and the
limits its admission checks (its tenant's ceiling and rate, its pool's and
connections' slots, rates and breakers, the tenant's status and quota), taking
nothing. Each answer names one cause from ``Cause``, in words and as data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from workflows.models import WorkflowRun


class Cause(StrEnum):
    NOT_DUE = "not_due"  # not due until ``until``
    PARTITION = "partition"  # behind ``details["ahead"]`` items of its partition
    TENANT_CONCURRENCY = "tenant_concurrency"  # tenant concurrency k of k
    RATE_LIMITED = "rate_limited"  # rate-limited until ``until``
    POOL_FULL = "pool_full"  # the pool's slots are all taken
    CONNECTION_FULL = "connection_full"  # every connection of the pool is full
    BREAKER_OPEN = "breaker_open"  # every usable connection's breaker is open until ``until``
    SUSPENDED = "suspended"  # the tenant is suspended
    QUOTA_EXHAUSTED = "quota_exhausted"  # the monthly run quota is used up (a child run cannot start)
    CHILD_RUN = "child_run"  # waiting for its child run to finish
    DISPATCHING = "dispatching"  # admitted, on its way to a worker
    IN_LINE = "in_line"  # due and admissible: waiting for its turn in the fair order


@dataclass(frozen=True)
class Waiting:
    """One waiting step and what holds it."""

    node_id: str
    attempt: int
    step_id: str
    status: str
    cause: Cause
    message: str
    until: datetime | None = None
    details: dict[str, Any] = field(default_factory=dict)


def why_waiting(run: WorkflowRun) -> list[Waiting]:
    """What holds each waiting step of ``run`` (in the tenant's context), taking nothing."""
    return []
