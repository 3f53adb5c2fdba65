"""Tenant-scoped models: the storage layer of tenant isolation.

``Model.objects`` is scoped: every query is filtered by the tenant in context,
and with no tenant in context it raises ``TenantScopeError`` (fail closed).
``Model.all_tenants`` crosses tenants on purpose; it is for the admin,
migrations and maintenance, and its name is meant to be grepped for.

Guarantees, each covered by a test in ``tests/tenants/test_scoping.py``:
- reverse related managers and ``prefetch_related`` are built on the default
  (scoped) manager, so they are filtered and fail closed too;
- ``update()`` cannot change the tenant column, ``bulk_create`` stamps and
  checks the tenant of each row, ``raw()`` is refused on the scoped manager;
- saving takes the tenant from the context; saving or deleting a row of
  another tenant raises; a foreign key to a scoped row of another tenant is
  refused at save time (so ``select_related`` joins stay inside one tenant).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import models

from tenants.context import TenantScopeError, current_tenant, peek_tenant, tenant_context


class TenantScopedQuerySet(models.QuerySet[Any]):
    def update(self, **kwargs: Any) -> int:
        if "tenant" in kwargs or "tenant_id" in kwargs:
            raise TenantScopeError("the tenant of a row cannot be changed")
        self._check_foreign_values(kwargs)
        return super().update(**kwargs)

    def _check_foreign_values(self, values: dict[str, Any]) -> None:
        """Refuse an update that would point a foreign key at a scoped row of another tenant."""
        row_tenants: set[Any] | None = None
        for name, value in values.items():
            try:
                field = self.model._meta.get_field(name.removesuffix("_id"))
            except FieldDoesNotExist:
                continue  # Django's own update() reports the unknown name
            target = getattr(field, "related_model", None)
            if value is None or not (
                isinstance(field, models.ForeignKey)
                and isinstance(target, type)
                and issubclass(target, TenantScopedModel)
            ):
                continue
            pk = value.pk if isinstance(value, models.Model) else value
            target_tenant = target.all_tenants.filter(pk=pk).values_list("tenant_id", flat=True).first()
            if row_tenants is None:
                row_tenants = set(self.values_list("tenant_id", flat=True).distinct())
            if target_tenant is None or row_tenants - {target_tenant}:
                raise TenantScopeError(f"cross-tenant reference refused: {name}={pk}")

    def bulk_create(self, objs: Iterable[Any], *args: Any, **kwargs: Any) -> list[Any]:
        tenant = current_tenant()
        objs = list(objs)
        for obj in objs:
            obj.bind_tenant(tenant)
            obj.check_tenant_links()
        return super().bulk_create(objs, *args, **kwargs)

    def bulk_update(  # type: ignore[override]
        self, objs: Iterable[Any], fields: Sequence[str], *args: Any, **kwargs: Any
    ) -> int:
        if "tenant" in fields or "tenant_id" in fields:
            raise TenantScopeError("the tenant of a row cannot be changed")
        tenant = current_tenant()
        objs = list(objs)
        for obj in objs:
            if obj.tenant_id != tenant.pk:
                raise TenantScopeError("bulk_update of a row of another tenant")
            obj.check_tenant_links()
        return super().bulk_update(objs, fields, *args, **kwargs)


class TenantScopedManager(models.Manager[Any]):
    """Filters by the tenant in context; raises ``TenantScopeError`` without one."""

    _queryset_class = TenantScopedQuerySet

    def get_queryset(self) -> TenantScopedQuerySet:
        tenant = current_tenant()
        return TenantScopedQuerySet(self.model, using=self._db).filter(tenant_id=tenant.pk)

    def none(self) -> TenantScopedQuerySet:
        """An empty queryset reveals nothing, so it needs no tenant (schema tools ask for one)."""
        return TenantScopedQuerySet(self.model, using=self._db).none()

    def raw(self, *args: Any, **kwargs: Any) -> Any:
        raise TenantScopeError("raw() is not scoped; use Model.all_tenants.raw() and filter by tenant")


class AllTenantsManager(models.Manager[Any]):
    """Crosses tenants. Only for admin, migrations and maintenance code."""

    _queryset_class = TenantScopedQuerySet

    def get_queryset(self) -> TenantScopedQuerySet:
        return TenantScopedQuerySet(self.model, using=self._db)


class TenantScopedModel(models.Model):
    """Abstract base of every tenant-owned model."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")

    objects: ClassVar[TenantScopedManager] = TenantScopedManager()
    all_tenants: ClassVar[AllTenantsManager] = AllTenantsManager()

    class Meta:
        abstract = True
        default_manager_name = "objects"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.bind_tenant(current_tenant())
        self.check_tenant_links()
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        if self.tenant_id != current_tenant().pk:
            raise TenantScopeError(f"delete of a {type(self).__name__} of another tenant")
        return super().delete(*args, **kwargs)

    def bind_tenant(self, tenant: Any) -> None:
        """Stamp ``tenant`` on an unsaved row; raise if the row belongs to another tenant."""
        if self.tenant_id is None:
            self.tenant = tenant
        elif self.tenant_id != tenant.pk:
            raise TenantScopeError(
                f"{type(self).__name__} belongs to another tenant than the one in context"
            )

    def tenant_link_errors(self) -> dict[str, str]:
        """Foreign keys of this row that point at a scoped row of another tenant."""
        errors: dict[str, str] = {}
        for field in self._meta.concrete_fields:
            if not isinstance(field, models.ForeignKey) or field.name == "tenant":
                continue
            target = field.related_model
            if not (isinstance(target, type) and issubclass(target, TenantScopedModel)):
                continue
            value = getattr(self, field.attname)
            if value is None:
                continue
            cached: Any = field.get_cached_value(self, default=None)
            if cached is not None and cached.pk == value:
                other_tenant = cached.tenant_id
            else:
                other_tenant = (
                    target.all_tenants.filter(pk=value).values_list("tenant_id", flat=True).first()
                )
            if other_tenant != self.tenant_id:
                errors[field.name] = f"{target.__name__} {value} does not exist"
        return errors

    def check_tenant_links(self) -> None:
        errors = self.tenant_link_errors()
        if errors:
            raise TenantScopeError(f"cross-tenant reference refused: {errors}")

    def clean(self) -> None:
        super().clean()
        if self.tenant_id is not None:
            errors = self.tenant_link_errors()
            if errors:
                raise ValidationError(errors)

    def _own_tenant(self) -> AbstractContextManager[Any]:
        """Validation of a row with no tenant in context runs in the row's own tenant."""
        if peek_tenant() is None and self.tenant_id is not None:
            return tenant_context(self.tenant)
        return nullcontext()

    def validate_unique(self, exclude: Any = None) -> None:
        with self._own_tenant():
            super().validate_unique(exclude)

    def validate_constraints(self, exclude: Any = None) -> None:
        with self._own_tenant():
            super().validate_constraints(exclude)
