"""Helpers for the team's own Celery workers that run Ductor's ``task`` nodes.

    from typing import Any

    from ductor_sdk.worker import current_step, install, step

    install(app)

    @step(app, name="billing.tasks.charge")
    def charge(order: str) -> dict[str, Any]:
        ctx = current_step()  # tenant, run, node, attempt, idempotency key
        return {"order": order, "key": ctx.idempotency_key}

Importing this package does not import Celery; ``install`` and ``step`` use the app given.
"""

from ductor_sdk.worker.cancels import StepCancelled
from ductor_sdk.worker.context import NotInStep, StepContext, current_step, current_step_or_none
from ductor_sdk.worker.errback import ERRBACK_TASK, RESULTS_QUEUE
from ductor_sdk.worker.failures import NonRetryable, is_retryable
from ductor_sdk.worker.heartbeats import cancel_requested, heartbeat
from ductor_sdk.worker.signals import install
from ductor_sdk.worker.step import NotJSONSafe, check_json_safe, step

__all__ = [
    "ERRBACK_TASK",
    "RESULTS_QUEUE",
    "NonRetryable",
    "NotInStep",
    "NotJSONSafe",
    "StepCancelled",
    "StepContext",
    "cancel_requested",
    "check_json_safe",
    "current_step",
    "current_step_or_none",
    "heartbeat",
    "install",
    "is_retryable",
    "step",
]
