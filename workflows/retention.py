"""History retention: the runs that ended more than the plan's ``history_retention_days`` ago go.

A run is kept or deleted with its whole tree (every run of its ``root_run_id``: its children, its
ContinueAsNew successors and theirs), and only once every run of the tree has ended, the last of
them more than the tenant's ``history_retention_days`` ago: an active run is never touched, nor
anything an active run points at. With the runs go their steps, history, signals, waits and
webhook deliveries; a rerun of a deleted run keeps its row (its ``rerun_of`` becomes null). The
usage counters (the monthly run quota) are not history: they stay.

``expire_runs`` is a coordinator housekeeper. Each call looks at the next ``TENANTS_PER_PASS``
tenants (round and round), and for each one at its ``ROOTS_PER_BATCH`` trees that ended first
after where its previous look stopped (an index on the roots' ``finished_at``): so a tree that
cannot go yet (a child still running) is passed over, not looked at again and again. Each batch
is deleted in its own short transaction, a few statements, each one an index lookup by run: no
long lock, however large the history.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import structlog
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from ductor_project.core.context import current_tenant, tenant_context
from scheduling.coordinator.housekeeping import TenantRound
from tenants.entitlements import effective_entitlements
from workflows.models import (
    EventWait,
    RunEvent,
    RunSignal,
    StepRun,
    WebhookDelivery,
    WorkflowRun,
)

log = structlog.get_logger(__name__)

# Most trees one batch deletes, and most tenants one pass looks at.
ROOTS_PER_BATCH = 200
TENANTS_PER_PASS = 50
ENDED = [str(status) for status in WorkflowRun.TERMINAL]
RUNS = WorkflowRun._meta.db_table
# Where the last pass stopped: the tenants, and per tenant the last root it looked at.
_tenants = TenantRound()
_root_cursor: dict[Any, tuple[datetime, Any]] = {}


def expire_runs(*, roots_per_batch: int = ROOTS_PER_BATCH, tenants_per_pass: int = TENANTS_PER_PASS) -> int:
    """Delete the expired run trees of the next tenants (see the module docs); how many runs."""
    deleted = 0
    now = timezone.now()
    for tenant in _tenants.next(tenants_per_pass):
        with tenant_context(tenant):
            cutoff = now - timedelta(days=effective_entitlements(tenant).history_retention_days)
            count = _expire_batch(cutoff, roots_per_batch)
        if count:
            log.info("runs_expired", target_tenant=str(tenant.pk), runs=count)
        deleted += count
    return deleted


def _expire_batch(cutoff: datetime, limit: int) -> int:
    """One batch of the tenant in context: the next ``limit`` roots that ended before ``cutoff``,
    and of those the trees that ended entirely before it, deleted. Returns how many runs."""
    tenant_id = current_tenant().pk
    roots = WorkflowRun.objects.filter(parent_run__isnull=True, continued_from__isnull=True,
                                       finished_at__lt=cutoff)
    after = _root_cursor.get(tenant_id)
    if after is not None:
        roots = roots.filter(Q(finished_at__gt=after[0]) | Q(finished_at=after[0], id__gt=after[1]))
    looked = list(roots.order_by("finished_at", "id").values_list("finished_at", "id")[:limit])
    if len(looked) < limit:
        _root_cursor.pop(tenant_id, None)  # round again from the oldest next time
    else:
        _root_cursor[tenant_id] = looked[-1]
    if not looked:
        return 0
    with transaction.atomic():
        trees = _ended_trees([root for _, root in looked], cutoff)
        return _delete_trees(trees) if trees else 0


def _ended_trees(roots: list[Any], cutoff: datetime) -> list[Any]:
    """Those of ``roots`` whose every run ended, the last of them before ``cutoff``; their rows
    locked, so that nothing starts in them meanwhile (a rerun, a signal: they lock the run)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT root_run_id FROM {RUNS} WHERE tenant_id = %s AND root_run_id = ANY(%s) "  # noqa: S608
            "GROUP BY root_run_id HAVING bool_and(status = ANY(%s)) AND max(finished_at) < %s",
            [current_tenant().pk, roots, ENDED, cutoff])
        ended = [row[0] for row in cursor.fetchall()]
    if ended:
        list(WorkflowRun.objects.select_for_update().filter(root_run_id__in=ended).values_list("pk"))
    return ended


def _delete_trees(roots: list[Any]) -> int:
    """Delete the runs of the trees of ``roots`` and everything of theirs; how many runs."""
    runs = WorkflowRun.objects.filter(root_run_id__in=roots)
    ids = list(runs.values_list("pk", flat=True))
    # What points at them from outside: reruns of them (kept, without the link), and signals
    # delivered to their steps (theirs: they go too).
    WorkflowRun.objects.filter(rerun_of_id__in=ids).exclude(root_run_id__in=roots).update(rerun_of=None)
    for model in (WebhookDelivery, RunSignal, EventWait, RunEvent, StepRun):
        model.objects.filter(run_id__in=ids)._raw_delete(connection.alias)
    # One statement for the runs: a tree's rows point at each other (parent, predecessor), which
    # the database checks when the statement ends.
    runs._raw_delete(connection.alias)
    return len(ids)
