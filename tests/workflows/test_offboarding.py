"""Offboarding on the real PostgreSQL and Redis: a suspended tenant marked ``deleting`` is purged in
batches (its run trees, then every other tenant model, children first, then its Redis state, then the
tenant row), and nothing of another tenant changes; a purge stopped between batches goes on; every
model with a foreign key to ``Tenant`` is purged, whatever app adds it."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from django.apps import apps
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import models

from ductor_project.core.context import across_tenants, no_tenant, tenant_context
from ductor_project.core.keys import shard_of
from scheduling import fair_queue as fq
from scheduling.models import Connection, FairnessKey, Pool, PoolMember, Rule
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.conftest import api_client
from tests.tenants.helpers import make_user
from tests.workflows.inline import run_items
from workflows import offboarding, retention, services
from workflows.models import (
    Event,
    EventWait,
    RunSignal,
    StepRun,
    TaskCatalogEntry,
    WebhookDelivery,
    WebhookEndpoint,
    WorkflowRun,
)
from workflows.triggers.events import trigger_create
from workflows.triggers.services import schedule_create

# Also on a Redis Cluster (the cluster run): the erasure walks every shard, on every master.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.cluster]

SLEEPY = {"nodes": [{"id": "nap", "type": "sleep", "duration_s": 3600}]}
QUICK = {"nodes": [{"id": "say", "type": "action", "action": "echo", "input": {"x": 1}}]}


# --- every tenant model is purged ------------------------------------------------------------------


def _points_at(model: type[models.Model], target: type[models.Model]) -> list[models.Field[Any, Any]]:
    return [f for f in model._meta.concrete_fields if f.is_relation and f.related_model is target]


def _leads_with_tenant(model: type[models.Model]) -> bool:
    """Whether an index (or a unique constraint) of ``model`` starts with its tenant column."""
    fields = offboarding.tenant_foreign_keys(model)
    names = {f.name for f in fields} | {f.attname for f in fields}
    if any(f.db_index for f in fields):
        return True
    leading = [index.fields[0].lstrip("-") for index in model._meta.indexes if index.fields]
    leading += [c.fields[0] for c in model._meta.constraints
                if isinstance(c, models.UniqueConstraint) and c.fields and c.condition is None]
    return bool(names & set(leading))


def test_every_model_with_a_tenant_foreign_key_is_purged_children_first_each_by_an_index():
    """A model added later with a foreign key to Tenant is purged by tenant (and needs an index that
    leads with it) or with its run trees (then it must be one of ``retention.TREE_MODELS``)."""
    owned = {m for m in apps.get_models(include_auto_created=True) if _points_at(m, Tenant)}
    assert owned == set(offboarding.tenant_models())
    by_tenant = offboarding.deletion_order()
    with_runs = {WorkflowRun, *retention.TREE_MODELS}
    assert owned == set(by_tenant) | (with_runs & owned), "a tenant model the purge forgets"
    on_runs = {m for m in apps.get_models(include_auto_created=True)
               if m is not WorkflowRun and _points_at(m, WorkflowRun)}
    assert on_runs <= set(retention.TREE_MODELS), "a model pointing at runs that the tree delete leaves"
    for index, model in enumerate(by_tenant):
        assert _leads_with_tenant(model), f"{model._meta.label}: no index leads with its tenant"
        for earlier in by_tenant[:index]:
            assert not _points_at(model, earlier), f"{model._meta.label} goes after {earlier._meta.label}"


# --- a world of two tenants --------------------------------------------------------------------------


def seed(tenant: Tenant, tag: str) -> WorkflowRun:
    """A row of every kind the tenant can own, and queue state: a waiting run (its sleep's wake-up,
    its steps and history), a run in the queue, a rerun, a signal, a wait, a trigger, a schedule, an
    event, a webhook with a delivery, routing, a fairness key, an override, a member."""
    tenant_services.override_set(tenant=tenant, field="max_concurrency", value=7)
    make_user(f"member-{tag}", tenant=tenant)
    with tenant_context(tenant):
        services.workflow_put(name="nap", spec=SLEEPY)
        services.workflow_put(name="quick", spec=QUICK)
        run, _ = services.run_start(workflow="nap", input={})  # its first tick inline: a sleeping step
        services.run_start(workflow="quick", input={})  # its step waits in the queue
        services.run_rerun(run=WorkflowRun.objects.get(pk=run.pk))
        step = StepRun.objects.filter(run=run).first()
        assert step is not None
        RunSignal.objects.create(run=run, name="approved", delivered_to=step)
        EventWait.objects.create(run=run, step=step, event="paid")
        trigger_create(workflow="nap", event="paid")
        schedule_create(name="hourly", workflow="nap", interval_s=3600)
        Event.objects.create(name="paid")
        endpoint = WebhookEndpoint.objects.create(url="https://hooks.example.com", events=["run.failed"], secret="s")
        WebhookDelivery.objects.create(endpoint=endpoint, run=run, type="run.succeeded", body={})
        WebhookDelivery.objects.create(endpoint=endpoint, type="ping", body={})
        connection = Connection.objects.create(name="api", kind="http", config={"base_url": "https://a.example.com"})
        pool = Pool.objects.create(name="main")
        PoolMember.objects.create(pool=pool, connection=connection, weight=1, priority=0)
        Rule.objects.create(name="all", priority=1, action={"route_to_pool": "main"})
        FairnessKey.objects.create(key="acme", weight=2)
    return run


def rows_of(tenant: Tenant) -> Counter[str]:
    """How many rows of each tenant model belong to ``tenant``."""
    counts: Counter[str] = Counter()
    with across_tenants("test: rows of a tenant"):
        for model in offboarding.tenant_models():
            for field in offboarding.tenant_foreign_keys(model):
                found = model._base_manager.filter(**{field.attname: tenant.pk}).count()
                if found:
                    counts[model._meta.label] += found
    return counts


def redis_traces(redis_client: Any, tenant_id: str) -> list[str]:
    """Every key that names the tenant, and every member or field of another key that does (the
    per-minute work buckets, which expire on their own, aside)."""
    found = []
    for raw in redis_client.scan_iter(count=1000):
        name = raw.decode()
        if tenant_id in name:
            found.append(name)
            continue
        if ":g:fq:work:" in name:
            continue
        kind = redis_client.type(raw).decode()
        entries: list[Any] = []
        if kind == "zset":
            entries = redis_client.zrange(raw, 0, -1)
        elif kind == "set":
            entries = list(redis_client.smembers(raw))
        elif kind == "hash":
            entries = list(redis_client.hkeys(raw))
        found += [f"{name} -> {e.decode()}" for e in entries if tenant_id in e.decode()]
    return found


def tenant_keys(redis_client: Any, tenant_id: str) -> set[str]:
    return {raw.decode() for raw in redis_client.scan_iter(match=f"*{tenant_id}*", count=1000)}


@pytest.fixture
def world(redis_client: Any, make_tenant: Any, tenants_on_shard: Any, django_capture_on_commit_callbacks: Any):
    gone, gone_key = make_tenant("leaving")
    kept, kept_key = make_tenant("staying")
    seed(gone, "gone")
    seed(kept, "kept")
    TaskCatalogEntry.objects.create(name="billing.charge", tenants=["leaving", "staying"])
    with django_capture_on_commit_callbacks(execute=True):
        tenant_services.tenant_set_status(tenant=gone, status=Tenant.Status.SUSPENDED)
    return gone, gone_key, kept, kept_key


def delete(tenant: Tenant, django_capture_on_commit_callbacks: Any) -> Tenant:
    with django_capture_on_commit_callbacks(execute=True):  # the queue hears of it once committed
        return tenant_services.tenant_delete(tenant=tenant)


def purge_to_the_end(tenant: Tenant, **limits: int) -> list[offboarding.Progress]:
    done = []
    while not (done and done[-1].done):
        done.append(offboarding.purge_batch(tenant, **limits))
        assert len(done) < 500
    return done


def test_the_purge_deletes_every_row_and_redis_key_of_the_tenant_and_nothing_of_another(
    world, redis_client, django_capture_on_commit_callbacks
):
    gone, gone_key, kept, kept_key = world
    assert set(rows_of(gone)) >= {m._meta.label for m in offboarding.tenant_models()
                                  if m._meta.app_label != "scoped"}, "the seed misses a model"
    kept_rows, kept_redis = rows_of(kept), tenant_keys(redis_client, str(kept.pk))
    assert tenant_keys(redis_client, str(gone.pk))
    delete(gone, django_capture_on_commit_callbacks)

    stages = [p.stage for p in purge_to_the_end(gone)]

    assert stages[0] == "workflows.WorkflowRun"
    assert stages[-1] == "redis"
    assert not Tenant.objects.filter(pk=gone.pk).exists()
    assert rows_of(gone) == Counter()
    assert redis_traces(redis_client, str(gone.pk)) == []
    assert TaskCatalogEntry.objects.get(name="billing.charge").tenants == ["staying"]
    assert rows_of(kept) == kept_rows
    assert tenant_keys(redis_client, str(kept.pk)) == kept_redis
    assert api_client(kept_key).get("/api/v1/workflows").status_code == 200
    with tenant_context(kept):
        run, _ = services.run_start(workflow="quick", input={})
    run_items(kept)  # the queued run of before, and this one: dispatched and run
    with tenant_context(kept):
        assert WorkflowRun.objects.get(pk=run.pk).status == WorkflowRun.Status.SUCCEEDED
    assert api_client(gone_key).get("/api/v1/tenant").status_code == 401


def test_a_purge_stopped_between_batches_goes_on_from_what_is_left(world, django_capture_on_commit_callbacks):
    gone, gone_key, kept, _ = world
    kept_rows = rows_of(kept)
    delete(gone, django_capture_on_commit_callbacks)
    first = [offboarding.purge_batch(gone, roots=1, rows=1) for _ in range(4)]

    assert [p.done for p in first] == [False] * 4
    assert Tenant.objects.get(pk=gone.pk).status == Tenant.Status.DELETING
    assert rows_of(gone), "the batches are bounded: rows are left"
    assert api_client(gone_key).get("/api/v1/tenant").status_code == 401

    # A new process: nothing but the database says where the purge stood.
    while Tenant.objects.filter(pk=gone.pk).exists():
        offboarding.purge_deleting_tenants(budget_s=0, rest=0)
    assert rows_of(gone) == Counter()
    assert rows_of(kept) == kept_rows


def test_the_tenant_row_stays_while_a_row_written_behind_the_purge_points_at_it(
    world, django_capture_on_commit_callbacks
):
    gone = world[0]
    delete(gone, django_capture_on_commit_callbacks)
    purge_to_the_end(gone)
    assert not Tenant.objects.filter(pk=gone.pk).exists()

    late = Tenant.objects.create(slug="late", status=Tenant.Status.DELETING)
    with tenant_context(late):
        FairnessKey.objects.create(key="behind", weight=1)
    with tenant_context(late):
        progress = offboarding.purge_batch(late)
    assert (progress.stage, progress.done) == ("scheduling.FairnessKey", False)
    assert purge_to_the_end(late)[-1].done


def test_a_batch_that_meets_a_row_written_behind_it_changes_nothing_and_the_next_goes_on(
    world, monkeypatch, django_capture_on_commit_callbacks
):
    """As if a pool member were added between the batch's look at the members and its delete of the
    pools: the database refuses the batch at its commit."""
    gone, _, kept, _ = world
    kept_rows = rows_of(kept)
    delete(gone, django_capture_on_commit_callbacks)
    while offboarding.purge_batch(gone).stage != "scheduling.FairnessKey":
        pass
    assert rows_of(gone)["scheduling.PoolMember"] == 1
    order = offboarding.deletion_order()
    parent_first = [Pool, *(m for m in order if m is not Pool)]
    monkeypatch.setattr(offboarding, "deletion_order", lambda: parent_first)
    left = rows_of(gone)

    progress = offboarding.purge_batch(gone)

    assert (progress.stage, progress.deleted, progress.done) == ("refused", 0, False)
    assert rows_of(gone) == left
    monkeypatch.setattr(offboarding, "deletion_order", lambda: order)
    assert purge_to_the_end(gone)[-1].done
    assert rows_of(gone) == Counter()
    assert rows_of(kept) == kept_rows


def test_only_a_tenant_being_deleted_is_purged(world):
    gone = world[0]
    with pytest.raises(ValueError, match="not being deleted"):
        offboarding.purge_batch(gone)  # suspended only
    assert offboarding.purge_deleting_tenants(budget_s=0, rest=0) == 0
    assert rows_of(gone)


def test_a_tenant_being_deleted_has_nothing_dispatched_and_another_has(
    world, redis_client, django_capture_on_commit_callbacks
):
    gone, _, kept, _ = world
    delete(gone, django_capture_on_commit_callbacks)
    with tenant_context(gone):
        assert fq.stats().due >= 1  # its queued run's tick waits
    taken = []
    with no_tenant():
        while (item := fq.dequeue(shard=shard_of(str(gone.pk)), lease_ms=60_000)) is not None:
            taken.append(item.tenant_id)
    assert taken
    assert set(taken) == {str(kept.pk)}


# --- the command ------------------------------------------------------------------------------------


def test_delete_tenant_asks_for_yes_without_a_terminal_and_changes_nothing(world, capsys):
    gone = world[0]
    before = rows_of(gone)
    with pytest.raises(CommandError, match="pass --yes"):
        call_command("delete_tenant", "leaving")
    assert Tenant.objects.get(pk=gone.pk).status == Tenant.Status.SUSPENDED
    assert rows_of(gone) == before


def test_delete_tenant_refuses_an_active_tenant_and_an_unknown_one(world):
    kept = world[2]
    with pytest.raises(CommandError, match="suspend it before deleting it"):
        call_command("delete_tenant", "staying", "--yes")
    with pytest.raises(CommandError, match="No tenant 'nobody'"):
        call_command("delete_tenant", "nobody", "--yes")
    assert Tenant.objects.get(pk=kept.pk).status == Tenant.Status.ACTIVE


def test_delete_tenant_marks_and_purges_to_the_end_with_progress(world, capsys):
    gone, _, kept, _ = world
    kept_rows = rows_of(kept)
    call_command("delete_tenant", "leaving", "--yes")
    out = capsys.readouterr().out
    assert "is being deleted; purging its data." in out
    assert "workflows.WorkflowRun:" in out
    assert "Tenant leaving deleted." in out
    assert not Tenant.objects.filter(pk=gone.pk).exists()
    assert rows_of(kept) == kept_rows


def test_a_run_tree_larger_than_a_batch_is_purged_a_part_at_a_time_the_root_last(
    make_tenant, monkeypatch, django_capture_on_commit_callbacks
):
    """A loop's long ContinueAsNew chain went in one transaction, however long it was."""
    tenant, _ = make_tenant("looping")
    monkeypatch.setattr(retention, "RUNS_PER_BATCH", 2)
    with tenant_context(tenant):
        services.workflow_put(name="nap", spec=SLEEPY)
        root, _ = services.run_start(workflow="nap", input={})
        last = root
        for _ in range(4):
            last = WorkflowRun.objects.create(workflow=root.workflow, workflow_name="nap", input={},
                                              root_run_id=root.root_run_id, continued_from=last)
    with django_capture_on_commit_callbacks(execute=True):
        tenant_services.tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)
    delete(tenant, django_capture_on_commit_callbacks)

    left = []
    while (progress := offboarding.purge_batch(tenant)).stage == "workflows.WorkflowRun":
        assert progress.deleted <= 2
        with tenant_context(tenant):
            runs = WorkflowRun.objects.filter(root_run_id=root.root_run_id)
            ids = set(runs.values_list("pk", flat=True))
            assert all(p is None or p in ids for p in runs.values_list("continued_from_id", flat=True))
            left.append(len(ids))
    assert left == [3, 1, 0]
    assert purge_to_the_end(tenant)[-1].done


def test_the_purges_lines_name_the_tenant_being_deleted_by_its_tenant_id(
    world, logged, django_capture_on_commit_callbacks
):
    """An operator searching a tenant's lines by ``tenant_id`` finds its purge, batch by batch, and
    the deletion of its row."""
    gone = world[0]
    delete(gone, django_capture_on_commit_callbacks)

    while Tenant.objects.filter(pk=gone.pk).exists():
        offboarding.purge_deleting_tenants(budget_s=0, rest=0)

    lines = [line for line in logged.json() if line["event"] in ("tenant_purge_batch", "tenant_deleted")]
    assert {line["event"] for line in lines} == {"tenant_purge_batch", "tenant_deleted"}
    assert {(line["tenant_id"], line["tenant"]) for line in lines} == {(str(gone.pk), gone.slug)}


def test_a_tenant_whose_batch_fails_leaves_the_others_purged_and_the_pass_goes_on(
    world, monkeypatch, logged, django_capture_on_commit_callbacks
):
    """A batch that raises (a shard away, a row the database refuses otherwise) is logged: the other
    tenants being deleted get their batches, and the coordinator's other housekeepers their turn."""
    gone, _, kept, _ = world
    delete(gone, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        tenant_services.tenant_set_status(tenant=kept, status=Tenant.Status.SUSPENDED)
    delete(kept, django_capture_on_commit_callbacks)
    kept_rows = sum(rows_of(kept).values())
    batch = offboarding.purge_batch

    def failing(tenant: Tenant, **limits: int) -> offboarding.Progress:
        if tenant.pk == gone.pk:
            raise RuntimeError("shard away")
        return batch(tenant, **limits)

    monkeypatch.setattr(offboarding, "purge_batch", failing)

    assert offboarding.purge_deleting_tenants(budget_s=0, rest=0) > 0

    assert sum(rows_of(kept).values()) < kept_rows
    assert Tenant.objects.get(pk=gone.pk).status == Tenant.Status.DELETING
    assert [line["tenant_id"] for line in logged.json() if line["event"] == "tenant_purge_batch_failed"] == [
        str(gone.pk)]


def test_the_purge_deletes_the_cache_entries_an_earlier_release_left_under_the_cache_version_before(
    world, redis_client, django_capture_on_commit_callbacks
):
    """Before the cache held JSON (its version 2), it held pickles under version 1, some of them
    kept for ever (a routing version, a stamp): they name the tenant and go with it too."""
    from django.core.cache import cache
    from django_redis import get_redis_connection

    cache_redis = get_redis_connection("default")  # the cache's own server (not the queue's, on a cluster)
    gone, _, kept, _ = world
    old = {}
    for tenant in (gone, kept):
        with tenant_context(tenant):
            old[tenant.pk] = cache.make_key("routing:version", version=1)
        cache_redis.set(old[tenant.pk], b"\x80\x05pickled")
    delete(gone, django_capture_on_commit_callbacks)

    purge_to_the_end(gone)

    assert redis_traces(redis_client, str(gone.pk)) == []
    assert cache_redis.get(old[gone.pk]) is None
    assert cache_redis.get(old[kept.pk]) == b"\x80\x05pickled"
