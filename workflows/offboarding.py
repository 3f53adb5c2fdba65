"""Offboarding: the purge of a tenant being deleted, in bounded batches, then of the tenant itself.

``tenants.services.tenant_delete`` only marks a suspended tenant ``deleting``; from then on its keys
authenticate no more and nothing of it is dispatched. ``purge_batch`` then does the next bounded
step of its purge, each one a short transaction of its own:

1. its run trees, those of its next ``ROOTS_PER_BATCH`` runs while they hold no more than
   ``retention.RUNS_PER_BATCH`` runs together, each with every row that points at a run (steps,
   history, signals, waits, deliveries: ``retention.TREE_MODELS``), as retention deletes them; a
   tree larger than that alone goes a part at a time, the root last, as retention takes it;
2. then every other model with a foreign key to ``Tenant`` (found in the app registry, so a model
   added later is not forgotten), ``ROWS_PER_BATCH`` rows at a time, children before parents;
3. then its Redis state in every shard and its cache (``scheduling.queue_erasure``), and its slug in
   the task catalog's ``tenants`` lists (a later tenant of that slug must not inherit them);
4. last the tenant row, which the database refuses while any row still points at it.

Where a purge stands is read from what is left, never kept: a purge stopped between two batches (a
coordinator that restarts, ``delete_tenant`` interrupted) goes on from there. ``purge_deleting_tenants``
is the coordinator's housekeeper: one batch for each tenant being deleted in turn, while
``PASS_BUDGET_S`` lasts, resting after each as retention does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from graphlib import TopologicalSorter
from typing import Any

import structlog
from django.apps import apps
from django.db import IntegrityError, connection, models, transaction
from django.db.models import Count

from ductor_project.core.context import tenant_context
from scheduling.coordinator.housekeeping import in_rounds
from scheduling.queue_erasure import erase_tenant_state
from tenants.models import Tenant
from workflows import retention
from workflows.models import TaskCatalogEntry, WorkflowRun

log = structlog.get_logger(__name__)

ROOTS_PER_BATCH = 100
ROWS_PER_BATCH = 1000
TENANTS_PER_PASS = 10
PASS_BUDGET_S = 1.0
# After each batch, a rest this many times as long as it took (retention's reason: the hot path).
REST_PER_BATCH = 1.0


@dataclass(frozen=True)
class Progress:
    """What one batch did: ``stage`` is the model it deleted rows of (its label), ``redis`` or
    ``tenant``; ``deleted`` how many rows (or keys); ``done`` once the tenant row is gone."""

    stage: str
    deleted: int
    done: bool
    seconds: float = 0.0


def tenant_foreign_keys(model: type[models.Model]) -> list[models.ForeignKey[Any, Any]]:
    """``model``'s foreign keys to ``Tenant``."""
    return [field for field in model._meta.concrete_fields
            if isinstance(field, models.ForeignKey) and field.related_model is Tenant]


def tenant_models() -> list[type[models.Model]]:
    """Every model of the app registry (many-to-many tables included) with a foreign key to
    ``Tenant``: all the rows a tenant can own."""
    return [model for model in apps.get_models(include_auto_created=True) if tenant_foreign_keys(model)]


def deleted_with_runs(model: type[models.Model]) -> bool:
    """Whether every row of ``model`` belongs to a run: it goes with its run tree."""
    return any(isinstance(field, models.ForeignKey) and field.related_model is WorkflowRun and not field.null
               for field in model._meta.concrete_fields)


def deletion_order() -> list[type[models.Model]]:
    """The models deleted by tenant after the run trees: every tenant model but the runs and what
    goes with them, each before the models it points at. Raises ``graphlib.CycleError`` on a cycle
    (a model that points at itself is deleted with the run trees or not at all)."""
    chosen = sorted((m for m in tenant_models() if m is not WorkflowRun and not deleted_with_runs(m)),
                    key=lambda m: m._meta.label)
    order: TopologicalSorter[type[models.Model]] = TopologicalSorter()
    for model in chosen:
        order.add(model)
        for field in model._meta.concrete_fields:
            if field.is_relation and field.related_model in chosen and field.related_model is not Tenant:
                order.add(field.related_model, model)  # the parent after the child that points at it
    return list(order.static_order())


def purge_batch(tenant: Tenant, *, roots: int = ROOTS_PER_BATCH, rows: int = ROWS_PER_BATCH) -> Progress:
    """The next bounded step of the purge of ``tenant``, which must be being deleted (module docs).
    Resumable and idempotent: each call reads what is left."""
    if not tenant.is_deleting:
        raise ValueError(f"tenant {tenant.slug} is not being deleted")
    started = time.perf_counter()
    try:
        with tenant_context(tenant):
            progress = _delete_run_trees(roots) or _delete_next_rows(tenant, rows)
    except IntegrityError:
        # A row written behind the purge points at one this batch deleted (the database refuses at
        # the commit, and the batch changes nothing): the next batch finds it first.
        log.warning("tenant_purge_batch_refused", tenant_id=str(tenant.pk), tenant=tenant.slug, exc_info=True)
        return Progress("refused", 0, done=False, seconds=time.perf_counter() - started)
    if progress is None:
        _forget_catalog_slug(tenant.slug)
        keys = erase_tenant_state(tenant)
        progress = Progress("redis", keys, done=_delete_tenant_row(tenant))
    return Progress(progress.stage, progress.deleted, progress.done, time.perf_counter() - started)


def _delete_run_trees(limit: int) -> Progress | None:
    """The trees of the tenant's next ``limit`` runs, while they hold no more than
    ``retention.RUNS_PER_BATCH`` runs together, locked, then deleted with everything of theirs; of a
    tree larger than that alone (a long ContinueAsNew loop), a part (``retention.delete_tree_part``)."""
    with transaction.atomic():
        roots = list(dict.fromkeys(WorkflowRun.objects.values_list("root_run_id", flat=True)[:limit]))
        if not roots:
            return None
        sizes = dict(WorkflowRun.objects.filter(root_run_id__in=roots).order_by().values_list("root_run_id")
                     .annotate(runs=Count("pk")).values_list("root_run_id", "runs"))
        chosen: list[Any] = []
        runs = 0
        for root in roots:
            if chosen and runs + sizes.get(root, 0) > retention.RUNS_PER_BATCH:
                break
            chosen.append(root)
            runs += sizes.get(root, 0)
        if runs > retention.RUNS_PER_BATCH:
            deleted = retention.delete_tree_part(chosen[0])
        else:
            list(WorkflowRun.objects.select_for_update().filter(root_run_id__in=chosen).values_list("pk"))
            deleted = retention.delete_run_trees(chosen)
    return Progress(WorkflowRun._meta.label, deleted, done=False)


def _delete_next_rows(tenant: Tenant, limit: int) -> Progress | None:
    """At most ``limit`` rows of the first model of ``deletion_order`` that has any left."""
    for model in deletion_order():
        deleted = _delete_rows(model, tenant, limit)
        if deleted:
            return Progress(model._meta.label, deleted, done=False)
    return None


def _delete_rows(model: type[models.Model], tenant: Tenant, limit: int) -> int:
    """One statement: ``limit`` rows at most of ``model`` that belong to ``tenant``, found by an
    index that leads with the tenant (``tests/workflows/test_offboarding.py`` checks there is one)."""
    quote = connection.ops.quote_name
    table, pk = quote(model._meta.db_table), quote(str(model._meta.pk.column))
    fields = tenant_foreign_keys(model)
    owned = " OR ".join(f"{quote(str(field.column))} = %s" for field in fields)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE {pk} IN "  # noqa: S608 - names from the registry, quoted
                       f"(SELECT {pk} FROM {table} WHERE {owned} LIMIT %s)", [*(tenant.pk for _ in fields), limit])
        return int(cursor.rowcount)


def _forget_catalog_slug(slug: str) -> None:
    """Take ``slug`` out of every catalog entry's ``tenants``: a tenant created later with the same
    slug is another customer."""
    for entry in TaskCatalogEntry.objects.filter(tenants__contains=[slug]):
        entry.tenants = [name for name in entry.tenants if name != slug]
        entry.save(update_fields=["tenants", "updated_at"])


def _delete_tenant_row(tenant: Tenant) -> bool:
    """Delete the tenant row (one statement: no collection of its rows). Whether it is gone; not
    while a row written behind the purge still points at it (the database refuses at the commit)."""
    try:
        with transaction.atomic():
            Tenant.objects.filter(pk=tenant.pk, status=Tenant.Status.DELETING)._raw_delete(connection.alias)
    except IntegrityError:
        log.warning("tenant_purge_rows_left", tenant_id=str(tenant.pk), tenant=tenant.slug)
        return False
    log.info("tenant_deleted", tenant_id=str(tenant.pk), tenant=tenant.slug)
    return True


def purge_deleting_tenants(*, budget_s: float = PASS_BUDGET_S, rest: float = REST_PER_BATCH,
                           tenants_per_pass: int = TENANTS_PER_PASS) -> int:
    """The coordinator's housekeeper: one batch of each tenant being deleted (the longest waiting
    first), in turn, while one has more and ``budget_s`` lasts (one round at least); how many rows.
    A batch that raises is logged and its tenant left to the next pass."""
    def one_batch(tenant: Tenant) -> tuple[int, bool, float]:
        try:
            progress = purge_batch(tenant)
        except Exception:
            # One tenant's failing batch (a shard away) must not stop the others' purges, nor
            # the coordinator's other housekeepers: it is tried again next pass.
            log.exception("tenant_purge_batch_failed", tenant_id=str(tenant.pk), tenant=tenant.slug)
            return 0, False, 0.0
        log.info("tenant_purge_batch", tenant_id=str(tenant.pk), tenant=tenant.slug, stage=progress.stage,
                 deleted=progress.deleted, batch_ms=round(progress.seconds * 1000, 1))
        return progress.deleted, not progress.done, progress.seconds

    waiting = Tenant.objects.filter(status=Tenant.Status.DELETING).order_by("updated_at", "pk")[:tenants_per_pass]
    return in_rounds(list(waiting), one_batch, budget_s=budget_s, rest=rest)
