"""Celery autodiscovery entry: importing the engine registers its fair-queue handlers
(``tick``, ``step``), its wake-ups and its reconciler on every worker."""

from workflows import engine  # noqa: F401
