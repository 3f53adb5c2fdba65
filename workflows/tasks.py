"""Celery tasks of the workflows app (found by Celery's autodiscovery): the outcomes of task nodes.

The team's worker sends them, through Celery's ``link`` and ``link_error``
callbacks set by ``workflows.engine.task_nodes``, to ``ductor.results``, with
the heartbeats of its long tasks (``workflows.engine.heartbeats``). Each
carries its tenant like every Ductor task, and records the outcome in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tenants.tasking import tenant_task
from workflows.engine import heartbeats, task_nodes
from workflows.engine.task_nodes import Sent


@tenant_task(name="ductor.task_succeeded", ignore_result=True)
def task_succeeded(result: Any, *, step_id: str, item_id: str, delivery: int, connection_id: str = "",
                   admitted: str = "", run_id: str = "", work_ms: Any = None, deadline: Any = None,
                   worker: Any = "") -> None:
    """A task node's Celery task returned ``result`` (having run ``work_ms`` on the Celery worker
    ``worker``, when the team's worker has ``ductor_sdk``'s hook), by ``deadline`` or after it."""
    task_nodes.task_succeeded(result, Sent(step_id, item_id, delivery, connection_id, admitted, run_id,
                                           task_nodes.reported_work(work_ms), task_nodes.deadline_of(deadline),
                                           task_nodes.worker_name(worker)))


@tenant_task(name="ductor.task_failed", ignore_result=True)
def task_failed(task_id: str, *, step_id: str, item_id: str, delivery: int, connection_id: str = "",
                admitted: str = "", run_id: str = "", error: Mapping[str, Any] | None = None,
                work_ms: Any = None, deadline: Any = None, worker: Any = "") -> None:
    """A task node's Celery task raised (Celery sends its id; ``ductor_sdk``'s hook adds the error,
    the time it ran and the worker it ran on), by ``deadline`` or after it."""
    task_nodes.task_failed(task_id, Sent(step_id, item_id, delivery, connection_id, admitted, run_id,
                                         task_nodes.reported_work(work_ms), task_nodes.deadline_of(deadline),
                                         task_nodes.worker_name(worker)), error)


@tenant_task(name="ductor.task_heartbeat", ignore_result=True)
def task_heartbeat(*, step_id: str, details: Any = None, worker: Any = "") -> None:
    """A task node's Celery task is alive (``ductor_sdk.worker.heartbeat``), with its progress, on the
    Celery worker ``worker`` (its node name; told when the step has ended)."""
    heartbeats.record(step_id, details, worker=task_nodes.worker_name(worker))
