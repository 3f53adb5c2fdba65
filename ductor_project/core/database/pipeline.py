"""Statements sent together: psycopg's pipeline mode on Django's connection.

Inside ``with pipelined():`` each statement is sent without waiting for its answer; they go
in one round trip, at the end of the block or when a result is first read (which waits for
all those before it). The server runs them in order, in the surrounding transaction; should
one fail, those after it in the batch are skipped and its error is raised then, at the read
or the block's end. For statements whose results are read only after all are sent: a
``rowcount`` is not known until the batch is answered.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection
from psycopg import pq


@contextmanager
def pipelined() -> Iterator[None]:
    """Inside a batch already in progress (a commit's), the statements join it."""
    connection.ensure_connection()
    if connection.connection.info.pipeline_status != pq.PipelineStatus.OFF:
        yield
        return
    with connection.wrap_database_errors, connection.connection.pipeline():  # Django's errors, as a cursor's
        yield
