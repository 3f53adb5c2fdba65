"""Plans, overrides and the one resolver of effective limits, against real PostgreSQL and Redis.

Covers the seeded plan numbers, plan + overrides per field, the per-tenant
cache and every way it is invalidated (override set/clear, plan change, plan
edit by model save and through the admin), and the validation of limit values.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import transaction
from django.test import Client

from ductor_project.core.context import TenantScopeError, tenant_context
from tenants import entitlements, services
from tenants.entitlements import LIMIT_FIELDS, Entitlements, coerce_limit, effective_entitlements
from tenants.models import Plan, Tenant, TenantEntitlementOverride
from tests.tenants.seeded_plans import SEEDED, limits_of


def as_limits(found: Entitlements) -> dict[str, Any]:
    data = found.as_dict()
    return {name: data[name] for name in LIMIT_FIELDS}


@pytest.fixture
def free_tenant(make_tenant, redis_client) -> Tenant:
    return make_tenant("free-co", plan="free")[0]


@pytest.fixture
def superuser_client(db) -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


# --- seeded plans ------------------------------------------------------------


def test_the_migration_seeds_free_pro_and_enterprise_with_the_documented_numbers(db):
    plans = list(Plan.objects.all())
    assert [plan.slug for plan in plans] == ["free", "pro", "enterprise"]  # ordered by weight
    for plan in plans:
        for name, value in SEEDED[plan.slug].items():
            assert getattr(plan, name) == value, f"{plan.slug}.{name}"


def test_every_limit_of_the_resolver_is_a_plan_column(db):
    columns = {field.name for field in Plan._meta.fields}
    assert set(LIMIT_FIELDS) <= columns
    assert set(LIMIT_FIELDS) == set(SEEDED["free"]) - {"name"}


def test_a_new_tenant_is_on_the_free_plan(db):
    assert Tenant.objects.create(slug="plain", name="Plain").plan_id == "free"
    assert services.tenant_create(slug="by-service").plan_id == "free"


# --- plan + overrides ----------------------------------------------------------


def test_without_overrides_the_effective_limits_are_the_plans(free_tenant):
    found = effective_entitlements(free_tenant)
    assert found.plan == "free"
    assert found.overridden == ()
    assert as_limits(found) == limits_of("free")
    assert found.allowed_tiers == ("standard", "batch")


def test_an_override_replaces_only_its_own_field(free_tenant):
    services.override_set(tenant=free_tenant, field="max_pools", value=7)
    services.override_set(tenant=free_tenant, field="api_rate_per_s", value=3)
    services.override_set(tenant=free_tenant, field="allowed_tiers", value=["batch", "interactive"])

    found = effective_entitlements(free_tenant)

    expected = limits_of("free") | {
        "max_pools": 7, "api_rate_per_s": 3.0, "allowed_tiers": ["interactive", "batch"],
    }
    assert as_limits(found) == expected
    assert found.overridden == ("allowed_tiers", "api_rate_per_s", "max_pools")
    assert found.plan == "free"


def test_an_override_can_lower_a_limit_below_the_plan(free_tenant):
    services.override_set(tenant=free_tenant, field="monthly_run_quota", value=0)
    assert effective_entitlements(free_tenant).monthly_run_quota == 0


def test_an_override_of_one_tenant_never_changes_another_tenants_limits(make_tenant, redis_client):
    a = make_tenant("a", plan="pro")[0]
    b = make_tenant("b", plan="pro")[0]
    services.override_set(tenant=a, field="max_concurrency", value=1)
    assert effective_entitlements(a).max_concurrency == 1
    assert effective_entitlements(b).max_concurrency == 50
    assert effective_entitlements(b).overridden == ()


# --- the cache -----------------------------------------------------------------


def test_the_limits_are_cached_under_the_tenants_key_and_a_second_call_does_no_query(
    free_tenant, django_assert_num_queries
):
    key = entitlements._cache_key(free_tenant)
    assert key.startswith(f"t:{free_tenant.pk}:")
    assert cache.get(key) is None

    with django_assert_num_queries(2):  # the plan (through the tenant row) and the overrides
        first = effective_entitlements(free_tenant)
    assert cache.get(key) == first.as_dict()

    with django_assert_num_queries(0):
        second = effective_entitlements(free_tenant)
    assert second == first


UNPICKLED: list[str] = []


def _unpickled(what: str) -> None:
    UNPICKLED.append(what)


class _Payload:
    """What a pickle runs as it is read: here, a call that records it ran."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unpickled, ("ran",))


def test_a_pickle_written_into_the_cache_is_never_unpickled_only_read_as_missing(free_tenant):
    """Whoever can write to the cache's Redis (the broker's, by default) must not get code run in
    every process that reads an entry: the cache holds JSON, and anything else reads as missing."""
    key = entitlements._cache_key(free_tenant)
    raw = cache.client.get_client(write=True)  # type: ignore[attr-defined]
    raw.set(cache.make_key(key), pickle.dumps(_Payload()))
    entitlements._copies.forget(free_tenant)

    found = effective_entitlements(free_tenant)

    assert UNPICKLED == []
    assert as_limits(found) == limits_of("free")
    assert cache.get(key) == found.as_dict()  # computed again, and cached as JSON


def test_the_cached_limits_of_a_tenant_cannot_be_read_inside_another_tenants_context(make_tenant):
    a = make_tenant("a")[0]
    b = make_tenant("b")[0]
    effective_entitlements(a)
    with tenant_context(b), pytest.raises(TenantScopeError):
        effective_entitlements(a)


def test_setting_an_override_invalidates_the_cached_limits(free_tenant):
    assert effective_entitlements(free_tenant).max_pools == 3
    services.override_set(tenant=free_tenant, field="max_pools", value=9)
    assert cache.get(entitlements._cache_key(free_tenant)) is None
    found = effective_entitlements(free_tenant)
    assert found.max_pools == 9
    assert found.overridden == ("max_pools",)


def test_changing_an_override_invalidates_the_cached_limits(free_tenant):
    services.override_set(tenant=free_tenant, field="max_pools", value=9)
    assert effective_entitlements(free_tenant).max_pools == 9
    services.override_set(tenant=free_tenant, field="max_pools", value=4)
    assert effective_entitlements(free_tenant).max_pools == 4


def test_clearing_an_override_invalidates_the_cached_limits(free_tenant):
    services.override_set(tenant=free_tenant, field="max_pools", value=9)
    assert effective_entitlements(free_tenant).max_pools == 9
    assert services.override_clear(tenant=free_tenant, field="max_pools") is True
    found = effective_entitlements(free_tenant)
    assert found.max_pools == 3
    assert found.overridden == ()


def test_changing_the_tenants_plan_invalidates_the_cached_limits(free_tenant):
    assert effective_entitlements(free_tenant).plan == "free"
    services.tenant_set_plan(tenant=free_tenant, plan_slug="pro")
    found = effective_entitlements(free_tenant)
    assert found.plan == "pro"
    assert as_limits(found) == limits_of("pro")


def test_saving_the_tenant_with_another_plan_invalidates_the_cached_limits(free_tenant):
    assert effective_entitlements(free_tenant).plan == "free"
    free_tenant.plan_id = "enterprise"
    free_tenant.save()
    assert effective_entitlements(free_tenant).plan == "enterprise"


def test_a_tenant_object_loaded_before_a_plan_change_resolves_the_new_plan(free_tenant):
    stale = Tenant.objects.get(pk=free_tenant.pk)
    services.tenant_set_plan(tenant=free_tenant, plan_slug="pro")
    assert stale.plan_id == "free"
    # The resolver reads the plan through the tenant row, so a stale object
    # cannot put the old plan back into the cache.
    assert effective_entitlements(stale).plan == "pro"
    assert effective_entitlements(free_tenant).plan == "pro"


def test_editing_a_plan_with_model_save_invalidates_every_tenant_on_it(make_tenant, redis_client):
    a = make_tenant("a", plan="free")[0]
    b = make_tenant("b", plan="free")[0]
    assert effective_entitlements(a).max_rules == 20
    assert effective_entitlements(b).max_rules == 20

    plan = Plan.objects.get(pk="free")
    plan.max_rules = 33
    plan.save()

    assert effective_entitlements(a).max_rules == 33
    assert effective_entitlements(b).max_rules == 33


def test_an_override_wins_over_a_plan_edit(free_tenant):
    services.override_set(tenant=free_tenant, field="max_rules", value=2)
    plan = Plan.objects.get(pk="free")
    plan.max_rules = 33
    plan.save()
    assert effective_entitlements(free_tenant).max_rules == 2


def test_saving_and_deleting_an_override_row_directly_invalidates_the_cached_limits(free_tenant):
    assert effective_entitlements(free_tenant).max_workflows == 10
    with tenant_context(free_tenant):
        row = TenantEntitlementOverride.objects.create(field="max_workflows", value=1)
    assert effective_entitlements(free_tenant).max_workflows == 1
    with tenant_context(free_tenant):
        row.delete()
    assert effective_entitlements(free_tenant).max_workflows == 10


def test_an_override_stored_past_its_limit_s_bound_counts_as_the_bound(free_tenant):
    """A row written before the bound (or past the API) never makes every request of the tenant fail."""
    with tenant_context(free_tenant):
        TenantEntitlementOverride.objects.create(field="max_nesting_depth", value=1_000_000)
        TenantEntitlementOverride.objects.create(field="api_rate_per_s", value=1e300)
    found = effective_entitlements(free_tenant)
    assert (found.max_nesting_depth, found.api_rate_per_s) == (32, 1_000_000.0)


def test_a_stale_read_cached_between_an_override_write_and_its_commit_is_dropped_at_commit(
    free_tenant, django_capture_on_commit_callbacks
):
    key = entitlements._cache_key(free_tenant)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        services.override_set(tenant=free_tenant, field="max_pools", value=9)
        # Another process that read PostgreSQL before the commit caches the old limits.
        cache.set(key, "stale", 300)
    assert cache.get(key) == "stale"
    for callback in callbacks:
        callback()
    # The stale entry is gone: dropped, or replaced by what was read after the commit (the fair
    # queue's copy of the limits is rewritten then).
    assert cache.get(key) != "stale"
    assert effective_entitlements(free_tenant).max_pools == 9


def test_a_plan_edit_bumps_the_plan_version_again_at_commit(
    free_tenant, django_capture_on_commit_callbacks
):
    effective_entitlements(free_tenant)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        plan = Plan.objects.get(pk="free")
        plan.max_rules = 44
        plan.save()
        key_after_write = entitlements._cache_key(free_tenant)
        cache.set(key_after_write, "stale", 300)
    for callback in callbacks:
        callback()
    assert entitlements._cache_key(free_tenant) != key_after_write
    assert effective_entitlements(free_tenant).max_rules == 44


# --- admin edits invalidate too ------------------------------------------------


def plan_form(plan: Plan, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"slug": plan.slug, "name": plan.name}
    for name in LIMIT_FIELDS:
        data[name] = getattr(plan, name)
    data["allowed_tiers"] = ",".join(plan.allowed_tiers)
    data.update(changes)
    data["_save"] = "Save"
    return data


def test_editing_a_plan_in_the_admin_invalidates_the_cached_limits(free_tenant, superuser_client):
    assert effective_entitlements(free_tenant).max_workflows == 10
    plan = Plan.objects.get(pk="free")

    response = superuser_client.post(
        "/admin/tenants/plan/free/change/", plan_form(plan, max_workflows=12)
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    assert Plan.objects.get(pk="free").max_workflows == 12
    assert effective_entitlements(free_tenant).max_workflows == 12


def test_the_admin_refuses_a_plan_edit_that_would_break_the_limiters(free_tenant, superuser_client):
    plan = Plan.objects.get(pk="free")
    for field, bad in [("api_rate_per_s", "0"), ("step_rate_per_s", "-1"), ("api_burst", "0"),
                       ("weight", "0")]:
        response = superuser_client.post("/admin/tenants/plan/free/change/", plan_form(plan, **{field: bad}))
        assert response.status_code == 200, field  # the form is shown again with the error
        assert response.context["adminform"].form.errors.get(field), field
    assert Plan.objects.get(pk="free").updated_at == plan.updated_at
    assert as_limits(effective_entitlements(free_tenant)) == limits_of("free")


def test_setting_an_override_in_the_admin_invalidates_the_cached_limits(free_tenant, superuser_client):
    assert effective_entitlements(free_tenant).max_pools == 3

    response = superuser_client.post(
        "/admin/tenants/tenantentitlementoverride/add/",
        {"tenant": str(free_tenant.pk), "field": "max_pools", "value": "5", "reason": "deal",
         "_save": "Save"},
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    assert effective_entitlements(free_tenant).max_pools == 5
    row = TenantEntitlementOverride.all_tenants.get(tenant=free_tenant)
    assert (row.field, row.value, row.reason) == ("max_pools", 5, "deal")


def test_changing_an_override_in_the_admin_invalidates_the_cached_limits(free_tenant, superuser_client):
    row = services.override_set(tenant=free_tenant, field="max_pools", value=5)
    assert effective_entitlements(free_tenant).max_pools == 5
    url = f"/admin/tenants/tenantentitlementoverride/{row.pk}/change/"
    assert superuser_client.get(url).status_code == 200

    response = superuser_client.post(
        url, {"field": "max_pools", "value": "6", "reason": "bigger deal", "_save": "Save"}
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    assert effective_entitlements(free_tenant).max_pools == 6
    with tenant_context(free_tenant):
        row.refresh_from_db()
    assert (row.tenant_id, row.value, row.reason) == (free_tenant.pk, 6, "bigger deal")


def test_deleting_an_override_in_the_admin_invalidates_the_cached_limits(free_tenant, superuser_client):
    row = services.override_set(tenant=free_tenant, field="max_pools", value=5)
    assert effective_entitlements(free_tenant).max_pools == 5

    response = superuser_client.post(
        f"/admin/tenants/tenantentitlementoverride/{row.pk}/delete/", {"post": "yes"}
    )

    assert response.status_code == 302
    assert not TenantEntitlementOverride.all_tenants.filter(tenant=free_tenant).exists()
    assert effective_entitlements(free_tenant).max_pools == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_widgets", "5"), ("max_pools", '"five"'), ("max_pools", "-1"), ("api_rate_per_s", "0"),
     ("allowed_tiers", '["gold"]')],
)
def test_the_admin_refuses_an_override_the_api_would_refuse(free_tenant, superuser_client, field, value):
    response = superuser_client.post(
        "/admin/tenants/tenantentitlementoverride/add/",
        {"tenant": str(free_tenant.pk), "field": field, "value": value, "reason": "", "_save": "Save"},
    )
    assert response.status_code == 200  # the form is shown again with the error
    errors = response.context["adminform"].form.errors
    assert errors.get("field" if field == "max_widgets" else "value")
    assert not TenantEntitlementOverride.all_tenants.filter(tenant=free_tenant).exists()
    assert as_limits(effective_entitlements(free_tenant)) == limits_of("free")


# --- coerce_limit --------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "normalized"),
    [
        ("max_pools", 0, 0),
        ("max_pools", 2**31 - 1, 2**31 - 1),
        ("monthly_run_quota", 2**40, 2**40),
        ("max_concurrency", 1, 1),
        ("api_rate_per_s", 3, 3.0),
        ("step_rate_per_s", 0.25, 0.25),
        ("step_rate_per_s", 0.001, 0.001),
        ("history_retention_days", 36_500, 36_500),
        ("allowed_tiers", ["batch", "interactive", "batch"], ["interactive", "batch"]),
        ("allowed_tiers", ["standard"], ["standard"]),
    ],
)
def test_coerce_limit_accepts_and_normalizes_a_valid_value(field, value, normalized):
    result = coerce_limit(field, value)
    assert result == normalized
    assert type(result) is type(normalized)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_widgets", 1, "unknown limit 'max_widgets'"),
        ("plan", "pro", "unknown limit 'plan'"),
        ("overridden", [], "unknown limit 'overridden'"),
        ("max_pools", "3", "non-negative integer"),
        ("max_pools", 3.0, "non-negative integer"),
        ("max_pools", True, "non-negative integer"),
        ("max_pools", None, "non-negative integer"),
        ("max_pools", -1, "non-negative integer"),
        ("max_pools", 2**31, "at most"),
        ("monthly_run_quota", 2**63, "at most"),
        ("weight", 0, "at least 1"),
        ("max_concurrency", 0, "at least 1"),
        ("step_burst", 0, "at least 1"),
        ("api_burst", 0, "at least 1"),
        ("api_rate_per_s", 0, "at least 0.001"),
        ("api_rate_per_s", 1e-320, "at least 0.001"),
        ("api_rate_per_s", -1.5, "at least 0.001"),
        ("api_rate_per_s", True, "at least 0.001"),
        ("api_rate_per_s", "fast", "at least 0.001"),
        ("step_rate_per_s", 0.0009, "at least 0.001"),
        ("event_retention_days", 36_501, "at most 36500"),
        ("history_retention_days", 2**31 - 1, "at most 36500"),
        ("step_rate_per_s", math.inf, "finite"),
        ("step_rate_per_s", 1_000_001, "at most 1000000 per second"),
        ("api_rate_per_s", 1e300, "at most 1000000 per second"),
        ("max_nesting_depth", 33, "at most 32"),
        ("max_nesting_depth", 1_000_000, "at most 32"),
        ("max_payload_bytes", 256 * 1024 * 1024, "at most 268435455"),
        ("step_rate_per_s", math.nan, "finite"),
        ("allowed_tiers", [], "non-empty list of tiers"),
        ("allowed_tiers", ["gold"], "non-empty list of tiers"),
        ("allowed_tiers", "standard", "non-empty list of tiers"),
        ("allowed_tiers", ["system"], "non-empty list of tiers"),
    ],
)
def test_coerce_limit_refuses_an_unknown_field_a_wrong_type_or_an_out_of_range_value(field, value, message):
    with pytest.raises(ValueError, match=message):
        coerce_limit(field, value)


def test_the_entitlements_dataclass_is_immutable(free_tenant):
    found = effective_entitlements(free_tenant)
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.max_pools = 99  # type: ignore[misc]


def test_an_override_set_inside_a_rolled_back_transaction_leaves_no_row(free_tenant):
    class Boom(Exception):
        pass

    def set_then_fail() -> None:
        with transaction.atomic():
            services.override_set(tenant=free_tenant, field="max_pools", value=9)
            raise Boom

    with pytest.raises(Boom):
        set_then_fail()
    assert not TenantEntitlementOverride.all_tenants.filter(tenant=free_tenant).exists()
    assert effective_entitlements(free_tenant).max_pools == 3
