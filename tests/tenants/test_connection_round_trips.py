"""The connection's round trips: what a statement needs first travels with it, and no more is sent.

Read off the wire (``ductor_project.core.database.wire``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction
from psycopg import pq

from ductor_project.core.context import tenant_context
from ductor_project.core.database.base import MAX_UNRELEASED, UtcTimestamptzLoader
from ductor_project.core.database.wire import wire
from tenants.models import Tenant
from tests.scoped.models import Folder

# Real transactions, not savepoints inside the test's own: what is sent is exactly the test's.
pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def select(value: int) -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::int", [value])
        return cursor.fetchone()[0]


def folders(tenant: Tenant) -> set[str]:
    with tenant_context(tenant):
        return set(Folder.objects.values_list("name", flat=True))


def create_then_fail(name: str, *, on_commit: list[str] | None = None) -> None:
    """A block that writes (and asks for a hook at the commit), then fails."""
    with transaction.atomic():
        Folder.objects.create(name=name)
        if on_commit is not None:
            transaction.on_commit(lambda: on_commit.append(name))
        raise Boom


def test_a_savepoint_travels_with_the_first_statement_of_its_block():
    with transaction.atomic():
        select(1)
        with wire() as seen, transaction.atomic():
            assert select(2) == 2
            assert select(3) == 3
    assert seen.round_trips == 2
    assert len(seen.sent("SAVEPOINT")) == 1
    assert seen.statements.index(seen.sent("SAVEPOINT")[0]) == 0


def test_a_block_that_runs_no_statement_sends_nothing():
    with transaction.atomic():
        select(1)
        with wire() as seen:
            with transaction.atomic():
                pass
            with pytest.raises(Boom), transaction.atomic():
                raise Boom
        select(2)
    assert seen.round_trips == 0
    assert seen.statements == []


def test_an_ended_savepoint_is_left_to_the_transactions_end(tenant_a):
    tenant = tenant_a[0]
    with tenant_context(tenant), wire() as seen, transaction.atomic():
        Folder.objects.create(name="outer")
        with transaction.atomic():
            Folder.objects.create(name="inner")
        Folder.objects.create(name="after")
    assert seen.sent("RELEASE") == []
    assert folders(tenant) == {"outer", "inner", "after"}


def test_a_rolled_back_block_undoes_its_writes_alone(tenant_a):
    tenant = tenant_a[0]
    with tenant_context(tenant), transaction.atomic():
        Folder.objects.create(name="kept")
        with pytest.raises(Boom):
            create_then_fail("undone")
        # The savepoint and the failing INSERT travel together: the error still rolls back to it.
        with pytest.raises(IntegrityError), transaction.atomic():
            Folder.objects.create(name="kept")
        with transaction.atomic():
            Folder.objects.create(name="later")
    assert folders(tenant) == {"kept", "later"}


def test_on_commit_hooks_of_a_rolled_back_block_are_dropped(tenant_a, django_capture_on_commit_callbacks):
    ran: list[str] = []
    with (django_capture_on_commit_callbacks(execute=True), tenant_context(tenant_a[0]),
          transaction.atomic()):
        transaction.on_commit(lambda: ran.append("outer"))
        with pytest.raises(Boom):
            create_then_fail("inner", on_commit=ran)
    assert ran == ["outer"]


def test_beyond_a_few_live_savepoints_an_ended_one_is_released_at_once(tenant_a):
    blocks = MAX_UNRELEASED + 5
    with tenant_context(tenant_a[0]), wire() as seen, transaction.atomic():
        for n in range(blocks):
            with transaction.atomic():
                Folder.objects.create(name=f"f{n}")
    assert len(seen.sent("SAVEPOINT")) == blocks
    assert len(seen.sent("RELEASE")) == blocks - MAX_UNRELEASED
    assert len(folders(tenant_a[0])) == blocks


def test_the_scope_and_the_savepoint_travel_with_the_statement_and_still_hold(tenant_a, tenant_b):
    a, b = tenant_a[0], tenant_b[0]
    for tenant in (a, b):
        with tenant_context(tenant):
            Folder.objects.create(name=tenant.slug)
    with transaction.atomic():
        with tenant_context(a):
            select(1)  # the session acts for A
        with tenant_context(b), wire() as seen, transaction.atomic():
            names = set(Folder.objects.values_list("name", flat=True))
    assert names == {b.slug}
    assert seen.round_trips == 1
    assert seen.executed == 3  # the savepoint, the session's scope (B), the query


def test_a_write_sent_with_the_commit_runs_as_the_tenant_it_was_given_for(tenant_a, tenant_b):
    def create(name: str) -> None:
        Folder.objects.create(name=name)

    with transaction.atomic():
        with tenant_context(tenant_a[0]):
            connection.send_with_commit(lambda: create("a-at-commit"))
        with tenant_context(tenant_b[0]):
            connection.send_with_commit(lambda: create("b-at-commit"), last=True)
            Folder.objects.create(name="b-now")
    # The COMMIT ran for no tenant; each write ran as its own, and the other does not see it.

    assert folders(tenant_a[0]) == {"a-at-commit"}
    assert folders(tenant_b[0]) == {"b-now", "b-at-commit"}


def test_a_connection_that_answered_a_moment_ago_is_not_checked_again(settings):
    select(1)
    settings.DUCTOR_DB_HEALTH_CHECK_IDLE_S = 3600
    connection.close_if_unusable_or_obsolete()  # a new task: the next query checks health
    with wire() as seen:
        select(2)
    assert (seen.executed, seen.round_trips) == (1, 1)
    settings.DUCTOR_DB_HEALTH_CHECK_IDLE_S = 0  # always checked, as Django does
    connection.close_if_unusable_or_obsolete()
    with wire() as seen:
        select(3)
    assert (seen.executed, seen.round_trips) == (2, 2)  # SELECT 1, then the query


def test_timestamps_are_read_by_psycopg_s_own_loader_as_aware_utc_datetimes():
    """The connection reads ``timestamptz`` with psycopg's loader (``UtcTimestamptzLoader``), not
    Django's pure-Python one: the same aware datetimes, in UTC, to the microsecond."""
    with connection.cursor() as cursor:
        loader = cursor.connection.adapters.get_loader(psycopg.adapters.types["timestamptz"].oid, pq.Format.TEXT)
        cursor.execute("SELECT '2026-01-02 03:04:05.123456+05'::timestamptz, %s::timestamptz, NULL::timestamptz",
                       [datetime(1999, 12, 31, 23, 59, 59, 1, tzinfo=ZoneInfo("America/New_York"))])
        read = cursor.fetchone()
    assert loader is UtcTimestamptzLoader
    assert read[0] == datetime(2026, 1, 1, 22, 4, 5, 123456, tzinfo=UTC)
    assert read[1] == datetime(2000, 1, 1, 4, 59, 59, 1, tzinfo=UTC)
    assert read[0].utcoffset() == read[1].utcoffset() == timedelta(0)
    assert read[2] is None


def test_a_model_s_times_read_back_as_they_were_written(tenant_a):
    written = datetime(2026, 7, 1, 12, 30, 15, 999999, tzinfo=ZoneInfo("Asia/Kolkata"))
    Tenant.objects.filter(pk=tenant_a[0].pk).update(created_at=written)
    read = Tenant.objects.get(pk=tenant_a[0].pk).created_at
    assert read == written
    assert read.utcoffset() == timedelta(0)
