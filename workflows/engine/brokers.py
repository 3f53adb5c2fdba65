"""The brokers task nodes' messages go to, and what is sent to their workers besides the tasks.

``broker_app(name)`` is the Celery app that publishes to a broker: Ductor's own
(``default``), or one of ``DUCTOR_TASK_BROKERS`` that a celery connection names.
``revoke(step)`` tells the workers of the broker an attempt's messages went to
not to run them (Celery's ``revoke`` of their task id, the attempt's step id,
broadcast on that broker): an attempt
cancelled, or ended by its run's failure or timeout, before a worker started its
task is then discarded unrun by a worker that holds its message or takes it
later, as long as that worker was running when the revoke was sent (a worker
keeps the ids it was told in memory, or in its ``--statedb``, for three hours
and 50,000 ids at most by default: Celery's ``CELERY_WORKER_REVOKE_EXPIRES`` and
``CELERY_WORKER_REVOKES_MAX``). A task already
running goes on, and its late result is discarded; a task that sends heartbeats
is told, on the worker they named (``tell_ended``), and can stop.
"""

from __future__ import annotations

from functools import cache

import structlog
from celery import Celery
from django.conf import settings

from ductor_project.celery import app as ductor_app
from ductor_project.core import redis_urls
from scheduling.connection_config import DEFAULT_BROKER
from scheduling.routing_table import routing_table
from workflows.models import StepRun

log = structlog.get_logger(__name__)

# The remote control command of ``ductor_sdk``'s worker hook by which a worker learns a step has ended.
CANCEL_COMMAND = "ductor_cancel"

class NoQueue(LookupError):
    """Neither the step's connection nor its catalog entry names a queue."""


@cache
def _named_broker(name: str) -> Celery:
    url = settings.DUCTOR_TASK_BROKERS[name]
    return Celery(f"ductor-broker-{name}", broker=url, set_as_current=False,
                  config_source={"task_serializer": "json", "accept_content": ["json"],
                                 "broker_transport": redis_urls.kombu_transport(url)})


@cache
def _own_broker() -> Celery:
    """Ductor's own broker, as the dispatcher publishes tasks to it: with no result backend, so that
    a publish does not subscribe to the task's result channel (Celery's Redis backend does, for a
    result nobody here reads). The team's worker stores the task's result with its own backend.
    Its control messages (a revoke) go where a team's app sends its own, not to Ductor's workers."""
    conf = ductor_app.conf
    return Celery("ductor-publisher", broker=conf.broker_url, set_as_current=False,
                  config_source={"task_serializer": "json", "accept_content": ["json"],
                                 "broker_transport": conf.broker_transport,
                                 "broker_transport_options": conf.broker_transport_options,
                                 "broker_connection_retry_on_startup": True})


def broker_app(name: str) -> Celery:
    """The Celery app that publishes to the broker ``name`` (``default``: Ductor's own)."""
    if name == DEFAULT_BROKER:
        return _own_broker()
    if name not in settings.DUCTOR_TASK_BROKERS:
        raise NoQueue(f"broker '{name}' is not configured (DUCTOR_TASK_BROKERS)")
    return _named_broker(name)


def _broker_of(connection_id: str) -> Celery:
    """The app of the broker of the celery connection ``connection_id`` ("": the catalog queue's, on
    Ductor's own), for the tenant in context."""
    member = routing_table().member(connection_id) if connection_id else None
    return broker_app(member.broker if member and member.broker else DEFAULT_BROKER)


def sent_through(step: StepRun) -> str:
    """The id of the celery connection the task node attempt ``step``'s messages went through, as its
    routing trace names it ("": none, the catalog queue's)."""
    return str(((step.routing or {}).get("connection") or {}).get("id") or "")


def revoke(step: StepRun, connection_id: str) -> None:
    """Revoke the task node attempt ``step``'s messages on the broker of the celery connection
    ``connection_id`` they went through. Never raises: a broker away leaves the task to run, and its
    result to be discarded."""
    try:
        _broker_of(connection_id).control.revoke(str(step.pk))
    except Exception:
        log.warning("task_revoke_failed", step_id=str(step.pk), exc_info=True)


def tell_ended(step: StepRun, connection_id: str, worker: str) -> None:
    """Tell the Celery worker ``worker`` (its node name), on the broker of the celery connection
    ``connection_id``, that the attempt ``step`` has ended while its task runs there: the task's
    next ``heartbeat()`` raises ``StepCancelled`` (``ductor_sdk.worker.cancels``). Never raises."""
    try:
        _broker_of(connection_id).control.broadcast(CANCEL_COMMAND, arguments={"task_id": str(step.pk)},
                                                    destination=[worker])
    except Exception:
        log.warning("task_cancel_not_told", step_id=str(step.pk), worker=worker, exc_info=True)
