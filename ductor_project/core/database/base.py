"""The connection: Django's PostgreSQL wrapper, which serves every query as the scope in context.

``core.context.database_scope`` says whom the code acts for; before each query
the connection makes its session match, in one statement and only when it
changed: in a tenant's context ``ductor.tenant_id`` is that tenant, inside
``across_tenants`` the session runs as the maintenance role (``SET ROLE``),
and otherwise as the app's role with no tenant, which sees no tenant's rows.
The settings are the session's (a pooled connection keeps them across
transactions); the connection forgets what it set when a rollback may have
undone it, and a new connection starts from nothing known.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db.backends.postgresql import base as postgresql

from ductor_project.core.context import database_scope

SET_SCOPE = "SELECT set_config('role', %s, false), set_config('ductor.tenant_id', %s, false)"


def session_settings(scope: tuple[str, str]) -> tuple[str, str]:
    """The ``role`` and ``ductor.tenant_id`` a session needs for ``scope`` ("none" is the role
    the connection logged in as)."""
    kind, value = scope
    if kind == "across":
        return settings.DUCTOR_DB_MAINTENANCE_ROLE, ""
    return "none", value if kind == "tenant" else ""


class DatabaseWrapper(postgresql.DatabaseWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._session: tuple[str, str] | None = None  # what the session is known to hold
        self._controlling = False  # a savepoint statement runs: no row is read, set nothing
        self.execute_wrappers.append(self._in_scope)

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        self._session = None
        return super().get_new_connection(conn_params)

    def _rollback(self) -> None:
        self._session = None  # a setting made in the transaction is undone with it
        super()._rollback()  # type: ignore[misc]

    def _savepoint(self, sid: str) -> None:
        with self._control():
            super()._savepoint(sid)  # type: ignore[misc]

    def _savepoint_commit(self, sid: str) -> None:
        with self._control():
            super()._savepoint_commit(sid)  # type: ignore[misc]

    def _savepoint_rollback(self, sid: str) -> None:
        with self._control():  # in a failed transaction, only the rollback itself may run
            super()._savepoint_rollback(sid)  # type: ignore[misc]
        self._session = None  # a setting made since the savepoint is undone with it

    @contextmanager
    def _control(self) -> Iterator[None]:
        self._controlling = True
        try:
            yield
        finally:
            self._controlling = False

    def _in_scope(self, execute: Callable[..., Any], sql: str, params: Any, many: bool,
                  context: dict[str, Any]) -> Any:
        if not settings.DUCTOR_ROW_SECURITY:  # only to measure what the wall costs
            return execute(sql, params, many, context)
        wanted = session_settings(database_scope())
        if wanted != self._session and not self._controlling:
            self._session = None  # should the statement fail, nothing is known
            with self.wrap_database_errors:
                self.connection.execute(SET_SCOPE, wanted)
            self._session = wanted
        return execute(sql, params, many, context)
