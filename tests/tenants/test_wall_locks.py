"""The wall each ``migrate`` puts up again (``secure_tables``) blocks no tenant table it finds
secured: a deploy's ``migrate`` runs while the previous release serves, and ``ALTER TABLE … ENABLE
ROW LEVEL SECURITY``, ``DROP POLICY`` and ``CREATE POLICY`` each take the lock that blocks every
read and write of the table until ``migrate`` commits, all the tenant tables' in one transaction."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from ductor_project.core.database.security import MAINTENANCE_POLICY, as_owner
from tenants.row_security import secure_tenant_tables, tenant_tables
from tests.conftest import let_the_app_role_truncate

pytestmark = pytest.mark.django_db(transaction=True)


def locked_while_securing(*statements: str) -> set[str]:
    """The tenant tables a ``migrate``'s wall holds in ``ACCESS EXCLUSIVE`` mode at its end, after
    ``statements`` (as the owner) changed the wall; the wall is left up whatever happens."""
    try:
        with as_owner(connection), transaction.atomic(), connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
            secure_tenant_tables()
            cursor.execute("SELECT relation::regclass::text FROM pg_locks WHERE pid = pg_backend_pid() "
                           "AND locktype = 'relation' AND mode = 'AccessExclusiveLock'")
            return {row[0] for row in cursor.fetchall()} & set(tenant_tables())
    finally:
        with as_owner(connection):
            secure_tenant_tables()
            let_the_app_role_truncate()


def wall_of(table: str) -> tuple[bool, set[str]]:
    with as_owner(connection), connection.cursor() as cursor:
        cursor.execute("SELECT relrowsecurity FROM pg_class WHERE oid = %s::regclass", [table])
        [(enabled,)] = cursor.fetchall()
        cursor.execute("SELECT policyname FROM pg_policies WHERE tablename = %s", [table])
        return enabled, {row[0] for row in cursor.fetchall()}


def test_a_migrate_that_finds_the_wall_up_locks_no_tenant_table() -> None:
    assert locked_while_securing() == set()


def test_a_migrate_puts_back_the_wall_of_a_table_that_lost_it_locking_that_table_alone() -> None:
    lost = ['ALTER TABLE "workflows_steprun" DISABLE ROW LEVEL SECURITY',
            f'DROP POLICY "{MAINTENANCE_POLICY}" ON "workflows_runevent"']
    assert locked_while_securing(*lost) == {"workflows_steprun", "workflows_runevent"}
    assert wall_of("workflows_steprun") == wall_of("workflows_runevent") == wall_of("workflows_workflowrun")
    assert wall_of("workflows_runevent")[0] is True
