"""API authentication: ``Authorization: Bearer dct_<prefix>_<secret>``.

Tenant keys (``dct_``) authenticate as their tenant; platform keys (``dctp_``)
authenticate a platform operator for the platform-admin endpoints only. A
missing, malformed, unknown, revoked or expired key is a 401 with a stable
code. The system tenant can never authenticate, nor a tenant being deleted.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from ductor_project.core.context import across_tenants
from ductor_project.core.errors import AuthError, ErrorCode
from tenants.models import ApiKey, PlatformKey, Tenant, hash_secret
from tenants.scoping import instance_with, row_columns

LAST_USED_RESOLUTION = timedelta(seconds=60)


@dataclass(frozen=True)
class KeyPrincipal:
    """``request.user`` for a request made with an API key."""

    tenant: Tenant | None
    key_name: str
    is_platform: bool = False

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_superuser = False
    is_staff = False

    @property
    def pk(self) -> str:
        return f"key:{self.key_name}"


def _parse(raw: str) -> tuple[str, str]:
    kind, _, rest = raw.partition("_")
    prefix, _, secret = rest.partition("_")
    if kind not in (ApiKey.PREFIX, PlatformKey.PREFIX) or not prefix or not secret:
        form = PlatformKey.PREFIX if kind == PlatformKey.PREFIX else ApiKey.PREFIX  # a platform key's own, if it is one
        raise AuthError(f"Malformed API key: expected '{form}_<prefix>_<secret>'.")
    return kind, prefix


def _check_hash(stored: str, raw: str) -> bool:
    return hmac.compare_digest(stored, hash_secret(raw))


def _touch(model: Any, pk: Any, last_used_at: Any) -> None:
    now = timezone.now()
    if last_used_at is None or now - last_used_at > LAST_USED_RESOLUTION:
        manager = model.all_tenants if model is ApiKey else model.objects
        manager.filter(pk=pk).update(last_used_at=now)


def authenticate_key(raw: str) -> tuple[KeyPrincipal, ApiKey | PlatformKey]:
    """Resolve a raw key. Raises ``AuthError`` (401) with a specific code when it is not usable."""
    kind, prefix = _parse(raw)
    if kind == PlatformKey.PREFIX:
        platform_key = PlatformKey.objects.filter(prefix=prefix).first()
        if platform_key is None or not _check_hash(platform_key.secret_hash, raw):
            raise AuthError("Invalid API key.")
        if platform_key.revoked_at is not None:
            raise AuthError("API key has been revoked.", code=ErrorCode.API_KEY_REVOKED)
        _touch(PlatformKey, platform_key.pk, platform_key.last_used_at)
        return KeyPrincipal(tenant=None, key_name=platform_key.name, is_platform=True), platform_key

    key = _tenant_key(prefix)
    if key is None or not _check_hash(key.secret_hash, raw) or key.tenant.is_system:
        raise AuthError("Invalid API key.")
    if key.tenant.is_deleting:
        raise AuthError("Invalid API key: its tenant is being deleted.")
    state = key.state_at()
    if state == "revoked":
        raise AuthError("API key has been revoked.", code=ErrorCode.API_KEY_REVOKED)
    if state == "expired":
        raise AuthError("API key has expired.", code=ErrorCode.API_KEY_EXPIRED)
    _touch(ApiKey, key.pk, key.last_used_at)
    return KeyPrincipal(tenant=key.tenant, key_name=key.name), key


def _tenant_key(prefix: str) -> ApiKey | None:
    """The tenant key of ``prefix`` with its tenant, or None. The key names its tenant: nothing is
    in context yet, hence across tenants. One written statement: every API request makes it, and
    the queryset (``select_related``) cost three times its CPU."""
    with across_tenants("ApiKey lookup"), connection.cursor() as cursor:
        cursor.execute(f"SELECT {row_columns(ApiKey, 'k')}, {row_columns(Tenant, 't')} "  # noqa: S608 - no value in the text
                       f"FROM {ApiKey._meta.db_table} k JOIN {Tenant._meta.db_table} t ON t.id = k.tenant_id "
                       "WHERE k.prefix = %s LIMIT 1", [prefix])
        row = cursor.fetchone()
    return instance_with(ApiKey, "tenant", row) if row is not None else None


class ApiKeyAuthentication(BaseAuthentication):
    keyword = b"bearer"

    def authenticate(self, request: Request) -> tuple[KeyPrincipal, ApiKey | PlatformKey] | None:
        header = get_authorization_header(request).split()
        if not header:
            return None
        if header[0].lower() != self.keyword:
            raise AuthError("Unsupported authorization scheme: use 'Bearer'.")
        if len(header) != 2:
            raise AuthError("Malformed Authorization header: expected 'Bearer <key>'.")
        try:
            raw = header[1].decode("ascii")
        except UnicodeDecodeError as exc:
            raise AuthError("Malformed API key.") from exc
        return authenticate_key(raw)

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"
