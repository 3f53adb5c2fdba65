"""Capacity counters under real concurrency: OS processes racing one real Redis, and SIGKILL."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest

from ductor_project.core.capacity import acquire, in_flight, pool_scope, release, tenant_scope
from ductor_project.core.context import tenant_context
from tests.scheduling.helpers import redis_now_ms, sleep_until, spawn_worker

WORKERS = 8
TENANT_LIMIT = 3
POOL_LIMIT = 2
RACE_SECONDS = 1.5


def live_members(redis: Any, keys: list[str]) -> list[set[bytes]]:
    """One atomic snapshot (MULTI/EXEC) of the live leases of each scope, at Redis TIME."""
    pipe = redis.pipeline(transaction=True)
    pipe.time()
    for key in keys:
        pipe.zrange(key, 0, -1, withscores=True)
    (seconds, micros), *entries = pipe.execute()
    now_ms = seconds * 1000 + micros / 1000
    return [{member for member, expiry in scope if expiry > now_ms} for scope in entries]


@pytest.mark.timeout(300)  # eight Django start-ups on a small, shared host
def test_racing_processes_never_hold_more_than_the_limit(redis_client, tenant_a, tmp_path):
    """8 processes race acquire/release of [tenant, pool p0|p1]; a sampler checks every snapshot."""
    tenant = tenant_a[0]
    with tenant_context(tenant):
        keys = [tenant_scope(TENANT_LIMIT).key(), pool_scope("p0", 0).key(), pool_scope("p1", 0).key()]
    procs = [
        spawn_worker(tmp_path / f"worker-{i}.log", "race", str(tenant.pk), str(i), str(TENANT_LIMIT),
                     str(POOL_LIMIT), str(RACE_SECONDS))
        for i in range(WORKERS)
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()

        samples, max_held = 0, 0
        while any(proc.poll() is None for proc in procs):
            held, pool0, pool1 = live_members(redis_client, keys)
            samples += 1
            max_held = max(max_held, len(held))
            assert len(held) <= TENANT_LIMIT
            assert len(pool0) <= POOL_LIMIT
            assert len(pool1) <= POOL_LIMIT
            # All or nothing: every holder of the tenant scope holds exactly one pool, and back.
            assert held == pool0 | pool1
            assert not pool0 & pool1
        results = [json.loads(proc.communicate(timeout=30)[0].strip().splitlines()[-1]) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    assert all(proc.returncode == 0 for proc in procs)
    assert sum(r["bad_releases"] for r in results) == 0
    assert sum(r["acquired"] for r in results) > WORKERS
    assert sum(r["refused"] for r in results) > 0, "the processes never contended"
    assert samples > 10
    assert 1 <= max_held <= TENANT_LIMIT
    assert live_members(redis_client, keys) == [set(), set(), set()]


def test_a_killed_holders_slot_is_held_until_its_lease_ends_and_then_free(redis_client, tenant_a, tmp_path):
    tenant = tenant_a[0]
    scope = tenant_scope(1)
    proc = spawn_worker(tmp_path / "holder.log", "hold", str(tenant.pk), "doomed", "1.5")
    try:
        assert proc.stdout.readline().strip() == "acquired"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    with tenant_context(tenant):
        expiry = redis_client.zscore(scope.key(), "doomed")
        assert redis_now_ms(redis_client) < expiry
        assert in_flight(scope) == 1
        assert acquire([scope], "next", lease_s=30) is False

        sleep_until(redis_client, expiry - 100)
        assert acquire([scope], "next", lease_s=30) is False
        if redis_now_ms(redis_client) >= expiry:
            pytest.fail("the host was too slow to check the slot just before its lease ended")

        sleep_until(redis_client, expiry)
        assert in_flight(scope) == 0
        assert acquire([scope], "next", lease_s=30) is True
        assert release("doomed") == 0
        assert release("next") == 1
