"""The storage layer of tenant isolation: every leak path of a scoped model, one test each.

Rows of tenant A and tenant B live side by side in the real PostgreSQL. A
"corrupt" cross-tenant link (which the ORM refuses to write) is made with raw
SQL, to show the read paths stay closed even when the data is wrong.
"""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace
from typing import Any

import pytest
from django.apps import apps
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Count, F, Subquery, Sum

from ductor_project.core.context import (
    SYSTEM_TENANT_SLUG,
    TenantScopeError,
    across_tenants,
    current_tenant,
    no_tenant,
    peek_tenant,
    tenant_context,
)
from tenants.models import ApiKey, Tenant, system_context
from tenants.scoping import TenantScopedModel
from tests.scoped.models import Folder, Note

SCOPED_MODELS = sorted(
    (model for model in apps.get_models() if issubclass(model, TenantScopedModel)),
    key=lambda model: model._meta.label,
)


@pytest.fixture
def world(tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str]) -> SimpleNamespace:
    """Two folders and two notes in A, one folder and one note in B."""
    a, b = tenant_a[0], tenant_b[0]
    with tenant_context(a):
        fa = Folder.objects.create(name="a-folder")
        fa2 = Folder.objects.create(name="a-folder-2")
        na1 = Note.objects.create(folder=fa, body="a1", size=1)
        na2 = Note.objects.create(folder=fa, body="a2", size=2)
    with tenant_context(b):
        fb = Folder.objects.create(name="b-folder")
        nb = Note.objects.create(folder=fb, body="b1", size=100)
    return SimpleNamespace(a=a, b=b, fa=fa, fa2=fa2, na1=na1, na2=na2, fb=fb, nb=nb)


def _sql(statement: str, params: list[Any]) -> Any:
    """Raw SQL as the maintenance role: the one way left to write what the ORM refuses (row-level
    security refuses it to a tenant's session too)."""
    with across_tenants("a test corrupts the data"), connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone() if cursor.description else None


def corrupt_note(*, tenant: Tenant, folder: Folder, body: str) -> int:
    """Insert a note whose folder belongs to another tenant, bypassing the ORM."""
    row = _sql(
        "INSERT INTO scoped_note (tenant_id, folder_id, body, size) VALUES (%s, %s, %s, 1000) RETURNING id",
        [tenant.pk, folder.pk, body],
    )
    return int(row[0])


def corrupt_link(note: Note, folder: Folder) -> None:
    """Point an existing note at a folder of another tenant, bypassing the ORM."""
    _sql("UPDATE scoped_note SET folder_id = %s WHERE id = %s", [folder.pk, note.pk])


def stored(note: Note) -> tuple[Any, ...]:
    return tuple(Note.all_tenants.filter(pk=note.pk).values_list("tenant_id", "folder_id", "body", "size").get())


# --- the tenant context -------------------------------------------------------


def test_current_tenant_raises_with_no_tenant_in_context() -> None:
    assert peek_tenant() is None
    with pytest.raises(TenantScopeError):
        current_tenant()


def test_tenant_context_sets_and_resets_the_tenant(world: SimpleNamespace) -> None:
    with tenant_context(world.a) as entered:
        assert entered is world.a
        assert current_tenant() == world.a
    assert peek_tenant() is None


def test_tenant_context_resets_the_token_even_on_exception(world: SimpleNamespace) -> None:
    with pytest.raises(ZeroDivisionError), tenant_context(world.a):
        raise ZeroDivisionError
    assert peek_tenant() is None
    with pytest.raises(TenantScopeError):
        Folder.objects.count()


def test_nested_tenant_contexts_restore_the_outer_tenant(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        with tenant_context(world.b):
            assert current_tenant() == world.b
            assert set(Folder.objects.values_list("name", flat=True)) == {"b-folder"}
        assert current_tenant() == world.a
        assert set(Folder.objects.values_list("name", flat=True)) == {"a-folder", "a-folder-2"}
        with pytest.raises(RuntimeError), tenant_context(world.b):
            raise RuntimeError
        assert current_tenant() == world.a
    assert peek_tenant() is None


def test_tenant_context_refuses_an_unsaved_tenant() -> None:
    with pytest.raises(TenantScopeError), tenant_context(Tenant(slug="ghost", name="ghost", pk=None)):
        pass
    with pytest.raises(TenantScopeError), tenant_context(None):  # type: ignore[arg-type]
        pass


def test_no_tenant_clears_the_context_inside_and_restores_it(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        with no_tenant():
            assert peek_tenant() is None
            with pytest.raises(TenantScopeError):
                Folder.objects.count()
        assert current_tenant() == world.a


def test_system_context_enters_the_system_tenant(db: None) -> None:
    with system_context() as system:
        assert current_tenant() is system
        assert system.slug == SYSTEM_TENANT_SLUG
        assert system.is_system
        assert Tenant.objects.get(slug=SYSTEM_TENANT_SLUG).pk == system.pk
    assert peek_tenant() is None


def test_tenant_context_is_not_inherited_by_other_threads(world: SimpleNamespace) -> None:
    with tenant_context(world.a), concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        seen = pool.submit(peek_tenant).result()
    assert seen is None


# --- the scoped manager -------------------------------------------------------


@pytest.mark.parametrize("model", SCOPED_MODELS, ids=lambda model: model._meta.label)
def test_scoped_manager_of_every_scoped_model_raises_without_tenant(db: None, model: Any) -> None:
    with pytest.raises(TenantScopeError):
        model.objects.all()
    with pytest.raises(TenantScopeError):
        model.objects.filter(pk=1)
    with pytest.raises(TenantScopeError):
        model.objects.count()
    assert model._default_manager is model.objects


@pytest.mark.parametrize(
    "query",
    [
        lambda: list(Folder.objects.all()),
        lambda: Folder.objects.get(name="a-folder"),
        lambda: Folder.objects.exists(),
        lambda: Folder.objects.first(),
        lambda: Folder.objects.values_list("name"),
        lambda: Folder.objects.in_bulk(),
        lambda: Folder.objects.aggregate(n=Count("id")),
        lambda: Folder.objects.create(name="x"),
        lambda: Folder.objects.get_or_create(name="x"),
        lambda: Folder.objects.update(name="x"),
        lambda: Folder.objects.all().delete(),
    ],
    ids=[
        "iterate",
        "get",
        "exists",
        "first",
        "values_list",
        "in_bulk",
        "aggregate",
        "create",
        "get_or_create",
        "update",
        "delete",
    ],
)
def test_scoped_manager_raises_without_tenant_for_every_operation(world: SimpleNamespace, query: Any) -> None:
    before = Folder.all_tenants.count()
    with pytest.raises(TenantScopeError):
        query()
    assert Folder.all_tenants.count() == before
    assert set(Folder.all_tenants.values_list("name", flat=True)) == {"a-folder", "a-folder-2", "b-folder"}


def test_scoped_manager_filters_by_the_tenant_in_context(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        assert set(Folder.objects.values_list("name", flat=True)) == {"a-folder", "a-folder-2"}
        assert set(Note.objects.values_list("body", flat=True)) == {"a1", "a2"}
        with pytest.raises(Folder.DoesNotExist):
            Folder.objects.get(pk=world.fb.pk)
        assert Folder.objects.filter(pk=world.fb.pk).first() is None
    with tenant_context(world.b):
        assert list(Folder.objects.values_list("name", flat=True)) == ["b-folder"]
        assert Folder.objects.in_bulk([world.fa.pk, world.fb.pk]) == {world.fb.pk: world.fb}


def test_all_tenants_manager_crosses_tenants_on_purpose(world: SimpleNamespace) -> None:
    assert set(Folder.all_tenants.values_list("name", flat=True)) == {"a-folder", "a-folder-2", "b-folder"}
    with tenant_context(world.a):
        assert Folder.all_tenants.count() == 3


def test_raw_is_refused_on_the_scoped_manager(world: SimpleNamespace) -> None:
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        Folder.objects.raw("SELECT * FROM scoped_folder")
    rows = Folder.all_tenants.raw("SELECT * FROM scoped_folder WHERE tenant_id = %s", [world.b.pk])
    assert [row.name for row in rows] == ["b-folder"]


def test_none_needs_no_tenant_and_returns_nothing(world: SimpleNamespace) -> None:
    assert list(Folder.objects.none()) == []
    assert Folder.objects.none().count() == 0


# --- saving and deleting --------------------------------------------------------


def test_save_takes_the_tenant_from_the_context(world: SimpleNamespace) -> None:
    with tenant_context(world.b):
        folder = Folder(name="new")
        folder.save()
    assert Folder.all_tenants.get(pk=folder.pk).tenant_id == world.b.pk


def test_save_without_a_tenant_raises_and_writes_nothing(db: None) -> None:
    with pytest.raises(TenantScopeError):
        Folder(name="orphan").save()
    assert not Folder.all_tenants.filter(name="orphan").exists()


def test_save_of_a_row_of_another_tenant_raises(world: SimpleNamespace) -> None:
    world.fb.name = "hijacked"
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        world.fb.save()
    assert Folder.all_tenants.get(pk=world.fb.pk).name == "b-folder"


def test_save_cannot_move_a_row_by_reassigning_its_tenant(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        note = Note.objects.get(pk=world.na1.pk)
    note.tenant = world.b
    note.folder = world.fb
    with tenant_context(world.b), pytest.raises(TenantScopeError):
        note.save()
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        note.save()
    assert stored(world.na1) == (world.a.pk, world.fa.pk, "a1", 1)


def test_save_with_a_forged_primary_key_cannot_overwrite_a_row_of_another_tenant(
    world: SimpleNamespace,
) -> None:
    with tenant_context(world.b), pytest.raises(TenantScopeError):
        Note(pk=world.na1.pk, folder=world.fb, body="forged").save()
    assert stored(world.na1) == (world.a.pk, world.fa.pk, "a1", 1)


def test_save_with_an_explicit_new_primary_key_still_works(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        Folder(pk=world.fb.pk + 1000, name="explicit").save()
    assert Folder.all_tenants.get(pk=world.fb.pk + 1000).tenant_id == world.a.pk


def test_save_of_an_updated_row_of_the_tenant_in_context_works(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        note = Note.objects.get(pk=world.na1.pk)
        note.body = "edited"
        note.folder = world.fa2
        note.save()
        note.save(update_fields=["body"])
    assert stored(world.na1) == (world.a.pk, world.fa2.pk, "edited", 1)


def test_delete_of_a_row_of_another_tenant_raises(world: SimpleNamespace) -> None:
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        world.nb.delete()
    assert Note.all_tenants.filter(pk=world.nb.pk).exists()


def test_delete_without_a_tenant_raises(world: SimpleNamespace) -> None:
    with pytest.raises(TenantScopeError):
        world.na1.delete()
    assert Note.all_tenants.filter(pk=world.na1.pk).exists()


def test_delete_cannot_reach_a_row_of_another_tenant_by_reassigning_its_tenant(
    world: SimpleNamespace,
) -> None:
    with tenant_context(world.a):
        note = Note.objects.get(pk=world.na1.pk)
    note.tenant = world.b
    with tenant_context(world.b), pytest.raises(TenantScopeError):
        note.delete()
    assert Note.all_tenants.filter(pk=world.na1.pk).exists()


def test_delete_of_a_row_of_the_tenant_in_context_cascades_inside_the_tenant(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        Folder.objects.get(pk=world.fa.pk).delete()
    assert not Note.all_tenants.filter(folder_id=world.fa.pk).exists()
    assert Note.all_tenants.filter(pk=world.nb.pk).exists()


# --- foreign keys to scoped rows ----------------------------------------------------


def test_foreign_key_to_a_row_of_another_tenant_is_refused_at_save(world: SimpleNamespace) -> None:
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        Note(folder=world.fb, body="cross").save()
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        Note.objects.create(folder_id=world.fb.pk, body="cross")
    assert not Note.all_tenants.filter(body="cross").exists()


def test_foreign_key_set_by_id_to_a_row_of_another_tenant_is_refused_at_save(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        note = Note.objects.get(pk=world.na1.pk)
        note.folder_id = world.fb.pk
        with pytest.raises(TenantScopeError):
            note.save()
    assert stored(world.na1)[1] == world.fa.pk


def test_assigning_a_row_of_another_tenant_to_a_foreign_key_raises(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        note = Note.objects.get(pk=world.na1.pk)
    with pytest.raises(TenantScopeError):
        note.folder = world.fb
    assert note.folder_id == world.fa.pk


def test_model_clean_reports_a_cross_tenant_foreign_key_as_a_validation_error(world: SimpleNamespace) -> None:
    note = Note(tenant=world.a, folder_id=world.fb.pk, body="cross")
    with pytest.raises(ValidationError) as error:
        note.clean()
    assert set(error.value.message_dict) == {"folder"}
    Note(tenant=world.a, folder_id=world.fa.pk, body="fine").clean()


def test_full_clean_outside_a_context_validates_in_the_row_tenant(world: SimpleNamespace) -> None:
    with pytest.raises(ValidationError) as error:
        Folder(tenant=world.a, name="a-folder").full_clean()
    assert "__all__" in error.value.message_dict
    Folder(tenant=world.b, name="a-folder").full_clean()


# --- related managers, prefetch_related, select_related ------------------------------


def test_reverse_related_manager_is_scoped_to_the_tenant_in_context(world: SimpleNamespace) -> None:
    corrupt_note(tenant=world.b, folder=world.fa, body="b-in-a-folder")
    with tenant_context(world.a):
        assert set(world.fa.notes.values_list("body", flat=True)) == {"a1", "a2"}
        assert world.fa.notes.count() == 2
    with tenant_context(world.b):
        # B only ever sees its own (corrupt) row, never A's notes of that folder.
        assert list(world.fa.notes.values_list("body", flat=True)) == ["b-in-a-folder"]


def test_reverse_related_manager_fails_closed_without_a_tenant(world: SimpleNamespace) -> None:
    with pytest.raises(TenantScopeError):
        world.fa.notes.all()
    with pytest.raises(TenantScopeError):
        world.fa.notes.count()


def test_reverse_related_manager_cannot_create_in_a_folder_of_another_tenant(world: SimpleNamespace) -> None:
    with tenant_context(world.b), pytest.raises(TenantScopeError):
        world.fa.notes.create(body="cross")
    assert not Note.all_tenants.filter(body="cross").exists()


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "one-by-one"])
def test_reverse_related_manager_add_cannot_link_a_row_of_another_tenant(world: SimpleNamespace, bulk: bool) -> None:
    for tenant in (world.a, world.b):
        # add(bulk=False) runs in atomic(savepoint=False): give each attempt its own savepoint.
        with tenant_context(tenant), pytest.raises(TenantScopeError), transaction.atomic():
            world.fb.notes.add(world.na1, bulk=bulk)
    assert stored(world.na1)[1] == world.fa.pk
    assert world.na1.folder_id == world.fa.pk


def test_prefetch_related_reverse_never_brings_rows_of_another_tenant(world: SimpleNamespace) -> None:
    corrupt_note(tenant=world.b, folder=world.fa, body="b-in-a-folder")
    with tenant_context(world.a):
        folders = list(Folder.objects.prefetch_related("notes").order_by("name"))
        prefetched = {folder.name: {note.body for note in folder.notes.all()} for folder in folders}
    assert prefetched == {"a-folder": {"a1", "a2"}, "a-folder-2": set()}


def test_prefetch_related_forward_does_not_attach_a_row_of_another_tenant(world: SimpleNamespace) -> None:
    corrupt_link(world.na1, world.fb)
    with tenant_context(world.a):
        notes = {note.body: note for note in Note.objects.prefetch_related("folder")}
    assert notes["a2"].folder == world.fa
    # The link reads as missing: B's folder was fetched by the prefetch but attached to nothing.
    assert notes["a1"]._state.fields_cache["folder"] is None
    with pytest.raises(Note.folder.RelatedObjectDoesNotExist):
        _ = notes["a1"].folder


def test_forward_relation_to_a_row_of_another_tenant_raises_on_access(world: SimpleNamespace) -> None:
    corrupt_link(world.na1, world.fb)
    with tenant_context(world.a):
        note = Note.objects.get(pk=world.na1.pk)
        with pytest.raises(Folder.DoesNotExist):
            _ = note.folder  # the database does not even show the folder (row-level security)
    # Across tenants the database shows it, and the ORM's wall refuses the link on its own.
    with across_tenants("a test of the ORM's wall alone"):
        note = Note.all_tenants.get(pk=world.na1.pk)
        with pytest.raises(TenantScopeError):
            _ = note.folder


def test_select_related_joins_stay_inside_the_tenant(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        notes = list(Note.objects.select_related("folder").order_by("body"))
    assert [(note.body, note.folder.name) for note in notes] == [("a1", "a-folder"), ("a2", "a-folder")]
    assert {note.folder.tenant_id for note in notes} == {world.a.pk}


def test_select_related_refuses_a_join_to_a_row_of_another_tenant(world: SimpleNamespace) -> None:
    corrupt_link(world.na1, world.fb)
    with tenant_context(world.a):  # the database joins the note to no folder it shows: no row
        assert [note.body for note in Note.objects.select_related("folder")] == ["a2"]
    # Across tenants the database makes the join, and the ORM's wall refuses it on its own.
    with across_tenants("a test of the ORM's wall alone"), pytest.raises(TenantScopeError):
        list(Note.all_tenants.select_related("folder"))
    with across_tenants("a test of the ORM's wall alone"), pytest.raises(TenantScopeError):
        list(Note.all_tenants.select_related("folder").iterator())


# --- aggregates, update(), delete() -----------------------------------------------


def test_aggregates_only_count_rows_of_the_tenant_in_context(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        assert Note.objects.aggregate(n=Count("id"), total=Sum("size")) == {"n": 2, "total": 3}
        per_folder = dict(Folder.objects.annotate(n=Count("notes")).values_list("name", "n"))
        assert per_folder == {"a-folder": 2, "a-folder-2": 0}
    with tenant_context(world.b):
        assert Note.objects.aggregate(n=Count("id"), total=Sum("size")) == {"n": 1, "total": 100}


def test_update_only_touches_rows_of_the_tenant_in_context(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        assert Note.objects.update(body="bulk", size=F("size") + 10) == 2
    assert stored(world.nb) == (world.b.pk, world.fb.pk, "b1", 100)
    assert set(Note.all_tenants.filter(tenant=world.a).values_list("body", "size")) == {
        ("bulk", 11),
        ("bulk", 12),
    }


@pytest.mark.parametrize("field", ["tenant", "tenant_id"])
def test_update_refuses_to_change_the_tenant(world: SimpleNamespace, field: str) -> None:
    value = world.b if field == "tenant" else world.b.pk
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        Note.objects.update(**{field: value})
    with pytest.raises(TenantScopeError):
        Note.all_tenants.filter(pk=world.na1.pk).update(**{field: value})
    assert stored(world.na1)[0] == world.a.pk


@pytest.mark.parametrize("field", ["folder", "folder_id"])
def test_update_refuses_a_foreign_key_to_a_row_of_another_tenant(world: SimpleNamespace, field: str) -> None:
    value = world.fb if field == "folder" else world.fb.pk
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        Note.objects.filter(pk=world.na1.pk).update(**{field: value})
    with pytest.raises(TenantScopeError):
        Note.all_tenants.filter(pk=world.na1.pk).update(**{field: value})
    assert stored(world.na1)[1] == world.fa.pk


def test_update_refuses_an_unverifiable_expression_for_a_scoped_foreign_key(world: SimpleNamespace) -> None:
    other = Subquery(Folder.all_tenants.filter(tenant=world.b).values("pk")[:1])
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        Note.objects.update(folder_id=other)
    assert stored(world.na1)[1] == world.fa.pk


def test_update_of_a_foreign_key_inside_the_tenant_works(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        assert Note.objects.filter(pk=world.na1.pk).update(folder=world.fa2) == 1
    assert stored(world.na1)[1] == world.fa2.pk


def test_delete_only_deletes_rows_of_the_tenant_in_context(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        deleted, _ = Note.objects.all().delete()
    assert deleted == 2
    assert list(Note.all_tenants.values_list("body", flat=True)) == ["b1"]


# --- bulk_create and bulk_update ---------------------------------------------------


def test_bulk_create_stamps_the_tenant_in_context(world: SimpleNamespace) -> None:
    with tenant_context(world.b):
        Folder.objects.bulk_create([Folder(name="bulk-1"), Folder(name="bulk-2")])
    assert set(Folder.all_tenants.filter(name__startswith="bulk").values_list("tenant_id", flat=True)) == {world.b.pk}


def test_bulk_create_refuses_a_row_of_another_tenant(world: SimpleNamespace) -> None:
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        Folder.objects.bulk_create([Folder(name="mine"), Folder(name="theirs", tenant=world.b)])
    assert not Folder.all_tenants.filter(name__in=["mine", "theirs"]).exists()


def test_bulk_create_refuses_a_foreign_key_to_a_row_of_another_tenant(world: SimpleNamespace) -> None:
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        Note.objects.bulk_create([Note(folder=world.fa, body="ok"), Note(folder=world.fb, body="cross")])
    assert not Note.all_tenants.filter(body__in=["ok", "cross"]).exists()


def test_bulk_create_without_a_tenant_raises(db: None) -> None:
    with pytest.raises(TenantScopeError):
        Folder.all_tenants.bulk_create([Folder(name="orphan")])
    assert not Folder.all_tenants.filter(name="orphan").exists()


def test_bulk_create_upsert_that_could_overwrite_another_tenants_row_is_refused(
    world: SimpleNamespace,
) -> None:
    with tenant_context(world.b):
        b_key = ApiKey.objects.get()
    before = ApiKey.all_tenants.filter(pk=b_key.pk).values_list("tenant_id", "name", "secret_hash").get()
    stolen = ApiKey(name="stolen", prefix=b_key.prefix, secret_hash="0" * 64, scopes=["read", "write"])
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        ApiKey.objects.bulk_create(
            [stolen], update_conflicts=True, unique_fields=["prefix"], update_fields=["secret_hash", "name"]
        )
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        Folder.objects.bulk_create(
            [Folder(name="a-folder")],
            update_conflicts=True,
            unique_fields=["tenant", "name"],
            update_fields=["tenant"],
        )
    after = ApiKey.all_tenants.filter(pk=b_key.pk).values_list("tenant_id", "name", "secret_hash").get()
    assert after == before


def test_bulk_create_upsert_on_the_tenant_column_stays_inside_the_tenant(world: SimpleNamespace) -> None:
    with tenant_context(world.b):
        Folder.objects.bulk_create(
            [Folder(name="a-folder"), Folder(name="b-folder")],
            update_conflicts=True,
            unique_fields=["tenant", "name"],
            update_fields=["name"],
        )
    assert Folder.all_tenants.filter(tenant=world.a).count() == 2
    assert set(Folder.all_tenants.filter(tenant=world.b).values_list("name", flat=True)) == {
        "a-folder",
        "b-folder",
    }


def test_bulk_update_refuses_rows_of_another_tenant(world: SimpleNamespace) -> None:
    world.fb.name = "hijacked"
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        Folder.objects.bulk_update([world.fb], ["name"])
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        Folder.all_tenants.bulk_update([world.fb], ["name"])
    assert Folder.all_tenants.get(pk=world.fb.pk).name == "b-folder"


def test_bulk_update_refuses_a_row_whose_tenant_was_reassigned(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        folder = Folder.objects.get(pk=world.fa.pk)
    folder.tenant = world.b
    folder.name = "moved"
    with tenant_context(world.b), pytest.raises(TenantScopeError):
        Folder.all_tenants.bulk_update([folder], ["name"])
    assert Folder.all_tenants.get(pk=world.fa.pk).name == "a-folder"


def test_bulk_update_refuses_to_change_the_tenant(world: SimpleNamespace) -> None:
    with tenant_context(world.a), pytest.raises(TenantScopeError):
        Folder.objects.bulk_update([world.fa], ["tenant"])


def test_bulk_update_refuses_a_foreign_key_to_a_row_of_another_tenant(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        note = Note.objects.get(pk=world.na1.pk)
        note.folder_id = world.fb.pk
        with pytest.raises(TenantScopeError):
            Note.objects.bulk_update([note], ["folder"])
    assert stored(world.na1)[1] == world.fa.pk


def test_bulk_update_inside_the_tenant_works(world: SimpleNamespace) -> None:
    with tenant_context(world.a):
        notes = list(Note.objects.order_by("body"))
        for note in notes:
            note.folder = world.fa2
            note.size += 5
        assert Note.objects.bulk_update(notes, ["folder", "size"]) == 2
    assert stored(world.na1) == (world.a.pk, world.fa2.pk, "a1", 6)
    assert stored(world.na2) == (world.a.pk, world.fa2.pk, "a2", 7)
    assert stored(world.nb) == (world.b.pk, world.fb.pk, "b1", 100)
