"""Admin of the routing data, through the tenant-scoped admin base.

A connection's secret is never shown: its encrypted token is not a form field
and the list shows only whether one is set; a new secret can be typed in (a
password input that never renders a value). Every add and change is written by
the service the API calls (``scheduling.services``): the plan's limits, the
checks (a burst needs a rate, a rule that ``route()`` can evaluate, a key is
never renamed), one default pool, and a pool's renaming in its rules all hold
here too, and what the service refuses is the form's error.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import HttpRequest

from ductor_project.core.context import peek_tenant, tenant_context
from ductor_project.core.errors import ApiError
from scheduling import selectors, services
from scheduling.connection_config import ConfigError, validate_config
from scheduling.models import MAX_FAIRNESS_KEY_WEIGHT, Connection, FairnessKey, Pool, PoolMember, Rule
from tenants.admin_scoping import ServiceDeleteMixin, TenantScopedAdmin, TenantScopedInline


class _TryOnly(Exception):
    """Rolls back the write a form tried."""


class ServiceForm(forms.ModelForm):
    """A form whose row is written by a service (``write``, with the cleaned data, in the row's tenant).
    ``clean()`` tries the write in a savepoint it rolls back, so what the service refuses is the form's
    error (on the field it names) and nothing is kept; ``ServiceAdmin.save_model`` then writes it."""

    def write(self) -> Any:
        raise NotImplementedError

    def tenant(self) -> Any:
        """The row's tenant: chosen in the form (superusers), the row's own, or the staff user's."""
        return self.cleaned_data.get("tenant") or (self.instance.tenant if self.instance.tenant_id else peek_tenant())

    def _post_clean(self) -> None:
        """The model's fields are checked, its constraints left to the service: it answers a taken name
        as the API does, and makes a new default pool the only one (the constraint refused a second)."""
        self.instance.validate_constraints = lambda exclude=None: None
        try:
            super()._post_clean()  # type: ignore[misc]
        finally:
            del self.instance.validate_constraints

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        self._check_columns(cleaned)
        tenant = self.tenant()
        if self.errors or tenant is None:
            return cleaned
        try:
            with transaction.atomic(), tenant_context(tenant):
                self.write()
                raise _TryOnly
        except _TryOnly:
            pass
        except ApiError as exc:
            self._add_service_errors(exc)
        return cleaned

    def _check_columns(self, cleaned: dict[str, Any]) -> None:
        """Each value is one its column can hold (a number in the range of its integer column), as
        the model's own checks, which run only after ``clean()``, would say: tried first, a number
        past the range failed in the database (a 500)."""
        model_fields = {field.name: field for field in self._meta.model._meta.concrete_fields}
        for name, value in list(cleaned.items()):
            field = model_fields.get(name)
            if field is None or value in field.empty_values or name in self.errors:
                continue
            try:
                field.run_validators(value)
            except ValidationError as exc:
                self.add_error(name, exc)

    def _add_service_errors(self, exc: ApiError) -> None:
        if not exc.details:
            self.add_error(None, str(exc.detail))
        for name, problems in exc.details.items():
            field = name.split(".")[0].split("[")[0]
            text = " ".join(problems) if isinstance(problems, list | tuple) else str(problems)
            self.add_error(field if field in self.fields else None, f"{name}: {text}")


class ServiceAdmin(ServiceDeleteMixin, TenantScopedAdmin):
    """An admin whose rows are added and changed by their form's service (``ServiceForm.write``), and
    deleted, one or many, by its delete service (``delete_one``), each in its row's tenant."""

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        with tenant_context(form.tenant()):
            row = form.write()
        for field in obj._meta.concrete_fields:  # the page goes on with the row as written (its inlines, its log)
            setattr(obj, field.attname, getattr(row, field.attname))
        obj._state.adding, obj._state.db = False, row._state.db


def _given(data: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: data.get(name) for name in names}


class ConnectionAdminForm(ServiceForm):
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
        kind, config = self.cleaned_data.get("kind"), self.cleaned_data.get("config")
        if kind and config is not None:
            try:
                self.cleaned_data["config"] = validate_config(kind, config)
            except ConfigError as exc:
                self.add_error("kind" if exc.field == "kind" else "config", f"{exc.field}: {exc.message}")
        return super().clean()

    def write(self) -> Connection:
        data = _given(self.cleaned_data, "name", "kind", "config", "max_concurrency", "rate_per_s", "burst")
        secret = self.cleaned_data.get("new_secret")
        if self.instance._state.adding:
            return services.connection_create(**data, secret=secret or "")
        return services.connection_update(connection=self.instance, **data, **({"secret": secret} if secret else {}))


@admin.register(Connection)
class ConnectionAdmin(ServiceAdmin):
    form = ConnectionAdminForm
    list_display = ["name", "kind", "secret_set", "max_concurrency", "rate_per_s", "burst", "updated_at"]
    list_filter = ["kind"]
    search_fields = ["name"]
    exclude = ["secret_token"]
    readonly_fields = ["secret_set", "created_at", "updated_at"]

    @admin.display(boolean=True, description="has secret")
    def secret_set(self, obj: Connection) -> bool:
        return obj.has_secret

    def delete_one(self, obj: Connection) -> None:
        services.connection_delete(connection=obj)


class PoolMemberInline(TenantScopedInline):
    model = PoolMember
    fields = ["connection", "weight", "priority"]


class PoolAdminForm(ServiceForm):
    """The pool's own fields (``pool_create``, ``pool_update``); its members are the inline rows."""

    class Meta:
        model = Pool
        fields = ["tenant", "name", "strategy", "is_default", "max_concurrency", "rate_per_s", "burst"]

    def write(self) -> Pool:
        data = _given(self.cleaned_data, "name", "strategy", "is_default", "max_concurrency", "rate_per_s", "burst")
        if self.instance._state.adding:
            return services.pool_create(**data)
        return services.pool_update(pool=self.instance, **data)


@admin.register(Pool)
class PoolAdmin(ServiceAdmin):
    form = PoolAdminForm
    list_display = ["name", "strategy", "is_default", "max_concurrency", "rate_per_s", "burst", "updated_at"]
    list_filter = ["strategy", "is_default"]
    search_fields = ["name"]
    readonly_fields = ["created_at", "updated_at"]
    inlines = [PoolMemberInline]

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        """As Django's, with the rules that route to a pool among what protects it: its deletion is
        refused while one does (``pool_delete``), as a rule routing to no pool could not be evaluated."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        for pool in objs:
            with tenant_context(pool.tenant):
                protected += [f"Rule: {rule.name} (routes to the pool {pool.name})"
                              for rule in selectors.rules_using_pool(pool.name)]
        return deleted, counts, perms_needed, protected

    def delete_one(self, obj: Pool) -> None:
        services.pool_delete(pool=obj)


class RuleAdminForm(ServiceForm):
    class Meta:
        model = Rule
        fields = ["tenant", "name", "priority", "enabled", "match", "action"]

    def write(self) -> Rule:
        data = _given(self.cleaned_data, "name", "priority", "enabled", "match", "action")
        if self.instance._state.adding:
            return services.rule_create(**data)
        return services.rule_update(rule=self.instance, **data)


@admin.register(Rule)
class RuleAdmin(ServiceAdmin):
    form = RuleAdminForm
    list_display = ["priority", "name", "enabled", "match", "action"]
    list_display_links = ["priority", "name"]
    list_filter = ["enabled"]
    search_fields = ["name"]
    ordering = ["tenant", "priority"]  # evaluation order (per tenant, for superusers)
    readonly_fields = ["created_at", "updated_at"]

    def delete_one(self, obj: Rule) -> None:
        services.rule_delete(rule=obj)


class FairnessKeyAdminForm(ServiceForm):
    weight = forms.IntegerField(min_value=1, max_value=MAX_FAIRNESS_KEY_WEIGHT,
                                help_text=f"1 to {MAX_FAIRNESS_KEY_WEIGHT}, as the API takes it.")

    class Meta:
        model = FairnessKey
        fields = ["tenant", "key", "weight"]

    def write(self) -> FairnessKey:
        if self.instance._state.adding:
            return services.fairness_key_create(key=self.cleaned_data["key"], weight=self.cleaned_data["weight"])
        return services.fairness_key_update(fairness_key=self.instance, weight=self.cleaned_data["weight"])


@admin.register(FairnessKey)
class FairnessKeyAdmin(ServiceAdmin):
    """A key's weight inside its tenant (other keys weigh 1); the fair queue follows on save. A key is
    never renamed: delete it and add another."""

    form = FairnessKeyAdminForm

    list_display = ["key", "weight", "updated_at"]
    search_fields = ["key"]
    readonly_fields = ["created_at", "updated_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        readonly = list(super().get_readonly_fields(request, obj))
        return [*readonly, "key"] if obj is not None else readonly

    def delete_one(self, obj: FairnessKey) -> None:
        services.fairness_key_delete(fairness_key=obj)
