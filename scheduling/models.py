"""Routing data of a tenant: connections, pools (with members) and rules; and the weights of its
fairness keys.

Every model is tenant-scoped. Each change of the routing data bumps the tenant's routing version
(``scheduling.routing_cache``), so the very next ``route()`` sees it; a fairness key's weight is
written to the fair queue once its change commits (``scheduling.fairness_keys``).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models

from scheduling.secrets import decrypt
from tenants.scoping import TenantScopedModel


class Connection(TenantScopedModel):
    """A tenant's credentialed endpoint to an external system."""

    class Kind(models.TextChoices):
        HTTP = "http"
        PYTHON = "python"
        CELERY = "celery"  # a queue of the team's own Celery workers (task nodes)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    config = models.JSONField(default=dict, blank=True)
    # Fernet token of the secret (scheduling.secrets); never returned by the API.
    secret_token = models.TextField(blank=True, default="", editable=False)
    max_concurrency = models.PositiveIntegerField(null=True, blank=True)
    rate_per_s = models.FloatField(null=True, blank=True)
    burst = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="connection_unique_name")]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def has_secret(self) -> bool:
        return bool(self.secret_token)

    def secret(self) -> str:
        """The decrypted secret ('' when none is set). Only actions may call this."""
        return decrypt(self.secret_token) if self.secret_token else ""


class Pool(TenantScopedModel):
    """A named group of connections with a selection strategy and its own limits."""

    class Strategy(models.TextChoices):
        ROUND_ROBIN = "round_robin"
        WEIGHTED = "weighted"
        LEAST_INFLIGHT = "least_inflight"
        FAILOVER = "failover"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100)
    strategy = models.CharField(max_length=16, choices=Strategy.choices, default=Strategy.ROUND_ROBIN)
    is_default = models.BooleanField(
        default=False, help_text="Route here when no rule matches (at most one per tenant)."
    )
    max_concurrency = models.PositiveIntegerField(null=True, blank=True)
    rate_per_s = models.FloatField(null=True, blank=True)
    burst = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="pool_unique_name"),
            models.UniqueConstraint(
                fields=["tenant"], condition=models.Q(is_default=True), name="pool_one_default"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class PoolMember(TenantScopedModel):
    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="members")
    connection = models.ForeignKey(Connection, on_delete=models.CASCADE, related_name="memberships")
    weight = models.PositiveIntegerField(default=1)
    priority = models.PositiveIntegerField(default=0, help_text="Failover order: lower goes first.")

    class Meta:
        ordering = ["priority", "id"]
        constraints = [
            models.UniqueConstraint(fields=["pool", "connection"], name="poolmember_unique_connection")
        ]

    def __str__(self) -> str:
        return f"{self.connection_id} in {self.pool_id}"


class Rule(TenantScopedModel):
    """An ordered routing rule: the first enabled rule whose ``match`` fits applies its ``action``.

    ``match``: ``{"workflow": glob, "action": glob, "tags": [..], "conditions":
    [{"path": "a.b", "op": "eq|ne|in|exists|prefix|gt|lt", "value": ...}]}``.
    ``action``: any of ``{"pool": name, "tier": t, "partition_key": template}`` (at
    least one), or ``{"deny": reason}`` alone. See ``scheduling.rules``.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100)
    priority = models.IntegerField(help_text="Lower is evaluated first; unique per tenant.")
    enabled = models.BooleanField(default=True)
    match = models.JSONField(default=dict, blank=True)
    action = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["priority"]
        constraints = [models.UniqueConstraint(fields=["tenant", "priority"], name="rule_unique_priority")]

    def __str__(self) -> str:
        return f"#{self.priority} {self.name}"

    def describe(self) -> dict[str, Any]:
        return {"id": str(self.id), "name": self.name, "priority": self.priority}


# The longest fairness key work may carry (the fair queue's second level), and the largest weight of one.
MAX_FAIRNESS_KEY = 128
MAX_FAIRNESS_KEY_WEIGHT = 10_000


class FairnessKey(TenantScopedModel):
    """The weight of one of the tenant's fairness keys: its backlogged work gets ``weight`` shares of
    the tenant's dispatches for every one share of a key with no row here (weight 1)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    key = models.CharField(max_length=MAX_FAIRNESS_KEY)
    weight = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["key"]
        constraints = [models.UniqueConstraint(fields=["tenant", "key"], name="fairnesskey_unique_key")]

    def __str__(self) -> str:
        return f"{self.key} (weight {self.weight})"
