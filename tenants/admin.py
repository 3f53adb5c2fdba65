from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.widgets import ForeignKeyRawIdWidget
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from ductor_project.core.context import tenant_context
from ductor_project.core.errors import Conflict
from tenants import services
from tenants.admin_scoping import (
    ChangelistLimitsMixin,
    StorableJSONMixin,
    TenantScopedAdmin,
    admin_may_write,
    admin_tenant,
)
from tenants.entitlements import LIMIT_FIELDS, coerce_limit
from tenants.models import (
    SLUG_RULE,
    ApiKey,
    MonthlyUsage,
    Plan,
    PlatformKey,
    Tenant,
    TenantEntitlementOverride,
    TenantMembership,
    slug_ok,
)


class SuperuserOnlyMixin:
    """Platform-managed data: superusers only. For anyone else no row exists, so that a row's page
    (its history's too, which Django looks up before it checks the permission) answers as for an id
    that does not exist: which plans, keys or catalog tasks there are is not told."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs: QuerySet[Any] = super().get_queryset(request)  # type: ignore[misc]
        return qs if request.user.is_superuser else qs.none()

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)


class TenantForm(forms.ModelForm[Tenant]):
    class Meta:
        model = Tenant
        fields = ["slug", "name", "status", "plan"]

    def clean_slug(self) -> str:
        slug = str(self.cleaned_data["slug"])
        if slug in services.RESERVED_SLUGS and (self.instance.pk is None or self.instance.slug != slug):
            raise forms.ValidationError("This slug is reserved.")
        if self.instance._state.adding and not slug_ok(slug):  # what tenant_create refuses (a UUID, say)
            raise forms.ValidationError(SLUG_RULE)
        return slug

    def clean_status(self) -> str:
        """A tenant is marked ``deleting`` by its delete only (suspended first), and never leaves it."""
        status = str(self.cleaned_data["status"])
        if status == Tenant.Status.DELETING and self.instance.status != Tenant.Status.DELETING:
            raise forms.ValidationError("Suspend the tenant, then delete it.")
        return status


@admin.register(Tenant)
class TenantAdmin(ChangelistLimitsMixin, admin.ModelAdmin[Tenant]):
    form = TenantForm
    list_display = ["slug", "name", "status", "plan", "created_at", "console"]
    list_filter = ["status", "plan"]
    search_fields = ["slug", "name"]
    readonly_fields = ["id", "console", "created_at", "updated_at"]
    actions = ["suspend", "activate"]

    @admin.display(description="usage and queue")
    def console(self, obj: Tenant) -> str:
        """A link to the run console's tenant page (served by the workflows admin, named by URL only)."""
        if obj._state.adding:
            return "—"
        return format_html('<a href="{}">usage, queue and fairness</a>',
                           reverse("admin:workflows_tenant_console", args=[obj.pk]))

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tenant]:
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        tenant = admin_tenant(request)
        return qs.filter(pk=tenant.pk) if tenant is not None else qs.none()

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if request.user.is_superuser:
            return self.readonly_fields
        return ["id", "slug", "status", "plan", "console", "created_at", "updated_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Superusers; an active tenant is shown as protected (``get_deleted_objects``)."""
        return bool(request.user.is_superuser) and not (obj is not None and obj.is_system)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and (obj.is_system or obj.is_deleting):  # a save could bring a purged row back
            return False
        return admin_may_write(request) and super().has_change_permission(request, obj)  # a viewer reads

    def get_deleted_objects(
        self, objs: Any, request: HttpRequest
    ) -> tuple[list[str], dict[str, int], set[str], list[str]]:
        """What the confirmation page lists: the tenants alone, not every row of theirs (Django would
        collect millions of them in the request); an active tenant or the system tenant is protected."""
        tenants = list(objs)
        protected = [f"{t.slug}: {'the system tenant' if t.is_system else 'active: suspend it first'}"
                     for t in tenants if t.is_system or t.is_active]
        listed = [f"{t.slug} and all its data (purged in the background)" for t in tenants]
        return listed, {"tenants": len(tenants)}, set(), protected

    def delete_model(self, request: HttpRequest, obj: Tenant) -> None:
        """Mark it ``deleting``, as ``DELETE /api/v1/tenants/{slug}`` does; the purge follows."""
        services.tenant_delete(tenant=obj)
        self.message_user(request, f"Tenant {obj.slug} is being deleted: its data is purged in the background.")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> None:
        slugs = [services.tenant_delete(tenant=tenant).slug for tenant in queryset]
        self.message_user(request, f"Being deleted, their data purged in the background: {', '.join(slugs)}.")

    def save_model(self, request: HttpRequest, obj: Tenant, form: Any, change: bool) -> None:
        if not change:
            created = services.tenant_create(slug=obj.slug, name=obj.name, plan=obj.plan_id or "free")
            obj.pk, obj.created_at = created.pk, created.created_at
            return
        super().save_model(request, obj, form, change)

    @admin.action(description="Suspend selected tenants")
    def suspend(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> None:
        self._set_status(request, queryset, Tenant.Status.SUSPENDED)

    @admin.action(description="Re-activate selected tenants")
    def activate(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> None:
        self._set_status(request, queryset, Tenant.Status.ACTIVE)

    def _set_status(self, request: HttpRequest, queryset: QuerySet[Tenant], status: str) -> None:
        """Each tenant but the system one; a tenant being deleted is left, and named."""
        for tenant in queryset.exclude(slug="system"):
            try:
                services.tenant_set_status(tenant=tenant, status=status)
            except Conflict as exc:
                self.message_user(request, str(exc.detail), messages.ERROR)

    def get_actions(self, request: HttpRequest) -> Any:
        actions = super().get_actions(request)
        if not request.user.is_superuser:
            actions.pop("suspend", None)
            actions.pop("activate", None)
        return actions


def enrollable(user: Any, tenant: Tenant | None) -> bool:
    """Whether a tenant's staff may name ``user`` in a membership: no superuser, none of another tenant."""
    return not user.is_superuser and not TenantMembership.all_tenants.filter(user=user).exclude(tenant=tenant).exists()


class EnrollableUserWidget(ForeignKeyRawIdWidget):
    """Django's raw id widget, naming beside the id only a user the tenant's staff may enrol: Django's
    names whatever user the id is (``?user=<id>`` on the add page), which told staff the usernames
    of every tenant's users."""

    def __init__(self, rel: Any, admin_site: Any, tenant: Tenant | None, **kwargs: Any) -> None:
        super().__init__(rel, admin_site, **kwargs)
        self.tenant = tenant

    def label_and_url_for_value(self, value: Any) -> tuple[str, str]:
        try:
            user = get_user_model().objects.filter(pk=value).first()
        except (TypeError, ValueError, ValidationError):
            user = None
        return super().label_and_url_for_value(value) if user and enrollable(user, self.tenant) else ("", "")


@admin.register(TenantMembership)
class TenantMembershipAdmin(TenantScopedAdmin):
    list_display = ["user", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__username", "user__email"]
    raw_id_fields = ["user"]

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "user" and not request.user.is_superuser:
            kwargs["widget"] = EnrollableUserWidget(db_field.remote_field, self.admin_site, admin_tenant(request),
                                                    using=kwargs.get("using"))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        """For a tenant's staff, a form that takes only users of no other tenant, and no superuser: the
        user field takes any id, and another tenant's user is not theirs to enrol. It is refused, and
        shown (``EnrollableUserWidget``), as an id that no user has: which ids are other tenants'
        users, and their names, are not told."""
        form = super().get_form(request, obj, change, **kwargs)
        if request.user.is_superuser:
            return form
        tenant = admin_tenant(request)

        class OwnUsersOnly(form):  # type: ignore[misc, valid-type]
            def clean_user(self) -> Any:
                user = self.cleaned_data["user"]
                if not enrollable(user, tenant):
                    field = self.fields["user"]
                    raise forms.ValidationError(field.error_messages["invalid_choice"], code="invalid_choice")
                return user

        return OwnUsersOnly


@admin.register(ApiKey)
class ApiKeyAdmin(TenantScopedAdmin):
    """A tenant's API keys. A key is added here (``api_key_create``) and revoked; it is never edited, as
    in the API: widening a key's scopes or expiry would give its holder more than it was issued."""

    list_display = ["name", "display", "scopes", "state", "last_used_at", "expires_at", "created_at"]
    search_fields = ["name", "prefix"]
    readonly_fields = ["display", "last_used_at", "revoked_at", "created_at", "created_by"]
    fields = ["tenant", "name", "scopes", "expires_at", *readonly_fields]
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        readonly = list(super().get_readonly_fields(request, obj))
        return [*readonly, "name", "scopes", "expires_at"] if obj is not None else readonly

    @admin.display(description="key")
    def display(self, obj: ApiKey) -> str:
        return f"{ApiKey.PREFIX}_{obj.prefix}_…" if obj.prefix else "(generated on save)"

    @admin.display(description="state")
    def state(self, obj: ApiKey) -> str:
        return obj.state_at()

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            return
        with tenant_context(obj.tenant if obj.tenant_id else admin_tenant(request)):
            key, raw = services.api_key_create(name=obj.name, scopes=obj.scopes, expires_at=obj.expires_at,
                                               created_by_id=request.user.pk)
        obj.pk, obj.tenant_id, obj.prefix, obj.created_at = key.pk, key.tenant_id, key.prefix, key.created_at
        obj._state.adding = False
        messages.warning(request, f"New API key (shown once, store it now): {raw}")

    @admin.action(description="Revoke selected keys", permissions=["change"])  # a write: not a viewer's
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for key in queryset.select_related("tenant"):
            with tenant_context(key.tenant):
                services.api_key_revoke(key=key)


@admin.register(PlatformKey)
class PlatformKeyAdmin(SuperuserOnlyMixin, ChangelistLimitsMixin, admin.ModelAdmin[PlatformKey]):
    """Platform operator keys: added, renamed and revoked (``platform_key_revoke``); a revocation is
    never undone, as it was when its date could be cleared here."""

    list_display = ["name", "prefix", "created_at", "last_used_at", "revoked_at"]
    fields = ["name", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def save_model(self, request: HttpRequest, obj: PlatformKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        key, raw = services.platform_key_create(name=obj.name)
        obj.pk, obj.prefix, obj.created_at = key.pk, key.prefix, key.created_at
        obj._state.adding = False
        messages.warning(request, f"New platform key (shown once, store it now): {raw}")

    @admin.action(description="Revoke selected platform keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[PlatformKey]) -> None:
        for key in queryset:
            services.platform_key_revoke(key=key)


class PlanAdminForm(forms.ModelForm[Plan]):
    """Every limit is checked like an override, so a plan edit cannot break the limiters."""

    class Meta:
        model = Plan
        fields = ["slug", "name", *LIMIT_FIELDS]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for name in LIMIT_FIELDS:
            if data.get(name) is None:
                continue
            value = list(data[name]) if name == "allowed_tiers" else data[name]
            try:
                data[name] = coerce_limit(name, value)
            except ValueError as exc:
                self.add_error(name, str(exc))
        return data


@admin.register(Plan)
class PlanAdmin(SuperuserOnlyMixin, StorableJSONMixin, ChangelistLimitsMixin, admin.ModelAdmin[Plan]):
    form = PlanAdminForm
    list_display = [
        "slug", "name", "max_concurrency", "step_rate_per_s", "monthly_run_quota",
        "max_workflows", "max_pools", "max_rules", "weight", "allowed_tiers",
    ]
    readonly_fields = ["updated_at"]


# Users and groups belong to no tenant (a user's tenant is its membership's): superusers only. Django's
# own admins of them showed every tenant's users to staff given the permissions, and let them set the
# password of another tenant's user. A tenant's staff enrol users through memberships.
admin.site.unregister(get_user_model())
admin.site.unregister(Group)


@admin.register(get_user_model())
class PlatformUserAdmin(SuperuserOnlyMixin, ChangelistLimitsMixin, UserAdmin):
    pass


@admin.register(Group)
class PlatformGroupAdmin(SuperuserOnlyMixin, ChangelistLimitsMixin, GroupAdmin):
    pass


class OverrideAdminForm(forms.ModelForm[TenantEntitlementOverride]):
    """The field is one of the limits and the value is checked for it, as in the API."""

    field = forms.ChoiceField(choices=[(name, name) for name in LIMIT_FIELDS])

    class Meta:
        model = TenantEntitlementOverride
        fields = ["tenant", "field", "value", "reason"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        field = data.get("field")
        if field and data.get("value") is not None:
            try:
                data["value"] = coerce_limit(field, data["value"])
            except ValueError as exc:
                self.add_error("value", f"'{field}' {exc}.")
        return data


@admin.register(TenantEntitlementOverride)
class TenantEntitlementOverrideAdmin(SuperuserOnlyMixin, TenantScopedAdmin):
    form = OverrideAdminForm
    list_display = ["field", "value", "reason", "updated_at"]
    search_fields = ["field", "tenant__slug"]


@admin.register(MonthlyUsage)
class MonthlyUsageAdmin(TenantScopedAdmin):
    list_display = ["month", "runs_started", "run_quota"]
    readonly_fields = ["month", "runs_started", "run_quota"]
    date_hierarchy = "month"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
