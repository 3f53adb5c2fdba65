"""The shop's settings. Everything that varies between deployments comes from the environment.

- ``SHOP_SECRET_KEY``: required.
- ``SHOP_DATABASE_URL``: its own PostgreSQL database (``postgres://user:pw@host:port/shop``).
- ``SHOP_BROKER_URL``: the broker Ductor publishes the task nodes to (Ductor's own Redis, unless a
  celery connection of the tenants names another), so that the results go back to Ductor there.
- ``SHOP_RESULT_BACKEND``: optional. Ductor learns a failed task's exception from the
  ``ductor_sdk.worker.install`` errback; a result backend is for the shop's own callers.
"""

from __future__ import annotations

import environ
from django.core.exceptions import ImproperlyConfigured

env = environ.Env()

SECRET_KEY = env.str("SHOP_SECRET_KEY")
DEBUG = env.bool("SHOP_DEBUG", default=False)
ALLOWED_HOSTS: list[str] = []
INSTALLED_APPS = ["shop"]

DATABASES = {"default": env.db_url("SHOP_DATABASE_URL")}
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise ImproperlyConfigured("SHOP_DATABASE_URL must name a PostgreSQL database (postgres://...)")
DATABASES["default"]["CONN_MAX_AGE"] = env.int("SHOP_DATABASE_CONN_MAX_AGE", default=60)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

CELERY_BROKER_URL = env.str("SHOP_BROKER_URL")
CELERY_RESULT_BACKEND = env.str("SHOP_RESULT_BACKEND", default="") or None
CELERY_TASK_DEFAULT_QUEUE = "shop"
# Every task is idempotent: a task lost with its worker runs again from the broker.
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
