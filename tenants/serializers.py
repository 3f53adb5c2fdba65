from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ductor_project.core.openapi import ComponentJSONField
from tenants.api import DateTimeField, NameField, PatternField, StrictModelSerializer, StrictSerializer, TextField
from tenants.entitlements import LIMIT_FIELDS
from tenants.models import SLUG_PATTERN, SLUG_RULE, ApiKey, Plan, Tenant, TenantEntitlementOverride, Tier, slug_ok

API_KEY_STATES = ("active", "revoked", "expired")  # ApiKey.state_at


class TenantSerializer(StrictModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "slug", "name", "status", "plan", "created_at"]
        read_only_fields = fields


class ApiKeySerializer(StrictModelSerializer):
    state = serializers.SerializerMethodField()
    display = serializers.SerializerMethodField()

    class Meta:
        model = ApiKey
        fields = [
            "id", "name", "display", "scopes", "state",
            "created_at", "last_used_at", "expires_at", "revoked_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.ChoiceField(choices=API_KEY_STATES))
    def get_state(self, obj: ApiKey) -> str:
        return obj.state_at()

    def get_display(self, obj: ApiKey) -> str:
        return f"{ApiKey.PREFIX}_{obj.prefix}_…"


class ApiKeyCreateSerializer(StrictSerializer):
    name = NameField(max_length=100)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ApiKey.Scope.choices),
        allow_empty=False,
        min_length=1,  # what allow_empty refuses, in the schema (minItems)
        default=lambda: [ApiKey.Scope.READ, ApiKey.Scope.WRITE],
    )
    expires_at = DateTimeField(required=False, allow_null=True)

    def validate_expires_at(self, value: Any) -> Any:
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("Must be in the future.")
        return value


class ApiKeyCreatedSerializer(ApiKeySerializer):
    """The one response that carries the raw key."""

    api_key = serializers.CharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "api_key"]
        read_only_fields = fields


class TenantCreateSerializer(StrictSerializer):
    slug = PatternField(SLUG_PATTERN, max_length=63, rule=SLUG_RULE)
    name = NameField(max_length=200, required=False, allow_blank=True)
    plan = serializers.SlugField(required=False, default="free")
    create_api_key = serializers.BooleanField(default=False)

    def validate_slug(self, value: str) -> str:
        if not slug_ok(value):  # the pattern passed: a UUID, refused in the pattern's own words
            raise serializers.ValidationError(self.fields["slug"].error_messages["invalid"])
        return value


class TenantCreatedSerializer(TenantSerializer):
    # Only with ``create_api_key``. Not read_only: the schema makes every read-only field required.
    api_key = serializers.CharField(required=False, help_text="With create_api_key only: shown once.")

    class Meta(TenantSerializer.Meta):
        fields = [*TenantSerializer.Meta.fields, "api_key"]
        read_only_fields = fields


class PlanSerializer(StrictModelSerializer):
    class Meta:
        model = Plan
        exclude = ["updated_at"]
        read_only_fields = [f.name for f in Plan._meta.fields]


class EntitlementLimitsSerializer(serializers.Serializer):
    """The effective limits (plan + overrides)."""

    plan = serializers.CharField()
    max_concurrency = serializers.IntegerField()
    step_rate_per_s = serializers.FloatField()
    step_burst = serializers.IntegerField()
    monthly_run_quota = serializers.IntegerField()
    max_workflows = serializers.IntegerField()
    max_pools = serializers.IntegerField()
    max_connections = serializers.IntegerField()
    max_rules = serializers.IntegerField()
    max_schedules = serializers.IntegerField()
    max_fairness_keys = serializers.IntegerField()
    max_nesting_depth = serializers.IntegerField()
    max_payload_bytes = serializers.IntegerField()
    event_retention_days = serializers.IntegerField()
    history_retention_days = serializers.IntegerField()
    api_rate_per_s = serializers.FloatField()
    api_burst = serializers.IntegerField()
    weight = serializers.IntegerField()
    allowed_tiers = serializers.ListField(child=serializers.CharField())
    overridden = serializers.ListField(child=serializers.CharField())


class UsageSerializer(serializers.Serializer):
    runs_this_month = serializers.IntegerField()
    steps_in_flight = serializers.IntegerField()
    objects = serializers.DictField(child=serializers.IntegerField())


class EntitlementsSerializer(serializers.Serializer):
    tenant = serializers.CharField()
    limits = EntitlementLimitsSerializer()
    usage = UsageSerializer()
    resets = serializers.DictField(child=serializers.DateTimeField())


class TenantPlanSerializer(StrictSerializer):
    plan = serializers.SlugField()


class LimitValueField(ComponentJSONField):
    """An override's ``value``, as ``tenants.entitlements.coerce_limit`` takes it."""

    component = "LimitValue"

    @classmethod
    def components(cls) -> dict[str, dict[str, Any]]:
        return {cls.component: {
            "description": "A number for a limit (a whole one but for the `_per_s` rates); for `allowed_tiers`, "
                           "a non-empty list of tiers.",
            "oneOf": [{"type": "number", "minimum": 0},
                      {"type": "array", "items": {"type": "string", "enum": list(Tier.values)}, "minItems": 1}],
        }}


class OverrideSerializer(StrictModelSerializer):
    field = serializers.ChoiceField(choices=LIMIT_FIELDS, read_only=True, help_text="One of the plans' limits.")
    value = LimitValueField(read_only=True)

    class Meta:
        model = TenantEntitlementOverride
        fields = ["field", "value", "reason", "updated_at"]
        read_only_fields = fields


class OverrideSetSerializer(StrictSerializer):
    value = LimitValueField()
    reason = TextField(max_length=200, required=False, allow_blank=True, default="")
