"""Tenants, memberships and API keys."""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import ClassVar

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.utils import timezone

from ductor_project.core.context import SYSTEM_TENANT_SLUG, tenant_context
from tenants.scoping import TenantScopedModel

_KEY_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


class Tier(models.TextChoices):
    """Customer queue tiers, strict priority from first to last. Tier 0 is the system tenant's."""

    INTERACTIVE = "interactive"
    STANDARD = "standard"
    BATCH = "batch"


def default_tiers() -> list[str]:
    return [Tier.STANDARD, Tier.BATCH]


class Plan(models.Model):
    """A plan's ceilings. Managed by the platform; seeded with free, pro and enterprise.

    The effective limits of a tenant come from ``tenants.entitlements`` only.
    """

    slug = models.SlugField(primary_key=True, max_length=32)
    name = models.CharField(max_length=100)
    max_concurrency = models.PositiveIntegerField(help_text="Steps in flight at once.")
    step_rate_per_s = models.FloatField(help_text="Steps started per second (GCRA).")
    step_burst = models.PositiveIntegerField(help_text="Steps that may start at once from idle.")
    monthly_run_quota = models.PositiveBigIntegerField(help_text="Runs started per calendar month (UTC).")
    max_workflows = models.PositiveIntegerField()
    max_pools = models.PositiveIntegerField()
    max_connections = models.PositiveIntegerField()
    max_rules = models.PositiveIntegerField()
    max_schedules = models.PositiveIntegerField(default=10, help_text="Schedules (cron or interval triggers).")
    max_fairness_keys = models.PositiveIntegerField(default=100, help_text="Fairness keys given a weight of "
                                                    "their own (others weigh 1).")
    max_nesting_depth = models.PositiveIntegerField(help_text="Sub-workflow levels below a root run.")
    event_retention_days = models.PositiveIntegerField(default=30, help_text="Days events are kept.")
    history_retention_days = models.PositiveIntegerField(default=30, help_text="Days a finished run (its whole "
                                                         "tree) is kept after it ended.")
    max_payload_bytes = models.PositiveIntegerField(help_text="Largest run input or workflow spec.")
    api_rate_per_s = models.FloatField(help_text="API requests per second (GCRA).")
    api_burst = models.PositiveIntegerField()
    weight = models.PositiveIntegerField(default=1, help_text="Fair-share weight in the fair queue.")
    allowed_tiers = ArrayField(
        models.CharField(max_length=16, choices=Tier.choices), default=default_tiers
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["weight", "slug"]

    def __str__(self) -> str:
        return self.name


# A tenant's slug: lowercase, so that two tenants never differ by case alone.
SLUG_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
SLUG_RULE = "Lowercase letters, digits and '-', starting with a letter or digit, and not in the form of a UUID."


def slug_ok(slug: str) -> bool:
    """Whether ``slug`` can name a tenant: ``SLUG_PATTERN``, and not a UUID, which a tenant's id is
    (where a slug or an id is taken, a UUID is read as an id)."""
    if not re.fullmatch(SLUG_PATTERN, slug):
        return False
    try:
        uuid.UUID(slug)
    except ValueError:
        return True
    return False


class Tenant(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active"
        SUSPENDED = "suspended"
        # Offboarding: marked, its rows and Redis keys being purged (``workflows.offboarding``), then
        # the row itself goes. Refused as a suspended tenant is, and never active again.
        DELETING = "deleting"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, default="free", related_name="tenants")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    _system: ClassVar[Tenant | None] = None

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    @property
    def is_system(self) -> bool:
        return self.slug == SYSTEM_TENANT_SLUG

    @property
    def is_active(self) -> bool:
        return self.status == self.Status.ACTIVE

    @property
    def is_deleting(self) -> bool:
        return self.status == self.Status.DELETING

    @classmethod
    def system(cls) -> Tenant:
        """The reserved system tenant (created by a data migration; cached per process)."""
        if cls._system is None:
            cls._system = cls.objects.get(slug=SYSTEM_TENANT_SLUG)
        return cls._system


@contextmanager
def system_context() -> Iterator[Tenant]:
    """Act as the reserved system tenant (engine-internal work only)."""
    with tenant_context(Tenant.system()) as tenant:
        yield tenant


class TenantMembership(TenantScopedModel):
    """A user's role in a tenant. Staff users act for their tenant in the admin."""

    class Role(models.TextChoices):
        OWNER = "owner"
        ADMIN = "admin"
        MEMBER = "member"
        VIEWER = "viewer"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tenant_memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant_id} as {self.role}"


def _random_token(length: int) -> str:
    return "".join(secrets.choice(_KEY_ALPHABET) for _ in range(length))


def hash_secret(raw: str) -> str:
    """SHA-256 of a whole key. Keys carry 238 bits of entropy, so a fast hash is enough."""
    return hashlib.sha256(raw.encode()).hexdigest()


KEY_PREFIX_LENGTH = 10
KEY_SECRET_LENGTH = 40


def generate_key(kind: str) -> tuple[str, str, str]:
    """A new ``(raw_key, prefix, secret_hash)`` of the form ``<kind>_<prefix>_<secret>``.

    The raw key is shown once and never stored.
    """
    prefix = _random_token(KEY_PREFIX_LENGTH)
    raw = f"{kind}_{prefix}_{_random_token(KEY_SECRET_LENGTH)}"
    return raw, prefix, hash_secret(raw)


class ApiKey(TenantScopedModel):
    """A tenant's API key, shown once as ``dct_<prefix>_<secret>`` and stored hashed."""

    PREFIX = "dct"

    class Scope(models.TextChoices):
        READ = "read"
        WRITE = "write"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    scopes = ArrayField(models.CharField(max_length=16, choices=Scope.choices), default=list)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="apikey_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.PREFIX}_{self.prefix}_…)"

    def state_at(self, now: datetime | None = None) -> str:
        """``active``, ``revoked`` or ``expired``."""
        now = now or timezone.now()
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes


class PlatformKey(models.Model):
    """A platform operator's key (``dctp_<prefix>_<secret>``): platform-admin endpoints only."""

    PREFIX = "dctp"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100, unique=True)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.PREFIX}_{self.prefix}_…)"


class TenantEntitlementOverride(TenantScopedModel):
    """One plan field changed for one tenant. Managed by platform admins."""

    field = models.CharField(max_length=32)
    value = models.JSONField()
    reason = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "field"], name="override_unique_field")
        ]

    def __str__(self) -> str:
        return f"{self.field}={self.value}"


WITHIN_RUN_QUOTA = "usage_within_run_quota"


class MonthlyUsage(TenantScopedModel):
    """Runs started by a tenant in one calendar month (UTC). The truth for the run quota."""

    month = models.DateField(help_text="First day of the month, UTC.")
    runs_started = models.PositiveBigIntegerField(default=0)
    run_quota = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="The monthly run quota the month's last charge was made under.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "month"], name="usage_unique_month"),
            # What refuses a charge sent with its start's COMMIT (``usage.quota_consume_at_commit``).
            models.CheckConstraint(
                condition=models.Q(run_quota__isnull=True) | models.Q(runs_started__lte=models.F("run_quota")),
                name=WITHIN_RUN_QUOTA,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.month:%Y-%m}: {self.runs_started} runs"
