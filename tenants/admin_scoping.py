"""Tenant scoping for the Django admin.

- A staff user with a membership sees and edits only their tenant's rows (the
  middleware puts their tenant in context for the whole request); a viewer's
  membership only sees them.
- A superuser sees every tenant's rows, with a tenant filter and column; each
  row is saved and deleted inside its own tenant's context. Neither the filter
  nor a form's tenant field lists every tenant (there may be ten thousand).
- Nobody can move a row to another tenant: the tenant is read-only once set,
  and foreign-key choices only offer rows of the row's tenant.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import nullcontext
from itertools import islice
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import widgets
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.views.main import ERROR_FLAG
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.forms import SimpleArrayField
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import QuerySet
from django.forms.fields import InvalidJSONInput
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.text import smart_split

from ductor_project.core.context import tenant_context
from ductor_project.core.payloads import unstorable_path
from tenants.permissions import READ_ONLY_ROLES
from tenants.scoping import TenantScopedModel
from tenants.selectors import membership_for_user


def admin_tenant(request: HttpRequest) -> Any:
    return getattr(request, "admin_tenant", None)


def admin_may_write(request: HttpRequest) -> bool:
    """Whether the user may write their tenant's rows at all: a superuser, or staff whose membership's
    role is not read only (a viewer reads, whatever model permissions the user holds), of a tenant
    that is not suspended (which acts through the admin no more than through the API: its staff
    read). Read once a request."""
    if request.user.is_superuser:
        return True
    if not hasattr(request, "_admin_may_write"):
        membership = membership_for_user(request.user)
        request._admin_may_write = (  # type: ignore[attr-defined]
            membership is not None and membership.role not in READ_ONLY_ROLES and membership.tenant.is_active)
    return bool(request._admin_may_write)  # type: ignore[attr-defined]


def _row_tenant(request: HttpRequest) -> Any:
    return getattr(request, "_admin_row_tenant", None) or admin_tenant(request)


def scoped_choices(db_field: Any, request: HttpRequest, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Foreign-key choices limited to the tenant of the row being edited."""
    related = db_field.related_model
    if isinstance(related, type) and issubclass(related, TenantScopedModel):
        tenant = _row_tenant(request)
        qs = related.all_tenants.all()
        if tenant is not None:
            qs = qs.filter(tenant=tenant)
        elif not request.user.is_superuser:
            qs = qs.none()
        kwargs["queryset"] = qs
    return kwargs


def scoped_foreignkey_formfield(db_field: Any, kwargs: dict[str, Any]) -> Any:
    """The form field of a foreign key to a scoped model, with the queryset of ``scoped_choices``.

    ``ForeignKey.formfield()`` first builds a default queryset from the related
    model's default (scoped) manager, which raises with no tenant in context (a
    superuser's admin request), and only then applies ours. Build the field
    without that default; ours is always given.
    """
    return super(models.ForeignKey, db_field).formfield(
        **{
            "form_class": forms.ModelChoiceField,
            "to_field_name": db_field.remote_field.field_name,
            **kwargs,
            "blank": db_field.blank,
        }
    )


def _plain_scoped_select(
    model_admin: Any, db_field: Any, request: HttpRequest, kwargs: dict[str, Any]
) -> bool:
    """A foreign key to a scoped model shown as a plain select (no admin widget of its own)."""
    related = db_field.related_model
    special = {
        *model_admin.raw_id_fields, *model_admin.get_autocomplete_fields(request), *model_admin.radio_fields
    }
    return (
        isinstance(related, type) and issubclass(related, TenantScopedModel)
        and "widget" not in kwargs and db_field.name not in special
    )


class TenantListFilter(admin.RelatedFieldListFilter):
    """A superuser's filter of a list by tenant: the first ``shown`` tenants by slug, and the one chosen.
    Any other is reached by its link (``?tenant__id__exact=<id>``, as the run console's tenant page
    links its runs). Django's lists every tenant: on a platform of ten thousand, each page of every
    list read and drew them all."""

    shown = 100

    def field_choices(self, field: Any, request: HttpRequest, model_admin: Any) -> Any:
        tenants = field.related_model.objects.order_by("slug")
        first = {str(tenant.pk): str(tenant) for tenant in tenants[: self.shown]}
        chosen = [value for value in self.lookup_val or [] if _a_key(field.related_model._meta.pk, value)]
        more = {str(tenant.pk): str(tenant) for tenant in tenants.filter(pk__in=chosen)} if chosen else {}
        return list({**first, **more}.items())


MAX_SEARCH_TERMS = 10  # the words of a changelist search that are taken


class ChangelistLimitsMixin:
    """What a changelist takes of its query string. A year no date can have
    (``?created_at__year=99999``) is answered as Django answers any lookup it cannot use (``?e=1``),
    instead of failing when the query's SQL is built. A search uses its first ``MAX_SEARCH_TERMS``
    words: each word is one more condition on every search field, and a request line of 1,900 of
    them held a web worker for seconds. An action on a selection that names an id no row can have
    (``_selected_action=not-a-uuid``) changes nothing and says so, instead of failing when the
    selection's query is built."""

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        for key, value in request.GET.lists():
            if "year" in key.split("__") and not all(_a_year(part) for raw in value for part in raw.split(",")):
                return HttpResponseRedirect(f"{request.path}?{ERROR_FLAG}=1")
        return super().changelist_view(request, extra_context)  # type: ignore[misc]

    def response_action(self, request: HttpRequest, queryset: QuerySet[Any], *args: Any,
                        **kwargs: Any) -> HttpResponse | None:
        pk = self.model._meta.pk  # type: ignore[attr-defined]
        for value in request.POST.getlist(ACTION_CHECKBOX_NAME):
            if not _a_key(pk, value):
                text = "A selected item has an id that no item can have. No items have been changed."
                self.message_user(request, text, messages.WARNING)  # type: ignore[attr-defined]
                return None
        return super().response_action(request, queryset, *args, **kwargs)  # type: ignore[misc]

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any], search_term: str) -> Any:
        bounded = " ".join(islice(smart_split(search_term), MAX_SEARCH_TERMS)) if search_term else search_term
        return super().get_search_results(request, queryset, bounded)  # type: ignore[misc]


def _a_key(pk: Any, text: str) -> bool:
    """Whether ``text`` can be the primary key ``pk`` of a row."""
    if "\x00" in text:
        return False
    try:
        pk.to_python(text)
    except ValidationError:
        return False
    return True


def _a_year(text: str) -> bool:
    return text.strip().lstrip("-").isdigit() and 1 <= int(text) <= 9999


class StorableJSONField(forms.JSONField):
    """A JSON form field that refuses what PostgreSQL's ``jsonb`` cannot store (a NUL, a lone
    surrogate, a number too large to be finite) with the field's error, naming where, as the API
    does; saved, it failed (a 500). Text nested deeper than the parser can go is invalid JSON too
    (it failed while parsed: a 500)."""

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except RecursionError:
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid",
                                        params={"value": "…"}) from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)

    def validate(self, value: Any) -> None:
        super().validate(value)
        found = unstorable_path(value)
        if found is not None:
            raise forms.ValidationError(f"{found[0]}: {found[1]}")


class PlainErrorsArrayField(SimpleArrayField):
    """Django's array form field, whose errors are said as they were written: Django formats an item's
    error with its value, then again with its parameters, so a value holding a ``%`` (``read,100%``)
    failed the page (a 500)."""

    def clean(self, value: Any) -> Any:
        try:
            return super().clean(value)
        except ValidationError as exc:
            raise ValidationError([ValidationError(str(error.message), code=error.code)
                                   for error in exc.error_list]) from None


class StorableJSONMixin:
    """Every JSON field of an admin's forms is a ``StorableJSONField``, and every array field a
    ``PlainErrorsArrayField``."""

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if isinstance(db_field, ArrayField):
            kwargs.setdefault("form_class", PlainErrorsArrayField)
        if isinstance(db_field, models.JSONField):
            kwargs.setdefault("form_class", StorableJSONField)
        return super().formfield_for_dbfield(db_field, request, **kwargs)  # type: ignore[misc]


class ServiceDeleteMixin:
    """Deletes, one or many, go through the model's delete service (``delete_one``), each in its
    row's tenant: the service also does what a bare ``delete()`` skips (locks, caches, references)."""

    def delete_one(self, obj: Any) -> None:
        raise NotImplementedError

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        with tenant_context(obj.tenant):
            self.delete_one(obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for obj in queryset.select_related("tenant"):
            self.delete_model(request, obj)


class TenantScopedAdmin(StorableJSONMixin, ChangelistLimitsMixin, admin.ModelAdmin[Any]):
    """Base admin of every tenant-scoped model."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # No select_related here: a changelist applies its own (``get_list_select_related``) only
        # to a queryset that selects nothing related yet, so one here left each row of a list to
        # read the relations it shows one query per row.
        qs = self.model.all_tenants.all()
        if request.user.is_superuser:
            return qs
        tenant = admin_tenant(request)
        return qs.filter(tenant=tenant) if tenant is not None else qs.none()

    def get_list_select_related(self, request: HttpRequest) -> Any:
        """A superuser's list shows each row's tenant: an admin that names the relations its list
        reads reads that one too (with none named, Django reads every relation a row must have)."""
        chosen = super().get_list_select_related(request)
        if request.user.is_superuser and isinstance(chosen, list | tuple) and "tenant" not in chosen:
            return [*chosen, "tenant"]
        return chosen

    def _allowed(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser or admin_tenant(request) is not None)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self._allowed(request) and super().has_module_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request) and super().has_view_permission(request, obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self._allowed(request) and admin_may_write(request) and super().has_add_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request) and admin_may_write(request) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request) and admin_may_write(request) and super().has_delete_permission(request, obj)

    def get_list_display(self, request: HttpRequest) -> Any:
        columns = list(super().get_list_display(request))
        if request.user.is_superuser and "tenant" not in columns:
            columns.append("tenant")
        return columns

    def get_list_filter(self, request: HttpRequest) -> Any:
        filters = list(super().get_list_filter(request))
        if request.user.is_superuser and "tenant" not in filters:
            filters.insert(0, ("tenant", TenantListFilter))
        return filters


    def get_exclude(self, request: HttpRequest, obj: Any = None) -> Any:
        excluded = list(super().get_exclude(request, obj) or [])
        if not request.user.is_superuser:
            excluded.append("tenant")
        return excluded

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """An admin's own ``fields`` without ``tenant`` for staff, whose forms exclude it (listed, the
        page looked it up in the form: a 500)."""
        fields = list(super().get_fields(request, obj))
        return fields if request.user.is_superuser else [name for name in fields if name != "tenant"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        readonly = list(super().get_readonly_fields(request, obj))
        if obj is not None and request.user.is_superuser:
            readonly.append("tenant")
        return readonly

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        tenant = obj.tenant if obj is not None else admin_tenant(request)
        request._admin_row_tenant = tenant  # type: ignore[attr-defined]
        return _checked_in_tenant(super().get_form(request, obj, change, **kwargs), tenant)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        """A superuser's form names its row's tenant by its id, with the tenants' list to look it up in
        (Django's raw id widget), not in a select of every tenant, which drew ten thousand options on
        each add page; the other foreign keys offer the rows of the row's tenant."""
        if db_field.name == "tenant" and request.user.is_superuser and "widget" not in kwargs:
            kwargs["widget"] = widgets.ForeignKeyRawIdWidget(db_field.remote_field, self.admin_site,
                                                             using=kwargs.get("using"))
        kwargs = scoped_choices(db_field, request, kwargs)
        if _plain_scoped_select(self, db_field, request, kwargs):
            return scoped_foreignkey_formfield(db_field, kwargs)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if obj.tenant_id is None:
            obj.tenant = admin_tenant(request)
        with tenant_context(obj.tenant):
            super().save_model(request, obj, form, change)

    def get_inline_instances(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        # A superuser adding a row has no tenant yet, so inline rows could not be
        # scoped: inlines appear once the row exists (or for a staff user's tenant).
        if obj is None and admin_tenant(request) is None:
            return []
        return super().get_inline_instances(request, obj)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        with tenant_context(form.instance.tenant):
            super().save_related(request, form, formsets, change)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        with tenant_context(obj.tenant):
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        by_tenant: dict[Any, list[Any]] = defaultdict(list)
        for obj in queryset.select_related("tenant"):
            by_tenant[obj.tenant].append(obj.pk)
        for tenant, pks in by_tenant.items():
            with tenant_context(tenant):
                self.model.objects.filter(pk__in=pks).delete()


def _checked_in_tenant(form: Any, tenant: Any) -> Any:
    """``form``, whose row's uniqueness is checked in ``tenant`` (a staff user's, or the row's) when the
    tenant is not a field of it. Django checks only the constraints of the fields a form has, and left a
    name taken in the tenant (``UniqueConstraint(tenant, name)``) to the database: a 500."""
    if tenant is None:
        return form

    class CheckedInTenant(form):
        def _get_validation_exclusions(self) -> Any:
            if self.instance.tenant_id is None:
                self.instance.tenant = tenant
            return super()._get_validation_exclusions() - {"tenant"}

    CheckedInTenant.__name__ = form.__name__
    return CheckedInTenant


class TenantScopedInlineFormSet(BaseInlineFormSet):
    """Builds each form in the parent row's tenant, and gives new rows that tenant.

    Django builds an inline form's hidden id field from the model's default
    (scoped) manager, which raises with no tenant in context (a superuser); a
    new row bound to its tenant is validated in that tenant (``_own_tenant``).
    """

    def add_fields(self, form: Any, index: Any) -> None:
        tenant = self.instance.tenant if getattr(self.instance, "tenant_id", None) else None
        if tenant is not None and form.instance.tenant_id is None:
            form.instance.tenant = tenant
        with tenant_context(tenant) if tenant is not None else nullcontext():
            super().add_fields(form, index)


class TenantScopedInline(admin.TabularInline[Any, Any]):
    """Inline of a scoped model: its rows come from the parent row's tenant only."""

    extra = 0
    formset = TenantScopedInlineFormSet

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = self.model.all_tenants.all()
        tenant = _row_tenant(request)
        if tenant is not None:
            return qs.filter(tenant=tenant)
        return qs if request.user.is_superuser else qs.none()

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        kwargs = scoped_choices(db_field, request, kwargs)
        if _plain_scoped_select(self, db_field, request, kwargs):
            return scoped_foreignkey_formfield(db_field, kwargs)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

