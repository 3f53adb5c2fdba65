"""Reads of the tenancy core. Lookups by id answer ``NotFound`` for other tenants' rows."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet

from ductor_project.core.capacity import tenant_in_flight
from ductor_project.core.context import SYSTEM_TENANT_SLUG
from ductor_project.core.errors import NotFound
from ductor_project.core.ids import canonical_uuid
from tenants.entitlements import effective_entitlements
from tenants.models import ApiKey, Plan, Tenant, TenantEntitlementOverride, TenantMembership
from tenants.usage import next_reset, object_counts, runs_this_month


def parse_uuid(value: Any) -> uuid.UUID:
    """A UUID from a path segment, in the canonical form (``ductor_project.core.ids``); anything
    else is simply not found."""
    found = canonical_uuid(value)
    if found is None:
        raise NotFound()
    return found


def first_or_404(queryset: QuerySet[Any]) -> Any:
    """The first row of a (tenant-scoped) queryset, or ``NotFound``: another tenant's row
    looks exactly like one that does not exist."""
    row = queryset.first()
    if row is None:
        raise NotFound()
    return row


def api_key_list() -> QuerySet[ApiKey]:
    """The keys of the tenant in context, newest first."""
    return ApiKey.objects.order_by("-created_at")


def get_api_key_for_tenant(key_id: Any) -> ApiKey:
    """A key of the tenant in context, or ``NotFound`` (also for another tenant's key)."""
    return first_or_404(ApiKey.objects.filter(pk=parse_uuid(key_id)))


def tenant_list() -> QuerySet[Tenant]:
    """Every customer tenant (platform admins only). The system tenant is not listed."""
    return Tenant.objects.exclude(slug=SYSTEM_TENANT_SLUG).order_by("slug")


def get_tenant(slug_or_id: str) -> Tenant:
    """A customer tenant by slug or id (platform admins only), or ``NotFound``."""
    qs = tenant_list()
    pk = canonical_uuid(slug_or_id)
    tenant = qs.filter(pk=pk).first() if pk is not None else qs.filter(slug=slug_or_id).first()
    if tenant is None:
        raise NotFound()
    return tenant


def membership_for_user(user: Any) -> TenantMembership | None:
    """A user's membership in a customer tenant (their earliest), or None.

    Used before any tenant is in context (to find it), hence ``all_tenants``,
    restricted to the user's own rows.
    """
    if not getattr(user, "is_authenticated", False) or not hasattr(user, "tenant_memberships"):
        return None
    return (
        TenantMembership.all_tenants.select_related("tenant")
        .filter(user_id=user.pk)
        .exclude(tenant__slug=SYSTEM_TENANT_SLUG)
        .order_by("created_at")
        .first()
    )


def entitlements_report(tenant: Tenant) -> dict[str, Any]:
    """Effective limits, current usage and reset times of ``tenant`` (must be in context)."""
    limits = effective_entitlements(tenant)
    return {
        "tenant": tenant.slug,
        "limits": limits.as_dict(),
        "usage": {
            "runs_this_month": runs_this_month(),
            "steps_in_flight": tenant_in_flight(),
            "objects": object_counts(),
        },
        "resets": {"monthly_run_quota": next_reset()},
    }


def plan_list() -> QuerySet[Plan]:
    return Plan.objects.order_by("weight", "slug")


def get_plan(slug: str) -> Plan:
    plan = Plan.objects.filter(pk=slug).first()
    if plan is None:
        raise NotFound()
    return plan


def override_list(tenant: Tenant) -> QuerySet[TenantEntitlementOverride]:
    """Overrides of ``tenant`` (platform admins; crosses tenants by design)."""
    return TenantEntitlementOverride.all_tenants.filter(tenant=tenant).order_by("field")
