"""A process's copies of a tenant's data are kept while the tenant's stamp is the same: read again
after a change of that tenant (at once in the process that made it, within ``LOCAL_TTL_S`` in any
other), after a plan change, and after the cache lost the stamp; never because another tenant
changed, and never more than once per ``LOCAL_TTL_S`` for the stamp itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.core.cache import cache

from tenants import freshness
from tenants.models import Plan, Tenant

pytestmark = pytest.mark.usefixtures("redis_client")


class Clock:
    """``time.monotonic`` as ``freshness`` reads it, moved by hand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        monkeypatch.setattr(freshness.time, "monotonic", lambda: self.now)

    def pass_ttl(self) -> None:
        self.now += freshness.LOCAL_TTL_S + 0.01


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    freshness.forget()
    return Clock(monkeypatch)


def counting(value: str) -> tuple[Callable[[], str], list[int]]:
    loads = [0]

    def load() -> str:
        loads[0] += 1
        return f"{value}-{loads[0]}"

    return load, loads


def another_process_changes(tenant: Tenant) -> None:
    """What ``renew`` does in another process: a new stamp, this process's reading left as it is."""
    known = dict(freshness._stamps)
    freshness.renew(tenant)
    freshness._stamps.update(known)


def test_a_copy_is_kept_across_ttls_while_the_stamp_is_the_same(db, make_tenant, clock):
    tenant, _ = make_tenant("fresh-kept")
    copies: freshness.Copies[str] = freshness.Copies()
    load, loads = counting("limits")

    first = copies.get(tenant, load)
    for _ in range(3):
        clock.pass_ttl()
        assert copies.get(tenant, load) == first

    assert loads == [1]


def test_another_process_s_change_is_seen_after_the_ttl_and_not_before(db, make_tenant, clock):
    tenant, _ = make_tenant("fresh-other")
    copies: freshness.Copies[str] = freshness.Copies()
    load, loads = counting("table")
    copies.get(tenant, load)

    another_process_changes(tenant)
    before_ttl = copies.get(tenant, load)
    clock.pass_ttl()
    after_ttl = copies.get(tenant, load)

    assert (before_ttl, after_ttl, loads) == ("table-1", "table-2", [2])


def test_the_process_that_made_a_change_sees_it_at_once(db, make_tenant, clock):
    tenant, _ = make_tenant("fresh-own")
    copies: freshness.Copies[str] = freshness.Copies()
    load, _ = counting("row")
    copies.get(tenant, load)

    freshness.bump(tenant)

    assert copies.get(tenant, load) == "row-2"


def test_a_plan_change_gives_every_tenant_a_new_stamp(db, make_tenant, clock):
    a, _ = make_tenant("fresh-plan-a")
    b, _ = make_tenant("fresh-plan-b")
    before = (freshness.stamp(a), freshness.stamp(b))

    plan = Plan.objects.get(pk="pro")
    plan.max_rules += 1
    plan.save()

    assert freshness.stamp(a) != before[0]
    assert freshness.stamp(b) != before[1]


def test_one_tenants_change_leaves_another_tenants_copies_alone(db, make_tenant, clock):
    a, _ = make_tenant("fresh-a")
    b, _ = make_tenant("fresh-b")
    copies: freshness.Copies[str] = freshness.Copies()
    load_a, loads_a = counting("a")
    load_b, loads_b = counting("b")
    copies.get(a, load_a)
    copies.get(b, load_b)

    freshness.bump(a)
    clock.pass_ttl()
    copies.get(a, load_a)
    copies.get(b, load_b)

    assert (loads_a, loads_b) == ([2], [1])


def test_a_stamp_the_cache_lost_reads_as_new(db, make_tenant, clock):
    tenant, _ = make_tenant("fresh-lost")
    copies: freshness.Copies[str] = freshness.Copies()
    load, loads = counting("endpoints")
    freshness.bump(tenant)
    copies.get(tenant, load)

    cache.clear()
    clock.pass_ttl()
    copies.get(tenant, load)

    assert loads == [2]


def test_reading_the_stamp_is_one_round_trip_per_ttl(db, make_tenant, clock, monkeypatch):
    tenant, _ = make_tenant("fresh-trips")
    calls: list[Any] = []
    real = cache.get_many
    monkeypatch.setattr(cache, "get_many", lambda keys: calls.append(keys) or real(keys))

    for _ in range(50):
        freshness.stamp(tenant)
    clock.pass_ttl()
    freshness.stamp(tenant)

    assert len(calls) == 2


def test_a_tenants_row_change_is_seen_by_the_worker_cache_at_once(db, make_tenant, clock):
    from tenants import services
    from tenants.tasking import cached_tenant

    tenant, _ = make_tenant("fresh-row")
    assert cached_tenant(str(tenant.pk)).status == Tenant.Status.ACTIVE

    services.tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)

    assert cached_tenant(str(tenant.pk)).status == Tenant.Status.SUSPENDED
