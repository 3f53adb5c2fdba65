"""The roles and policies of the second wall, and the owner's credentials that build it.

Three roles:

- the **app role** (``DATABASE_URL``): every web process, worker, dispatcher and
  coordinator connects as it. It is neither a superuser nor ``BYPASSRLS``, and
  it owns nothing, so the policies bind it;
- the **maintenance role** (``DUCTOR_DB_MAINTENANCE_ROLE``, ``NOLOGIN``): the app
  role is a member and switches to it (``SET ROLE``) for the code that crosses
  tenants on purpose (``across_tenants``: the admin for superusers, the
  reconciler, key lookups); its policy shows every row;
- the **owner** (``DATABASE_OWNER_URL``): owns the tables and runs the
  migrations, which build the wall (``secure_tables``) after every ``migrate``.
  As their owner it is not bound by the policies, so a data migration sees
  every row.

Embedded mode creates all three. With ``DATABASE_URL``, an administrator runs
``roles_sql()`` once (``manage.py rls_roles`` prints it). ``secure_tables``
refuses an app role that would not be bound: a superuser, a ``BYPASSRLS``
role, or the owner itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.conf import settings
from psycopg import sql

# The owner's part of a connection's settings; the database NAME stays (a test database).
CREDENTIALS = ("USER", "PASSWORD", "HOST", "PORT", "OPTIONS")
TENANT_SETTING = "ductor.tenant_id"
TENANT_POLICY = "ductor_tenant_rows"
MAINTENANCE_POLICY = "ductor_maintenance_rows"
_building: ContextVar[bool] = ContextVar("ductor_building_the_wall", default=False)


class RowSecurityError(RuntimeError):
    """The database lacks a role the wall needs."""


def roles_sql(app_role: str, maintenance_role: str, database: str) -> list[sql.Composed]:
    """What an administrator runs once (as a superuser, or a role with ``CREATEROLE``), before
    the first ``migrate``: the maintenance role, and the app role's membership of it. The app
    role does not inherit it (``NOINHERIT``), or the maintenance policy would bind it always.
    Safe to run again, and for another app role or database of the same server: a maintenance
    role that exists already is kept."""
    app, maintenance = sql.Identifier(app_role), sql.Identifier(maintenance_role)
    return [
        sql.SQL("DO $$ BEGIN CREATE ROLE {} NOLOGIN NOSUPERUSER NOBYPASSRLS; "
                "EXCEPTION WHEN duplicate_object THEN NULL; END $$").format(maintenance),
        sql.SQL("ALTER ROLE {} NOINHERIT").format(app),
        # A membership made before keeps the inheritance it had: made again, it takes NOINHERIT.
        sql.SQL("REVOKE {} FROM {}").format(maintenance, app),
        sql.SQL("GRANT {} TO {}").format(maintenance, app),
        sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), app),
    ]


def owner_credentials() -> dict[str, Any] | None:
    """The connection settings of ``DATABASE_OWNER_URL`` (None: the app role owns the tables)."""
    owner: Mapping[str, Any] | None = settings.DUCTOR_DATABASE_OWNER
    return {key: owner.get(key, "") for key in CREDENTIALS} if owner else None


def use_credentials(connection: Any, credentials: Mapping[str, Any]) -> dict[str, Any]:
    """Have ``connection`` log in with ``credentials`` from its next query on; returns the ones
    it had."""
    previous = {key: connection.settings_dict.get(key, "") for key in CREDENTIALS}
    connection.close()
    connection.settings_dict.update(credentials)
    return previous


@contextmanager
def as_owner(connection: Any) -> Iterator[None]:
    """Run the block (``migrate``) as the tables' owner, and let it build the wall
    (``building_the_wall``)."""
    owner = owner_credentials()
    previous = use_credentials(connection, owner) if owner else None
    token = _building.set(True)
    try:
        yield
    finally:
        _building.reset(token)
        if previous is not None:
            use_credentials(connection, previous)


def building_the_wall() -> bool:
    """Whether this is a ``migrate`` (``as_owner``): only then are roles granted and policies made."""
    return _building.get()


def check_roles(connection: Any, *, app_role: str, maintenance_role: str) -> None:
    """The roles are as the wall needs them (``RowSecurityError`` naming what is not): the app role one
    the policies bind, and a member of the maintenance role that does not inherit it. ``migrate`` checks
    it before it migrates anything, so that a refused one has created no table (as the app role: tables
    it would own), and ``secure_tables`` again at its end."""
    _require_bound(connection, app_role)
    _require_roles(connection, app_role, maintenance_role)


def secure_tables(connection: Any, tables: list[str], *, app_role: str, maintenance_role: str) -> None:
    """Grant the two roles the rows of every table, and put row-level security on ``tables``
    (each with a ``tenant_id``). Idempotent; in one transaction, so the tables are never left
    half secured. Runs as the tables' owner.

    A table whose wall is up as it would be made (``_walls``) is left alone: enabling row-level
    security and making a policy each take the lock that blocks the table's every read and write
    until the transaction ends, and every ``migrate`` of a deploy runs this while the previous
    release serves, on the runs, steps and events tables among the others."""
    check_roles(connection, app_role=app_role, maintenance_role=maintenance_role)
    roles = sql.SQL(", ").join([sql.Identifier(app_role), sql.Identifier(maintenance_role)])
    tenant_row = sql.SQL("tenant_id = nullif(current_setting({}, true), '')::uuid").format(
        sql.Literal(TENANT_SETTING))
    maintenance = sql.Identifier(maintenance_role)
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}")
                       .format(roles).as_string(cursor.connection))
        cursor.execute(sql.SQL("GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {}")
                       .format(roles).as_string(cursor.connection))
        wanted, walls = _wanted_wall(cursor, tenant_row, maintenance), _walls(cursor, tables)
        for table in tables:
            if walls.get(table) == wanted:
                continue
            for statement in _table_statements(sql.Identifier(table), tenant_row, maintenance):
                cursor.execute(statement.as_string(cursor.connection))


# A table's wall as the catalog shows it: row-level security on, and its two policies as PostgreSQL
# prints them back (name, permissive, roles, command, its rows' condition and its writes' check).
Wall = tuple[bool, frozenset[tuple[Any, ...]]]
_POLICIES = ("SELECT tablename, policyname, permissive, roles::text[], cmd, qual, with_check FROM pg_policies "
             "WHERE schemaname = %s AND policyname IN (%s, %s)")
# The table ``_wanted_wall`` makes the wall on, inside the transaction, to read it back.
_WALL_SHAPE = "ductor_wall_shape"


def _walls(cursor: Any, tables: list[str], schema: str = "public") -> dict[str, Wall]:
    """The wall of each of ``tables`` of ``schema`` now: two catalog reads, no lock on the tables."""
    cursor.execute("SELECT relname, relrowsecurity FROM pg_class WHERE relnamespace = %s::regnamespace "
                   "AND relname = ANY(%s)", [schema, tables])
    enabled = dict(cursor.fetchall())
    cursor.execute(_POLICIES, [schema, TENANT_POLICY, MAINTENANCE_POLICY])
    policies: dict[str, set[tuple[Any, ...]]] = {}
    for table, *policy in cursor.fetchall():
        policies.setdefault(table, set()).add((policy[0], policy[1], tuple(sorted(policy[2])), *policy[3:]))
    return {table: (bool(on), frozenset(policies.get(table, ()))) for table, on in enabled.items()}


def _wanted_wall(cursor: Any, tenant_row: sql.Composable, maintenance: sql.Identifier) -> Wall:
    """The wall ``_table_statements`` makes, as the catalog shows it: made on a table this
    transaction creates (no other sees it, and its locks block nobody), read back, and dropped."""
    shape = sql.Identifier("public", _WALL_SHAPE)
    cursor.execute(sql.SQL("CREATE TABLE {} (tenant_id uuid)").format(shape).as_string(cursor.connection))
    for statement in _table_statements(shape, tenant_row, maintenance):
        cursor.execute(statement.as_string(cursor.connection))
    wall = _walls(cursor, [_WALL_SHAPE])[_WALL_SHAPE]
    cursor.execute(sql.SQL("DROP TABLE {}").format(shape).as_string(cursor.connection))
    return wall


def _table_statements(table: sql.Identifier, tenant_row: sql.Composable,
                      maintenance: sql.Identifier) -> list[sql.Composed]:
    tenant_policy, maintenance_policy = sql.Identifier(TENANT_POLICY), sql.Identifier(MAINTENANCE_POLICY)
    return [
        sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(table),
        sql.SQL("DROP POLICY IF EXISTS {} ON {}").format(tenant_policy, table),
        sql.SQL("CREATE POLICY {} ON {} USING ({}) WITH CHECK ({})").format(
            tenant_policy, table, tenant_row, tenant_row),
        sql.SQL("DROP POLICY IF EXISTS {} ON {}").format(maintenance_policy, table),
        sql.SQL("CREATE POLICY {} ON {} TO {} USING (true) WITH CHECK (true)").format(
            maintenance_policy, table, maintenance),
    ]


def _require_bound(connection: Any, app_role: str) -> None:
    """The app role is one the policies bind: no superuser, no ``BYPASSRLS``, not the owner."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper OR rolbypassrls, rolname = current_user FROM pg_roles WHERE rolname = %s",
                       [app_role])
        row = cursor.fetchone()
    if row is None:
        raise RowSecurityError(f"the app role {app_role!r} (DATABASE_URL) does not exist")
    if row[0]:
        raise RowSecurityError(
            f"row-level security would not bind the app role {app_role!r} (DATABASE_URL): it is a superuser "
            f"or has BYPASSRLS. Connect the app as a plain role, and migrate as the owner (DATABASE_OWNER_URL); "
            f"see docs/configuration.md, 'Database roles'."
        )
    if row[1]:
        raise RowSecurityError(
            f"the migrations would run as the app role {app_role!r} (DATABASE_URL), which would then own the "
            f"tables, and row-level security would not bind it: set DATABASE_OWNER_URL to the tables' owner, "
            f"another role; see docs/configuration.md, 'Database roles'."
        )


def _require_roles(connection: Any, app_role: str, maintenance_role: str) -> None:
    """The maintenance role exists, and the app role is a member that does not inherit it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_has_role(%s, oid, 'MEMBER'), pg_has_role(%s, oid, 'USAGE') FROM pg_roles "
                       "WHERE rolname = %s", [app_role, app_role, maintenance_role])
        row = cursor.fetchone()
    if row is None or not row[0] or row[1]:
        script = ";\n".join(s.as_string(None) for s in roles_sql(
            app_role, maintenance_role, connection.settings_dict["NAME"]))
        raise RowSecurityError(
            f"role {maintenance_role!r} is missing, or {app_role!r} is not a member of it, or inherits it. "
            f"As a superuser, run once:\n{script};"
        )
