"""Helpers of the scheduling tests: Redis TIME and keys, and child processes on this run's services."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ductor_project.core.redis import get_redis, is_cluster
from scheduling import fair_queue as fq
from tenants.models import Tenant
from tests.conftest import ROOT, service_env


def redis_now_ms(redis: Any) -> float:
    """Redis TIME in ms (with µs as the fraction): the clock the capacity scripts use."""
    seconds, micros = redis.time()
    return seconds * 1000 + micros / 1000


def redis_keys(redis: Any, pattern: str = "*") -> list[bytes]:
    """Every key matching ``pattern``, on every server (each primary of a Redis Cluster)."""
    if is_cluster(redis):
        return list(redis.keys(pattern, target_nodes=redis.PRIMARIES))
    return list(redis.keys(pattern))


def sleep_until(redis: Any, target_ms: float) -> None:
    """Sleep until Redis TIME reaches ``target_ms``, and no longer than that."""
    while (left := target_ms - redis_now_ms(redis)) > 0:
        time.sleep(left / 1000)


def lapse_lease(item: fq.Dequeued, tenant: Tenant) -> None:
    """End ``item``'s lease now, as its worker's death would once the lease ran out: the lease is cut
    to 1 ms (``extend_lease``) and Redis's clock waited past it. A test that holds a lease while it
    checks what the lease holds back takes a long one and ends it so, whatever the host's speed:
    a short one could end before the checks, on a busy host."""
    assert fq.extend_lease(item.item_id, lease_ms=1, delivery=item.delivery, tenant=tenant)
    sleep_until(get_redis(), redis_now_ms(get_redis()) + 2)


def spawn_worker(log: Path, *args: str) -> subprocess.Popen[str]:
    """Start ``tests.scheduling.capacity_worker`` against this run's Redis and database."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.scheduling.capacity_worker", *args],
        cwd=ROOT, env=service_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=log.open("w"), text=True,
    )
