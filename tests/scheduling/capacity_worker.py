"""A child process for the capacity tests, run as ``python -m tests.scheduling.capacity_worker``.

It gets this test run's services from ``tests.conftest.service_env()``. The
counters only need the tenant's id, so the child builds an unsaved ``Tenant``
with that id instead of reading the row: the parent's test transaction stays
private, and no transactional flush wipes the seeded plans.

Modes:
- ``race TENANT_ID INDEX TENANT_LIMIT POOL_LIMIT SECONDS``: print ``ready``,
  wait for a line on stdin, then acquire/release ``[tenant, pool p<INDEX % 2>]``
  in a loop; print one JSON line of counts.
- ``hold TENANT_ID HOLDER LEASE_S``: acquire the tenant scope (limit 1), print
  ``acquired``, and wait to be killed.
"""

from __future__ import annotations

import json
import random
import sys
import time
import uuid

import django


def _race(tenant_id: str, index: int, tenant_limit: int, pool_limit: int, seconds: float) -> None:
    from ductor_project.core import capacity

    scopes = [capacity.tenant_scope(tenant_limit), capacity.pool_scope(f"p{index % 2}", pool_limit)]
    tenant = _tenant(tenant_id)
    counts = {"acquired": 0, "refused": 0, "bad_releases": 0}
    print("ready", flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        holder = f"w{index}-{n}"
        n += 1
        if not capacity.acquire(scopes, holder, lease_s=30, tenant=tenant):
            counts["refused"] += 1
            continue
        counts["acquired"] += 1
        # Hold the slot a little every time, so that eight racers overlap even on a busy host.
        time.sleep(0.002 + random.random() / 500)
        if capacity.release(holder, tenant=tenant) != len(scopes):
            counts["bad_releases"] += 1
    print(json.dumps(counts), flush=True)


def _hold(tenant_id: str, holder: str, lease_s: float) -> None:
    from ductor_project.core import capacity

    acquired = capacity.acquire([capacity.tenant_scope(1)], holder, lease_s, tenant=_tenant(tenant_id))
    print("acquired" if acquired else "refused", flush=True)
    time.sleep(120)


def _tenant(tenant_id: str):
    from tenants.models import Tenant

    return Tenant(id=uuid.UUID(tenant_id))


def main(argv: list[str]) -> None:
    django.setup()
    mode, *args = argv
    if mode == "race":
        _race(args[0], int(args[1]), int(args[2]), int(args[3]), float(args[4]))
    elif mode == "hold":
        _hold(args[0], args[1], float(args[2]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
