"""The connection: Django's PostgreSQL wrapper, which serves every query as the scope in context.

``core.context.database_scope`` says whom the code acts for; before each query
the connection makes its session match, in one statement and only when it
changed: in a tenant's context ``ductor.tenant_id`` is that tenant, inside
``across_tenants`` the session runs as the maintenance role (``SET ROLE``),
and otherwise as the app's role with no tenant, which sees no tenant's rows.
The settings are the session's (a pooled connection keeps them across
transactions); the connection forgets what it set when a rollback may have
undone it, and a new connection starts from nothing known.

**Round trips.** What a statement needs before it (the transaction's
``BEGIN``, that setting, the ``SAVEPOINT`` of an ``atomic`` block it opens)
is sent with it, in one batch (psycopg's pipeline mode), not as round trips
of their own: psycopg's connection stays in autocommit, and this wrapper
begins Django's transactions itself (psycopg would send the ``BEGIN`` alone,
and a transaction that runs no statement needs none). A savepoint whose
block ran no statement is never sent; one whose block ended well is left to
the transaction's end to release (a few per transaction at most, so that
PostgreSQL's per-backend cache of subtransactions never overflows). And
Django's health check of a kept connection (a ``SELECT 1`` before each
request's or task's first query) is skipped for a connection the server
answered less than ``DUCTOR_DB_HEALTH_CHECK_IDLE_S`` ago, as a connection
pooler does. Writes whose results nobody reads can travel with the
``COMMIT`` (``send_with_commit``).
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC
from typing import Any

import psycopg
from django.conf import settings
from django.db.backends.postgresql import base as postgresql
from psycopg import pq
from psycopg.types.datetime import TimestamptzLoader

from ductor_project.core.context import database_scope

SET_SCOPE = "SELECT set_config('role', %s, false), set_config('ductor.tenant_id', %s, false)"
# Savepoints alive in a transaction beyond which an ended one is released at once, not left to
# the transaction's end: PostgreSQL caches 64 subtransactions per backend, and a backend that
# overflows its cache slows every session's snapshots.
MAX_UNRELEASED = 8


# psycopg's own loader of ``timestamptz`` text (its C one, in psycopg[binary]).
_FAST_TIMESTAMPTZ = (psycopg.adapters.get_loader(psycopg.adapters.types["timestamptz"].oid, pq.Format.TEXT)
                     or TimestamptzLoader)


class UtcTimestamptzLoader(TimestamptzLoader):
    """Django's loader of ``timestamptz`` for a connection whose session is in UTC, at the speed of
    psycopg's own: Django's subclasses psycopg's pure-Python loader (to set the time zone it
    returns), so every timestamp it reads is parsed in Python (about 9 µs each here, 0.8 with
    psycopg's; a step's attempts carry a few dozen). In UTC, psycopg's loader returns the same
    aware datetimes; ``timezone`` is what Django compares to decide that a cursor needs no loader
    of its own."""

    timezone = UTC

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        self.load = _FAST_TIMESTAMPTZ(oid, context).load  # type: ignore[method-assign]


def session_settings(scope: tuple[str, str]) -> tuple[str, str]:
    """The ``role`` and ``ductor.tenant_id`` a session needs for ``scope`` ("none" is the role
    the connection logged in as)."""
    kind, value = scope
    if kind == "across":
        return settings.DUCTOR_DB_MAINTENANCE_ROLE, ""
    return "none", value if kind == "tenant" else ""


class DatabaseWrapper(postgresql.DatabaseWrapper):
    # Django's, which its type stubs leave out.
    health_check_enabled: bool
    health_check_done: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._session: tuple[str, str] | None = None  # what the session is known to hold
        self._controlling = False  # a savepoint statement runs: no row is read, set nothing
        self._unsent: list[str] = []  # savepoints created, sent with the next statement
        self._live: list[str] = []  # savepoints sent and not released, oldest first
        self._answered_at = -math.inf  # when the server last answered (time.monotonic())
        # Writes sent with the COMMIT: each with whether it goes last, and the context it was given in.
        self._with_commit: list[tuple[Callable[[], None], bool, contextvars.Context]] = []
        self._begin = False  # Django's transaction is open, its BEGIN not sent yet
        self.execute_wrappers.append(self._in_scope)

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        self._session = None
        self._unsent, self._live, self._with_commit, self._begin = [], [], [], False
        connection = super().get_new_connection(conn_params)
        if self.timezone == UTC:  # Django sets the session's time zone to it (``ensure_timezone``)
            connection.adapters.register_loader("timestamptz", UtcTimestamptzLoader)
        return connection

    def _set_autocommit(self, autocommit: bool) -> None:
        # psycopg's connection stays in autocommit; Django's transaction begins with its first
        # statement (``_in_scope``), and psycopg's commit and rollback end it (they act on the
        # server's transaction, whatever psycopg's mode).
        if not self.connection.autocommit:  # a new connection
            with self.wrap_database_errors:
                self.connection.autocommit = True
        self._begin = not autocommit

    def close_if_health_check_failed(self) -> None:
        if (self.connection is not None and self.health_check_enabled and not self.health_check_done
                and not self.connection.closed and not self.connection.broken
                and time.monotonic() - self._answered_at < settings.DUCTOR_DB_HEALTH_CHECK_IDLE_S):
            self.health_check_done = True  # it answered a moment ago
            return
        super().close_if_health_check_failed()

    def is_usable(self) -> bool:
        usable = bool(super().is_usable())
        if usable:
            self._answered_at = time.monotonic()
        return usable

    def send_with_commit(self, write: Callable[[], None], *, last: bool = False) -> None:
        """Have ``write`` (statements whose results it does not read before the commit's end) run
        when the transaction commits, its statements sent with the ``COMMIT`` in one round trip,
        in the order they were given, those given ``last`` after the others. Each runs in the
        context it was given in: as the tenant (the database scope) it was given for, whoever the
        commit runs for. Should one fail, the transaction rolls back whole and the commit raises.
        Dropped by a rollback; not by a savepoint's: ``write`` reads at the commit what it must
        write."""
        if not self.in_atomic_block:
            raise RuntimeError("send_with_commit needs a transaction")
        self._with_commit.append((write, last, contextvars.copy_context()))

    def writes_with_commit(self) -> list[Callable[[], None]]:
        """What the transaction in progress will send with its ``COMMIT``, in order."""
        return [write for write, _, _ in self._ordered()]

    def _ordered(self) -> list[tuple[Callable[[], None], bool, contextvars.Context]]:
        return sorted(self._with_commit, key=lambda sent: sent[1])

    def _commit(self) -> None:
        writes, self._with_commit = self._ordered(), []
        self._unsent, self._live = [], []
        if writes and self.connection is not None:
            with self.wrap_database_errors, self.connection.pipeline():
                for write, _, context in writes:  # the first of their statements sends the BEGIN if none was
                    context.run(write)
                self.connection.execute("COMMIT")
        else:
            super()._commit()  # type: ignore[misc]
        self._begin = not self.autocommit  # the next transaction, if Django stays in one
        self._answered_at = time.monotonic()

    def _rollback(self) -> None:
        self._session = None  # a setting made in the transaction is undone with it
        self._unsent, self._live, self._with_commit = [], [], []
        super()._rollback()  # type: ignore[misc]
        self._begin = not self.autocommit

    def _savepoint(self, sid: str) -> None:
        self._unsent.append(sid)  # it travels with the next statement

    def _savepoint_commit(self, sid: str) -> None:
        if sid in self._unsent:  # nothing ran in it: there is nothing to release
            self._unsent.remove(sid)
        elif sid in self._live and len(self._live) > MAX_UNRELEASED:
            with self._control():
                super()._savepoint_commit(sid)  # type: ignore[misc]
            del self._live[self._live.index(sid):]
        # else: the transaction's end releases it (or it was rolled back before it was sent)

    def _savepoint_rollback(self, sid: str) -> None:
        if sid in self._unsent:  # nothing ran in it (nor in those created after it)
            del self._unsent[self._unsent.index(sid):]
            return
        self._unsent.clear()  # created after it, never sent: undone with it
        with self._control():  # in a failed transaction, only the rollback itself may run
            super()._savepoint_rollback(sid)  # type: ignore[misc]
        if sid in self._live:
            del self._live[self._live.index(sid) + 1:]  # those created after it are gone
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
        """Run the statement after what it needs first (the transaction's ``BEGIN``, the
        savepoints not sent yet, the session's scope), all in one round trip."""
        wanted = session_settings(database_scope()) if settings.DUCTOR_ROW_SECURITY else None
        rescope = wanted is not None and wanted != self._session and not self._controlling
        if not self._begin and not self._unsent and not rescope:
            result = execute(sql, params, many, context)
            self._answered_at = time.monotonic()
            return result
        with self.wrap_database_errors, self._batch(params, context):
            if self._begin:
                self._begin = False  # sent, whatever comes of the batch: a rollback ends it
                self.connection.execute("BEGIN")
            for sid in self._unsent:
                self.connection.execute(self.ops.savepoint_create_sql(sid))
            self._live += self._unsent
            self._unsent.clear()
            if rescope:
                self._session = None  # should a statement of the batch fail, nothing is known
                self.connection.execute(SET_SCOPE, wanted)
            result = execute(sql, params, many, context)
        if rescope:
            self._session = wanted
        self._answered_at = time.monotonic()
        return result

    def _batch(self, params: Any, context: dict[str, Any]) -> Any:
        """A pipeline for the statement and what goes before it, in a transaction. None inside one
        already (the batch grows); none in autocommit (a batch is one implicit transaction, which
        some statements refuse); none for a statement without parameters (it may be several, which
        only go unbatched), nor for a server-side cursor (it cannot be pipelined): there the
        statements go one by one."""
        if (params is None or self.connection.info.pipeline_status != pq.PipelineStatus.OFF
                or self.autocommit
                or isinstance(getattr(context.get("cursor"), "cursor", None), psycopg.ServerCursor)):
            return nullcontext()
        return self.connection.pipeline()
