"""The hot queries on the runs table can be served by their indexes, on the real PostgreSQL.

The tables here are tiny, so the planner would read them whole, or read a few rows by another
index and sort them; with sequential scans and sorts priced out of reach, a plan that still sorts
the table or reads it whole means no index serves the query as written. (With sorts allowed, what
the planner picks depends on the statistics the tests before left: on a table it believes holds
one row of the tenant, sorting that row is cheapest.) ``bench/retention.py --explain`` shows the
same plans on a million runs."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.db import connection, transaction
from django.utils import timezone

from ductor_project.core.context import tenant_context
from tenants.models import Tenant
from workflows import models as tables
from workflows import retention, selectors
from workflows.engine import statements
from workflows.engine.journal import Event, events_insert
from workflows.models import StepRun, WebhookDelivery, WorkflowRun
from workflows.services import run_start, workflow_put

pytestmark = pytest.mark.django_db


@pytest.fixture
def no_sequential_scans() -> Iterator[None]:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_sort = off")
        yield


def plan(queryset: Any) -> str:
    return str(queryset.explain())


def indexes_in(plan: str) -> set[str]:
    return set(re.findall(r"(?:Index Scan|Index Only Scan|Bitmap Index Scan)(?: Backward)?(?: using| on) (\w+)", plan))


def plan_of(statement: tuple[str, list[Any]]) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {statement[0]}", statement[1])
        return "\n".join(row[0] for row in cursor.fetchall())


def test_the_run_list_reads_the_tenant_s_newest_runs_from_an_index_without_sorting(
        tenant_a: tuple[Tenant, str], no_sequential_scans: None) -> None:
    with tenant_context(tenant_a[0]):
        page = plan(selectors.run_list({}).order_by("-created_at", "-id")[:51])
    assert "run_tenant_newest" in page
    assert "Sort" not in page


def test_the_active_runs_index_leaves_out_exactly_the_terminal_statuses() -> None:
    """The reconciler's pass reads ``run_active`` only if its query's condition (not TERMINAL)
    implies the index's; on tiny tables the planner prefers others, so the bench shows the plan."""
    index = next(index for index in WorkflowRun._meta.indexes if index.name == "run_active")
    assert index.condition is not None
    assert index.condition.negated
    assert index.condition.children == [("status__in", sorted(WorkflowRun.TERMINAL))]


def test_retention_walks_the_roots_index_from_its_cursor(tenant_a: tuple[Tenant, str],
                                                          no_sequential_scans: None) -> None:
    cutoff = timezone.now()
    with tenant_context(tenant_a[0]):
        roots = plan(retention.expired_roots(cutoff, after=(cutoff - timedelta(days=3), uuid.uuid4()))[:200])
    assert "run_tenant_root_finished" in roots
    assert "Sort" not in roots


@pytest.mark.parametrize("table", ["workflows_steprun", "workflows_runevent"])
def test_a_run_s_attempts_and_events_have_no_index_of_the_tenant_alone(table: str) -> None:
    """Under row-level security every query names the tenant: an index on it alone would be
    ANDed with the run's, reading an entry for every row of the tenant to find one run's few."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table])
        indexes = dict(cursor.fetchall())
    assert any("(run_id" in definition for definition in indexes.values())
    assert not [name for name, definition in indexes.items() if "(tenant_id)" in definition]


def test_the_runs_table_writes_no_index_that_no_query_needs() -> None:
    """Every run started, and every change of its status, writes each of the table's indexes: none
    on the tenant alone (the tenant's indexes lead with it) and no pattern index of the status."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", ["workflows_workflowrun"])
        indexes = dict(cursor.fetchall())
    assert not [name for name, definition in indexes.items() if "(tenant_id)" in definition]
    assert not [name for name, definition in indexes.items() if "pattern_ops" in definition]
    assert "USING btree (status)" in indexes["run_status"]


def test_the_admins_filter_of_every_tenant_s_runs_by_status_reads_the_status_index(
        no_sequential_scans: None) -> None:
    assert "run_status" in indexes_in(plan(WorkflowRun.all_tenants.filter(status="failed").order_by()))


def test_a_step_reads_its_run_s_attempts_and_last_event_through_the_run_s_indexes(
        tenant_a: tuple[Tenant, str], no_sequential_scans: None) -> None:
    with tenant_context(tenant_a[0]):
        workflow_put(name="one", spec={"nodes": [{"id": "a", "type": "action", "action": "noop"}]})
        run = run_start(workflow="one")[0]
        attempts = plan_of(statements._attempts_of(run.pk))
        events = plan_of(events_insert([Event(run.pk, "x", "a", {}, timezone.now())]))
    assert indexes_in(attempts) == {"steprun_unique_attempt"}
    assert indexes_in(events) == {"runevent_unique_seq"}


def test_the_run_list_by_fairness_key_reads_its_index_newest_first_without_sorting(
        tenant_a: tuple[Tenant, str], no_sequential_scans: None) -> None:
    with tenant_context(tenant_a[0]):
        page = plan(selectors.run_list({"fairness_key": "acme"}).order_by("-created_at", "-id")[:51])
    assert "run_tenant_fairness_key" in page
    assert "Sort" not in page


def test_the_run_list_by_workflow_reads_its_index_newest_first_without_sorting(
        tenant_a: tuple[Tenant, str], no_sequential_scans: None) -> None:
    """Without its index, the planner walked the tenant's runs newest first, or read the whole table,
    to find a workflow with few runs among many."""
    with tenant_context(tenant_a[0]):
        page = plan(selectors.run_list({"workflow": "billing"}).order_by("-created_at", "-id")[:51])
    assert "run_tenant_workflow" in indexes_in(page)
    assert "Sort" not in page


@pytest.mark.parametrize(("model", "index"), [(tables.Event, "event_newest"), (WebhookDelivery, "delivery_newest")])
def test_the_admins_list_of_every_tenant_s_events_and_deliveries_reads_its_index_without_sorting(
        model: Any, index: str, no_sequential_scans: None) -> None:
    """Without its index, each page of the list sorted the whole table; the index of the tenant alone
    it replaces served nothing that the tenant's other indexes do not."""
    page = plan(model.all_tenants.order_by("-created_at", "-id")[:100])
    assert index in indexes_in(page)
    assert "Sort" not in page
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", [model._meta.db_table])
        assert not [definition for (definition,) in cursor.fetchall() if "(tenant_id)" in definition]


def test_the_admins_step_list_reads_the_newest_runs_attempts_through_indexes_without_sorting_them(
        no_sequential_scans: None) -> None:
    """Ordered by when each attempt was created, which no index serves, each page of the list sorted
    every attempt of the table (5.5 s a page on 800,000)."""
    ordering = admin.site._registry[StepRun].get_ordering(None)
    page = plan(StepRun.all_tenants.select_related("run").order_by(*ordering, "-id")[:100])
    assert "steprun_unique_attempt" in indexes_in(page)
    assert not re.search(r"(?<!Incremental )Sort  ", page)  # at most the few attempts of one run sorted
