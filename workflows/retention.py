"""History retention: the runs that ended more than the plan's ``history_retention_days`` ago go.

A run is kept or deleted with its whole tree (every run of its ``root_run_id``: its children, its
ContinueAsNew successors and theirs), and only once every run of the tree has ended, the last of
them more than the tenant's ``history_retention_days`` ago: an active run is never touched, nor
anything an active run points at. With the runs go their steps, history, signals, waits and
webhook deliveries; a rerun of a deleted run keeps its row (its ``rerun_of`` becomes null). The
usage counters (the monthly run quota) are not history: they stay.

``expire_runs`` is a coordinator housekeeper. Each call looks at the next ``TENANTS_PER_PASS``
tenants (round and round), finds in one statement those that have a root to look at (a tenant
with nothing past its retention costs the pass nothing of its own), and for each of those at its
``ROOTS_PER_BATCH`` trees that ended first after where its previous look stopped (an index on the
roots' ``finished_at``, entered at that place): so a tree that cannot go yet is passed over, not
looked at again and again. A batch takes those trees while they hold no more than
``RUNS_PER_BATCH`` runs together, and the next batch goes on from the first it left. A tree larger
than that alone (a root's thousands of children, a loop's long ContinueAsNew chain) goes a part at a
time, ``RUNS_PER_BATCH`` runs a batch across as many passes as it takes: the runs none of the others
points at first (the newest; the root last), so what is left between two batches is a tree whose
rows point at nothing deleted, and each batch looks again, under its locks, that every run of the
tree ended before the cutoff. It goes on,
one batch per tenant in turn, while a tenant has more to look at and ``PASS_BUDGET_S`` lasts: a
tenant whose history grows faster than one batch a pass still gets through it, and the pass
stays short enough for the coordinator's other work. Each batch is deleted in its own short
transaction, a few statements, each one an index lookup by run: no long lock, however large the
history; after each, a rest (``REST_PER_BATCH``) leaves the database to the hot path
(``bench/retention.py`` measures both on a million runs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from ductor_project.core.context import across_tenants, current_tenant, tenant_context
from scheduling.coordinator.housekeeping import TenantRound, in_rounds
from tenants.entitlements import resolve_many
from tenants.models import Tenant
from workflows.engine.statements import ENDED
from workflows.models import (
    EventWait,
    RunEvent,
    RunSignal,
    StepRun,
    WebhookDelivery,
    WorkflowRun,
)

log = structlog.get_logger(__name__)

# Most trees one batch deletes, most tenants one pass looks at, and how long a pass goes on
# taking batches (it ends the round under way, one batch and rest per tenant with more to do).
ROOTS_PER_BATCH = 100
# Most runs one batch deletes, however many trees that is (at least one tree): a tree has no bound
# (its children, and a loop's ContinueAsNew successors), and 100 trees of a thousand runs each were
# one transaction of a hundred thousand runs, with their steps and history.
RUNS_PER_BATCH = 1000
TENANTS_PER_PASS = 50
PASS_BUDGET_S = 1.0
# After each batch that deleted something, a rest this many times as long as the batch took: the
# deletes (their writes, their WAL) take at most half of one database backend, and the hot path
# finds the server between two short batches, not behind a long run of them.
REST_PER_BATCH = 1.0
RUNS = WorkflowRun._meta.db_table
# What goes with a run, in one statement each: every row that points at it (a delivery of its outcome
# too). ``tests/workflows/test_offboarding.py`` checks that no model that points at a run is missing.
TREE_MODELS = (WebhookDelivery, RunSignal, EventWait, RunEvent, StepRun)
# Of the trees of some roots (tenant, roots), those whose every run ended, the last before a cutoff.
# With each one's number of runs.
ENDED_TREES = (f"SELECT root_run_id, count(*) FROM {RUNS} WHERE tenant_id = %s AND root_run_id = ANY(%s) "  # noqa: S608
               "GROUP BY root_run_id HAVING bool_and(status = ANY(%s)) AND max(finished_at) < %s")
# Of some tenants (ids, cutoffs, and where their last look stopped, if it did), those whose first root
# that ended after that place ended before their cutoff: one step into ``run_tenant_root_finished``
# each, entered at the place as ``expired_roots`` enters it, in one statement. (Asked whether any such
# root exists, the planner may join the tenants to a scan of the whole table.)
WITH_EXPIRED_ROOTS = (
    "SELECT t.id FROM unnest(%s::uuid[], %s::timestamptz[], %s::timestamptz[], %s::uuid[]) "  # noqa: S608
    "AS t(id, cutoff, after_at, after_id) WHERE "
    f"(SELECT r.finished_at FROM {RUNS} r WHERE r.tenant_id = t.id AND r.parent_run_id IS NULL "
    "AND r.continued_from_id IS NULL AND r.finished_at >= coalesce(t.after_at, '-infinity') "
    "AND (t.after_at IS NULL OR r.finished_at > t.after_at OR r.id > t.after_id) "
    "ORDER BY r.finished_at, r.id LIMIT 1) < t.cutoff")
# Where the last pass stopped: the tenants, and per tenant the last root it looked at.
_tenants = TenantRound()
_root_cursor: dict[Any, tuple[datetime, Any]] = {}


@dataclass(frozen=True)
class Batch:
    """What one batch did: the runs it deleted, whether it looked at a whole batch of roots
    (then the tenant may have more), and how long its transaction lasted."""

    runs: int
    full: bool
    seconds: float


def expire_runs(*, roots_per_batch: int = ROOTS_PER_BATCH, tenants_per_pass: int = TENANTS_PER_PASS,
                budget_s: float = PASS_BUDGET_S, rest: float = REST_PER_BATCH) -> int:
    """Delete the expired run trees of the next tenants, one batch per tenant in turn while one
    has more and ``budget_s`` lasts (at least one batch each: see the module docs), resting
    ``rest`` times as long as each batch took after it; how many runs."""
    def one_batch(waiting: tuple[Tenant, datetime]) -> tuple[int, bool, float]:
        tenant, cutoff = waiting
        with tenant_context(tenant):
            batch = _expire_batch(cutoff, roots_per_batch)
        if batch.runs:
            log.info("runs_expired", tenant_id=str(tenant.pk), tenant=tenant.slug, runs=batch.runs,
                     batch_ms=round(batch.seconds * 1000, 1))
        return batch.runs, batch.full, batch.seconds

    return in_rounds(_expiring(_tenants.next(tenants_per_pass), timezone.now()), one_batch, budget_s=budget_s,
                     rest=rest)


def _expiring(tenants: list[Tenant], now: datetime) -> list[tuple[Tenant, datetime]]:
    """Those of ``tenants`` that have a root that ended before their ``history_retention_days``, after
    where their previous look stopped, each with its cutoff: three queries for them all, however many
    they are. The others' look starts again from their oldest root next time, as a batch that found
    none does."""
    limits = resolve_many(tenants)
    cutoffs = {pk: now - timedelta(days=limit.history_retention_days) for pk, limit in limits.items()}
    cursors = [_root_cursor.get(pk, (None, None)) for pk in cutoffs]
    with across_tenants("the history retention"), connection.cursor() as cursor:
        cursor.execute(WITH_EXPIRED_ROOTS, [list(cutoffs), list(cutoffs.values()), [at for at, _ in cursors],
                                            [pk for _, pk in cursors]])
        found = {row[0] for row in cursor.fetchall()}
    for tenant in tenants:
        if tenant.pk not in found:
            _root_cursor.pop(tenant.pk, None)
    return [(tenant, cutoffs[tenant.pk]) for tenant in tenants if tenant.pk in found]


def _expire_batch(cutoff: datetime, limit: int) -> Batch:
    """One batch of the tenant in context: the next ``limit`` roots that ended before ``cutoff``,
    and of those the trees that ended entirely before it, in that order while they hold no more
    than ``RUNS_PER_BATCH`` runs together, deleted in one transaction; when the first is larger
    than that alone, a part of it (``_expire_part``). The trees left for want of room, and what is
    left of that one, are the next batch's first."""
    tenant_id = current_tenant().pk
    before = _root_cursor.get(tenant_id)
    looked = list(expired_roots(cutoff, after=before)[:limit])
    if not looked:
        _root_cursor.pop(tenant_id, None)  # round again from the oldest next time
        return Batch(runs=0, full=False, seconds=0.0)
    sizes = dict(_trees_ended([root for _, root in looked], cutoff))
    chosen: list[Any] = []
    runs, reached, part = 0, len(looked), None
    for index, (_, root) in enumerate(looked):
        size = sizes.get(root)
        if size is None:
            continue  # cannot go yet: passed over
        if not chosen and size > RUNS_PER_BATCH:
            part, reached = root, index  # too large for one batch: a part of it, and the rest is the next batch's
            break
        if chosen and runs + size > RUNS_PER_BATCH:
            reached = index  # this tree and those after it: the next batch's
            break
        chosen.append(root)
        runs += size
    full = part is not None or reached < len(looked) or len(looked) == limit
    cursor = (looked[reached - 1] if reached else before) if full else None
    if cursor is None:
        _root_cursor.pop(tenant_id, None)  # round again from the oldest next time
    else:
        _root_cursor[tenant_id] = cursor
    if not chosen and part is None:
        return Batch(runs=0, full=full, seconds=0.0)
    started = time.perf_counter()
    with transaction.atomic():
        if part is not None:
            deleted = _expire_part(part, cutoff)
        else:
            trees = _ended_trees(chosen, cutoff)
            deleted = delete_run_trees(trees) if trees else 0
    return Batch(runs=deleted, full=full, seconds=time.perf_counter() - started)


def expired_roots(cutoff: datetime, *, after: tuple[datetime, Any] | None = None) -> QuerySet[WorkflowRun, Any]:
    """The ``(finished_at, id)`` of the tenant's roots that ended before ``cutoff``, after ``after``
    in that order: a walk of the index ``run_tenant_root_finished``, entered at ``after``."""
    roots = WorkflowRun.objects.filter(parent_run__isnull=True, continued_from__isnull=True, finished_at__lt=cutoff)
    if after is not None:
        # ``finished_at >=`` enters the index at the cursor; the rest of the cursor is a filter on those rows.
        roots = roots.filter(finished_at__gte=after[0]).filter(Q(finished_at__gt=after[0]) | Q(id__gt=after[1]))
    return roots.order_by("finished_at", "id").values_list("finished_at", "id")


def _ended_trees(roots: list[Any], cutoff: datetime) -> list[Any]:
    """Those of ``roots`` (trees seen ended) whose every run ended, the last of them before
    ``cutoff``, once their rows are locked, so that nothing starts in them meanwhile (a retry, a
    rerun, a signal: they lock the run). Looked at again once locked: a run that started again
    between the first look and its lock (a retry committed in between) keeps its tree."""
    list(WorkflowRun.objects.select_for_update().filter(root_run_id__in=roots).values_list("pk"))
    # A statement after the locks sees what committed before them.
    return [root for root, _ in _trees_ended(roots, cutoff)]


def _trees_ended(roots: list[Any], cutoff: datetime) -> list[tuple[Any, int]]:
    """Those of ``roots`` whose every run ended, the last of them before ``cutoff``, each with its
    number of runs."""
    with connection.cursor() as cursor:
        cursor.execute(ENDED_TREES, [current_tenant().pk, roots, ENDED, cutoff])
        return [(row[0], row[1]) for row in cursor.fetchall()]


def delete_run_trees(roots: list[Any]) -> int:
    """Delete the runs of the trees of ``roots`` (of the tenant in context) and everything of theirs;
    how many runs. The caller's transaction holds the runs' locks."""
    return _delete_runs(list(WorkflowRun.objects.filter(root_run_id__in=roots).values_list("pk", flat=True)))


def _expire_part(root: Any, cutoff: datetime) -> int:
    """Delete, in the caller's transaction, a part of the tree of ``root``, which is too large for
    one batch: up to ``RUNS_PER_BATCH`` of its runs that none of the others points at
    (``_leaves_first``), once the root's row and theirs are locked and every run of the tree is
    seen ended before ``cutoff`` (else nothing: a run that started again keeps what is left of its
    tree); how many runs. What is left points at nothing deleted, and the root, which the next
    batches find the tree by, goes last."""
    part = _locked_part(root)
    # A statement after the locks sees what committed before them; a run that started again since
    # the part was chosen (the only way a run comes to point at one of them) is not ended.
    if not part or not _trees_ended([root], cutoff):
        return 0
    return _delete_part(part)


def delete_tree_part(root: Any) -> int:
    """Delete, in the caller's transaction, a part of the tree of ``root`` (of the tenant in
    context) as ``_expire_part`` does, whatever its runs' states: a tenant's purge
    (``workflows.offboarding``). How many runs."""
    return _delete_part(_locked_part(root))


def _locked_part(root: Any) -> list[Any]:
    """``_leaves_first``, once the root's row and theirs are locked."""
    part = _leaves_first(root)
    list(WorkflowRun.objects.select_for_update().filter(pk__in=[root, *part]).values_list("pk"))
    return part


def _delete_part(part: list[Any]) -> int:
    """Delete the runs ``part`` of a tree (``_leaves_first``); their parents' steps, which stay, no
    longer point at them (as when a child run is deleted alone)."""
    StepRun.objects.filter(child_run_id__in=part).exclude(run_id__in=part).update(child_run=None)
    return _delete_runs(part)


def _leaves_first(root: Any) -> list[Any]:
    """Up to ``RUNS_PER_BATCH`` runs of the tree of ``root`` that none of its other runs points at
    (as parent or predecessor): its newest, since a child is created after its parent and a
    successor after its predecessor (the root, the oldest, is the last); and when runs created at
    the same moment leave one of those pointed at from outside them, the runs nothing points at at
    all (fewer a batch: a ContinueAsNew chain has one)."""
    runs = WorkflowRun.objects.filter(root_run_id=root)
    newest = list(runs.order_by("-created_at", "-id").values_list("pk", flat=True)[:RUNS_PER_BATCH])
    pointing = runs.filter(Q(parent_run_id__in=newest) | Q(continued_from_id__in=newest)).exclude(pk__in=newest)
    if not pointing.exists():
        return newest
    pointed_at = WorkflowRun.objects.filter(Q(parent_run_id=OuterRef("pk")) | Q(continued_from_id=OuterRef("pk")))
    return list(runs.exclude(Exists(pointed_at)).values_list("pk", flat=True)[:RUNS_PER_BATCH])


def _delete_runs(ids: list[Any]) -> int:
    """Delete the runs ``ids`` and everything of theirs; how many runs. None of the runs that stay
    may point at them as parent or predecessor."""
    # What points at them from outside: reruns of them (kept, without the link), and signals
    # delivered to their steps (theirs: they go too).
    WorkflowRun.objects.filter(rerun_of_id__in=ids).exclude(pk__in=ids).update(rerun_of=None)
    for model in TREE_MODELS:
        model.objects.filter(run_id__in=ids)._raw_delete(connection.alias)
    # One statement for the runs: a tree's rows point at each other (parent, predecessor), which
    # the database checks when the statement ends.
    WorkflowRun.objects.filter(pk__in=ids)._raw_delete(connection.alias)
    return len(ids)
