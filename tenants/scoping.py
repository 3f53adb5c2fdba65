"""Tenant-scoped models: the storage layer of tenant isolation.

``Model.objects`` is scoped: every query is filtered by the tenant in context,
and with no tenant in context it raises ``TenantScopeError`` (fail closed).
``Model.all_tenants`` crosses tenants on purpose; it is for the admin,
migrations and maintenance, and its name is meant to be grepped for. Its
queries run ``across_tenants``: under the database's row-level security (the
second wall, ``tenants.row_security``) as the maintenance role, the only one
that sees every tenant's rows.

Guarantees, each covered by a test in ``tests/tenants/test_scoping.py``:
- reverse related managers and ``prefetch_related`` are built on the default
  (scoped) manager, so they are filtered and fail closed too;
- forward relations (``note.folder``) are read through Django's unfiltered
  base manager, so their descriptor checks the tenant: assigning a row of
  another tenant to a stored row raises (this guards ``folder.notes.add()``),
  and a link to another tenant's row (only possible through raw SQL) raises on
  access, reads as missing through ``prefetch_related``, and raises when
  ``select_related`` joins it;
- ``update()`` cannot change the tenant column nor point a foreign key at a
  scoped row of another tenant; ``raw()`` is refused on the scoped manager;
- ``bulk_create`` stamps and checks the tenant of each row, and an upsert must
  conflict on the tenant column (so it never overwrites another tenant's row);
  ``bulk_update`` only takes rows of the tenant in context;
- saving takes the tenant from the context; saving or deleting a row of
  another tenant raises, also when the row's tenant was reassigned in memory or
  its primary key was forged; a foreign key to a scoped row of another tenant is
  refused at save time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from typing import Any, ClassVar, TypeGuard

from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import connections, models
from django.db.models import F, Window
from django.db.models.base import ModelState
from django.db.models.fields.related_descriptors import (
    ForwardManyToOneDescriptor,
    ForwardOneToOneDescriptor,
)
from django.db.models.functions import RowNumber
from django.db.models.query import ModelIterable
from django.db.models.signals import class_prepared, post_init, pre_init

from ductor_project.core.context import (
    TenantScopeError,
    across_tenants,
    current_tenant,
    peek_tenant,
    tenant_context,
)

_TENANT_FIELDS = {"tenant", "tenant_id"}
# Set while bulk_update() runs: it checked every row's links itself, and the
# update() it issues assigns them as per-row CASE expressions.
_links_checked: ContextVar[bool] = ContextVar("ductor_tenant_links_checked", default=False)


def _is_scoped(model: Any) -> TypeGuard[type[TenantScopedModel]]:
    return isinstance(model, type) and issubclass(model, TenantScopedModel)


class TenantCheckedIterable(ModelIterable):
    """Model rows; a row that ``select_related`` joined to a row of another tenant raises."""

    def __iter__(self) -> Iterator[Any]:
        joined = bool(self.queryset.query.select_related)
        for obj in super().__iter__():
            if joined:
                _refuse_cross_tenant_joins(obj)
            yield obj


def _refuse_cross_tenant_joins(obj: Any, seen: set[int] | None = None) -> None:
    """Raises for a row joined to a row of another tenant. Each row is checked once: a one-to-one
    join caches each side on the other, and walking that cycle again never ended."""
    seen = set() if seen is None else seen
    seen.add(id(obj))
    for related in obj._state.fields_cache.values():
        if isinstance(related, TenantScopedModel) and id(related) not in seen:
            if related.tenant_id != obj.tenant_id:
                raise TenantScopeError(
                    f"{type(obj).__name__} {obj.pk} is linked to a {type(related).__name__} "
                    "of another tenant"
                )
            _refuse_cross_tenant_joins(related, seen)


class TenantScopedQuerySet(models.QuerySet[Any]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._iterable_class = TenantCheckedIterable

    def update(self, **kwargs: Any) -> int:
        if _TENANT_FIELDS & kwargs.keys():
            raise TenantScopeError("the tenant of a row cannot be changed")
        if not _links_checked.get():
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
            if hasattr(value, "resolve_expression"):
                raise TenantScopeError(f"cannot check the tenant of an expression assigned to {name}")
            pk = value.pk if isinstance(value, models.Model) else value
            # Read as the rows are (row-level security hides another tenant's: it reads as None).
            target_tenant = target._base_manager.filter(pk=pk).values_list("tenant_id", flat=True).first()
            if row_tenants is None:
                row_tenants = set(self.values_list("tenant_id", flat=True).distinct())
            if target_tenant is None or row_tenants - {target_tenant}:
                raise TenantScopeError(f"cross-tenant reference refused: {name}={pk}")

    def bulk_create(  # type: ignore[override]
        self,
        objs: Iterable[Any],
        batch_size: int | None = None,
        ignore_conflicts: bool = False,
        update_conflicts: bool = False,
        update_fields: Sequence[str] | None = None,
        unique_fields: Sequence[str] | None = None,
    ) -> list[Any]:
        if update_conflicts and not _TENANT_FIELDS & set(unique_fields or ()):
            raise TenantScopeError(
                "an upsert must conflict on the tenant column, or it could overwrite a row of another tenant"
            )
        if _TENANT_FIELDS & set(update_fields or ()):
            raise TenantScopeError("the tenant of a row cannot be changed")
        tenant = current_tenant()
        objs = list(objs)
        for obj in objs:
            obj.bind_tenant(tenant)
            obj.check_tenant_links()
        return super().bulk_create(
            objs,
            batch_size=batch_size,
            ignore_conflicts=ignore_conflicts,
            update_conflicts=update_conflicts,
            update_fields=update_fields,
            unique_fields=unique_fields,
        )

    def bulk_update(  # type: ignore[override]
        self, objs: Iterable[Any], fields: Sequence[str], *args: Any, **kwargs: Any
    ) -> int:
        if _TENANT_FIELDS & set(fields):
            raise TenantScopeError("the tenant of a row cannot be changed")
        tenant = current_tenant()
        objs = list(objs)
        for obj in objs:
            if obj.tenant_id != tenant.pk or obj.stored_tenant_id() != tenant.pk:
                raise TenantScopeError("bulk_update of a row of another tenant")
            obj.check_tenant_links()
        token = _links_checked.set(True)
        try:
            return super().bulk_update(objs, fields, *args, **kwargs)
        finally:
            _links_checked.reset(token)


_columns: dict[tuple[type[models.Model], str, tuple[str, ...]], str] = {}
_converted: dict[tuple[type[models.Model], str, tuple[str, ...]], tuple[tuple[Any, list[Any]], ...]] = {}


def _fields(model: type[models.Model], defer: tuple[str, ...]) -> list[Any]:
    return [field for field in model._meta.concrete_fields if field.attname not in defer]


def row_columns(model: type[models.Model], alias: str = "", *, defer: tuple[str, ...] = ()) -> str:
    """The columns of ``model``'s rows (of ``alias``, else its table; all but the fields in
    ``defer``), in the order ``instances_of`` reads them: for the ``SELECT`` or ``RETURNING`` of a
    hand-written statement."""
    found = _columns.get((model, alias, defer))
    if found is None:
        quote = connections["default"].ops.quote_name
        table = quote(alias or model._meta.db_table)
        found = ", ".join(f"{table}.{quote(str(field.column))}" for field in _fields(model, defer))
        _columns[(model, alias, defer)] = found
    return found


def _converters(model: type[models.Model], using: str, defer: tuple[str, ...]) -> tuple[tuple[Any, list[Any]], ...]:
    found = _converted.get((model, using, defer))
    if found is None:
        connection = connections[using]
        columns = [field.get_col(model._meta.db_table) for field in _fields(model, defer)]
        found = tuple((col, connection.ops.get_db_converters(col) + col.get_db_converters(connection))
                      for col in columns)
        _converted[(model, using, defer)] = found
    return found


def insert_rows(objs: Sequence[TenantScopedModel], *, using: str = "default") -> None:
    """Insert new rows of one scoped model in one plain ``INSERT``: what ``bulk_create`` does for
    rows whose every column is set in Python (primary keys included), at a fraction of its cost.
    Each row is stamped with the tenant in context and its links checked, as ``bulk_create``
    does, and is then a saved instance."""
    if not objs:
        return
    with connections[using].cursor() as cursor:
        cursor.execute(*rows_insert(objs, using=using))
    rows_inserted(objs, using=using)


def rows_insert(objs: Sequence[TenantScopedModel], *, using: str = "default") -> tuple[str, list[Any]]:
    """``insert_rows``'s ``INSERT`` of ``objs`` (each stamped with the tenant in context and its
    links checked), to send with other statements; ``rows_inserted`` once it ran."""
    model, tenant, connection = type(objs[0]), current_tenant(), connections[using]
    fields = model._meta.concrete_fields
    quote = connection.ops.quote_name
    params: list[Any] = []
    for obj in objs:
        if type(obj) is not model or not obj._state.adding or obj.pk is None:
            raise ValueError("insert_rows() takes new rows of one model, their primary keys set")
        obj.bind_tenant(tenant)
        obj.check_tenant_links()
        params += [field.get_db_prep_save(_inserted_value(field, obj), connection) for field in fields]
    row = f"({', '.join(['%s'] * len(fields))})"
    columns = ", ".join(quote(str(field.column)) for field in fields)
    return (f"INSERT INTO {quote(model._meta.db_table)} ({columns}) "  # noqa: S608 - placeholders only
            f"VALUES {', '.join([row] * len(objs))}", params)


def _inserted_value(field: models.Field[Any, Any], obj: models.Model) -> Any:
    """What ``field`` of the new row ``obj`` holds: its ``pre_save``, except that a creation time
    (``auto_now_add``) given to the object is kept, as when it was made before its row is written."""
    if getattr(field, "auto_now_add", False) and not getattr(field, "auto_now", False):
        given = getattr(obj, field.attname)
        if given is not None:
            return given
    return field.pre_save(obj, True)


def rows_inserted(objs: Sequence[TenantScopedModel], *, using: str = "default") -> None:
    """``objs``, whose ``rows_insert`` ran, are saved instances."""
    for obj in objs:
        obj._state.adding, obj._state.db = False, using
        obj._loaded_tenant_id = obj.tenant_id


def instances_of(model: type[models.Model], rows: Iterable[Sequence[Any]], *, using: str = "default",
                 defer: tuple[str, ...] = ()) -> list[Any]:
    """``model`` instances of ``rows`` read with ``row_columns(model, defer=defer)``, as a queryset
    would make them (each column converted, the stored tenant remembered, the fields in ``defer``
    read when first used).

    A queryset makes each through ``Model.__init__``, which sets the fields one by one through
    their descriptors and sends ``pre_init`` and ``post_init``: 6% of the instructions of a chain
    step in a worker, whose every tick reads its run's attempts. When no receiver listens
    to those signals for ``model``, the instance's fields are set at once instead, as
    ``__init__`` would leave them on a new instance (nothing cached to clear)."""
    connection, converters = connections[using], _converters(model, using, defer)
    names = _names(model, defer)
    plain = not (pre_init.has_listeners(model) or post_init.has_listeners(model))
    scoped = issubclass(model, TenantScopedModel)
    found = []
    for row in rows:
        values = list(row)
        for i, (col, convert) in enumerate(converters):
            for converter in convert:
                values[i] = converter(values[i], col, connection)
        if not plain:
            found.append(model.from_db(using, names, values))
            continue
        obj = model.__new__(model)
        obj.__dict__.update(zip(names, values, strict=True))
        obj._state = state = ModelState()
        state.adding, state.db = False, using
        if scoped:
            obj.__dict__["_loaded_tenant_id"] = obj.__dict__.get("tenant_id")
        found.append(obj)
    return found


@functools.cache
def _names(model: type[models.Model], defer: tuple[str, ...]) -> list[str]:
    return [field.attname for field in _fields(model, defer)]


def instance_with(model: type[models.Model], related: str, row: Sequence[Any], *, using: str = "default",
                  defer: tuple[str, ...] = ()) -> Any:
    """The ``model`` instance of ``row``, read with ``row_columns(model, defer=defer)`` then the
    columns of the model its foreign key ``related`` points to, with that row set on it as
    ``select_related`` would set it."""
    split = len(_fields(model, defer))
    found = instances_of(model, [row[:split]], using=using, defer=defer)[0]
    target = model._meta.get_field(related).related_model
    if not isinstance(target, type):
        raise TypeError(f"{model.__name__}.{related} is not a foreign key")
    setattr(found, related, instances_of(target, [row[split:]], using=using)[0])
    return found


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


def _across(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` of a queryset, run ``across_tenants``."""

    @functools.wraps(method)
    def run(self: models.QuerySet[Any], *args: Any, **kwargs: Any) -> Any:
        with across_tenants(f"{self.model.__name__}.all_tenants"):
            return method(self, *args, **kwargs)

    return run


class AcrossTenantsIterator:
    """A queryset's ``iterator()``, each step of it ``across_tenants`` (never the caller's code
    between two steps)."""

    def __init__(self, rows: Iterator[Any], reason: str) -> None:
        self.rows, self.reason = rows, reason

    def __iter__(self) -> AcrossTenantsIterator:
        return self

    def __next__(self) -> Any:
        with across_tenants(self.reason):
            return next(self.rows)


class AcrossTenantsQuerySet(TenantScopedQuerySet):
    """What ``Model.all_tenants`` hands out: every query it runs crosses tenants on purpose."""

    _fetch_all = _across(TenantScopedQuerySet._fetch_all)
    count = _across(TenantScopedQuerySet.count)
    exists = _across(TenantScopedQuerySet.exists)
    contains = _across(TenantScopedQuerySet.contains)
    aggregate = _across(TenantScopedQuerySet.aggregate)
    explain = _across(TenantScopedQuerySet.explain)
    update = _across(TenantScopedQuerySet.update)
    _update = _across(TenantScopedQuerySet._update)  # type: ignore[attr-defined]
    delete = _across(TenantScopedQuerySet.delete)
    _raw_delete = _across(TenantScopedQuerySet._raw_delete)

    def iterator(self, chunk_size: int | None = None) -> Iterator[Any]:
        return AcrossTenantsIterator(super().iterator(chunk_size), f"{self.model.__name__}.all_tenants")


class AllTenantsManager(models.Manager[Any]):
    """Crosses tenants. Only for admin, migrations and maintenance code."""

    _queryset_class = AcrossTenantsQuerySet

    def get_queryset(self) -> AcrossTenantsQuerySet:
        return AcrossTenantsQuerySet(self.model, using=self._db)

    def raw(self, *args: Any, **kwargs: Any) -> Any:
        """The rows of a raw query, read ``across_tenants`` (all at once)."""
        with across_tenants(f"{self.model.__name__}.all_tenants.raw"):
            return list(super().raw(*args, **kwargs))


def in_tenant_turns(queryset: models.QuerySet[Any], field: str) -> models.QuerySet[Any]:
    """``queryset``'s rows of every tenant in turns: each tenant's first by ``field`` (then by
    key), then each one's second, and so on, by ``field`` within a turn. Housekeeping that takes a
    batch at a time goes through it, so that one tenant's many rows take one place of each turn,
    not the whole batch, and another tenant's row is not held up for as long as they last."""
    turn = Window(RowNumber(), partition_by=[F("tenant_id")], order_by=[F(field).asc(), F("pk").asc()])
    return queryset.annotate(turn=turn).order_by("turn", field, "pk")


def tenant_field(*, db_index: bool = True) -> Any:
    """A tenant-owned model's ``tenant``. ``db_index=False`` for a table whose rows are always
    found by a narrower key that the tenant's rows cannot outnumber (a run's attempts and
    events, by their run): under row-level security every query carries the tenant's
    condition, and a lone index on it invites the planner to AND it with the narrow one,
    reading an index entry for every row of the tenant to find a run's few (and each row
    written has one index more to write)."""
    return models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+", db_index=db_index)


class TenantScopedModel(models.Model):
    """Abstract base of every tenant-owned model."""

    tenant = tenant_field()

    objects: ClassVar[TenantScopedManager] = TenantScopedManager()
    all_tenants: ClassVar[AllTenantsManager] = AllTenantsManager()

    _loaded_tenant_id: Any = None

    class Meta:
        abstract = True
        default_manager_name = "objects"

    def save(self, *args: Any, **kwargs: Any) -> None:
        tenant = current_tenant()
        self.bind_tenant(tenant)
        self._refuse_overwrite(tenant, force_insert=bool(kwargs.get("force_insert")))
        self.check_tenant_links()
        super().save(*args, **kwargs)
        self._loaded_tenant_id = self.tenant_id

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        tenant = current_tenant()
        if self.tenant_id != tenant.pk or self.stored_tenant_id() != tenant.pk:
            raise TenantScopeError(f"delete of a {type(self).__name__} of another tenant")
        return super().delete(*args, **kwargs)

    @classmethod
    def from_db(cls, db: Any, field_names: Any, values: Any, **kwargs: Any) -> Any:
        row = super().from_db(db, field_names, values, **kwargs)
        row._loaded_tenant_id = row.__dict__.get("tenant_id")
        return row

    def stored_tenant_id(self) -> Any:
        """The row's tenant in the database, as far as this instance knows (its tenant if unsaved)."""
        return self._loaded_tenant_id if self._loaded_tenant_id is not None else self.tenant_id

    def _refuse_overwrite(self, tenant: Any, *, force_insert: bool) -> None:
        """Refuse a save that would write over a row of another tenant."""
        if self.stored_tenant_id() != tenant.pk:
            raise TenantScopeError(f"save of a {type(self).__name__} of another tenant")
        # A new instance with a hand-set primary key (and no generated default)
        # makes Django try an UPDATE by primary key first.
        forged = self._state.adding and not force_insert and self.pk is not None
        if forged and not self._meta.pk.has_default():
            others = type(self).all_tenants.filter(pk=self.pk).exclude(tenant_id=tenant.pk)
            if others.exists():
                raise TenantScopeError(f"save of a {type(self).__name__} of another tenant")

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
            if not _is_scoped(target):
                continue
            value = getattr(self, field.attname)
            if value is None:
                continue
            cached: Any = field.get_cached_value(self, default=None)
            if cached is not None and cached.pk == value:
                other_tenant = cached.tenant_id
            else:  # read in the row's own tenant: row-level security hides the others' rows
                with self._own_tenant():
                    other_tenant = (
                        target._base_manager.filter(pk=value).values_list("tenant_id", flat=True).first()
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

    def _unowned(self) -> bool:
        """No tenant to validate in: none in context and none chosen (a form whose tenant field is
        empty or wrong, which that field's own error reports; such a row cannot be saved)."""
        return self.tenant_id is None and peek_tenant() is None

    def validate_unique(self, exclude: Any = None) -> None:
        if self._unowned():
            return
        with self._own_tenant():
            super().validate_unique(exclude)

    def validate_constraints(self, exclude: Any = None) -> None:
        if self._unowned():
            return
        with self._own_tenant():
            super().validate_constraints(exclude)


class _TenantForwardMixin:
    """Forward relations of a scoped row reach only rows of that row's tenant.

    Django reads them through the target's base manager, which is unfiltered.
    """

    field: Any

    def _scoped_target(self) -> bool:
        return _is_scoped(self.field.related_model)

    def __set__(self, instance: Any, value: Any) -> None:
        # Only stored rows: a new row's links are checked by clean() and save(), so
        # that a form reports them as a validation error.
        if (
            isinstance(value, TenantScopedModel)
            and not instance._state.adding
            and value.tenant_id != instance.tenant_id
        ):
            raise TenantScopeError(
                f"{type(instance).__name__}.{self.field.name} cannot point at a row of another tenant"
            )
        super().__set__(instance, value)  # type: ignore[misc]

    def get_object(self, instance: Any) -> Any:
        obj = super().get_object(instance)  # type: ignore[misc]
        if self._scoped_target() and obj.tenant_id != instance.tenant_id:
            raise TenantScopeError(
                f"{type(instance).__name__}.{self.field.name} points at a row of another tenant"
            )
        return obj

    def get_prefetch_querysets(self, instances: Any, querysets: Any = None) -> Any:
        queryset, rel_obj_attr, instance_attr, single, cache_name, is_descriptor = (
            super().get_prefetch_querysets(instances, querysets)  # type: ignore[misc]
        )
        if self._scoped_target():
            # Match on (key, tenant): a row of another tenant is attached to nothing.
            rel_obj_attr = _with_tenant(rel_obj_attr)
            instance_attr = _with_tenant(instance_attr)
        return queryset, rel_obj_attr, instance_attr, single, cache_name, is_descriptor


def _with_tenant(key: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda obj: (key(obj), obj.tenant_id)


class TenantForwardManyToOneDescriptor(_TenantForwardMixin, ForwardManyToOneDescriptor):
    pass


class TenantForwardOneToOneDescriptor(_TenantForwardMixin, ForwardOneToOneDescriptor):
    pass


_GUARDED_DESCRIPTORS: dict[type, type] = {
    ForwardManyToOneDescriptor: TenantForwardManyToOneDescriptor,
    ForwardOneToOneDescriptor: TenantForwardOneToOneDescriptor,
}


def _guard_forward_relations(sender: type, **kwargs: Any) -> None:
    """Give every foreign key of a concrete scoped model the tenant-checking descriptor."""
    if not _is_scoped(sender) or sender._meta.abstract:
        return
    for field in sender._meta.local_fields:
        if isinstance(field, models.ForeignKey) and field.name != "tenant":
            guarded = _GUARDED_DESCRIPTORS.get(type(sender.__dict__.get(field.name)))
            if guarded is not None:
                setattr(sender, field.name, guarded(field))


class_prepared.connect(_guard_forward_relations, dispatch_uid="tenants.scoping.guard_forward_relations")
