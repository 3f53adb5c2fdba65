"""The Celery app. ``celery -A ductor_project worker`` needs no other configuration.

A plain worker consumes the customer work queue, the reserved system queue
(``ductor.system``) and the results of task nodes (``ductor.results``);
``-Q ductor.system`` makes a worker serve only engine-internal work. A results
worker (``RESULTS_WORKER_ARGS``: ``-Q ductor.results --pool solo``) records the
outcomes of task nodes alone, in its own process; beside one, the other workers
take ``STEP_WORKER_ARGS`` (docs/operations.md).

A worker traces (``ductor_project.core.tracing``, when the environment asks for
it) in each process that runs tasks: every prefork pool process from its start,
after the fork, flushing its spans before it exits; or the worker's own process
for a pool without processes (solo, threads).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals
from kombu import Exchange, Queue

from ductor_project import embedded
from ductor_project.core import tracing
from ductor_project.core.heap import freeze_startup_heap

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ductor_project.settings")

WORK_QUEUE = "ductor.work"
SYSTEM_QUEUE = "ductor.system"
# The outcomes of task nodes: the team's workers send them here (Celery's link / link_error).
RESULTS_QUEUE = "ductor.results"
# A worker of the outcomes alone. Recording one is Ductor's own short code that waits on PostgreSQL
# and Redis: the solo pool runs it in the worker's process, where a prefork pool would pass each
# message to a pool process and its result back through a pipe (8 to 20% of the outcome's
# CPU, docs/performance.md). One such worker per core; ``manage.py up`` starts one.
RESULTS_WORKER_ARGS = ("-Q", RESULTS_QUEUE, "--pool", "solo")
# The other workers' queues where results workers run: steps and engine-internal work.
STEP_WORKER_ARGS = ("-Q", f"{WORK_QUEUE},{SYSTEM_QUEUE}")

app = Celery("ductor_project")
# Lazy: nothing here reads the settings, so importing the package starts no server; the app's
# first configuration does (below).
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_default_queue = WORK_QUEUE
# Its workers' remote control and events on exchanges of their own: a team's workers share the
# broker, and a team's habitual `celery control shutdown` (or `inspect`, `events`) must neither reach
# Ductor's workers nor Ductor's reach theirs. `celery -A ductor_project ...` and Flower use these.
app.conf.control_exchange = "ductor"
app.conf.event_exchange = "ductor.ev"
app.conf.task_queues = (
    Queue(WORK_QUEUE, Exchange(WORK_QUEUE), routing_key=WORK_QUEUE),
    Queue(SYSTEM_QUEUE, Exchange(SYSTEM_QUEUE), routing_key=SYSTEM_QUEUE),
    Queue(RESULTS_QUEUE, Exchange(RESULTS_QUEUE), routing_key=RESULTS_QUEUE),
)
# The outcomes of task nodes, wherever they are sent from (the team's workers name the queue too).
app.conf.task_routes = {name: {"queue": RESULTS_QUEUE} for name in ("ductor.task_succeeded", "ductor.task_failed")}
app.autodiscover_tasks()


@app.on_configure.connect
def _boot_services(sender: Any = None, **kwargs: Any) -> None:
    """The first use of the app's configuration (a worker booting, a task sent) needs the broker:
    start the embedded servers the environment does not replace, before the settings are read."""
    embedded.boot()


@signals.worker_init.connect
def _check_worker(sender: Any = None, **kwargs: Any) -> None:
    """A worker whose settings or action modules are wrong stops before it takes any work."""
    from ductor_project.startup_checks import refuse_to_start

    refuse_to_start("celery worker")


@signals.worker_init.connect
def _trace_worker(sender: Any = None, **kwargs: Any) -> None:
    """A pool that runs tasks in the worker's own process (solo, threads) traces from here; a
    prefork pool's processes do from their own start (below)."""
    from celery import concurrency
    from celery.concurrency.prefork import TaskPool

    pool = concurrency.get_implementation(getattr(sender, "pool_cls", None) or "prefork")
    if not (isinstance(pool, type) and issubclass(pool, TaskPool)):
        tracing.configure()


@signals.worker_process_init.connect
def _start_pool_process(**kwargs: Any) -> None:
    """A prefork pool's process, once forked: it traces, and keeps what it inherited out of the
    garbage collector's way."""
    tracing.configure()
    freeze_startup_heap()


@signals.worker_ready.connect
def _freeze_worker(**kwargs: Any) -> None:
    """The worker's own process (which runs the tasks of a solo or threads pool), once ready."""
    freeze_startup_heap()


@signals.worker_process_shutdown.connect
def _flush_pool_process(**kwargs: Any) -> None:
    """A pool process exits without running its atexit hooks: its buffered spans go now."""
    tracing.shutdown()
