"""The shop's Celery app: ``celery -A shop_project worker -Q shop``.

Configured from the Django settings (``CELERY_*``) and prepared for Ductor's task nodes by
``ductor_sdk.worker.install``: the current step (``current_step()``) around every task, and the
errback that tells Ductor a failed task's exception type and message.
"""

from __future__ import annotations

import os

from celery import Celery
from ductor_sdk.worker import install

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop_project.settings")

app = Celery("shop")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
install(app)
