"""Admin of the routing data, through the tenant-scoped admin base.

A connection's secret is never shown: its encrypted token is not a form field
and the list shows only whether one is set; a new secret can be typed in (a
password input that never renders a value). Configs and rules are validated by
the same code as the API, so the admin cannot store a rule that ``route()``
could not evaluate.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from ductor_project.core.context import peek_tenant, tenant_context
from ductor_project.core.errors import ApiError
from scheduling import services
from scheduling.connection_config import ConfigError, validate_config
from scheduling.models import MAX_FAIRNESS_KEY_WEIGHT, Connection, FairnessKey, Pool, PoolMember, Rule
from scheduling.secrets import encrypt
from tenants.admin_scoping import TenantScopedAdmin, TenantScopedInline


class ConnectionAdminForm(forms.ModelForm):
    new_secret = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Stored encrypted and never shown again. Leave empty to keep the current secret.",
    )

    class Meta:
        model = Connection
        # Not secret_token: the stored secret is never a form field.
        fields = ["tenant", "name", "kind", "config", "max_concurrency", "rate_per_s", "burst"]

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        kind, config = cleaned.get("kind"), cleaned.get("config")
        if kind and config is not None:
            try:
                cleaned["config"] = validate_config(kind, config)
            except ConfigError as exc:
                self.add_error("kind" if exc.field == "kind" else "config", f"{exc.field}: {exc.message}")
        return cleaned


@admin.register(Connection)
class ConnectionAdmin(TenantScopedAdmin):
    form = ConnectionAdminForm
    list_display = ["name", "kind", "secret_set", "max_concurrency", "rate_per_s", "burst", "updated_at"]
    list_filter = ["kind"]
    search_fields = ["name"]
    exclude = ["secret_token"]
    readonly_fields = ["secret_set", "created_at", "updated_at"]

    @admin.display(boolean=True, description="has secret")
    def secret_set(self, obj: Connection) -> bool:
        return obj.has_secret

    def save_model(self, request: HttpRequest, obj: Connection, form: Any, change: bool) -> None:
        new_secret = form.cleaned_data.get("new_secret")
        if new_secret:
            obj.secret_token = encrypt(new_secret)
        super().save_model(request, obj, form, change)


class PoolMemberInline(TenantScopedInline):
    model = PoolMember
    fields = ["connection", "weight", "priority"]


@admin.register(Pool)
class PoolAdmin(TenantScopedAdmin):
    list_display = ["name", "strategy", "is_default", "max_concurrency", "rate_per_s", "burst", "updated_at"]
    list_filter = ["strategy", "is_default"]
    search_fields = ["name"]
    readonly_fields = ["created_at", "updated_at"]
    inlines = [PoolMemberInline]


class RuleAdminForm(forms.ModelForm):
    class Meta:
        model = Rule
        fields = ["tenant", "name", "priority", "enabled", "match", "action"]

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        if "match" not in cleaned or "action" not in cleaned:
            return cleaned
        # The row's tenant: chosen in the form (superusers), the row's own, or the staff user's.
        tenant = cleaned.get("tenant") or (self.instance.tenant if self.instance.tenant_id else peek_tenant())
        if tenant is None:
            return cleaned
        try:
            with tenant_context(tenant):
                cleaned["match"], cleaned["action"] = services.rule_validate(
                    match=cleaned["match"], action=cleaned["action"]
                )
        except ApiError as exc:
            for field, messages in exc.details.items():
                target = "match" if field.startswith("match") else "action"
                self.add_error(target, f"{field}: {' '.join(messages)}")
        return cleaned


@admin.register(Rule)
class RuleAdmin(TenantScopedAdmin):
    form = RuleAdminForm
    list_display = ["priority", "name", "enabled", "match", "action"]
    list_display_links = ["priority", "name"]
    list_filter = ["enabled"]
    search_fields = ["name"]
    ordering = ["tenant", "priority"]  # evaluation order (per tenant, for superusers)
    readonly_fields = ["created_at", "updated_at"]


class FairnessKeyAdminForm(forms.ModelForm):
    weight = forms.IntegerField(min_value=1, max_value=MAX_FAIRNESS_KEY_WEIGHT,
                                help_text=f"1 to {MAX_FAIRNESS_KEY_WEIGHT}, as the API takes it.")

    class Meta:
        model = FairnessKey
        fields = ["tenant", "key", "weight"]


@admin.register(FairnessKey)
class FairnessKeyAdmin(TenantScopedAdmin):
    """A key's weight inside its tenant (other keys weigh 1); the fair queue follows on save."""

    form = FairnessKeyAdminForm

    list_display = ["key", "weight", "updated_at"]
    search_fields = ["key"]
    readonly_fields = ["created_at", "updated_at"]
