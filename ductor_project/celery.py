"""The Celery app. ``celery -A ductor_project worker`` needs no other configuration.

A plain worker consumes both the customer work queue and the reserved system
queue (``ductor.system``); ``-Q ductor.system`` makes a worker serve only
engine-internal work.
"""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ductor_project.settings")

app = Celery("ductor_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = (
    Queue(app.conf.task_default_queue or "ductor.work"),
    Queue("ductor.system"),
)
app.autodiscover_tasks()
