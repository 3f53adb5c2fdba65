"""Celery tasks of the scheduling app (found by Celery's autodiscovery).

Importing the broker registers ``ductor.execute_item``; importing the
coordinator registers the wake-up handler it dispatches to.
"""

from scheduling import coordinator  # noqa: F401 - registers the "wakeup" item handler
from scheduling.broker import execute_item

__all__ = ["execute_item"]
