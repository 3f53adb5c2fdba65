"""History retention on the real PostgreSQL: a run tree goes once every run of it ended, the last
more than the plan's ``history_retention_days`` ago, with its steps, history, signals and
deliveries; an active tree, a recent one and another tenant's longer-kept ones stay; the usage
counters stay; a tree that cannot go yet is passed over, not looked at again and again."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ductor_project.core.context import tenant_context
from tenants import services as tenant_services
from tenants.models import Tenant
from tenants.usage import runs_this_month
from workflows import retention, services
from workflows.models import RunEvent, RunSignal, StepRun, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

SLEEPY = {"nodes": [{"id": "nap", "type": "sleep", "duration_s": 3600}]}


@pytest.fixture(autouse=True)
def fresh_cursors() -> None:
    retention._tenants.after = None
    retention._root_cursor.clear()


@pytest.fixture
def tenant(redis_client: Any, tenant_a: tuple[Tenant, str]) -> Tenant:
    tenant_services.override_set(tenant=tenant_a[0], field="history_retention_days", value=1)
    with tenant_context(tenant_a[0]):
        services.workflow_put(name="nap", spec=SLEEPY)
    return tenant_a[0]


def tree(tenant: Tenant, *, ended_days_ago: float | None, children: int = 1,
         child_active: bool = False) -> WorkflowRun:
    """A root run with ``children`` child runs, each with a step, an event and a signal; ended
    ``ended_days_ago`` (None: still running), a child still running with ``child_active``."""
    with tenant_context(tenant):
        root, _ = services.run_start(workflow="nap", input={})
        for n in range(children):
            WorkflowRun.objects.create(workflow=root.workflow, workflow_name="nap", input={}, parent_run=root,
                                       root_run_id=root.root_run_id, nesting_depth=1, parent_node_id=f"c{n}")
        RunSignal.objects.create(run=root, name="approved")
        members = WorkflowRun.objects.filter(root_run_id=root.root_run_id)
        if ended_days_ago is not None:
            ended = timezone.now() - timedelta(days=ended_days_ago)
            members.update(status="succeeded", finished_at=ended)
            if child_active:
                members.exclude(pk=root.pk).filter(parent_node_id="c0").update(status="running", finished_at=None)
        return root


def runs_of(tenant: Tenant, root: WorkflowRun) -> int:
    with tenant_context(tenant):
        return WorkflowRun.objects.filter(root_run_id=root.root_run_id).count()


def test_an_ended_tree_past_its_retention_goes_with_everything_of_it_and_nothing_else(tenant, tenant_b):
    old, recent, active = (tree(tenant, ended_days_ago=3), tree(tenant, ended_days_ago=0.5),
                           tree(tenant, ended_days_ago=None))
    partly = tree(tenant, ended_days_ago=3, child_active=True)
    with tenant_context(tenant_b[0]):
        services.workflow_put(name="nap", spec=SLEEPY)
    theirs = tree(tenant_b[0], ended_days_ago=3)  # their plan keeps history longer than 3 days
    with tenant_context(tenant):
        rerun, _ = services.run_rerun(run=WorkflowRun.objects.get(pk=old.pk))
        WorkflowRun.objects.filter(pk=rerun.pk).update(status="succeeded", finished_at=timezone.now())
        used = runs_this_month()

    assert retention.expire_runs() == 2  # the old root and its child

    assert runs_of(tenant, old) == 0
    with tenant_context(tenant):
        assert not StepRun.objects.filter(run_id=old.pk).exists()
        assert not RunEvent.objects.filter(run_id=old.pk).exists()
        assert not RunSignal.objects.filter(run_id=old.pk).exists()
        assert WorkflowRun.objects.get(pk=rerun.pk).rerun_of_id is None
        assert runs_this_month() == used
    assert (runs_of(tenant, recent), runs_of(tenant, active), runs_of(tenant, partly)) == (2, 2, 2)
    assert runs_of(tenant_b[0], theirs) == 2
    assert retention.expire_runs() == 0


def test_a_tree_that_cannot_go_yet_is_passed_over_and_the_ones_after_it_go(tenant):
    stuck = tree(tenant, ended_days_ago=5, child_active=True, children=1)
    later = tree(tenant, ended_days_ago=4, children=0)

    # No time for a second batch: one batch per tenant a pass.
    assert retention.expire_runs(roots_per_batch=1, budget_s=0) == 0  # the stuck tree, looked at once
    assert retention.expire_runs(roots_per_batch=1, budget_s=0) == 1  # then the next one
    assert (runs_of(tenant, stuck), runs_of(tenant, later)) == (2, 0)


def test_a_pass_takes_batch_after_batch_while_its_budget_lasts_and_each_tenant_gets_its_turn(tenant, tenant_b):
    tenant_services.override_set(tenant=tenant_b[0], field="history_retention_days", value=1)
    with tenant_context(tenant_b[0]):
        services.workflow_put(name="nap", spec=SLEEPY)
    ours = [tree(tenant, ended_days_ago=days, children=1) for days in (5, 4, 3)]
    theirs = [tree(tenant_b[0], ended_days_ago=days, children=0) for days in (5, 4)]

    # One batch each (a tree of 2 runs, a tree of 1), then no time for more.
    assert retention.expire_runs(roots_per_batch=1, budget_s=0) == 3
    # The rest in one pass: batch after batch, the tenants in turn, until neither has more.
    assert retention.expire_runs(roots_per_batch=1) == 5
    assert [runs_of(tenant, root) for root in ours] == [0, 0, 0]
    assert [runs_of(tenant_b[0], root) for root in theirs] == [0, 0]
    assert retention.expire_runs(roots_per_batch=1) == 0


def test_a_batch_takes_trees_while_their_runs_fit_and_the_next_batch_goes_on_from_the_first_left(
    tenant, monkeypatch
):
    """A tree has no bound (its children, a loop's successors): a batch takes trees while they hold
    no more than ``RUNS_PER_BATCH`` runs together, and a tree larger than that alone a part of it,
    so that a batch of large trees is not one long transaction; the trees left are the next batch's."""
    monkeypatch.setattr(retention, "RUNS_PER_BATCH", 4, raising=False)
    roots = [tree(tenant, ended_days_ago=days, children=children) for days, children in ((5, 4), (4, 2), (3, 1))]

    # No time for a second batch: one batch a pass. 4 of the first tree's 5 runs (its children), then
    # its root and the second tree (1 + 3; the third's 2 do not fit), then the third.
    assert [retention.expire_runs(budget_s=0) for _ in range(4)] == [4, 4, 2, 0]
    assert [runs_of(tenant, root) for root in roots] == [0, 0, 0]


def test_roots_that_ended_at_the_same_moment_are_all_looked_at_across_batches(tenant):
    roots = [tree(tenant, ended_days_ago=3, children=0) for _ in range(3)]
    with tenant_context(tenant):  # one moment for all: the cursor's order falls to their ids
        WorkflowRun.objects.filter(pk__in=[root.pk for root in roots]).update(
            finished_at=timezone.now() - timedelta(days=3))

    for _ in roots:
        assert retention.expire_runs(roots_per_batch=1, budget_s=0) == 1
    assert [runs_of(tenant, root) for root in roots] == [0, 0, 0]


def test_a_tenant_s_deletion_never_reaches_another_tenant_s_tree(tenant, tenant_b):
    with tenant_context(tenant_b[0]):
        services.workflow_put(name="nap", spec=SLEEPY)
    theirs = tree(tenant_b[0], ended_days_ago=30)

    with tenant_context(tenant), transaction.atomic():  # as a batch locks: in its transaction
        assert retention._ended_trees([theirs.root_run_id], timezone.now()) == []
        assert retention.delete_run_trees([theirs.root_run_id]) == 0

    assert runs_of(tenant_b[0], theirs) == 2
    with tenant_context(tenant_b[0]):
        assert RunSignal.objects.filter(run_id=theirs.pk).exists()


def test_a_tree_whose_run_started_again_before_retention_locked_it_is_kept(tenant, monkeypatch):
    """A retry that commits between retention's first look at a tree and its lock on the tree's rows
    (as ``run_retry`` locks the run) keeps the tree: retention looks again once it holds the locks."""
    retried, other = tree(tenant, ended_days_ago=3, children=0), tree(tenant, ended_days_ago=3, children=0)
    first_look = retention._trees_ended

    def retry_lands_in_between(roots: list[Any], cutoff: Any) -> list[Any]:
        ended = first_look(roots, cutoff)
        monkeypatch.setattr(retention, "_trees_ended", first_look)  # only the first look is followed by it
        WorkflowRun.objects.filter(pk=retried.pk).update(status="running", finished_at=None)
        return ended

    monkeypatch.setattr(retention, "_trees_ended", retry_lands_in_between)

    assert retention.expire_runs() == 1

    assert (runs_of(tenant, retried), runs_of(tenant, other)) == (1, 0)


def chain(tenant: Tenant, *, length: int, ended_days_ago: float) -> WorkflowRun:
    """A root run continued as new ``length - 1`` times, each run with a step and its successor's
    ``continued_from``; all ended ``ended_days_ago``."""
    with tenant_context(tenant):
        root, _ = services.run_start(workflow="nap", input={})
        last = root
        for _ in range(length - 1):
            last = WorkflowRun.objects.create(workflow=root.workflow, workflow_name="nap", input={},
                                              root_run_id=root.root_run_id, continued_from=last)
        ended = timezone.now() - timedelta(days=ended_days_ago)
        WorkflowRun.objects.filter(root_run_id=root.root_run_id).update(status="continued", finished_at=ended)
        WorkflowRun.objects.filter(pk=last.pk).update(status="succeeded")
        return root


def parent_steps(tenant: Tenant, root: WorkflowRun) -> None:
    """A ``subworkflow`` step of the root for each of its children, pointing at it."""
    with tenant_context(tenant):
        for child in WorkflowRun.objects.filter(parent_run_id=root.pk):
            StepRun.objects.create(run=root, node_id=child.parent_node_id, node_type="subworkflow",
                                   status="succeeded", child_run=child)


def consistent(tenant: Tenant, root: WorkflowRun) -> int:
    """The runs left of ``root``'s tree, once it is checked that none of them, nor of their steps,
    points at a run that is gone, and that the root is among them while any is."""
    with tenant_context(tenant):
        left = WorkflowRun.objects.filter(root_run_id=root.root_run_id)
        ids = set(left.values_list("pk", flat=True))
        for parent, predecessor in left.values_list("parent_run_id", "continued_from_id"):
            assert parent is None or parent in ids
            assert predecessor is None or predecessor in ids
        children = StepRun.objects.filter(run_id__in=ids, child_run__isnull=False)
        assert set(children.values_list("child_run_id", flat=True)) <= ids
        assert not ids or root.pk in ids
        return len(ids)


@pytest.mark.parametrize("one_moment", [False, True], ids=["created-in-order", "created-at-one-moment"])
def test_a_tree_larger_than_a_batch_goes_in_bounded_batches_leaves_first_and_stays_whole_between_them(
    tenant, monkeypatch, one_moment
):
    """A root with thousands of children, or a loop's long ContinueAsNew chain, went in one
    transaction. It goes a batch at a time, the runs nothing else points at first (the newest: a
    child after its parent, a successor after its predecessor; the root last), so that what is left
    between two passes points at nothing deleted."""
    monkeypatch.setattr(retention, "RUNS_PER_BATCH", 2, raising=False)
    wide = tree(tenant, ended_days_ago=5, children=5)
    parent_steps(tenant, wide)
    long = chain(tenant, length=5, ended_days_ago=4)
    if one_moment:  # the newest first cannot tell them apart: the runs nothing points at are taken
        with tenant_context(tenant):
            WorkflowRun.objects.update(created_at=timezone.now() - timedelta(days=6))

    sizes = []
    for _ in range(8):  # one batch a pass
        deleted = retention.expire_runs(budget_s=0)
        assert deleted <= 2
        sizes.append((consistent(tenant, wide), consistent(tenant, long)))
    assert sizes[:3] == [(4, 5), (2, 5), (0, 5)]
    assert sizes[-1] == (0, 0)
    with tenant_context(tenant):
        assert not StepRun.objects.exists()
        assert not RunSignal.objects.exists()


def test_a_tree_being_deleted_in_batches_is_kept_once_one_of_its_runs_starts_again(tenant, monkeypatch):
    monkeypatch.setattr(retention, "RUNS_PER_BATCH", 2, raising=False)
    wide = tree(tenant, ended_days_ago=5, children=5)
    assert retention.expire_runs(budget_s=0) == 2
    with tenant_context(tenant):  # a retry of one of the runs left
        left = WorkflowRun.objects.filter(parent_run_id=wide.pk).order_by("created_at").first()
        WorkflowRun.objects.filter(pk=left.pk).update(status="running", finished_at=None)

    assert [retention.expire_runs(budget_s=0) for _ in range(3)] == [0, 0, 0]
    assert consistent(tenant, wide) == 4


def test_a_pass_costs_the_same_however_many_tenants_have_no_history_past_their_retention(tenant):
    """Each tenant a pass looked at cost its retention's read (a cache's round trips, or queries) and a
    look at its roots, whether it had old history or not: on a platform of idle tenants, a pass did
    fifty of each for nothing."""

    def a_pass() -> int:
        tree(tenant, ended_days_ago=3)
        with CaptureQueriesContext(connection) as queries:
            assert retention.expire_runs(rest=0) == 2
        return len(queries.captured_queries)

    Tenant.objects.bulk_create([Tenant(slug=f"idle-{n}", name=f"idle-{n}") for n in range(3)])
    few = a_pass()
    Tenant.objects.bulk_create([Tenant(slug=f"more-idle-{n}", name=f"more-idle-{n}") for n in range(30)])
    assert a_pass() == few


def test_the_line_of_a_retention_batch_names_the_tenant_whose_runs_went(tenant, logged):
    """An operator searching a tenant's lines by ``tenant_id`` finds the deletion of its history."""
    tree(tenant, ended_days_ago=3)

    assert retention.expire_runs() == 2

    (line,) = [line for line in logged.json() if line["event"] == "runs_expired"]
    assert (line["tenant_id"], line["tenant"], line["runs"]) == (str(tenant.pk), tenant.slug, 2)
