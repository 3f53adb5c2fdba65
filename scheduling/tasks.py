"""Celery tasks of the scheduling app (found by Celery's autodiscovery): ``ductor.execute_item``."""

from scheduling.dispatch.worker import execute_item

__all__ = ["execute_item"]
