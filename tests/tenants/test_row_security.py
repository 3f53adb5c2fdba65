"""The second wall: PostgreSQL row-level security under the scoped managers.

The tests connect as the app role, as the product does (``tests/conftest.py``);
the raw SQL here bypasses the ORM and its scoping on purpose, so that only the
database stands between one tenant and another's rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from ductor_project.core.context import across_tenants, tenant_context
from ductor_project.core.database.security import MAINTENANCE_POLICY, TENANT_POLICY
from tenants.models import Tenant
from tenants.row_security import tenant_tables
from tests.conftest import ROOT
from tests.scoped.models import Folder

pytestmark = pytest.mark.django_db


class Boom(Exception):
    pass


def raw(query: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(query, params or [])
        return list(cursor.fetchall()) if cursor.description else []


def folder_tenants() -> set[str]:
    """The tenants of the folders the database shows this session, read with raw SQL."""
    return {str(row[0]) for row in raw("SELECT tenant_id FROM scoped_folder")}


@pytest.fixture
def two(tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str]) -> tuple[Tenant, Tenant]:
    a, b = tenant_a[0], tenant_b[0]
    for tenant in (a, b):
        with tenant_context(tenant):
            Folder.objects.create(name=f"{tenant.slug}'s")
    return a, b


def test_the_app_connects_as_a_role_that_is_no_superuser_does_not_bypass_rls_and_owns_no_table():
    [(user, superuser, bypass)] = raw(
        "SELECT rolname, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user")
    assert user == settings.DUCTOR_DB_APP_ROLE
    assert (superuser, bypass) == (False, False)
    owned = raw("SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tableowner = current_user")
    assert owned == [(0,)]


def test_migrate_as_the_app_role_refuses_and_says_the_owner_url_is_not_set(monkeypatch: pytest.MonkeyPatch):
    """Without DATABASE_OWNER_URL, migrate runs as the app role, which the wall must bind: refused,
    with what to set (it was a traceback that never named the unset URL)."""
    monkeypatch.setattr(settings, "DUCTOR_DATABASE_OWNER", None)
    with pytest.raises(CommandError) as refused:
        call_command("migrate", verbosity=0)
    assert "the migrations would run as the app role" in str(refused.value)
    assert "superuser" not in str(refused.value)
    assert str(refused.value).endswith(
        "DATABASE_OWNER_URL is not set, so migrate would run as the app role (DATABASE_URL).")


def test_migrate_refuses_the_app_role_before_it_migrates_anything(monkeypatch: pytest.MonkeyPatch):
    """On a new database the migrations ran first, as the app role: a traceback where it may not create
    a table, or tables it then owned where it may, and the refusal only at the end."""
    from django.core.management.commands import migrate

    def migrated(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the migrations ran")

    monkeypatch.setattr(settings, "DUCTOR_DATABASE_OWNER", None)
    monkeypatch.setattr(migrate.Command, "handle", migrated)
    with pytest.raises(CommandError, match="the migrations would run as the app role"):
        call_command("migrate", verbosity=0)


def test_every_tenant_table_has_row_level_security_and_the_two_policies():
    tables = tenant_tables()
    assert {"workflows_workflowrun", "workflows_steprun", "tenants_apikey", "scheduling_pool",
            "scoped_folder"} <= set(tables)
    for table in tables:
        [(enabled,)] = raw("SELECT relrowsecurity FROM pg_class WHERE relname = %s", [table])
        assert (table, enabled) == (table, True)
        policies = {row[0] for row in raw("SELECT policyname FROM pg_policies WHERE tablename = %s", [table])}
        assert policies == {TENANT_POLICY, MAINTENANCE_POLICY}, table


def test_raw_sql_in_a_tenants_context_sees_only_its_rows_and_with_no_tenant_none(two):
    a, b = two
    with tenant_context(a):
        assert folder_tenants() == {str(a.pk)}
    with tenant_context(b):
        assert folder_tenants() == {str(b.pk)}
    assert folder_tenants() == set()  # no tenant in context: no tenant's rows
    with across_tenants("a test of the maintenance role"):
        assert folder_tenants() == {str(a.pk), str(b.pk)}
        with tenant_context(a):  # a tenant's context inside acts for that tenant alone
            assert folder_tenants() == {str(a.pk)}
    assert folder_tenants() == set()


def test_the_database_refuses_to_write_another_tenants_rows(two):
    a, b = two
    with tenant_context(a):
        assert raw("UPDATE scoped_folder SET name = 'taken' WHERE tenant_id = %s RETURNING id", [b.pk]) == []
        assert raw("DELETE FROM scoped_folder WHERE tenant_id = %s RETURNING id", [b.pk]) == []
        with pytest.raises(DatabaseError, match="row-level security"), transaction.atomic():
            raw("INSERT INTO scoped_folder (tenant_id, name) VALUES (%s, 'planted')", [b.pk])
        with pytest.raises(DatabaseError, match="row-level security"), transaction.atomic():
            raw("UPDATE scoped_folder SET tenant_id = %s", [b.pk])  # moving a row out of the tenant
    with across_tenants("a test of the maintenance role"):
        assert sorted(row[0] for row in raw("SELECT name FROM scoped_folder")) == ["tenant-a's", "tenant-b's"]


def act_for_then_roll_back(tenant: Tenant) -> None:
    """Switch the session to ``tenant`` inside a transaction (or a savepoint) that rolls back,
    which undoes the switch in the database."""
    with transaction.atomic(), tenant_context(tenant):
        assert folder_tenants() == {str(tenant.pk)}
        raise Boom


def test_a_rolled_back_transaction_cannot_leave_the_session_acting_for_another_tenant(two):
    a, b = two
    with tenant_context(a):
        assert folder_tenants() == {str(a.pk)}  # the session now acts for A
    with pytest.raises(Boom):
        act_for_then_roll_back(b)  # the session acts for A again
    with tenant_context(b):
        assert folder_tenants() == {str(b.pk)}
    with tenant_context(a), transaction.atomic():
        with pytest.raises(Boom):
            act_for_then_roll_back(b)  # a savepoint this time
        assert folder_tenants() == {str(a.pk)}


def test_all_tenants_reads_across_tenants_and_its_iterator_keeps_that_to_itself(two):
    assert Folder.all_tenants.count() == 2
    assert {str(f.tenant_id) for f in Folder.all_tenants.all()} == {str(t.pk) for t in two}
    seen = []
    for folder in Folder.all_tenants.order_by("name").iterator(chunk_size=1):
        seen.append(folder.name)
        assert folder_tenants() == set()  # between two steps of it, the caller's own scope
    assert seen == ["tenant-a's", "tenant-b's"]
    assert [f.name for f in Folder.all_tenants.raw("SELECT * FROM scoped_folder ORDER BY name")] == seen


def _as_owner() -> Any:
    """A connection to the test database as the tables' owner (a superuser on the embedded server)."""
    import psycopg

    owner = settings.DUCTOR_DATABASE_OWNER or {}
    params = {**owner.get("OPTIONS", {}), "dbname": connection.settings_dict["NAME"], "user": owner.get("USER"),
              **{key.lower(): owner[key] for key in ("PASSWORD", "HOST", "PORT") if owner.get(key)}}
    return psycopg.connect(**params, autocommit=True)


def test_the_rls_roles_sql_runs_again_for_a_second_app_role_of_the_same_server():
    """The maintenance role exists once per server: running the printed SQL for another app role (a
    second database, or an installation whose old app role becomes the owner) must not stop at its
    CREATE ROLE, as a script run with ON_ERROR_STOP would."""
    from ductor_project.core.database.security import roles_sql

    app_role, maintenance = "second_app_role", settings.DUCTOR_DB_MAINTENANCE_ROLE
    with _as_owner() as owner:
        [(may_create_roles,)] = owner.execute(
            "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user").fetchall()
        assert may_create_roles, "the tables' owner of the test servers creates roles (rls_roles needs it)"
        owner.execute(f'DROP ROLE IF EXISTS "{app_role}"')
        owner.execute(f'CREATE ROLE "{app_role}" LOGIN')
        try:
            for _ in range(2):
                for statement in roles_sql(app_role, maintenance, connection.settings_dict["NAME"]):
                    owner.execute(statement)
            [(member, inherits)] = owner.execute(
                "SELECT pg_has_role(%s, oid, 'MEMBER'), pg_has_role(%s, oid, 'USAGE') FROM pg_roles "
                "WHERE rolname = %s", [app_role, app_role, maintenance]).fetchall()
            assert (member, inherits) == (True, False)
        finally:
            owner.execute(f'REVOKE CONNECT ON DATABASE "{connection.settings_dict["NAME"]}" FROM "{app_role}"')
            owner.execute(f'DROP ROLE "{app_role}"')


@pytest.mark.parametrize(("environ", "refusal"), [
    ({"DATABASE_URL": "postgresql://db:5432/ductor"},
     "CommandError: DATABASE_URL names no user, and its user is the app role the SQL is for: "
     "postgresql://ductor_app:…@host:5432/ductor\n"),
    ({"DATABASE_URL": "postgresql://ductor_app@db:5432/"},
     "CommandError: DATABASE_URL names no database, and the app role is granted its database: "
     "postgresql://ductor_app:…@host:5432/ductor\n"),
    ({"DATABASE_URL": "postgresql://ductor_app@db:5432/ductor", "DUCTOR_DB_MAINTENANCE_ROLE": " "}, None),
], ids=["no user", "no database", "blank maintenance role"])
def test_rls_roles_prints_no_sql_naming_an_empty_role_or_database(tmp_path: Any, environ: dict[str, str],
                                                                   refusal: str | None) -> None:
    env = {key: value for key, value in os.environ.items() if key != "DUCTOR_DB_MAINTENANCE_ROLE"}
    env.update(DUCTOR_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="ductor_project.settings",
               REDIS_URL="redis://redis:6379/0", **environ)
    done = subprocess.run([sys.executable, "manage.py", "rls_roles"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    if refusal is None:  # a blank setting is its default, as a blank number's is
        assert done.returncode == 0, done.stderr
        assert 'GRANT "ductor_maintenance" TO "ductor_app";' in done.stdout
        assert '""' not in done.stdout
    else:
        assert (done.returncode, done.stdout, done.stderr) == (1, "", refusal)
