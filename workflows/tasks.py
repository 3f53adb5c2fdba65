"""Celery tasks of the workflows app (found by Celery's autodiscovery): the outcomes of task nodes.

The team's worker sends them, through Celery's ``link`` and ``link_error``
callbacks set by ``workflows.engine.task_nodes``, to ``ductor.results``, with
the heartbeats of its long tasks (``workflows.engine.heartbeats``). Each
carries its tenant like every Ductor task, and records the outcome in it.
An outcome whose message does not name an attempt as Ductor's callbacks do
(made up, or mangled on the way: ``refusal``) is refused, logged as
``task_outcome_refused``, and changes nothing. One that cannot be kept because
PostgreSQL is out of reach is tried again later (``OutcomeTask``).

Each passes over the arguments it does not know (``**later``): a callback's are those of the
release that published its task, which may run for hours, and one a later release signed (before a
rollback, or while a deploy rolls) would otherwise fail, its outcome lost and its step run again
after its timeout. An argument a release adds is one this release may leave unread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog
from django.conf import settings

from ductor_project.celery import RESULTS_QUEUE
from ductor_project.core.errors import database_unreachable
from ductor_project.core.ids import canonical_uuid
from tenants.tasking import TenantTask, tenant_task
from workflows.engine import heartbeats, task_nodes
from workflows.engine.task_nodes import Sent

log = structlog.get_logger(__name__)


def refusal(step_id: Any, item_id: Any, delivery: Any, connection_id: Any, admitted: Any, run_id: Any) -> str | None:
    """Why an outcome's message names no attempt the way Ductor's callbacks do (``task_nodes._send``),
    or None: its step and run are ids, its item is named, its delivery is a whole number from 1."""
    if not isinstance(step_id, str) or canonical_uuid(step_id) is None:
        return "step_id is not a step id"
    if run_id != "" and (not isinstance(run_id, str) or canonical_uuid(run_id) is None):
        return "run_id is not a run id"
    if not isinstance(item_id, str) or not item_id:
        return "item_id is not an item id"
    if isinstance(delivery, bool) or not isinstance(delivery, int) or delivery < 1:
        return "delivery is not a whole number from 1"
    if not isinstance(connection_id, str) or not isinstance(admitted, str):
        return "connection_id and admitted are not text"
    return None


def _refused(task: str, step_id: Any, reason: str) -> None:
    log.warning("task_outcome_refused", callback=task, step_id=str(step_id)[:100], reason=reason)


class OutcomeTask(TenantTask):
    """An outcome that could not be kept because PostgreSQL is out of reach (its tenant or its step
    unread, its transaction not committed: nothing of it is written) is sent again
    ``DUCTOR_FAILED_ITEM_DELAY_MS`` later, then twice that, up to ``DUCTOR_FAILED_ITEM_MAX_DELAY_MS``,
    as a step's item is, until it is kept: not lost, which would leave the step waiting for its
    timeout and run the team's task again."""

    abstract = True
    max_retries = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:
            if not database_unreachable(exc):
                raise
            retries = self.request.retries
            delay_ms = min(settings.DUCTOR_FAILED_ITEM_DELAY_MS * 2 ** retries,
                           settings.DUCTOR_FAILED_ITEM_MAX_DELAY_MS)
            log.warning("task_outcome_deferred", callback=self.name, step_id=str(kwargs.get("step_id"))[:100],
                        retries=retries, delay_s=delay_ms / 1000, error=repr(exc))
            raise self.retry(exc=exc, countdown=delay_ms / 1000, queue=RESULTS_QUEUE) from None


@tenant_task(name="ductor.task_succeeded", ignore_result=True, base=OutcomeTask)
def task_succeeded(result: Any, *, step_id: str, item_id: str, delivery: int, connection_id: str = "",
                   admitted: str = "", run_id: str = "", work_ms: Any = None, deadline: Any = None,
                   worker: Any = "", **later: Any) -> None:
    """A task node's Celery task returned ``result`` (having run ``work_ms`` on the Celery worker
    ``worker``, when the team's worker has ``ductor_sdk``'s hook), by ``deadline`` or after it."""
    reason = refusal(step_id, item_id, delivery, connection_id, admitted, run_id)
    if reason is not None:
        _refused("ductor.task_succeeded", step_id, reason)
        return
    task_nodes.task_succeeded(result, Sent(step_id, item_id, delivery, connection_id, admitted, run_id,
                                           task_nodes.reported_work(work_ms), task_nodes.deadline_of(deadline),
                                           task_nodes.worker_name(worker)))


@tenant_task(name="ductor.task_failed", ignore_result=True, base=OutcomeTask)
def task_failed(task_id: str, *, step_id: str, item_id: str, delivery: int, connection_id: str = "",
                admitted: str = "", run_id: str = "", error: Mapping[str, Any] | None = None,
                work_ms: Any = None, deadline: Any = None, worker: Any = "", **later: Any) -> None:
    """A task node's Celery task raised (Celery sends its id; ``ductor_sdk``'s hook adds the error,
    the time it ran and the worker it ran on), by ``deadline`` or after it."""
    reason = refusal(step_id, item_id, delivery, connection_id, admitted, run_id)
    if reason is not None:
        _refused("ductor.task_failed", step_id, reason)
        return
    task_nodes.task_failed(task_id, Sent(step_id, item_id, delivery, connection_id, admitted, run_id,
                                         task_nodes.reported_work(work_ms), task_nodes.deadline_of(deadline),
                                         task_nodes.worker_name(worker)), error)


@tenant_task(name="ductor.task_heartbeat", ignore_result=True)
def task_heartbeat(*, step_id: str, details: Any = None, worker: Any = "", **later: Any) -> None:
    """A task node's Celery task is alive (``ductor_sdk.worker.heartbeat``), with its progress, on the
    Celery worker ``worker`` (its node name; told when the step has ended)."""
    heartbeats.record(step_id, details, worker=task_nodes.worker_name(worker))
