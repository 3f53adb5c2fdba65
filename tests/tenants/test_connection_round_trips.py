"""The connection's round trips: what a statement needs first travels with it, and no more is sent.

Read off the wire (``ductor_project.core.database.wire``).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from ductor_project.core.context import tenant_context
from ductor_project.core.database.base import MAX_UNRELEASED
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
