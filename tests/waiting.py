"""Waiting on a condition in tests that drive real processes: poll it, never sleep and hope, and
fail naming what was awaited. Also the condition the end-to-end modules quiesce on."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings

from ductor_project.core.context import no_tenant
from scheduling import fair_queue


def wait_for(condition: Callable[[], Any], *, timeout: float = 30, every: float = 0.05, what: str) -> Any:
    """``condition()``'s first truthy value, polled every ``every`` seconds; fails the test after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)
    return value


def another_waits_on_a_lock() -> bool:
    """Whether another backend of this test database waits on a lock now (a statement of another
    thread, blocked by a lock this one holds): what a test forcing an interleaving waits for."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
        return bool(cursor.fetchone()[0])


def until_another_waits_on_a_lock(timeout: float = 15) -> bool:
    """Poll ``another_waits_on_a_lock`` until it holds (True) or ``timeout`` seconds pass (False: the
    other thread never blocked, as on code without the lock a test checks; the test then goes on
    and its assertions say what happened)."""
    deadline = time.monotonic() + timeout
    while not another_waits_on_a_lock():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def in_a_thread(results: dict[str, Any], key: str, work: Callable[[], Any]) -> Any:
    """``work()`` started in a thread (returned), on connections of its own: ``results[key]`` is what it
    returned, or its exception, once it has ended. With ``until_another_waits_on_a_lock``, how a test
    forces two writes to meet."""
    import threading

    from django.db import connections

    def run() -> None:
        try:
            results[key] = work()
        except Exception as exc:
            results[key] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def backend_pid() -> int:
    """The PostgreSQL backend of this thread's database connection."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def until_blocked(waiter: int, by: int | None = None, timeout: float = 30) -> bool:
    """Poll until the backend ``waiter`` waits on a lock that the backend ``by`` holds (any backend's,
    when None): True, or False after ``timeout`` seconds (the test then goes on, and its assertions
    say what happened). What a test forcing an interleaving of transactions waits for."""
    from django.db import connection

    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT pg_blocking_pids(%s)", [waiter])
            blockers = cursor.fetchone()[0]
            if (by in blockers) if by is not None else blockers:
                return True
            time.sleep(0.02)
    return False


def queue_is_empty() -> bool:
    """Nothing waits in the fair queue (due or not), and nothing is in flight, on any shard."""
    with no_tenant():
        depths = [fair_queue.depth(shard) for shard in range(settings.DUCTOR_QUEUE_SHARDS)]
    return all(row.backlog == 0 and row.in_flight == 0 for depth in depths for row in depth.tiers.values())
