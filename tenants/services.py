"""Writes of the tenancy core. Each function is one transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import structlog
from django.db import transaction
from django.utils import timezone

from ductor_project.core.context import SYSTEM_TENANT_SLUG, current_tenant, tenant_context
from ductor_project.core.errors import ApiError, Conflict, ErrorCode, conflict_on_duplicate
from tenants.entitlements import LIMIT_FIELDS, coerce_limit
from tenants.models import (
    SLUG_RULE,
    ApiKey,
    Plan,
    PlatformKey,
    Tenant,
    TenantEntitlementOverride,
    generate_key,
    slug_ok,
)

log = structlog.get_logger(__name__)

RESERVED_SLUGS = {SYSTEM_TENANT_SLUG, "admin", "api", "platform"}


def _plan_or_invalid(slug: str) -> Plan:
    plan = Plan.objects.filter(pk=slug).first()
    if plan is None:
        known = ", ".join(Plan.objects.order_by("pk").values_list("pk", flat=True))
        raise ApiError(f"Unknown plan '{slug}'; the plans are {known}.", code=ErrorCode.INVALID,
                       details={"plan": ["Unknown plan."]})
    return plan


@transaction.atomic
def tenant_create(*, slug: str, name: str = "", plan: str = "free") -> Tenant:
    """Create an active tenant on ``plan``. Raises ``Conflict`` if the slug is taken or reserved,
    ``400 invalid`` if it is not lowercase letters, digits and '-'. The name is its callers' to check
    (the API's serializer, the admin's form, ``create_tenant``'s ``--name``: all as the API reads it)."""
    if not slug_ok(slug):
        raise ApiError(f"Invalid field(s): slug. {SLUG_RULE}", code=ErrorCode.INVALID, details={"slug": [SLUG_RULE]})
    if slug in RESERVED_SLUGS:
        raise Conflict(f"Tenant slug '{slug}' is reserved.", details={"slug": ["Reserved."]})
    _plan_or_invalid(plan)
    with conflict_on_duplicate("slug", f"Tenant slug '{slug}' is already taken."):
        tenant = Tenant.objects.create(slug=slug, name=name or slug, plan_id=plan)
    log.info("tenant_created", tenant_id=str(tenant.pk), slug=slug)
    return tenant


def _refuse_if_deleting(tenant: Tenant) -> None:
    if tenant.is_deleting:
        raise Conflict(f"Tenant '{tenant.slug}' is being deleted; it cannot change.",
                       details={"status": ["The tenant is being deleted."]})


def _locked(tenant: Tenant) -> Tenant:
    """``tenant`` read again under its row lock (the caller's transaction): a status written
    meanwhile (a deletion) is seen, and none is written over it until the commit."""
    locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
    tenant.status, tenant.plan_id, tenant.updated_at = locked.status, locked.plan_id, locked.updated_at
    return tenant


@transaction.atomic
def tenant_set_status(*, tenant: Tenant, status: str) -> Tenant:
    """Suspend or re-activate a tenant. Idempotent. The system tenant cannot change, nor can a tenant
    being deleted (``409 conflict`` naming ``status``): the row lock keeps an activation from
    undoing a deletion that committed first."""
    if tenant.is_system:
        raise Conflict("The system tenant cannot be changed.")
    _refuse_if_deleting(_locked(tenant))
    if tenant.status != status:
        tenant.status = status
        tenant.save(update_fields=["status", "updated_at"])
        log.info("tenant_status_changed", tenant_id=str(tenant.pk), status=status)
    return tenant


@transaction.atomic
def tenant_delete(*, tenant: Tenant) -> Tenant:
    """Mark a suspended tenant as being deleted; idempotent. Cheap: the purge (``workflows.offboarding``)
    deletes its rows and Redis keys in batches afterwards, then the tenant itself. From the commit on,
    its keys authenticate no more and nothing of it is dispatched (the queue takes it as suspended).
    An active tenant is ``409 conflict`` naming ``status`` (suspend it first), the system tenant
    ``409`` too; nothing changes."""
    if tenant.is_system:
        raise Conflict("The system tenant cannot be deleted.")
    _locked(tenant)
    if tenant.status == Tenant.Status.ACTIVE:
        raise Conflict(f"Tenant '{tenant.slug}' is active: suspend it before deleting it.",
                       details={"status": ["Suspend the tenant first."]})
    if not tenant.is_deleting:
        tenant.status = Tenant.Status.DELETING
        tenant.save(update_fields=["status", "updated_at"])
        log.info("tenant_deletion_requested", tenant_id=str(tenant.pk), slug=tenant.slug)
    return tenant


@transaction.atomic
def api_key_create(
    *,
    name: str,
    scopes: list[str],
    expires_at: datetime | None = None,
    created_by_id: int | None = None,
) -> tuple[ApiKey, str]:
    """Create a key for the tenant in context. Returns the row and the raw key (shown once)."""
    tenant = current_tenant()
    raw, prefix, secret_hash = generate_key(ApiKey.PREFIX)
    with conflict_on_duplicate("name", f"An API key named '{name}' already exists."):
        key = ApiKey.objects.create(
            name=name,
            prefix=prefix,
            secret_hash=secret_hash,
            scopes=sorted(set(scopes)),
            expires_at=expires_at,
            created_by_id=created_by_id,
        )
    log.info("api_key_created", tenant_id=str(tenant.pk), key_id=str(key.pk), scopes=key.scopes)
    return key, raw


def api_key_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke a key of the tenant in context. Idempotent: a second revoke changes nothing."""
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        log.info("api_key_revoked", key_id=str(key.pk))
    return key


def platform_key_create(*, name: str) -> tuple[PlatformKey, str]:
    """Create a platform operator key. Returns the row and the raw key (shown once)."""
    raw, prefix, secret_hash = generate_key(PlatformKey.PREFIX)
    key = PlatformKey.objects.create(name=name, prefix=prefix, secret_hash=secret_hash)
    return key, raw


def platform_key_revoke(*, key: PlatformKey) -> PlatformKey:
    """Revoke a platform operator key. Idempotent: a second revoke changes nothing, and a revoked key
    is never valid again."""
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        log.info("platform_key_revoked", key_id=str(key.pk))
    return key


@transaction.atomic
def tenant_set_plan(*, tenant: Tenant, plan_slug: str) -> Tenant:
    """Move a tenant to another plan. Its cached limits are invalidated (signal). A tenant being
    deleted is ``409 conflict``."""
    plan = _plan_or_invalid(plan_slug)
    _refuse_if_deleting(_locked(tenant))
    if tenant.plan_id != plan.pk:
        tenant.plan = plan
        tenant.save(update_fields=["plan", "updated_at"])
        log.info("tenant_plan_changed", tenant_id=str(tenant.pk), plan=plan.pk)
    return tenant


def _known_limit_or_invalid(field: str) -> None:
    if field not in LIMIT_FIELDS:
        raise ApiError(
            f"Invalid field(s): field. Unknown limit '{field}'.", code=ErrorCode.INVALID,
            details={"field": [f"Unknown limit '{field}'; expected one of {list(LIMIT_FIELDS)}."]},
        )


@transaction.atomic
def override_set(*, tenant: Tenant, field: str, value: Any, reason: str = "") -> TenantEntitlementOverride:
    """Set one limit for one tenant, on top of its plan. Validates the value for the field. A tenant
    being deleted is ``409 conflict``."""
    _known_limit_or_invalid(field)
    try:
        value = coerce_limit(field, value)
    except ValueError as exc:
        raise ApiError(
            f"Invalid field(s): value. '{field}' {exc}.", code=ErrorCode.INVALID,
            details={"value": [f"'{field}' {exc}."]},
        ) from exc
    _refuse_if_deleting(_locked(tenant))  # the purge would meet a row written behind it
    with tenant_context(tenant):
        override, _ = TenantEntitlementOverride.objects.update_or_create(
            field=field, defaults={"value": value, "reason": reason}
        )
    log.info("entitlement_override_set", tenant_id=str(tenant.pk), field=field, value=value)
    return override


@transaction.atomic
def override_clear(*, tenant: Tenant, field: str) -> bool:
    """Remove one override; idempotent. Returns whether one existed. Unknown limits are a 400, a
    tenant being deleted ``409 conflict``."""
    _known_limit_or_invalid(field)
    _refuse_if_deleting(_locked(tenant))
    with tenant_context(tenant):
        deleted, _ = TenantEntitlementOverride.objects.filter(field=field).delete()
    return deleted > 0
