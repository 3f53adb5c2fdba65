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


def queue_is_empty() -> bool:
    """Nothing waits in the fair queue (due or not), and nothing is in flight, on any shard."""
    with no_tenant():
        depths = [fair_queue.depth(shard) for shard in range(settings.DUCTOR_QUEUE_SHARDS)]
    return all(row.backlog == 0 and row.in_flight == 0 for depth in depths for row in depth.tiers.values())
