"""The Celery app. ``celery -A ductor_project worker`` needs no other configuration.

A plain worker consumes both the customer work queue and the reserved system
queue (``ductor.system``); ``-Q ductor.system`` makes a worker serve only
engine-internal work.
"""

from __future__ import annotations

import os

from celery import Celery
from kombu import Exchange, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ductor_project.settings")

WORK_QUEUE = "ductor.work"
SYSTEM_QUEUE = "ductor.system"

app = Celery("ductor_project")
# Lazy: nothing here reads the settings, so importing the package starts no server.
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_default_queue = WORK_QUEUE
app.conf.task_queues = (
    Queue(WORK_QUEUE, Exchange(WORK_QUEUE), routing_key=WORK_QUEUE),
    Queue(SYSTEM_QUEUE, Exchange(SYSTEM_QUEUE), routing_key=SYSTEM_QUEUE),
)
app.autodiscover_tasks()
