"""Writes of the tenancy core. Each function is one transaction."""

from __future__ import annotations

from datetime import datetime

import structlog
from django.db import transaction
from django.utils import timezone

from ductor_project.errors import Conflict, conflict_on_duplicate
from tenants.context import SYSTEM_TENANT_SLUG, current_tenant
from tenants.models import ApiKey, PlatformKey, Tenant, generate_key

log = structlog.get_logger(__name__)

RESERVED_SLUGS = {SYSTEM_TENANT_SLUG, "admin", "api", "platform"}


@transaction.atomic
def tenant_create(*, slug: str, name: str = "") -> Tenant:
    """Create an active tenant. Raises ``Conflict`` if the slug is taken or reserved."""
    if slug in RESERVED_SLUGS:
        raise Conflict(f"Tenant slug '{slug}' is reserved.", details={"slug": ["Reserved."]})
    with conflict_on_duplicate("slug", f"Tenant slug '{slug}' is already taken."):
        tenant = Tenant.objects.create(slug=slug, name=name or slug)
    log.info("tenant_created", tenant_id=str(tenant.pk), slug=slug)
    return tenant


def tenant_set_status(*, tenant: Tenant, status: str) -> Tenant:
    """Suspend or re-activate a tenant. Idempotent. The system tenant cannot change."""
    if tenant.is_system:
        raise Conflict("The system tenant cannot be changed.")
    if tenant.status != status:
        tenant.status = status
        tenant.save(update_fields=["status", "updated_at"])
        log.info("tenant_status_changed", tenant_id=str(tenant.pk), status=status)
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
