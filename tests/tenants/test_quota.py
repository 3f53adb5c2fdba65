"""The monthly run quota and the object ceilings, against real PostgreSQL and Redis.

PostgreSQL is the truth for the quota (one conditional upsert per charge);
Redis only holds the "used up" fast-path flag. Concurrency tests use real
threads, each with its own database connection, on a transactional database.
"""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from django.db import IntegrityError, connection, transaction

from ductor_project.core.capacity import acquire, tenant_in_flight, tenant_scope
from ductor_project.core.context import TenantScopeError, tenant_context
from ductor_project.core.errors import exception_handler
from tenants import services, usage
from tenants.entitlements import effective_entitlements
from tenants.models import MonthlyUsage, Plan, Tenant
from tenants.usage import (
    PlanLimitReached,
    QuotaExceeded,
    enforce_ceiling,
    month_start,
    next_reset,
    quota_consume,
    quota_consume_at_commit,
    runs_this_month,
)
from tests.conftest import api_client, in_threads
from tests.scoped.models import Folder


class Boom(Exception):
    pass


@pytest.fixture
def tenant(make_tenant, redis_client) -> Tenant:
    return make_tenant("quota-co", plan="free")[0]


def with_quota(tenant: Tenant, quota: int) -> Tenant:
    services.override_set(tenant=tenant, field="monthly_run_quota", value=quota)
    return tenant


def usage_row(tenant: Tenant) -> int | None:
    row = MonthlyUsage.all_tenants.filter(tenant=tenant, month=month_start()).first()
    return row.runs_started if row else None


def flag_key(tenant: Tenant) -> str:
    return usage._flag_key(tenant, month_start())


def charge(tenant: Tenant, runs: int = 1) -> int:
    with tenant_context(tenant):
        return quota_consume(runs=runs)


def charge_then_fail(tenant: Tenant) -> None:
    """Charge one run inside a transaction that then fails."""
    with transaction.atomic():
        assert charge(tenant) == 1
        raise Boom


# --- the monthly run quota -----------------------------------------------------


def test_quota_consume_charges_up_to_the_quota_then_refuses_with_429_quota_exceeded(tenant):
    with_quota(tenant, 3)
    assert [charge(tenant) for _ in range(3)] == [1, 2, 3]

    with pytest.raises(QuotaExceeded) as refused:
        charge(tenant)

    exc = refused.value
    reset = next_reset()
    assert exc.status_code == 429
    assert exc.error_code == "quota_exceeded"
    assert exc.details == {
        "limit": "monthly_run_quota", "quota": 3, "plan": "free", "resets_at": reset.isoformat(),
    }
    assert reset.isoformat() in str(exc.detail)
    assert int(exc.headers["Retry-After"]) >= 1
    assert usage_row(tenant) == 3


def test_quota_exceeded_answers_in_the_api_error_shape_with_retry_after(tenant):
    with_quota(tenant, 0)
    with pytest.raises(QuotaExceeded) as refused:
        charge(tenant)

    response = exception_handler(refused.value, {})

    assert response.status_code == 429
    error = response.data["error"]
    assert error["code"] == "quota_exceeded"
    assert error["details"]["resets_at"] == next_reset().isoformat()
    assert error["details"]["limit"] == "monthly_run_quota"
    assert error["message"]
    retry_after = int(response["Retry-After"])
    assert 1 <= retry_after <= int((next_reset() - datetime.now(UTC)).total_seconds()) + 1


def test_the_quota_resets_at_midnight_utc_on_the_first_of_next_month():
    assert next_reset(datetime(2026, 11, 30, 8, 0, tzinfo=UTC)) == datetime(2026, 12, 1, tzinfo=UTC)
    assert next_reset(datetime(2026, 12, 31, 23, 59, tzinfo=UTC)) == datetime(2027, 1, 1, tzinfo=UTC)
    assert next_reset(datetime(2027, 1, 1, 0, 0, tzinfo=UTC)) == datetime(2027, 2, 1, tzinfo=UTC)
    # 23:30 on 30 November in New York is already December in UTC.
    new_york = timezone(timedelta(hours=-5))
    late = datetime(2026, 11, 30, 23, 30, tzinfo=new_york)
    assert month_start(late) == date(2026, 12, 1)
    assert next_reset(late) == datetime(2027, 1, 1, tzinfo=UTC)


def test_the_reset_time_is_the_first_of_next_month_utc(tenant):
    with_quota(tenant, 0)
    with pytest.raises(QuotaExceeded) as refused:
        charge(tenant)
    resets_at = datetime.fromisoformat(refused.value.details["resets_at"])
    now = datetime.now(UTC)
    assert resets_at.utcoffset() == timedelta(0)
    assert (resets_at.day, resets_at.hour, resets_at.minute, resets_at.second) == (1, 0, 0, 0)
    assert resets_at > now
    assert (resets_at - timedelta(days=1)).month == now.month


def test_a_refused_charge_changes_nothing(tenant):
    with_quota(tenant, 3)
    charge(tenant)
    charge(tenant)

    with pytest.raises(QuotaExceeded):
        charge(tenant, runs=2)  # 2 + 2 > 3

    assert usage_row(tenant) == 2
    # A refused batch does not mark the month as used up: one more run still fits.
    assert charge(tenant) == 3
    assert usage_row(tenant) == 3


def test_a_first_charge_larger_than_the_quota_creates_no_usage_row(tenant):
    with_quota(tenant, 3)
    with pytest.raises(QuotaExceeded):
        charge(tenant, runs=4)
    assert usage_row(tenant) is None
    assert charge(tenant, runs=3) == 3


def test_a_charge_of_several_runs_counts_them_all(tenant):
    with_quota(tenant, 10)
    assert charge(tenant, runs=4) == 4
    assert charge(tenant, runs=6) == 10
    with tenant_context(tenant):
        assert runs_this_month() == 10


def test_quota_consume_refuses_fewer_than_one_run(tenant):
    with pytest.raises(ValueError, match="at least 1"):
        charge(tenant, runs=0)
    with pytest.raises(ValueError, match="at least 1"):
        charge(tenant, runs=-5)
    assert usage_row(tenant) is None


def test_quota_consume_needs_a_tenant_in_context(tenant):
    with pytest.raises(TenantScopeError):
        quota_consume()


def test_the_charge_rolls_back_with_the_surrounding_transaction(tenant):
    with_quota(tenant, 2)
    with pytest.raises(Boom):
        charge_then_fail(tenant)
    assert usage_row(tenant) is None
    assert [charge(tenant), charge(tenant)] == [1, 2]


def test_a_start_that_rolls_back_its_outermost_transaction_gives_its_charge_back(
    transactional_db, make_tenant, redis_client
):
    tenant = with_quota(make_tenant("rollback-co", plan="free")[0], 1)
    assert not connection.in_atomic_block
    with pytest.raises(Boom):
        charge_then_fail(tenant)
    assert usage_row(tenant) is None
    assert charge(tenant) == 1  # the one run of the quota is still available


def test_runs_this_month_counts_only_the_current_calendar_month(tenant):
    with tenant_context(tenant):
        MonthlyUsage.objects.create(month=date(2020, 1, 1), runs_started=999)
        assert runs_this_month() == 0
        quota_consume()
        assert runs_this_month() == 1


def test_last_months_usage_does_not_count_against_this_months_quota(tenant):
    with_quota(tenant, 1)
    with tenant_context(tenant):
        MonthlyUsage.objects.create(month=date(2020, 1, 1), runs_started=1)
    assert charge(tenant) == 1


# --- the Redis fast path ---------------------------------------------------------


def test_once_the_quota_is_used_up_refusals_come_from_redis_without_a_query(
    tenant, redis_client, django_assert_num_queries
):
    with_quota(tenant, 1)
    charge(tenant)
    with pytest.raises(QuotaExceeded):
        charge(tenant)  # PostgreSQL refuses and Redis remembers
    assert redis_client.exists(flag_key(tenant)) == 1
    assert 0 < redis_client.ttl(flag_key(tenant)) <= (next_reset() - datetime.now(UTC)).total_seconds() + 1

    with django_assert_num_queries(0), pytest.raises(QuotaExceeded):
        charge(tenant)
    assert usage_row(tenant) == 1


def test_while_this_process_s_last_charge_left_room_the_flag_is_not_read(tenant, redis_client, monkeypatch):
    with_quota(tenant, 3)
    charge(tenant)  # the month's first: the flag is read once
    reads: list[str] = []
    real = usage.get_redis

    def counting() -> object:
        client = real()
        reads.append("client")
        return client

    monkeypatch.setattr(usage, "get_redis", counting)
    charge(tenant)
    charge(tenant)  # the last run of the quota: the charge before left room for it
    assert reads == []
    with pytest.raises(QuotaExceeded):
        charge(tenant)  # no room left: the flag is read, then PostgreSQL refuses and Redis remembers
    assert reads
    assert redis_client.exists(flag_key(tenant)) == 1
    reads.clear()
    with pytest.raises(QuotaExceeded):
        charge(tenant)  # from the flag
    assert reads == ["client"]
    assert usage_row(tenant) == 3


def test_an_override_raising_the_quota_clears_the_redis_flag(tenant, redis_client):
    with_quota(tenant, 1)
    charge(tenant)
    with pytest.raises(QuotaExceeded):
        charge(tenant)
    assert redis_client.exists(flag_key(tenant)) == 1

    with_quota(tenant, 3)

    assert redis_client.exists(flag_key(tenant)) == 0
    assert [charge(tenant), charge(tenant)] == [2, 3]
    with pytest.raises(QuotaExceeded):
        charge(tenant)


def test_clearing_the_quota_override_lifts_the_redis_flag(tenant, redis_client):
    with_quota(tenant, 1)
    charge(tenant)
    with pytest.raises(QuotaExceeded):
        charge(tenant)
    services.override_clear(tenant=tenant, field="monthly_run_quota")  # back to free: 10,000
    assert charge(tenant) == 2


def test_a_plan_edit_raising_the_quota_lifts_the_redis_flag(tenant, redis_client):
    plan = Plan.objects.get(pk="free")
    plan.monthly_run_quota = 1
    plan.save()
    charge(tenant)
    with pytest.raises(QuotaExceeded):
        charge(tenant)
    assert redis_client.exists(flag_key(tenant)) == 1

    plan.monthly_run_quota = 2
    plan.save()

    assert charge(tenant) == 2


def test_moving_the_tenant_to_a_bigger_plan_lifts_the_redis_flag(tenant, redis_client):
    with_quota(tenant, 1)
    charge(tenant)
    with pytest.raises(QuotaExceeded):
        charge(tenant)
    services.override_clear(tenant=tenant, field="monthly_run_quota")
    plan = Plan.objects.get(pk="free")
    plan.monthly_run_quota = 1
    plan.save()
    with pytest.raises(QuotaExceeded):
        charge(tenant)

    services.tenant_set_plan(tenant=tenant, plan_slug="pro")

    assert charge(tenant) == 2


def test_a_flag_left_by_an_older_quota_is_not_honoured(tenant, redis_client):
    with_quota(tenant, 5)
    redis_client.set(flag_key(tenant), 4)  # set when the quota was 4 and not cleared
    assert charge(tenant) == 1


# --- isolation -----------------------------------------------------------------


def test_one_tenant_using_up_its_quota_leaves_another_tenants_quota_untouched(make_tenant, redis_client):
    a = with_quota(make_tenant("a", plan="free")[0], 2)
    b = with_quota(make_tenant("b", plan="free")[0], 2)
    charge(a)
    charge(a)
    with pytest.raises(QuotaExceeded):
        charge(a)

    assert charge(b) == 1
    assert charge(b) == 2
    assert usage_row(a) == 2
    assert usage_row(b) == 2
    with tenant_context(b):
        assert runs_this_month() == 2


def test_tenant_a_using_up_its_concurrency_rate_and_quota_leaves_tenant_b_unaffected(
    tenant_a, tenant_b, redis_client
):
    (a, raw_a), (b, raw_b) = tenant_a, tenant_b
    for tenant in (a, b):
        for field, value in [("max_concurrency", 2), ("api_rate_per_s", 1), ("api_burst", 2),
                             ("monthly_run_quota", 1)]:
            services.override_set(tenant=tenant, field=field, value=value)

    def take_slot(tenant: Tenant, holder: str) -> bool:
        with tenant_context(tenant):
            limit = effective_entitlements(tenant).max_concurrency
            return acquire([tenant_scope(limit)], holder, lease_s=60)

    # A uses up everything.
    assert [take_slot(a, f"a{i}") for i in range(3)] == [True, True, False]
    client_a = api_client(raw_a)
    assert [client_a.get("/api/v1/tenant").status_code for _ in range(3)] == [200, 200, 429]
    charge(a)
    with pytest.raises(QuotaExceeded):
        charge(a)

    # B is untouched.
    assert take_slot(b, "b0") is True
    assert take_slot(b, "b1") is True
    client_b = api_client(raw_b)
    assert [client_b.get("/api/v1/tenant").status_code for _ in range(2)] == [200, 200]
    assert charge(b) == 1
    with tenant_context(b):
        assert tenant_in_flight() == 2
    with tenant_context(a):
        assert tenant_in_flight() == 2


# --- concurrency -----------------------------------------------------------------


@pytest.mark.parametrize(("quota", "already", "racers"), [(5, 0, 24), (10, 8, 24)])
def test_threads_racing_at_the_quota_boundary_never_overshoot(
    transactional_db, make_tenant, redis_client, quota, already, racers
):
    tenant = with_quota(make_tenant("race-co", plan="free")[0], quota)
    if already:
        charge(tenant, runs=already)

    def start(_: int) -> int | Exception:
        try:
            return charge(tenant)
        except QuotaExceeded as exc:
            return exc

    results = in_threads(racers, start)

    totals = sorted(r for r in results if isinstance(r, int))
    refused = [r for r in results if isinstance(r, QuotaExceeded)]
    assert totals == list(range(already + 1, quota + 1))  # each charge saw its own new total
    assert len(refused) == racers - (quota - already)
    assert len(totals) + len(refused) == racers
    assert usage_row(tenant) == quota


def test_threads_charging_several_runs_at_once_never_overshoot(
    transactional_db, make_tenant, redis_client
):
    tenant = with_quota(make_tenant("batch-co", plan="free")[0], 10)

    def start(index: int) -> int | Exception:
        try:
            return charge(tenant, runs=1 + index % 3)
        except QuotaExceeded as exc:
            return exc

    results = in_threads(16, start)

    assert usage_row(tenant) <= 10
    charged = [1 + i % 3 for i, r in enumerate(results) if isinstance(r, int)]
    assert sum(charged) == usage_row(tenant)
    assert all(isinstance(r, int | QuotaExceeded) for r in results)


# --- a charge sent with the start's COMMIT ---------------------------------------------


def commit_with_charge(tenant: Tenant, runs: int = 1, *, name: str = "kept") -> None:
    """A start's transaction of its own: a row of the tenant, then the charge sent with the COMMIT;
    refused as a start refuses it."""
    charge = None
    try:
        with tenant_context(tenant), transaction.atomic():
            charge = quota_consume_at_commit(runs=runs)
            Folder.objects.create(name=name)
    except IntegrityError as exc:
        refused = charge.refusal(exc) if charge is not None else None
        if refused is None:
            raise
        raise refused from None


def folders(tenant: Tenant) -> list[str]:
    with tenant_context(tenant):
        return sorted(Folder.objects.values_list("name", flat=True))


def test_a_charge_sent_with_the_commit_counts_and_past_the_quota_fails_the_commit_keeping_nothing(
    transactional_db, make_tenant, redis_client
):
    tenant = with_quota(make_tenant("commit-co", plan="free")[0], 2)
    commit_with_charge(tenant, name="one")
    charge(tenant)  # another process's charge: this one's last answer still leaves room
    assert usage_row(tenant) == 2

    with pytest.raises(QuotaExceeded) as refused:
        commit_with_charge(tenant, name="refused")  # the row's check constraint fails the COMMIT

    assert refused.value.details["quota"] == 2
    assert usage_row(tenant) == 2
    assert folders(tenant) == ["one"]  # nothing of the refused transaction is kept
    assert redis_client.get(flag_key(tenant)) == b"2"  # the month is known to be used up
    with pytest.raises(QuotaExceeded):
        commit_with_charge(tenant, name="flagged")  # refused at once, from the flag
    assert folders(tenant) == ["one"]


def test_the_answer_of_a_charge_sent_with_the_commit_spares_the_next_charge_the_flag(
    transactional_db, make_tenant, redis_client, monkeypatch
):
    tenant = with_quota(make_tenant("seen-co", plan="free")[0], 3)
    commit_with_charge(tenant, name="one")  # the month's first: the flag is read once
    reads: list[str] = []
    real = usage.get_redis
    monkeypatch.setattr(usage, "get_redis", lambda: reads.append("client") or real())

    commit_with_charge(tenant, name="two")
    commit_with_charge(tenant, name="three")  # the charge before answered 2 of 3: room for it

    assert reads == []
    assert usage_row(tenant) == 3


def test_a_charge_made_before_the_commit_counts_the_one_the_commit_will_send(
    transactional_db, make_tenant, redis_client
):
    tenant = with_quota(make_tenant("pending-co", plan="free")[0], 2)
    charge(tenant)
    with tenant_context(tenant), transaction.atomic():
        quota_consume_at_commit(runs=1)  # the run being started
        with pytest.raises(QuotaExceeded):
            quota_consume(runs=1)  # a child its first tick starts: the quota's last run is taken
    assert usage_row(tenant) == 2
    # The month is used up only if that transaction commits: the refusal leaves no flag.
    assert redis_client.exists(flag_key(tenant)) == 0


def test_the_month_s_row_is_not_locked_by_a_start_before_its_commit(transactional_db, make_tenant, redis_client):
    tenant = with_quota(make_tenant("lock-co", plan="free")[0], 10)
    charge(tenant)  # the month's row exists
    charged, done = threading.Event(), threading.Event()

    def start() -> None:  # a start whose transaction is still open
        with tenant_context(tenant), transaction.atomic():
            quota_consume_at_commit(runs=1)
            Folder.objects.create(name="open")
            charged.set()
            assert done.wait(30)
        connection.close()

    opened = threading.Thread(target=start)
    opened.start()
    try:
        assert charged.wait(30)
        with tenant_context(tenant), transaction.atomic():
            # Were the row locked, this charge would wait for the other transaction, which waits for it.
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '5s'")
            assert quota_consume(runs=1) == 2
    finally:
        done.set()
        opened.join()
    assert usage_row(tenant) == 3


def test_threads_sending_charges_with_their_commits_at_the_quota_boundary_never_overshoot(
    transactional_db, make_tenant, redis_client
):
    tenant = with_quota(make_tenant("commit-race-co", plan="free")[0], 5)
    charge(tenant, runs=2)

    def start(index: int) -> str | Exception:
        try:
            commit_with_charge(tenant, name=f"f{index}")
            return "started"
        except QuotaExceeded as exc:
            return exc

    results = in_threads(8, start)

    assert results.count("started") == 3
    assert all(r == "started" or isinstance(r, QuotaExceeded) for r in results)
    assert usage_row(tenant) == 5
    assert len(folders(tenant)) == 3


def test_one_tenant_s_charges_sent_with_the_commit_neither_count_nor_refuse_for_another(
    transactional_db, make_tenant, redis_client
):
    a = with_quota(make_tenant("commit-a-co", plan="free")[0], 1)
    b = with_quota(make_tenant("commit-b-co", plan="free")[0], 1)
    commit_with_charge(a, name="a1")
    with pytest.raises(QuotaExceeded):
        commit_with_charge(a, name="a2")  # a's month is used up, and flagged

    commit_with_charge(b, name="b1")  # b's month is its own

    assert (usage_row(a), usage_row(b)) == (1, 1)
    assert (folders(a), folders(b)) == (["a1"], ["b1"])
    assert redis_client.exists(flag_key(b)) == 0
    c = with_quota(make_tenant("commit-c-co", plan="free")[0], 1)
    d = with_quota(make_tenant("commit-d-co", plan="free")[0], 1)
    with transaction.atomic():
        with tenant_context(c):
            quota_consume_at_commit(runs=1)
        with tenant_context(d):
            assert quota_consume(runs=1) == 1  # c's pending charge is c's alone
    assert (usage_row(c), usage_row(d)) == (1, 1)


def test_the_month_s_row_refuses_a_total_past_the_quota_it_was_charged_under(tenant):
    with_quota(tenant, 2)
    charge(tenant)
    with pytest.raises(IntegrityError), transaction.atomic():
        MonthlyUsage.all_tenants.filter(tenant=tenant, month=month_start()).update(runs_started=3)
    assert usage_row(tenant) == 1


# --- object ceilings -------------------------------------------------------------


def create_folder(name: str) -> Folder:
    with transaction.atomic():
        enforce_ceiling("pools", Folder.objects.all())
        return Folder.objects.create(name=name)


def test_creating_past_the_ceiling_is_refused_with_403_plan_limit_reached_naming_limit_and_plan(tenant):
    services.override_set(tenant=tenant, field="max_pools", value=2)
    with tenant_context(tenant):
        create_folder("one")
        create_folder("two")
        with pytest.raises(PlanLimitReached) as refused:
            create_folder("three")
        assert Folder.objects.count() == 2  # the refused create changed nothing

    exc = refused.value
    assert exc.status_code == 403
    assert exc.error_code == "plan_limit_reached"
    assert exc.details == {"limit": "max_pools", "plan": "free", "maximum": 2, "current": 2}
    assert "max_pools" in str(exc.detail)
    assert "free" in str(exc.detail)

    response = exception_handler(exc, {})
    assert response.status_code == 403
    assert response.data["error"]["code"] == "plan_limit_reached"
    assert response.data["error"]["details"]["limit"] == "max_pools"
    assert response.data["error"]["details"]["plan"] == "free"


def test_the_plans_ceiling_applies_without_an_override(tenant):
    with tenant_context(tenant):  # free: max_pools = 3
        for name in ("a", "b", "c"):
            create_folder(name)
        with pytest.raises(PlanLimitReached) as refused:
            create_folder("d")
    assert refused.value.details["maximum"] == 3


def test_a_ceiling_of_zero_refuses_the_first_object(tenant):
    services.override_set(tenant=tenant, field="max_pools", value=0)
    with tenant_context(tenant):
        with pytest.raises(PlanLimitReached):
            create_folder("first")
        assert Folder.objects.count() == 0


def test_raising_the_ceiling_allows_more_objects(tenant):
    services.override_set(tenant=tenant, field="max_pools", value=1)
    with tenant_context(tenant):
        create_folder("one")
        with pytest.raises(PlanLimitReached):
            create_folder("two")
    services.override_set(tenant=tenant, field="max_pools", value=2)
    with tenant_context(tenant):
        create_folder("two")
        assert Folder.objects.count() == 2


def test_the_ceiling_counts_only_the_tenants_own_objects(make_tenant, redis_client):
    a = make_tenant("a", plan="free")[0]
    b = make_tenant("b", plan="free")[0]
    services.override_set(tenant=a, field="max_pools", value=2)
    with tenant_context(b):
        for name in ("b1", "b2", "b3"):
            create_folder(name)
    with tenant_context(a):
        create_folder("a1")
        create_folder("a2")
        with pytest.raises(PlanLimitReached):
            create_folder("a3")
    with tenant_context(b):
        assert Folder.objects.count() == 3


def test_enforce_ceiling_refuses_an_unknown_kind(tenant):
    with tenant_context(tenant), transaction.atomic(), pytest.raises(ValueError, match="unknown ceiling"):
        enforce_ceiling("widgets", Folder.objects.all())


def test_enforce_ceiling_needs_a_tenant_in_context(tenant):
    with transaction.atomic(), pytest.raises(TenantScopeError):
        enforce_ceiling("pools", Folder.all_tenants.all())


def test_enforce_ceiling_must_be_called_inside_the_creating_transaction(
    transactional_db, make_tenant, redis_client
):
    tenant = make_tenant("no-tx", plan="free")[0]
    with tenant_context(tenant):
        assert not connection.in_atomic_block
        with pytest.raises(RuntimeError, match="inside the creating transaction"):
            enforce_ceiling("pools", Folder.objects.all())
        with transaction.atomic():
            enforce_ceiling("pools", Folder.objects.all())


def test_concurrent_creates_never_pass_the_ceiling(
    transactional_db, make_tenant, redis_client
):
    tenant = make_tenant("race-co", plan="free")[0]
    services.override_set(tenant=tenant, field="max_pools", value=3)

    def create(index: int) -> Folder | Exception:
        with tenant_context(tenant):
            try:
                return create_folder(f"f{index}")
            except PlanLimitReached as exc:
                return exc

    results = in_threads(12, create)

    assert sum(isinstance(r, Folder) for r in results) == 3
    assert sum(isinstance(r, PlanLimitReached) for r in results) == 9
    assert Folder.all_tenants.filter(tenant=tenant).count() == 3


def test_the_ceiling_lock_does_not_block_other_inserts_of_the_tenant(
    transactional_db, make_tenant, redis_client
):
    """FOR NO KEY UPDATE on the tenant row: a foreign-key insert (FOR KEY SHARE) is not blocked."""
    tenant = make_tenant("lock-co", plan="free")[0]
    inserted = threading.Event()

    def insert_elsewhere(_: int) -> bool:
        with tenant_context(tenant), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '5s'")
            Folder.objects.create(name="elsewhere")
        inserted.set()
        return True

    with tenant_context(tenant), transaction.atomic():
        enforce_ceiling("pools", Folder.objects.all())  # holds the tenant row lock until commit
        results = in_threads(1, insert_elsewhere)
        assert results == [True]
        assert inserted.is_set()
        Folder.objects.create(name="mine")
    assert Folder.all_tenants.filter(tenant=tenant).count() == 2
