"""The engine driven in this process, without workers: ticks, steps and the reconciler called
directly against the real PostgreSQL and Redis.

Every test is transactional, so rows commit and the fair-queue items the engine hands to
Redis on commit are really there; ``queued`` reads them back the way a dispatcher would.
"""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from django.db import OperationalError, connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from structlog.testing import capture_logs

from ductor_project.core.context import no_tenant, tenant_context
from ductor_project.core.database.wire import wire
from ductor_project.core.errors import StepErrorCode
from ductor_project.core.keys import shard_of
from ductor_project.core.redis import get_redis
from ductor_project.embedded import free_port
from scheduling import fair_queue as fq
from scheduling import services as scheduling_services
from scheduling.action_errors import RetryableActionError
from scheduling.coordinator.epoch import RedisWatch, epoch_key
from scheduling.coordinator.loop import Coordinator
from scheduling.dispatch.credits import SYSTEM_TIER
from scheduling.dispatch.handlers import ItemContext, handler_for, kind_of
from tenants import freshness
from tenants import services as tenant_services
from tenants.models import Tenant
from tenants.usage import QuotaExceeded, quota_consume, runs_this_month
from workflows import services
from workflows.actions import ActionCall, action
from workflows.engine import items, journal, reconcile, statements, steps, timers
from workflows.engine import tick as engine_tick
from workflows.models import RunEvent, StepRun, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tenant(redis_client: Any, tenant_a: tuple[Tenant, str]) -> Tenant:
    return tenant_a[0]


def put(tenant: Tenant, name: str, spec: dict[str, Any]) -> None:
    with tenant_context(tenant):
        services.workflow_put(name=name, spec=spec)


def start(tenant: Tenant, workflow: str, input: Any = None) -> WorkflowRun:
    with tenant_context(tenant):
        run, created = services.run_start(workflow=workflow, input=input or {})
    assert created
    return run


def tick(tenant: Tenant, run: WorkflowRun) -> WorkflowRun:
    with tenant_context(tenant):
        engine_tick.tick(run.pk)
        return WorkflowRun.objects.get(pk=run.pk)


def execute(tenant: Tenant, step: StepRun, item: fq.Dequeued | None = None) -> None:
    """Run a step item's handler, as a worker does once the item is dispatched (``item``, if
    given, says which connection its admission chose)."""
    ctx = ItemContext(tenant_id=str(tenant.pk), item_id=items.step_item_id(step.pk), tier="standard",
                      partition=f"step:{step.pk}", delivery=item.delivery if item else 1, waited_ms=0,
                      connection_id=item.connection_id if item else "", admitted=item.admitted if item else "")
    with tenant_context(tenant):
        steps.execute_step(ctx, {"step_id": str(step.pk)})


def by_node(tenant: Tenant, run: WorkflowRun) -> dict[str, StepRun]:
    with tenant_context(tenant):
        return {s.node_id: s for s in StepRun.objects.filter(run_id=run.pk).order_by("node_id", "attempt")}


def queued(tenant: Tenant) -> set[str]:
    """The ids of the tenant's items waiting in the fair queue (dequeued, as a dispatcher would)."""
    found: set[str] = set()
    while item := fq.dequeue(shard=shard_of(str(tenant.pk)), lease_ms=60_000):
        if item.tenant_id == str(tenant.pk):
            found.add(item.item_id)
    return found


def echo(node_id: str, input: Any, *deps: str, **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "action", "action": "echo", "input": input, "depends_on": list(deps), **extra}


# -- the monthly run quota ----------------------------------------------------------------------


def test_a_child_run_is_charged_to_the_quota_and_refused_with_quota_exceeded_once_it_is_used_up(tenant):
    tenant_services.override_set(tenant=tenant, field="monthly_run_quota", value=3)
    put(tenant, "leaf", {"nodes": [echo("say", {})]})
    put(tenant, "parent", {"nodes": [{"id": "kid", "type": "subworkflow", "workflow": "leaf"}]})
    first = tick(tenant, start(tenant, "parent"))
    with tenant_context(tenant):
        assert WorkflowRun.objects.filter(parent_run_id=first.pk).count() == 1
        assert runs_this_month() == 2  # the parent and its child

    second = tick(tenant, start(tenant, "parent"))  # the third run: the quota is used up

    kid = by_node(tenant, second)["kid"]
    assert kid.status == "failed"
    assert kid.child_run_id is None
    assert kid.error["code"] == "quota_exceeded"
    assert not kid.error["retryable"]
    assert kid.error["message"].startswith("sub-workflow 'leaf' not started: Monthly run quota of 3 runs")
    assert kid.error["details"]["limit"] == "monthly_run_quota"
    assert second.status == "failed"
    assert second.error["error"]["code"] == "quota_exceeded"
    with tenant_context(tenant):
        assert WorkflowRun.objects.filter(parent_run_id=second.pk).count() == 0  # nothing half-created
        assert WorkflowRun.objects.count() == 3
        assert runs_this_month() == 3


def test_continue_as_new_is_charged_to_the_quota_and_fails_the_run_with_quota_exceeded_once_it_is_used_up(
    tenant,
):
    tenant_services.override_set(tenant=tenant, field="monthly_run_quota", value=2)
    put(tenant, "forever", {"nodes": [{"id": "again", "type": "continue_as_new", "input": {}}]})
    first = tick(tenant, start(tenant, "forever"))
    assert first.status == "continued"
    with tenant_context(tenant):
        successor = WorkflowRun.objects.get(continued_from=first)
        assert runs_this_month() == 2

    successor = tick(tenant, successor)

    assert successor.status == "failed"
    assert successor.output is None
    assert successor.error["node"] == "again"
    assert successor.error["error"]["code"] == "quota_exceeded"
    assert successor.error["error"]["message"].startswith("no successor run started: Monthly run quota of 2 runs")
    again = by_node(tenant, successor)["again"]
    assert (again.status, again.output) == ("failed", None)
    with tenant_context(tenant):
        assert not WorkflowRun.objects.filter(continued_from=successor).exists()  # nothing half-created
        assert WorkflowRun.objects.count() == 2
        assert runs_this_month() == 2


def kid(node_id: str = "kid", workflow: str = "leaf") -> dict[str, Any]:
    return {"id": node_id, "type": "subworkflow", "workflow": workflow}


def deny_tagged(tenant: Tenant) -> None:
    """A rule that denies the routing of every step tagged ``blocked``."""
    with tenant_context(tenant):
        scheduling_services.rule_create(name="frozen", priority=1, match={"tags": ["blocked"]},
                                        action={"deny": "frozen"})


def children_and_charge(tenant: Tenant, run: WorkflowRun) -> tuple[int, int]:
    with tenant_context(tenant):
        return WorkflowRun.objects.filter(parent_run_id=run.pk).count(), runs_this_month()


@pytest.mark.parametrize("kid_first", [True, False], ids=["listed-before", "listed-after"])
def test_a_sibling_sub_workflow_of_a_node_refused_in_the_same_tick_is_neither_created_nor_charged(tenant, kid_first):
    deny_tagged(tenant)
    put(tenant, "leaf", {"nodes": [echo("say", {})]})
    siblings = [kid(), echo("blocked", {}, tags=["blocked"])]
    put(tenant, "parent", {"nodes": siblings if kid_first else siblings[::-1]})

    run = tick(tenant, start(tenant, "parent"))

    assert run.status == "failed"
    assert run.error["error"]["code"] == "routing_denied"
    assert "kid" not in by_node(tenant, run)
    assert children_and_charge(tenant, run) == (0, 1)  # the parent alone


@pytest.mark.parametrize("kid_first", [True, False], ids=["listed-before", "listed-after"])
def test_a_sibling_sub_workflow_of_a_continue_as_new_ready_in_the_same_tick_is_neither_created_nor_charged(
    tenant, kid_first,
):
    put(tenant, "leaf", {"nodes": [echo("say", {})]})
    siblings = [kid(), {"id": "again", "type": "continue_as_new", "input": {}}]
    put(tenant, "forever", {"nodes": siblings if kid_first else siblings[::-1]})

    run = tick(tenant, start(tenant, "forever"))

    assert run.status == "continued"
    assert "kid" not in by_node(tenant, run)
    assert children_and_charge(tenant, run) == (0, 2)  # the run and its successor


@pytest.mark.parametrize("good_first", [True, False], ids=["listed-before", "listed-after"])
def test_a_sub_workflow_refused_in_a_tick_leaves_its_sibling_sub_workflows_uncreated_and_uncharged(
    tenant, good_first,
):
    put(tenant, "leaf", {"nodes": [echo("say", {})]})
    siblings = [kid("good"), kid("bad", "missing")]
    put(tenant, "parent", {"nodes": siblings if good_first else siblings[::-1]})

    run = tick(tenant, start(tenant, "parent"))

    assert run.status == "failed"
    assert run.error["node"] == "bad"
    assert run.error["error"]["code"] == "unknown_workflow"
    assert "good" not in by_node(tenant, run)
    assert children_and_charge(tenant, run) == (0, 1)


def test_sibling_sub_workflows_past_the_quota_together_are_none_created_and_the_first_fails(tenant):
    tenant_services.override_set(tenant=tenant, field="monthly_run_quota", value=2)
    put(tenant, "leaf", {"nodes": [echo("say", {})]})
    put(tenant, "parent", {"nodes": [kid("one"), kid("two")]})

    run = tick(tenant, start(tenant, "parent"))  # room for one child of the two

    assert run.status == "failed"
    assert (run.error["node"], run.error["error"]["code"]) == ("one", "quota_exceeded")
    assert "two" not in by_node(tenant, run)
    assert children_and_charge(tenant, run) == (0, 1)


def test_sibling_sub_workflows_that_start_together_are_charged_together(tenant):
    put(tenant, "leaf", {"nodes": [echo("say", {})]})
    put(tenant, "parent", {"nodes": [kid("one"), echo("between", {}), kid("two")]})

    run = tick(tenant, start(tenant, "parent"))

    steps = by_node(tenant, run)
    assert [steps[n].status for n in ("one", "between", "two")] == ["waiting", "queued", "waiting"]
    assert children_and_charge(tenant, run) == (2, 3)


def test_a_start_refused_at_its_commit_by_the_quota_leaves_no_run_history_or_item(tenant):
    tenant_services.override_set(tenant=tenant, field="monthly_run_quota", value=2)
    put(tenant, "one", {"nodes": [echo("a", {"n": 1})]})
    start(tenant, "one")  # its charge answered 1 of 2: this process sees room for the next
    queued(tenant)
    with tenant_context(tenant):
        quota_consume(runs=1)  # another process takes the last run meanwhile

        # The charge goes with the run's writes and fails their COMMIT on the month's row.
        with pytest.raises(QuotaExceeded) as refused:
            services.run_start(workflow="one")

        assert refused.value.status_code == 429
        assert WorkflowRun.objects.count() == 1
        assert RunEvent.objects.exclude(run__in=WorkflowRun.objects.all()).count() == 0
        assert StepRun.objects.count() == 1
        assert runs_this_month() == 2
    assert queued(tenant) == set()


# -- a busy pool ----------------------------------------------------------------------------------


def test_a_step_whose_only_connection_is_busy_is_parked_at_dequeue_and_dispatched_once_the_slot_frees(tenant):
    with tenant_context(tenant):
        api = scheduling_services.connection_create(name="api", kind="http", max_concurrency=1,
                                                    config={"base_url": "https://api.example.com"})
        scheduling_services.pool_create(name="one", members=[scheduling_services.MemberSpec("api")])
    put(tenant, "busy", {"nodes": [echo("call", {"v": 1}, pool="one")], "output": "$nodes.call.output"})
    first_run, second_run = start(tenant, "busy"), start(tenant, "busy")
    shard = shard_of(str(tenant.pk))

    first = fq.dequeue(shard=shard, lease_ms=60_000)
    assert first is not None
    assert first.item_id == items.step_item_id(by_node(tenant, first_run)["call"].pk)
    assert (first.connection_id, first.admitted) == (str(api.pk), "round robin: turn 1")
    # The second run's step is not handed out to wait on a worker: it is parked, due, holding nothing.
    assert fq.dequeue(shard=shard, lease_ms=60_000) is None
    stats = fq.stats(tenant)
    assert (stats.backlog, stats.due, stats.in_flight) == (1, 1, 1)
    step = by_node(tenant, second_run)["call"]
    assert step.status == "queued"
    assert step.routing["pool"]["name"] == "one"
    assert step.routing["connection"] is None  # chosen at admission, not by the tick

    execute(tenant, by_node(tenant, first_run)["call"], first)
    assert fq.ack(first.item_id, delivery=first.delivery, tenant=tenant)  # the slot frees: the step wakes
    second = fq.dequeue(shard=shard, lease_ms=60_000)
    assert second is not None
    assert second.item_id == items.step_item_id(step.pk)
    assert (second.connection_id, second.attempt) == (str(api.pk), 1)  # its first and only delivery
    execute(tenant, step, second)
    step = by_node(tenant, second_run)["call"]
    assert step.status == "succeeded"
    assert (step.routing["connection"]["name"], step.routing["admitted"]) == ("api", "round robin: turn 2")
    run = tick(tenant, second_run)
    assert (run.status, run.output) == ("succeeded", {"v": 1})


def test_a_sleep_that_ended_has_its_end_as_iso_8601_in_its_output(tenant):
    put(tenant, "nap", {"nodes": [{"id": "nap", "type": "sleep", "until": "2026-01-01T09:00:00+01:00"}]})
    run = tick(tenant, start(tenant, "nap"))
    step = by_node(tenant, run)["nap"]

    with tenant_context(tenant):
        timers.sleep_done(str(step.pk), {})

    assert by_node(tenant, run)["nap"].output == {"slept_until": "2026-01-01T08:00:00+00:00"}
    with tenant_context(tenant):
        ends = list(RunEvent.objects.filter(run_id=run.pk, node_id="nap").order_by("seq").values_list("type", "data"))
    assert ends == [("step_sleeping", {"until": "2026-01-01T09:00:00+01:00"}),
                    ("step_succeeded", {"attempt": 1, "error": None})]  # its end is in the history too


def test_every_steps_end_in_the_history_carries_its_attempt_and_its_error_code(tenant):
    put(tenant, "leaf", {"nodes": [echo("say", {})]})
    put(tenant, "mixed", {"nodes": [
        {"id": "kid", "type": "subworkflow", "workflow": "leaf"},
        {"id": "ghost", "type": "subworkflow", "workflow": "nowhere", "depends_on": ["kid"]},
    ]})
    run = tick(tenant, start(tenant, "mixed"))
    child = tick(tenant, WorkflowRun(pk=by_node(tenant, run)["kid"].child_run_id))
    execute(tenant, by_node(tenant, child)["say"])
    run = tick(tenant, run)

    assert run.status == "failed"
    with tenant_context(tenant):
        ends = {e.node_id: (e.type, e.data) for e in RunEvent.objects.filter(
            run_id=run.pk, type__in=["step_succeeded", "step_failed"])}
    assert ends["kid"] == ("step_succeeded", {"attempt": 1, "error": None, "child_run": str(child.pk)})
    assert ends["ghost"][0] == "step_failed"
    assert ends["ghost"][1]["attempt"] == 1
    assert ends["ghost"][1]["error"] == "unknown_workflow"  # a refusal names its code, beside its reason
    assert "does not exist" in ends["ghost"][1]["reason"]


def test_a_sub_workflow_step_that_does_not_wait_has_its_end_in_the_history_with_its_child(tenant):
    put(tenant, "leaf", {"nodes": [echo("say", {})]})
    put(tenant, "fire", {"nodes": [{"id": "kid", "type": "subworkflow", "workflow": "leaf", "wait": False}]})

    run = start(tenant, "fire")

    kid = by_node(tenant, run)["kid"]
    assert (run.status, kid.status) == ("succeeded", "succeeded")
    with tenant_context(tenant):
        history = list(RunEvent.objects.filter(run_id=run.pk, node_id="kid").order_by("seq")
                       .values_list("type", "data"))
    assert history == [("child_started", {"child_run": str(kid.child_run_id)}),
                       ("step_succeeded", {"attempt": 1, "error": None, "child_run": str(kid.child_run_id)})]


# -- ContinueAsNew ----------------------------------------------------------------------------------


def test_continue_as_new_cancels_the_other_branches_steps_and_takes_their_items_out_of_the_queue(tenant):
    put(tenant, "branchy", {"nodes": [
        echo("work", {}),
        {"id": "nap", "type": "sleep", "duration_s": 600},
        {"id": "again", "type": "continue_as_new", "input": {},
         "when": {"path": "input.first", "op": "exists"}},
    ]})
    run = tick(tenant, start(tenant, "branchy", {"first": True}))

    assert run.status == "continued"
    steps = by_node(tenant, run)
    assert {node: s.status for node, s in steps.items()} == {
        "work": "cancelled", "nap": "cancelled", "again": "succeeded"}
    with tenant_context(tenant):
        successor = WorkflowRun.objects.get(continued_from=run)
    assert queued(tenant) == {items.tick_item_id(successor.pk)}  # no item of "work" is left


def test_a_step_that_a_tick_on_a_worker_starts_and_continue_as_new_cancels_leaves_no_item_in_the_queue(tenant):
    put(tenant, "branchy", {"nodes": [
        echo("first", {}),
        echo("work", {}, "first"),
        {"id": "again", "type": "continue_as_new", "input": {}, "depends_on": ["first"],
         "when": {"path": "input.first", "op": "exists"}},
    ]})
    run = start(tenant, "branchy", {"first": True})
    first = by_node(tenant, run)["first"]
    assert queued(tenant) == {items.step_item_id(first.pk)}

    with fq.holding_enqueues():  # as a worker runs it: what its commit enqueues travels with the next handoff
        execute(tenant, first)

    steps = by_node(tenant, run)
    assert (steps["work"].status, steps["again"].status) == ("cancelled", "succeeded")
    with tenant_context(tenant):
        successor = WorkflowRun.objects.get(continued_from=run)
    assert queued(tenant) == {items.tick_item_id(successor.pk)}  # "work" was withdrawn, not enqueued after


@pytest.mark.parametrize("held_by", ["ceiling", "suspension"])
def test_a_cancel_ends_the_run_while_its_tenant_is_at_its_concurrency_ceiling_or_suspended(
        tenant, held_by, django_capture_on_commit_callbacks):
    """An operator stops a tenant's work by suspending it and cancelling its runs: neither the
    suspension nor a ceiling its running tasks hold keeps a cancelled run going."""
    tenant_services.override_set(tenant=tenant, field="max_concurrency", value=1)
    put(tenant, "pair", {"nodes": [echo("first", {}), echo("second", {})]})
    run = start(tenant, "pair")
    with no_tenant():
        held = fq.dequeue(shard=shard_of(str(tenant.pk)), lease_ms=60_000)
    assert held is not None  # in flight, as a task that runs for hours holds the tenant's one slot
    if held_by == "suspension":
        with django_capture_on_commit_callbacks(execute=True):
            tenant_services.tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)
        tenant.refresh_from_db()

    with tenant_context(tenant):
        services.run_cancel(run=run)

    with no_tenant():
        assert fq.dequeue(shard=shard_of(str(tenant.pk)), lease_ms=60_000, tiers=["standard"]) is None  # the tick waits
        woken = fq.dequeue(shard=shard_of(str(Tenant.system().pk)), lease_ms=60_000, tiers=[SYSTEM_TIER])
    assert woken is not None
    handler = handler_for(kind_of(woken))
    assert handler is not None
    handler(ItemContext(tenant_id=woken.tenant_id, item_id=woken.item_id, tier=woken.tier, partition=woken.partition,
                        delivery=woken.delivery, waited_ms=0), woken.payload)

    with tenant_context(tenant):
        assert WorkflowRun.objects.get(pk=run.pk).status == "cancelled"
    assert {s.status for s in by_node(tenant, run).values()} == {"cancelled"}


# The wait the next "test.asks_to_wait" asks for, as a server's Retry-After would.
HINT: list[float] = []


@action("test.asks_to_wait")
def asks_to_wait(call: ActionCall) -> Any:
    """Fails as retryable, with ``HINT`` as the server's hint of how long to wait."""
    raise RetryableActionError("busy", code=StepErrorCode.RATE_LIMITED, retry_after_s=HINT[0])


@pytest.mark.parametrize("hint", [float("inf"), 1e300, float("nan")], ids=["infinite", "past-any-date", "nan"])
def test_a_retry_hint_past_any_wait_retries_after_at_most_a_year_and_the_failure_is_kept(tenant, hint):
    HINT[:] = [hint]
    put(tenant, "hinted", {"nodes": [{"id": "call", "type": "action", "action": "test.asks_to_wait",
                                      "retry": {"max_attempts": 2, "backoff_s": 1, "jitter": False}}]})
    run = start(tenant, "hinted")

    execute(tenant, by_node(tenant, run)["call"])
    tick(tenant, run)  # a tick through the queue, as well

    with tenant_context(tenant):
        attempts = list(StepRun.objects.filter(run_id=run.pk).order_by("attempt"))
        retry = RunEvent.objects.get(run_id=run.pk, type="step_retry_scheduled")
    assert [(s.attempt, s.status) for s in attempts] == [(1, "failed"), (2, "scheduled")]
    assert attempts[0].error["code"] == "rate_limited"
    assert 1 <= retry.data["delay_s"] <= 366 * 86_400
    assert attempts[1].scheduled_for <= timezone.now() + timedelta(days=366)


@action("test.odd_details")
def odd_details(call: ActionCall) -> Any:
    """Fails as retryable, with details that JSON does not carry as they are."""
    raise RetryableActionError("odd", code=StepErrorCode.SERVER_ERROR, details={
        "at": datetime(2026, 12, 7, tzinfo=UTC), "ratio": float("inf"), "none": float("nan"), "raw": b"\x01"})


def test_an_action_error_whose_details_json_does_not_carry_is_kept_as_text_and_retried(tenant):
    put(tenant, "odd", {"nodes": [{"id": "call", "type": "action", "action": "test.odd_details",
                                   "retry": {"max_attempts": 2, "backoff_s": 1}}]})
    run = start(tenant, "odd")

    execute(tenant, by_node(tenant, run)["call"])

    with tenant_context(tenant):
        attempts = list(StepRun.objects.filter(run_id=run.pk).order_by("attempt"))
    assert [(s.attempt, s.status) for s in attempts] == [(1, "failed"), (2, "scheduled")]
    assert attempts[0].error["details"] == {"at": "2026-12-07T00:00:00+00:00", "ratio": "Infinity", "none": "NaN",
                                            "raw": "b'\\x01'"}


@action("test.cancelled_meanwhile")
def cancelled_meanwhile(call: ActionCall) -> Any:
    """Has its own run asked to cancel while it runs (as a client's cancel that comes between the
    attempt's start and its outcome), then returns."""
    run_id = call.idempotency_key.split(":")[0]
    services.run_cancel(run=WorkflowRun.objects.get(pk=run_id))
    return {"done": True}


def test_an_outcome_that_comes_after_its_run_was_asked_to_cancel_is_discarded_and_the_run_cancelled(tenant):
    put(tenant, "last", {"nodes": [echo("first", {}),
                                   {"id": "last", "type": "action", "action": "test.cancelled_meanwhile",
                                    "depends_on": ["first"]}],
                         "output": "$nodes.last.output"})
    run = start(tenant, "last")
    execute(tenant, by_node(tenant, run)["first"])

    execute(tenant, by_node(tenant, run)["last"])  # asked to cancel while it ran

    with tenant_context(tenant):
        ended = WorkflowRun.objects.get(pk=run.pk)
        history = list(RunEvent.objects.filter(run_id=run.pk, node_id__in=["", "last"]).order_by("seq")
                       .values_list("type", "node_id"))
    assert (ended.status, ended.output) == ("cancelled", None)
    assert {node_id: step.status for node_id, step in by_node(tenant, run).items()} == {
        "first": "succeeded", "last": "cancelled"}  # its result dropped, as a running step's on a cancel
    assert history[-3:] == [("cancel_requested", ""), ("step_result_discarded", "last"), ("cancelled", "")]


def test_a_sleep_that_ends_after_its_run_was_asked_to_cancel_is_cancelled_with_it(tenant):
    put(tenant, "nap", {"nodes": [{"id": "nap", "type": "sleep", "duration_s": 0.01}]})
    run = start(tenant, "nap")
    nap = by_node(tenant, run)["nap"]
    with tenant_context(tenant):
        StepRun.objects.filter(pk=nap.pk).update(scheduled_for=timezone.now() - timedelta(seconds=1))
        services.run_cancel(run=run)
        timers.sleep_done(str(nap.pk), {})  # its wake-up comes before the cancel's
    assert by_node(tenant, run)["nap"].status == "scheduled"

    assert tick(tenant, run).status == "cancelled"
    assert by_node(tenant, run)["nap"].status == "cancelled"


def test_a_run_in_a_tier_its_plan_has_lost_since_is_cancelled_through_a_tick_in_the_plans_default_tier(tenant):
    put(tenant, "nap", {"nodes": [{"id": "nap", "type": "sleep", "duration_s": 3600}]})
    with tenant_context(tenant):
        run, _ = services.run_start(workflow="nap", input={}, tier="interactive")
    tenant_services.override_set(tenant=tenant, field="allowed_tiers", value=["standard", "batch"])  # a downgrade

    with tenant_context(tenant):
        services.run_cancel(run=run)

    with no_tenant():
        ticked = fq.dequeue(shard=shard_of(str(tenant.pk)), lease_ms=60_000, tiers=["standard"])
    assert ticked is not None
    assert ticked.item_id == items.tick_item_id(run.pk)
    assert tick(tenant, run).status == "cancelled"


# A loop of two runs: the first continues as new, and its successor sleeps for an hour.
LOOP = {"nodes": [
    {"id": "again", "type": "continue_as_new", "input": {"second": True},
     "when": {"path": "input.second", "op": "exists", "value": False}},
    {"id": "nap", "type": "sleep", "duration_s": 3600},
]}


def looping(tenant: Tenant) -> tuple[WorkflowRun, WorkflowRun]:
    """A ``LOOP`` started: its first run, continued, and its successor, asleep."""
    put(tenant, "loop", LOOP)
    first = tick(tenant, start(tenant, "loop"))
    assert first.status == "continued"
    with tenant_context(tenant):
        successor = WorkflowRun.objects.get(continued_from=first.pk)
    assert tick(tenant, successor).status == "running"
    return first, successor


def test_a_cancel_of_a_run_that_continued_as_new_asks_the_active_run_of_its_chain(tenant, client_a):
    first, successor = looping(tenant)

    response = client_a.post(f"/api/v1/runs/{first.pk}/cancel")

    assert response.status_code == 200
    assert (response.json()["id"], response.json()["cancel_requested"]) == (str(successor.pk), True)
    assert tick(tenant, successor).status == "cancelled"
    with tenant_context(tenant):
        assert WorkflowRun.objects.get(pk=first.pk).status == "continued"  # its own end stands
    again = client_a.post(f"/api/v1/runs/{first.pk}/cancel")
    assert (again.status_code, again.json()["id"], again.json()["status"]) == (200, str(successor.pk), "cancelled")


def test_a_cancel_of_many_by_the_id_of_a_run_that_continued_as_new_cancels_the_active_run_of_its_chain(
    tenant, client_a
):
    first, successor = looping(tenant)

    response = client_a.post("/api/v1/runs/cancel", {"ids": [str(first.pk)]}, format="json")

    assert (response.status_code, response.json()["runs"]) == (200, [str(successor.pk)])
    assert tick(tenant, successor).status == "cancelled"


def test_another_tenant_s_loop_is_not_cancelled_by_the_id_of_its_first_run(tenant_b, client_a):
    first, successor = looping(tenant_b[0])

    alone = client_a.post(f"/api/v1/runs/{first.pk}/cancel")
    many = client_a.post("/api/v1/runs/cancel", {"ids": [str(first.pk)]}, format="json")

    assert (alone.status_code, many.status_code, many.json()["runs"]) == (404, 200, [])
    with tenant_context(tenant_b[0]):
        assert not WorkflowRun.objects.get(pk=successor.pk).cancel_requested


def test_cancelling_a_parent_cancels_the_run_its_child_continued_as(tenant):
    put(tenant, "loop", LOOP)
    put(tenant, "parent", {"nodes": [{"id": "kid", "type": "subworkflow", "workflow": "loop"}]})
    parent = tick(tenant, start(tenant, "parent"))
    child = tick(tenant, WorkflowRun(pk=by_node(tenant, parent)["kid"].child_run_id))
    assert child.status == "continued"
    with tenant_context(tenant):
        successor = WorkflowRun.objects.get(continued_from=child)
    assert tick(tenant, successor).status == "running"  # asleep: the chain's run the parent waits for

    with tenant_context(tenant):
        services.run_cancel(run=parent)
    assert tick(tenant, parent).status == "cancelled"

    successor = tick(tenant, successor)
    assert successor.cancel_requested
    assert successor.status == "cancelled"
    assert by_node(tenant, successor)["nap"].status == "cancelled"


def test_a_node_refused_as_it_starts_fails_the_run_and_nothing_after_it_starts_not_even_continue_as_new(tenant):
    put(tenant, "leaf", {"nodes": [echo("say", {})]})
    put(tenant, "loop", {"nodes": [
        {"id": "ghost", "type": "subworkflow", "workflow": "nowhere"},  # refused: unknown_workflow
        {"id": "kid", "type": "subworkflow", "workflow": "leaf"},
        {"id": "again", "type": "continue_as_new", "input": {}},
    ]})

    run = tick(tenant, start(tenant, "loop"))

    assert run.status == "failed"
    assert (run.error["node"], run.error["error"]["code"]) == ("ghost", "unknown_workflow")
    assert {node: s.status for node, s in by_node(tenant, run).items()} == {"ghost": "failed"}
    with tenant_context(tenant):
        assert WorkflowRun.objects.count() == 1  # no child, no successor
        assert runs_this_month() == 1


def test_the_run_a_chain_of_continue_as_new_ends_at_is_found_in_one_statement_however_long(tenant):
    put(tenant, "forever", {"nodes": [{"id": "again", "type": "continue_as_new", "input": {}}]})
    first = run = start(tenant, "forever")
    for _ in range(6):  # six runs continued, each as the next
        run = tick(tenant, run)
        assert run.status == "continued"
        with tenant_context(tenant):
            run = WorkflowRun.objects.get(continued_from=run)

    with tenant_context(tenant), CaptureQueriesContext(connection) as ran:
        last = statements.chain_end(first.pk)

    assert last is not None
    assert (last.pk, last.status) == (run.pk, "pending")
    assert len(ran) == 1


@pytest.mark.parametrize("kind", ["subworkflow", "continue_as_new"])
def test_a_child_or_successor_input_that_renders_null_starts_its_run_with_an_empty_input(tenant, kind):
    put(tenant, "leaf", {"nodes": [echo("say", "$input")], "output": "$nodes.say.output"})
    node = {"id": "next", "type": kind, "input": "$input.cursor",  # absent: the loop's last page, say
            "when": {"path": "input.first", "op": "exists"}}
    put(tenant, "p", {"nodes": [{**node, "workflow": "leaf"} if kind == "subworkflow" else node]})

    run = tick(tenant, start(tenant, "p", {"first": True}))

    with tenant_context(tenant):
        started = WorkflowRun.objects.get(parent_run=run) if kind == "subworkflow" else (
            WorkflowRun.objects.get(continued_from=run))
        assert not RunEvent.objects.filter(run_id=run.pk, type="tick_failed").exists()
    assert run.status == ("running" if kind == "subworkflow" else "continued")  # the tick went through
    assert started.input == {}  # as a start takes a null input


# -- the reconciler -------------------------------------------------------------------------------


def test_the_reconciler_skips_runs_whose_tick_is_waiting_and_repairs_the_oldest_first_a_batch_at_a_time(
    tenant, monkeypatch
):
    put(tenant, "one", {"nodes": [echo("a", {})]})
    waiting, lost_old, lost_new = (start(tenant, "one") for _ in range(3))
    with tenant_context(tenant):
        items.enqueue_tick(waiting)  # the other two lost theirs (a crash before the enqueue)
    long_ago = timezone.now() - timedelta(hours=1)
    for age, run in enumerate((waiting, lost_old, lost_new)):
        WorkflowRun.all_tenants.filter(pk=run.pk).update(updated_at=long_ago - timedelta(minutes=10 - age))
    monkeypatch.setattr(reconcile, "RECONCILE_BATCH", 2)

    def updated(run: WorkflowRun) -> Any:
        return WorkflowRun.all_tenants.get(pk=run.pk).updated_at

    assert reconcile.reconcile_runs() == 1  # looks at the oldest two; the waiting one is moving
    assert updated(waiting) > long_ago  # touched: the next pass looks at others first
    assert updated(lost_old) > long_ago
    assert updated(lost_new) < long_ago  # past this pass's batch
    assert reconcile.reconcile_runs() == 1
    assert reconcile.reconcile_runs() == 0
    ticks = {item for item in queued(tenant) if item.startswith("tick:")}
    assert ticks == {items.tick_item_id(run.pk) for run in (waiting, lost_old, lost_new)}


def test_idor_another_tenant_s_many_stale_runs_never_hold_up_the_repair_of_a_lost_run(tenant, tenant_b, monkeypatch):
    """A tenant's runs waiting in its backlog stay unchanged, and look stale: a pass that took the
    longest-unchanged first, every tenant's alike, spent its batches on them, and another tenant's run
    that lost its tick waited until every one of them had had its turn (a flood of a million: hours).
    Each tenant's longest-unchanged run comes first, then each one's next."""
    b = tenant_b[0]
    put(tenant, "one", {"nodes": [echo("a", {})]})
    put(b, "one", {"nodes": [echo("a", {})]})
    backlog = [start(tenant, "one") for _ in range(3)]
    lost = start(b, "one")
    with tenant_context(tenant):
        for run in backlog:
            items.enqueue_tick(run)  # waiting their turn
    long_ago = timezone.now() - timedelta(hours=1)
    WorkflowRun.all_tenants.filter(pk__in=[run.pk for run in backlog]).update(updated_at=long_ago)
    WorkflowRun.all_tenants.filter(pk=lost.pk).update(updated_at=long_ago + timedelta(minutes=30))
    monkeypatch.setattr(reconcile, "RECONCILE_BATCH", 2)

    assert reconcile.reconcile_runs() == 1

    assert fq.pending([(b, items.tick_item_id(lost.pk))]) == [True]


def test_a_pass_deals_its_turns_over_the_stale_runs_ids_alone(tenant):
    """Dealt over whole rows, each with its workflow version's spec, a backlog of 200,000 waiting runs
    spilled 120 MB to disk and took 0.75 s at every batch of a pass; the batch's runs are read by id."""
    put(tenant, "one", {"nodes": [echo("a", {})]})
    runs = [start(tenant, "one") for _ in range(2)]
    WorkflowRun.all_tenants.filter(pk__in=[run.pk for run in runs]).update(
        updated_at=timezone.now() - timedelta(hours=1))

    with CaptureQueriesContext(connection) as queries:
        assert reconcile.reconcile_runs() == 2

    dealt = [q["sql"] for q in queries.captured_queries if "ROW_NUMBER() OVER" in q["sql"].upper()]
    assert len(dealt) == 1
    chosen = dealt[0].split(" FROM ", 1)[0]
    assert '"input"' not in chosen
    assert "workflowversion" not in dealt[0]


def test_a_run_whose_rows_cannot_be_read_is_logged_and_passed_over_and_the_others_are_repaired(tenant):
    put(tenant, "one", {"nodes": [echo("a", {})]})
    poisoned, healthy = (tick(tenant, start(tenant, "one")) for _ in range(2))
    long_ago = timezone.now() - timedelta(hours=1)
    WorkflowRun.all_tenants.filter(pk__in=[poisoned.pk, healthy.pk]).update(updated_at=long_ago)
    with tenant_context(tenant), connection.cursor() as cursor:
        # A time PostgreSQL keeps and no datetime holds: reading the step back fails.
        cursor.execute("UPDATE workflows_steprun SET scheduled_for = '10000-01-01 00:00:00+00' WHERE run_id = %s",
                       [poisoned.pk])

    with capture_logs() as logs:
        assert reconcile.reconcile_runs() == 1

    assert [(line["event"], line["run_id"]) for line in logs if line["log_level"] == "error"] == [
        ("run_repair_failed", str(poisoned.pk))]
    assert items.tick_item_id(healthy.pk) in queued(tenant)
    # Touched: the next passes take the others first.
    assert WorkflowRun.all_tenants.get(pk=poisoned.pk).updated_at > long_ago


def test_after_redis_lost_its_data_every_active_run_is_repaired_at_once_with_its_steps_items(
    tenant, redis_client, monkeypatch
):
    put(tenant, "one", {"nodes": [echo("a", {})]})
    fresh = [tick(tenant, start(tenant, "one")) for _ in range(4)]  # each with a queued step
    redis_client.flushdb()  # everything the fair queue held, leases included, is gone
    monkeypatch.setattr(reconcile, "RECONCILE_BATCH", 2)

    assert reconcile.reconcile_runs() == 0  # none looks stale: they moved a moment ago
    assert reconcile.reconcile_runs(full=True) == 4  # in batches, however recent

    steps = {items.step_item_id(by_node(tenant, run)["a"].pk) for run in fresh}
    ticks = {items.tick_item_id(run.pk) for run in fresh}
    assert queued(tenant) == steps | ticks


def test_a_full_repair_walks_the_active_runs_once_by_a_cursor(tenant, redis_client, monkeypatch):
    """After Redis lost its data every active run is repaired in one pass, batch after batch: dealt in
    tenant turns, each batch sorted every run not repaired yet again (a million active runs: two
    thousand sorts of up to a million). The turns matter for the passes that take one batch; a full
    one takes them all, and walks the active runs' index from where its last batch ended."""
    put(tenant, "one", {"nodes": [echo("a", {})]})
    runs = [tick(tenant, start(tenant, "one")) for _ in range(5)]
    redis_client.flushdb()
    monkeypatch.setattr(reconcile, "RECONCILE_BATCH", 2)

    with CaptureQueriesContext(connection) as queries:
        assert reconcile.reconcile_runs(full=True) == 5

    assert not [q for q in queries.captured_queries if "ROW_NUMBER() OVER" in q["sql"].upper()]
    assert {items.tick_item_id(run.pk) for run in runs} <= queued(tenant)


def test_the_coordinator_notices_a_flush_on_its_next_pass_and_repairs_everything_then(tenant, redis_client):
    put(tenant, "one", {"nodes": [echo("a", {})]})
    runs = [tick(tenant, start(tenant, "one")) for _ in range(2)]
    coordinator = Coordinator(reconcile_every_s=3600)  # its periodic reconcile never comes
    with capture_logs() as logs:
        assert coordinator.tick()["repaired"] == 2  # the first look finds no epoch: a full repair
    # A first look at an empty Redis is a loss only if the repair found something lost: here, it did.
    assert [(line["event"], line.get("repaired")) for line in logs if "epoch" in line["event"]
            or line["event"] == "redis_data_lost"] == [("redis_data_lost", 2)]
    assert coordinator.tick()["repaired"] == 0
    assert queued(tenant)  # drained: nothing waits any more

    redis_client.flushdb()

    with capture_logs() as logs:
        assert coordinator.tick()["repaired"] == 2
    assert [line["event"] for line in logs if line["event"] == "redis_data_lost"] == ["redis_data_lost"]
    assert coordinator.tick()["repaired"] == 0
    assert queued(tenant) == {items.step_item_id(by_node(tenant, run)["a"].pk) for run in runs} | {
        items.tick_item_id(run.pk) for run in runs}


def test_a_first_start_on_an_empty_redis_with_nothing_to_repair_is_no_alarm(redis_client):
    with capture_logs() as logs:
        assert Coordinator(reconcile_every_s=3600).tick()["repaired"] == 0  # an empty Redis: a full repair
    events = [line["event"] for line in logs]
    assert "redis_epoch_set" in events
    assert "redis_data_lost" not in events
    assert [line["log_level"] for line in logs if line["event"] == "redis_epoch_set"] == ["info"]


def test_the_redis_watch_says_lost_until_the_loss_is_repaired():
    watch = RedisWatch()
    get_redis().flushdb()
    assert watch.lost() is True
    assert watch.lost() is True  # a pass that did not get to repair it does not forget it
    watch.repaired()
    assert watch.lost() is False
    get_redis().delete(epoch_key(0))
    assert watch.lost() is True
    watch.repaired()
    assert watch.lost() is False


CALLS: list[int] = []


@action("test.lose_connection")
def lose_connection(call: ActionCall) -> Any:
    """Counts its calls, then has PostgreSQL terminate this process's connection (as a failover or
    an operator would) before the engine records the outcome."""
    CALLS.append(call.attempt)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()

    def terminate() -> None:  # from another connection: a thread has its own
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        connections.close_all()

    killer = threading.Thread(target=terminate)
    killer.start()
    killer.join()
    return {"ok": True}


def test_an_outcome_is_kept_on_a_new_connection_when_the_database_dropped_it_during_the_action(tenant):
    put(tenant, "drop", {"nodes": [{"id": "a", "type": "action", "action": "test.lose_connection"}]})
    run = tick(tenant, start(tenant, "drop"))
    CALLS.clear()

    execute(tenant, by_node(tenant, run)["a"])

    step = by_node(tenant, run)["a"]
    assert (step.status, step.output, step.attempt) == ("succeeded", {"ok": True}, 1)
    assert CALLS == [1]  # the action ran once: its outcome was not lost with the connection
    with tenant_context(tenant):
        assert WorkflowRun.objects.get(pk=run.pk).status == "succeeded"


def test_an_outcome_whose_commit_went_through_before_the_connection_was_lost_is_not_recorded_twice(
        tenant, monkeypatch):
    put(tenant, "kept", {"nodes": [echo("a", {"n": 1})]})
    run = start(tenant, "kept")
    real, tries = steps.record_outcome, []

    def committed_then_lost(*args: Any, **kwargs: Any) -> None:
        tries.append(kwargs.get("again", False))
        real(*args, **kwargs)
        if len(tries) == 1:  # the COMMIT went through; its answer was lost with the connection
            raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(steps, "record_outcome", committed_then_lost)
    execute(tenant, by_node(tenant, run)["a"])

    assert tries == [False, True]  # recorded once more on a new connection, as a lost COMMIT needs
    with tenant_context(tenant):
        history = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert history.count("step_succeeded") == 1
    assert "step_result_discarded" not in history  # the first try kept it: no result came late
    assert history[-1] == "succeeded"


def test_a_late_result_of_an_attempt_that_ended_otherwise_is_still_recorded_as_discarded(tenant):
    put(tenant, "late", {"nodes": [echo("a", {"n": 1})]})
    run = start(tenant, "late")
    step = by_node(tenant, run)["a"]
    with tenant_context(tenant):
        StepRun.objects.filter(pk=step.pk).update(status="cancelled", finished_at=timezone.now())
        steps.record_outcome(step.pk, run.pk, steps.Outcome.succeeded({"n": 1}), again=True)
        history = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert history[-1] == "step_result_discarded"  # ``again`` hides only the outcome it finds kept


@action("test.overrun")
def overrun(call: ActionCall) -> Any:
    """Returns well after its node's ``timeout_s`` (0.05 s) has passed."""
    time.sleep(0.3)
    return {"late": True}


def test_an_action_that_returns_past_its_timeout_fails_with_timeout_though_its_timer_has_not_fired(tenant):
    put(tenant, "overrun", {"nodes": [{"id": "a", "type": "action", "action": "test.overrun", "timeout_s": 0.05,
                                       "retry": {"max_attempts": 2, "backoff_s": 60}}]})
    run = start(tenant, "overrun")

    execute(tenant, by_node(tenant, run)["a"])  # no worker is there to run the timeout's timer meanwhile
    run = tick(tenant, run)
    with tenant_context(tenant):
        first = StepRun.objects.get(run_id=run.pk, node_id="a", attempt=1)
        timers.step_timeout(str(first.pk), {})  # the timer, when it comes at last, changes nothing
        attempts = list(StepRun.objects.filter(run_id=run.pk).order_by("attempt").values_list(
            "attempt", "status", "output", "error__code"))
        history = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))

    assert attempts == [(1, "failed", None, "timeout"), (2, "scheduled", None, None)]  # retried as a timeout
    assert "step_succeeded" not in history
    assert history.count("step_timed_out") == 1
    assert history.index("step_timed_out") < history.index("step_result_discarded")  # its result came late
    assert run.status == "running"


CACHE_AWAY: list[Any] = []  # the test's ``settings``, whose cache the action points nowhere


@action("test.cache_goes_away")
def cache_goes_away(call: ActionCall) -> Any:
    """Returns once the shared cache's Redis can no longer be reached (an outage that begins while
    the action runs), with this process's reading of its tenant's stamp due again (as it is
    ``LOCAL_TTL_S`` after the last)."""
    settings = CACHE_AWAY[0]
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}
    freshness.forget()
    return {"ok": True}


def test_a_redis_outage_that_begins_during_the_action_is_not_taken_for_the_actions_crash(tenant, settings):
    put(tenant, "away", {"nodes": [{"id": "a", "type": "action", "action": "test.cache_goes_away"}]})
    run = start(tenant, "away")
    CACHE_AWAY[:] = [settings]

    # The outcome commits; the tick it enqueues once committed cannot be (the reconciler's to repair).
    with contextlib.suppress(redis.ConnectionError):
        execute(tenant, by_node(tenant, run)["a"])

    step = by_node(tenant, run)["a"]
    assert (step.status, step.output, step.error) == ("succeeded", {"ok": True}, None)


def test_a_timeout_set_for_an_attempt_that_began_again_since_waits_for_the_new_start_s_deadline(tenant):
    put(tenant, "again", {"nodes": [{"id": "a", "type": "action", "action": "echo", "input": {}, "timeout_s": 60}]})
    run = start(tenant, "again")
    step = by_node(tenant, run)["a"]
    with tenant_context(tenant):
        # Its first delivery began 61 s ago, and its worker died; delivered again after its lease,
        # it begins now. The timer set by the first start is the one that fires (the second coalesced).
        StepRun.objects.filter(pk=step.pk).update(status="running", started_at=timezone.now() - timedelta(seconds=61))
        assert statements.start_attempt(step.pk, None) is not None

        timers.step_timeout(str(step.pk), {})
        assert StepRun.objects.get(pk=step.pk).status == "running"  # 60 s from its new start are not over

        StepRun.objects.filter(pk=step.pk).update(started_at=timezone.now() - timedelta(seconds=61))
        timers.step_timeout(str(step.pk), {})  # its timer set again, for the new deadline, once it passed
        ended = StepRun.objects.get(pk=step.pk)
    assert (ended.status, ended.error["code"]) == ("failed", "timeout")


def test_a_child_run_past_its_subworkflow_node_s_timeout_is_cancelled_and_the_node_fails_with_timeout(tenant):
    put(tenant, "leaf", {"nodes": [echo("say", {})]})
    put(tenant, "parent", {"nodes": [{"id": "kid", "type": "subworkflow", "workflow": "leaf", "timeout_s": 60,
                                      "retry": {"max_attempts": 3}}]})
    parent = tick(tenant, start(tenant, "parent"))
    kid = by_node(tenant, parent)["kid"]
    assert (kid.status, kid.started_at is not None) == ("waiting", True)
    with tenant_context(tenant):
        timers.step_timeout(str(kid.pk), {})  # early: the child has 60 s
        assert StepRun.objects.get(pk=kid.pk).status == "waiting"
        StepRun.objects.filter(pk=kid.pk).update(started_at=timezone.now() - timedelta(seconds=61))

        timers.step_timeout(str(kid.pk), {})

        child = WorkflowRun.objects.get(pk=kid.child_run_id)
    ended = by_node(tenant, parent)["kid"]
    assert (ended.status, ended.error["code"], ended.error["retryable"]) == ("failed", "timeout", False)
    assert str(child.pk) in ended.error["message"]
    assert child.cancel_requested
    assert tick(tenant, parent).status == "failed"  # not tried again: its child was cancelled
    with tenant_context(tenant):
        engine_tick.run_cancel(str(child.pk), {})  # the wake-up its cancel sent
        assert WorkflowRun.objects.get(pk=child.pk).status == "cancelled"
    assert [s.status for s in by_node(tenant, parent).values()] == ["failed"]  # the child's end changes nothing


def test_a_child_run_that_ended_before_its_node_s_timeout_fired_is_taken_not_timed_out(tenant):
    put(tenant, "leaf", {"nodes": [echo("say", {"said": "hi"})], "output": "$nodes.say.output"})
    put(tenant, "parent", {"nodes": [{"id": "kid", "type": "subworkflow", "workflow": "leaf", "timeout_s": 60}],
                           "output": "$nodes.kid.output"})
    parent = tick(tenant, start(tenant, "parent"))
    kid = by_node(tenant, parent)["kid"]
    child = tick(tenant, WorkflowRun(pk=kid.child_run_id))
    execute(tenant, by_node(tenant, child)["say"])  # the child succeeds; its parent's tick is yet to come
    with tenant_context(tenant):
        assert WorkflowRun.objects.get(pk=child.pk).status == "succeeded"
        StepRun.objects.filter(pk=kid.pk).update(started_at=timezone.now() - timedelta(seconds=61))

        timers.step_timeout(str(kid.pk), {})  # its timer, late

        assert StepRun.objects.get(pk=kid.pk).status == "waiting"
    parent = tick(tenant, parent)
    assert (parent.status, parent.output) == ("succeeded", {"said": "hi"})
    assert by_node(tenant, parent)["kid"].status == "succeeded"


# -- ticks that skip the queue ------------------------------------------------------------------


def test_a_steps_outcome_ticks_its_run_in_the_same_transaction(tenant):
    put(tenant, "chain", {"nodes": [echo("a", {"n": 1}), echo("b", {"n": 2}, "a")]})
    run = start(tenant, "chain")  # its first tick ran in run_start: step a is queued
    assert queued(tenant) == {items.step_item_id(by_node(tenant, run)["a"].pk)}

    execute(tenant, by_node(tenant, run)["a"])

    steps = by_node(tenant, run)
    assert steps["a"].status == StepRun.Status.SUCCEEDED
    assert steps["b"].status == StepRun.Status.QUEUED  # started by the tick inside a's outcome
    assert queued(tenant) == {items.step_item_id(steps["b"].pk)}  # and no tick item to run


def test_an_inline_tick_that_fails_is_rolled_back_alone_and_goes_through_the_queue(tenant, monkeypatch):
    put(tenant, "chain", {"nodes": [echo("a", {"n": 1}), echo("b", {"n": 2}, "a")]})
    run = start(tenant, "chain")
    step = by_node(tenant, run)["a"]
    queued(tenant)

    def broken(*args: Any, **kwargs: Any) -> bool:
        StepRun.objects.filter(pk=step.pk).update(output={"written": "by the failed tick"})
        raise RuntimeError("a bug in the tick")

    monkeypatch.setattr(engine_tick, "_start_ready", broken)
    execute(tenant, step)

    steps = by_node(tenant, run)
    assert steps["a"].status == StepRun.Status.SUCCEEDED  # the outcome is kept ...
    assert steps["a"].output == {"n": 1}  # ... without what the failed tick wrote
    assert "b" not in steps
    assert queued(tenant) == {items.tick_item_id(run.pk)}  # the tick waits in the queue instead


def test_a_steps_start_and_outcome_take_three_round_trips_with_the_ticks_writes_sent_with_the_commit(tenant):
    put(tenant, "chain", {"nodes": [echo("a", {"n": 1}), echo("b", {"n": 2}, "a")]})
    run = start(tenant, "chain")
    step = by_node(tenant, run)["a"]
    queued(tenant)
    with tenant_context(tenant):
        assert WorkflowRun.objects.filter(pk=run.pk).exists()  # the session acts for the tenant

    with wire() as seen:
        execute(tenant, step)

    # The start (one UPDATE); the outcome (BEGIN, the run's lock, the attempt's end, the attempts);
    # then the tick's writes (the next attempt, the events, the run's state) with the COMMIT.
    assert seen.round_trips == 3
    assert "COMMIT" in seen.statements
    steps = by_node(tenant, run)
    assert (steps["a"].status, steps["b"].status) == (StepRun.Status.SUCCEEDED, StepRun.Status.QUEUED)


def test_a_run_s_start_takes_two_round_trips_its_row_first_writes_and_charge_sent_with_the_commit(tenant):
    put(tenant, "chain", {"nodes": [echo("a", {"n": 1}), echo("b", {"n": 2}, "a")]})
    start(tenant, "chain")  # the version's spec and the routing table are read once per process
    queued(tenant)
    sent: list[str] = []

    def record(execute: Any, sql: str, *args: Any) -> Any:
        sent.append(sql)
        return execute(sql, *args)

    with tenant_context(tenant), wire() as seen, connection.execute_wrapper(record):
        run, created = services.run_start(workflow="chain")

    # The version; then the run's row, its first attempt and its events in one statement, and the
    # quota's charge after it, with the COMMIT: the month's row is locked for the commit alone.
    assert created
    assert seen.round_trips == 2
    assert "COMMIT" in seen.statements
    assert len(sent) == 3
    assert "workflows_workflowrun" in sent[1]
    assert "tenants_monthlyusage" in sent[2]
    with tenant_context(tenant):
        assert WorkflowRun.objects.get(pk=run.pk).status == WorkflowRun.Status.RUNNING
        assert list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True)) == [
            "created", "started", "step_queued"]
    assert set(by_node(tenant, run)) == {"a"}
    assert queued(tenant) == {items.step_item_id(by_node(tenant, run)["a"].pk)}


def test_a_run_its_first_tick_finishes_is_written_finished_with_the_row_that_creates_it(tenant):
    put(tenant, "skipped", {"nodes": [{**echo("a", {"n": 1}), "when": {"path": "input.go", "op": "exists"}}]})
    run = start(tenant, "skipped")

    with tenant_context(tenant):
        stored = WorkflowRun.objects.get(pk=run.pk)
        types = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert (stored.status, stored.finished_at is not None) == (WorkflowRun.Status.SUCCEEDED, True)
    assert types == ["created", "started", "step_skipped", "succeeded"]
    assert by_node(tenant, run)["a"].status == StepRun.Status.SKIPPED


def test_a_start_that_loses_the_idempotency_key_s_race_at_the_commit_returns_the_winner_charged_once(tenant):
    put(tenant, "one", {"nodes": [echo("a", {"n": 1})]})
    with tenant_context(tenant):
        first, created = services.run_start(workflow="one", idempotency_key="k")
        used = runs_this_month()
        version = WorkflowRun.objects.select_related("workflow__definition").get(pk=first.pk).workflow
        # As a concurrent request that looked before the winner committed: its row is refused at the commit.
        again, created_again = services._start(version, input={}, idempotency_key="k", tier="standard", tags=None)
        assert (created, created_again) == (True, False)
        assert again.pk == first.pk
        assert runs_this_month() == used
        assert WorkflowRun.objects.filter(idempotency_key="k").count() == 1


def test_a_write_of_the_tick_that_fails_at_the_commit_leaves_the_outcome_recorded_alone(tenant, monkeypatch):
    put(tenant, "chain", {"nodes": [echo("a", {"n": 1}), echo("b", {"n": 2}, "a")]})
    run = start(tenant, "chain")
    step = by_node(tenant, run)["a"]
    queued(tenant)
    real, failed = journal.events_insert, []

    def fails_once(events: Any) -> tuple[str, list[Any]]:
        if not failed:
            failed.append(True)
            return "INSERT INTO workflows_runevent (seq) SELECT 1 / 0", []  # the server refuses it, at the commit
        return real(events)

    monkeypatch.setattr(journal, "events_insert", fails_once)
    execute(tenant, step)

    assert failed
    steps = by_node(tenant, run)
    assert (steps["a"].status, steps["a"].output) == (StepRun.Status.SUCCEEDED, {"n": 1})
    assert "b" not in steps  # the tick's writes went with the failed commit ...
    assert queued(tenant) == {items.tick_item_id(run.pk)}  # ... and the tick waits in the queue
    with tenant_context(tenant):
        types = list(RunEvent.objects.filter(run_id=run.pk).values_list("type", flat=True))
    assert types.count("step_succeeded") == 1  # the outcome recorded once


# -- the order of a tenant's work ---------------------------------------------------------------


def test_bulk_started_runs_steps_go_out_before_the_later_runs_first_ticks(tenant):
    """Each bulk-started run's first tick waits in the queue; a run's items carry the run's start
    as their order key, so the first run's step goes out before the second run's tick, and so on,
    not after the whole backlog of first ticks."""
    put(tenant, "one", {"nodes": [echo("a", {"x": 1})]})
    with tenant_context(tenant):
        started = services.run_start_many(runs=[{"workflow": "one"} for _ in range(4)])
    runs = [str(run.pk) for run, _ in started]
    kinds = []
    while item := fq.dequeue(shard=shard_of(str(tenant.pk)), lease_ms=60_000):
        body = item.payload
        kinds.append((body["kind"], runs.index(body["run_id"])))
        ctx = ItemContext(tenant_id=str(tenant.pk), item_id=item.item_id, tier=item.tier, partition=item.partition,
                          delivery=item.delivery, waited_ms=item.waited_ms)
        with tenant_context(tenant):
            (engine_tick.execute_tick if body["kind"] == items.TICK else steps.execute_step)(ctx, body)
            assert fq.ack(item.item_id, delivery=item.delivery, work_ms=1.0)

    assert kinds == [(kind, n) for n in range(4) for kind in (items.TICK, items.STEP)]
    with tenant_context(tenant):
        assert set(WorkflowRun.objects.filter(pk__in=runs).values_list("status", flat=True)) == {"succeeded"}


def test_a_run_is_created_when_it_starts_before_its_events_and_first_steps_though_its_row_is_written_after(
    tenant,
):
    """Its row goes with its first tick's writes at the commit: its creation time is still the time
    it started, not the commit's, so the newest-first run list shows a parent after its children."""
    put(tenant, "nest", {"nodes": [echo("a", {}), echo("b", {})]})
    run = start(tenant, "nest")
    with tenant_context(tenant):
        stored = WorkflowRun.objects.get(pk=run.pk)
        events = list(RunEvent.objects.filter(run_id=run.pk).values_list("created_at", flat=True))
        firsts = list(StepRun.objects.filter(run_id=run.pk).values_list("created_at", flat=True))
    assert stored.created_at == stored.started_at
    assert events
    assert firsts
    assert stored.created_at <= min(events)
    assert stored.created_at <= min(firsts)


def test_a_worker_without_the_step_s_action_leaves_the_step_to_another_delivery(tenant_a, monkeypatch):
    """A worker started without the action's module (its DUCTOR_ACTION_MODULES left it out) fails the
    item, not the step: the item is delivered again, and a worker that has the action runs it."""
    from workflows import actions

    tenant = tenant_a[0]
    put(tenant, "one", {"nodes": [echo("a", {"x": 1})], "output": "$nodes.a.output"})
    run = start(tenant, "one")
    step = by_node(tenant, run)["a"]
    lacking = {name: fn for name, fn in actions._registry.items() if name != "echo"}
    with monkeypatch.context() as patched:
        patched.setattr(actions, "_registry", lacking)
        with pytest.raises(steps.ActionNotRegistered, match="action 'echo' is not registered in this worker"):
            execute(tenant, step)
    assert by_node(tenant, run)["a"].status == "running"  # not failed: its item goes round again
    execute(tenant, step)  # delivered again, to a worker that has it
    assert tick(tenant, run).status == "succeeded"
