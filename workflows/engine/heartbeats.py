"""Heartbeats of task nodes: a long task says it is alive, and how far it got.

A task node may name ``heartbeat_s``. Its task then sends heartbeats
(``ductor_sdk.worker.heartbeat``; ``install``'s hook sends the first as the
task starts) to ``ductor.task_heartbeat`` on ``ductor.results``. Each is
recorded on its attempt while the attempt runs (``record``): when it came, and
its details, the progress the task reports (JSON, within the plan's payload
limit). The first one sets a coordinator wake-up ``heartbeat_s`` later
(``timers.heartbeat_due``), which times the attempt out when no heartbeat came
within ``heartbeat_s`` of the last (retryable, its item's slots freed and its
connection's breaker fed, as at its timeout), and otherwise waits for the rest.
So a worker that died with a long task is noticed within ``heartbeat_s``, not
at the end of the node's ``timeout_s``. The heartbeat's clock starts with the
task: a message waiting in the team's queue is bounded by ``timeout_s`` alone.

The node's next attempt (its retry) is sent with the last details in its
headers, to resume from (``statements.LAST_HEARTBEAT_DETAILS``). A heartbeat of
an attempt that ended, of a node without ``heartbeat_s`` (its details are still
kept), or of another tenant's step changes nothing else.
"""

from __future__ import annotations

import uuid
from typing import Any

import structlog
from django.db import transaction
from django.utils import timezone

from workflows.engine import brokers
from workflows.engine.attempts import payload_refusal
from workflows.engine.items import TASK, wakeup_on_commit
from workflows.models import StepRun

log = structlog.get_logger(__name__)

def heartbeat_s_of(step: StepRun) -> float:
    """The most seconds between two heartbeats of ``step``, as its message was published (0: none)."""
    return float(((step.routing or {}).get("task") or {}).get("heartbeat_s") or 0)


def record(step_id: str, details: Any = None, *, worker: str = "") -> bool:
    """Record a heartbeat of the attempt ``step_id`` of the tenant in context, with ``details`` when
    given (None keeps the last ones), sent from the Celery worker ``worker`` (its node name). True
    when it was recorded: the attempt is a task node's, and running. A heartbeat of an attempt that
    has ended is answered to its worker (``brokers.tell_ended``): its task can stop."""
    try:
        pk = uuid.UUID(str(step_id))
    except ValueError:
        log.warning("task_heartbeat_refused", step_id=str(step_id)[:100], reason="not a step id")
        return False
    values: dict[str, Any] = {"heartbeat_at": timezone.now()}
    if details is not None:
        refusal = payload_refusal(details, "heartbeat details")
        if refusal is None:
            values["heartbeat_details"] = details
        else:  # the heartbeat counts; its details are not kept
            log.warning("task_heartbeat_details_refused", step_id=str(pk), reason=(refusal.error or {}).get("message"))
    with transaction.atomic():
        step = (StepRun.objects.select_for_update().filter(pk=pk, node_type=TASK)
                .only("id", "routing", "heartbeat_at", "status").first())
        if step is None or step.status != StepRun.Status.RUNNING:
            log.info("task_heartbeat_ignored", step_id=str(pk), reason="no such running task step",
                     status=getattr(step, "status", None))
            if step is not None and step.status in StepRun.TERMINAL and worker:
                ended = step
                transaction.on_commit(lambda: brokers.tell_ended(ended, brokers.sent_through(ended), worker))
            return False
        if worker and (step.routing or {}).get("worker") != worker:  # where it runs, on its trace
            values["routing"] = {**(step.routing or {}), "worker": worker}
        StepRun.objects.filter(pk=pk).update(**values)
        heartbeat_s = heartbeat_s_of(step)
        if step.heartbeat_at is None and heartbeat_s:  # its first: the wake-up that checks the next
            wakeup_on_commit(str(pk), kind="heartbeat_due", delay_s=heartbeat_s)
    return True
