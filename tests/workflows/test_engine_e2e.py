"""The workflow engine end to end: real Celery worker, dispatcher and coordinator processes.

One worker (concurrency 2), one ``manage.py run_dispatcher`` and one
``manage.py run_coordinator`` serve the whole module (starting them costs
seconds on a small machine); every test is transactional, so those processes
see its rows. The processes run with a short lease (``LEASE_MS``) so that a
SIGKILLed worker's item comes back within seconds.

Each test ends by checking that its tenants' queues drained: nothing waiting,
nothing in flight, no capacity slot held. A test that left work behind would
also leave the next test's processes busy with rows that the flush deleted.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.utils import timezone

from ductor_project.core import capacity
from ductor_project.core.context import tenant_context
from ductor_project.stack import Child
from scheduling import fair_queue as fq
from scheduling import services as scheduling_services
from tenants.models import Tenant
from tenants.usage import runs_this_month
from tests.conftest import api_client, celery_worker_child, error_code, log_lines, service_env, service_stack
from tests.waiting import wait_for
from workflows import services
from workflows.engine import items, reconcile
from workflows.engine import tick as engine_tick
from workflows.models import RunEvent, StepRun, WorkflowRun

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

LEASE_MS = 3000
TERMINAL = {str(s) for s in WorkflowRun.TERMINAL}


# -- the processes ------------------------------------------------------------------------------


class Processes:
    """The module's processes, under the product's supervisor: one worker, a dispatcher and the
    coordinator. ``stop`` ends every one that was started, whatever failed."""

    def __init__(self) -> None:
        self.stack = service_stack()

    def start(self) -> None:
        self.worker = celery_worker_child(self.stack, concurrency=2)
        self.dispatcher = self.stack.dispatcher(env=service_env())
        self.coordinator = self.stack.coordinator(env=service_env())
        self.stack.wait_ready(self.dispatcher, self.coordinator, timeout_s=60)

    def kill_worker(self) -> None:
        """SIGKILL the worker and every process it forked: no warm shutdown, no acks."""
        self.worker.kill()
        self.stack.stop(self.worker)

    def new_worker(self) -> Child:
        self.worker = celery_worker_child(self.stack, concurrency=2)
        return self.worker

    def stop(self) -> None:
        self.stack.stop_all(grace_s=20)


@contextmanager
def module_processes(**env: str) -> Iterator[Processes]:
    """A flushed Redis and the module's processes, with the short lease, JSON logs and ``env``."""
    from ductor_project.core.redis import get_redis

    get_redis().flushdb()
    # For the module's lifetime: service_env() copies os.environ into every process started.
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {"DUCTOR_LEASE_MS": str(LEASE_MS), "DUCTOR_LOG_FORMAT": "json", **env}.items():
            mp.setenv(name, value)  # JSON: log_lines() reads the processes' logs
        running = Processes()
        try:
            running.start()
            yield running
        finally:
            running.stop()


@pytest.fixture(scope="module")
def stack(django_db_setup: None) -> Iterator[Processes]:
    with module_processes() as running:
        yield running


# -- helpers ------------------------------------------------------------------------------------


def put(tenant: Tenant, name: str, spec: dict[str, Any]) -> None:
    with tenant_context(tenant):
        services.workflow_put(name=name, spec=spec)


def start(tenant: Tenant, workflow: str, input: Any = None, **kwargs: Any) -> WorkflowRun:
    with tenant_context(tenant):
        run, created = services.run_start(workflow=workflow, input=input or {}, **kwargs)
    assert created
    return run


def fresh(tenant: Tenant, run_id: Any) -> WorkflowRun:
    with tenant_context(tenant):
        return WorkflowRun.objects.get(pk=run_id)


def finished(tenant: Tenant, run_id: Any, timeout: float = 30) -> WorkflowRun:
    def done() -> WorkflowRun | None:
        run = fresh(tenant, run_id)
        return run if run.status in TERMINAL else None

    return wait_for(done, timeout=timeout, what=f"run {run_id} to finish")


def steps(tenant: Tenant, run: WorkflowRun) -> list[StepRun]:
    with tenant_context(tenant):
        return list(StepRun.objects.filter(run_id=run.pk).order_by("node_id", "attempt"))


def by_node(tenant: Tenant, run: WorkflowRun) -> dict[str, StepRun]:
    """The latest attempt of each node."""
    return {step.node_id: step for step in steps(tenant, run)}


def events(tenant: Tenant, run: WorkflowRun) -> list[RunEvent]:
    with tenant_context(tenant):
        rows = list(RunEvent.objects.filter(run_id=run.pk).order_by("seq"))
    assert [e.seq for e in rows] == list(range(1, len(rows) + 1))  # ordered, no gaps
    return rows


def status_of(tenant: Tenant, run: WorkflowRun, node_id: str) -> str | None:
    step = by_node(tenant, run).get(node_id)
    return step.status if step else None


def types(tenant: Tenant, run: WorkflowRun) -> list[str]:
    return [e.type for e in events(tenant, run)]


def in_flight(tenant: Tenant) -> int:
    with tenant_context(tenant):
        return capacity.tenant_in_flight()


def drained(*tenants: Tenant, timeout: float = 20) -> None:
    """Every tenant's queue is empty and none holds a capacity slot."""
    for tenant in tenants:
        wait_for(lambda t=tenant: (s := fq.stats(t)).backlog == 0 and s.in_flight == 0 and in_flight(t) == 0,
                 timeout=timeout, what=f"{tenant.slug}'s queue to drain")


def snapshot(tenant: Tenant, run: WorkflowRun) -> tuple[Any, ...]:
    """What a tick could change: the run's state and output, its steps and its events."""
    current = fresh(tenant, run.pk)
    step_rows = [(str(s.id), s.node_id, s.attempt, s.status, json.dumps(s.output, sort_keys=True))
                 for s in steps(tenant, run)]
    return (current.status, json.dumps(current.output, sort_keys=True), step_rows,
            [(e.seq, e.type, e.node_id) for e in events(tenant, run)])


def dispatches(stack: Processes, item_id: str) -> list[dict[str, Any]]:
    """The dispatcher's log records of each dispatch of the item (its tier and partition)."""
    return [line for line in log_lines(stack.dispatcher.output())
            if line.get("event") == "dispatched" and line.get("item_id") == item_id]


def dispatches_of(stack: Processes, item_id: str) -> int:
    return len(dispatches(stack, item_id))


def echo(node_id: str, input: Any, *deps: str, **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "action", "action": "echo", "input": input, "depends_on": list(deps), **extra}


# -- shapes -------------------------------------------------------------------------------------


def test_a_diamond_runs_each_node_once_after_its_dependencies_and_builds_the_output(stack, tenant_a):
    tenant = tenant_a[0]
    put(tenant, "diamond", {
        "nodes": [
            echo("a", {"v": "$input.v"}),
            echo("b", {"left": "$nodes.a.output.v"}, "a"),
            echo("c", {"right": "{{ $nodes.a.output.v }}!"}, "a"),
            echo("d", {"b": "$nodes.b.output", "c": "$nodes.c.output"}, "b", "c"),
        ],
        "output": {"d": "$nodes.d.output", "a_status": "$nodes.a.status"},
    })
    run = finished(tenant, start(tenant, "diamond", {"v": 7}).pk)

    assert run.status == "succeeded", run.error
    assert run.output == {"d": {"b": {"left": 7}, "c": {"right": "7!"}}, "a_status": "succeeded"}
    assert run.error is None
    assert run.started_at
    assert run.finished_at
    latest = by_node(tenant, run)
    assert len(steps(tenant, run)) == 4
    assert {(s.node_id, s.attempt, s.status) for s in latest.values()} == {
        (n, 1, "succeeded") for n in "abcd"}
    assert all(s.routing and s.started_at and s.finished_at for s in latest.values())
    for node, deps in {"b": "a", "c": "a", "d": "bc"}.items():
        assert all(latest[node].started_at >= latest[dep].finished_at for dep in deps)
    kinds = Counter(types(tenant, run))
    assert kinds == {"created": 1, "started": 1, "step_queued": 4, "step_succeeded": 4, "succeeded": 1}
    assert types(tenant, run)[:2] == ["created", "started"]
    assert types(tenant, run)[-1] == "succeeded"
    drained(tenant)


def test_a_fan_out_of_50_nodes_joins_in_one_fan_in(stack, tenant_a):
    tenant = tenant_a[0]
    fan = [f"f{n:02d}" for n in range(50)]
    put(tenant, "fan", {
        "nodes": [
            echo("src", {"base": "$input.base"}),
            *[echo(f, {"n": n, "base": "$nodes.src.output.base"}, "src") for n, f in enumerate(fan)],
            echo("join", {"all": [f"$nodes.{f}.output.n" for f in fan]}, *fan),
        ],
        "output": "$nodes.join.output.all",
    })
    run = finished(tenant, start(tenant, "fan", {"base": "x"}).pk, timeout=60)

    assert run.status == "succeeded", run.error
    assert run.output == list(range(50))
    latest = by_node(tenant, run)
    assert len(steps(tenant, run)) == 52
    assert all(s.status == "succeeded" and s.attempt == 1 for s in latest.values())
    assert all(latest[f].output == {"n": n, "base": "x"} for n, f in enumerate(fan))
    assert latest["join"].started_at >= max(latest[f].finished_at for f in fan)
    kinds = Counter(types(tenant, run))
    assert (kinds["step_queued"], kinds["step_succeeded"], kinds["succeeded"]) == (52, 52, 1)
    drained(tenant)


def test_a_false_when_skips_its_node_and_the_skip_propagates_downstream(stack, tenant_a):
    tenant = tenant_a[0]
    put(tenant, "branches", {
        "nodes": [
            echo("gate", {"go": "$input.go"}),
            echo("yes", {"took": "yes"}, "gate", when={"path": "nodes.gate.output.go", "op": "eq", "value": True}),
            echo("after_yes", {"x": 1}, "yes"),
            echo("no", {"took": "no"}, "gate", when={"path": "nodes.gate.output.go", "op": "eq", "value": False}),
            echo("join", {"x": 2}, "after_yes", "no"),
            echo("extra", {"x": 3}, "no", when={"path": "input.extra", "op": "exists"}),
        ],
        "output": {"yes": "$nodes.yes.output", "no": "$nodes.no.output", "after": "$nodes.after_yes.status",
                   "join": "$nodes.join.status"},
    })
    run = finished(tenant, start(tenant, "branches", {"go": False}).pk)

    assert run.status == "succeeded", run.error
    assert run.output == {"yes": None, "no": {"took": "no"}, "after": "skipped", "join": "skipped"}
    latest = by_node(tenant, run)
    assert {n: s.status for n, s in latest.items()} == {
        "gate": "succeeded", "yes": "skipped", "after_yes": "skipped", "no": "succeeded", "join": "skipped",
        "extra": "skipped"}
    assert all(latest[n].started_at is None and latest[n].attempt == 1 for n in ("yes", "after_yes", "join"))
    skipped = [e.node_id for e in events(tenant, run) if e.type == "step_skipped"]
    assert sorted(skipped) == ["after_yes", "extra", "join", "yes"]
    assert Counter(types(tenant, run))["step_queued"] == 2  # skipped nodes were never queued
    drained(tenant)


# -- failures -----------------------------------------------------------------------------------


def test_retry_with_exponential_backoff_succeeds_on_the_third_attempt(stack, tenant_a):
    tenant = tenant_a[0]
    put(tenant, "flaky", {
        "nodes": [{"id": "flaky", "type": "action", "action": "fail",
                   "input": {"succeed_on_attempt": 3, "message": "not yet"},
                   "retry": {"max_attempts": 5, "backoff_s": 0.3, "max_backoff_s": 5, "jitter": False}}],
        "output": "$nodes.flaky.output",
    })
    run = finished(tenant, start(tenant, "flaky").pk)

    assert run.status == "succeeded", run.error
    assert run.output == {"attempt": 3}
    attempts = steps(tenant, run)
    assert [(s.attempt, s.status) for s in attempts] == [(1, "failed"), (2, "failed"), (3, "succeeded")]
    assert all(s.error["code"] == "action_failed" and s.error["retryable"] for s in attempts[:2])
    assert attempts[2].error is None
    # Exponential: 0.3 s after the first failure, 0.6 s after the second; never early.
    for before, after, delay in ((attempts[0], attempts[1], 0.3), (attempts[1], attempts[2], 0.6)):
        assert (after.scheduled_for - before.finished_at).total_seconds() >= delay - 0.01
        assert (after.started_at - before.finished_at).total_seconds() >= delay - 0.01
    retries = [e for e in events(tenant, run) if e.type == "step_retry_scheduled"]
    assert [(e.data["attempt"], e.data["delay_s"]) for e in retries] == [(2, 0.3), (3, 0.6)]
    assert Counter(types(tenant, run))["step_failed"] == 2
    drained(tenant)


def test_a_retried_step_keeps_the_tier_and_partition_its_rule_gave_the_first_attempt(stack, tenant_a):
    tenant = tenant_a[0]
    with tenant_context(tenant):
        scheduling_services.rule_create(name="accounts-in-batch", priority=1, match={"action": "fail"},
                                        action={"tier": "batch", "partition_key": "acct-{input.account}"})
    put(tenant, "flaky-account", {
        "nodes": [{"id": "charge", "type": "action", "action": "fail",
                   "input": {"succeed_on_attempt": 2, "account": "$input.account"},
                   "retry": {"max_attempts": 2, "backoff_s": 0.2, "jitter": False}}],
    })
    run = finished(tenant, start(tenant, "flaky-account", {"account": 7}).pk)

    assert run.status == "succeeded", run.error
    attempts = steps(tenant, run)
    assert [(s.attempt, s.status) for s in attempts] == [(1, "failed"), (2, "succeeded")]
    for attempt in attempts:
        assert (attempt.routing["tier"], attempt.routing["partition_key"]) == ("batch", "acct-7")
        sent = wait_for(lambda a=attempt: dispatches(stack, items.step_item_id(a.pk)),
                        what=f"attempt {attempt.attempt}'s dispatch in the log")
        assert {(line["tier"], line["partition"]) for line in sent} == {("batch", "acct-7")}
    drained(tenant)


def test_a_step_past_its_timeout_fails_the_run_with_timeout_and_its_late_result_is_discarded(stack, tenant_a):
    tenant = tenant_a[0]
    put(tenant, "slow", {
        "nodes": [
            {"id": "slow", "type": "action", "action": "sleep_ms", "input": {"ms": 2500}, "timeout_s": 0.5,
             "retry": {"max_attempts": 1}},
            echo("after", {}, "slow"),
        ],
    })
    run = finished(tenant, start(tenant, "slow").pk)

    assert run.status == "failed"
    assert run.error["node"] == "slow"
    assert run.error["attempt"] == 1
    assert run.error["error"]["code"] == "timeout"
    slow = by_node(tenant, run)["slow"]
    assert slow.status == "failed"
    assert slow.error["code"] == "timeout"
    assert (run.finished_at - slow.started_at).total_seconds() < 2.0  # the timer, not the action, ended it
    assert "after" not in by_node(tenant, run)
    # The action finishes 2.5 s in; its result must not revive the step or the run, only be
    # recorded in the history.
    before = snapshot(tenant, run)
    wait_for(lambda: any(line.get("event") == "step_result_discarded" and line.get("step_id") == str(slow.pk)
                         for line in log_lines(stack.worker.output())),
             timeout=15, what="the late result to be discarded")
    drained(tenant)
    after = snapshot(tenant, run)
    assert after[:3] == before[:3]

    def without_discard(history: list[tuple[int, str, str]]) -> list[tuple[str, str]]:
        return [(kind, node) for _, kind, node in history if kind != "step_result_discarded"]

    assert without_discard(after[3]) == without_discard(before[3])
    assert after[3][-1][1:] == ("step_result_discarded", "slow")
    assert Counter(types(tenant, run))["step_result_discarded"] == 1
    assert Counter(types(tenant, run))["step_timed_out"] == 1
    assert "step_succeeded" not in types(tenant, run)


def test_cancelling_a_parent_cascades_to_its_waiting_child_and_is_idempotent(stack, tenant_a, client_a):
    tenant = tenant_a[0]
    put(tenant, "napper", {"nodes": [{"id": "nap", "type": "sleep", "duration_s": 120}]})
    put(tenant, "waits_for_napper", {
        "nodes": [{"id": "kid", "type": "subworkflow", "workflow": "napper", "input": {"from": "$run.id"}},
                  echo("after", {}, "kid")],
    })
    parent = start(tenant, "waits_for_napper")

    def child_sleeping() -> WorkflowRun | None:
        with tenant_context(tenant):
            child = WorkflowRun.objects.filter(parent_run_id=parent.pk).first()
            asleep = child and StepRun.objects.filter(run=child, node_id="nap", status="scheduled").exists()
        return child if asleep else None

    child = wait_for(child_sleeping, what="the child to sleep")
    assert by_node(tenant, parent)["kid"].status == "waiting"
    response = client_a.post(f"/api/v1/runs/{parent.pk}/cancel")
    assert response.status_code == 200
    assert response.json()["cancel_requested"] is True

    parent, child = finished(tenant, parent.pk), finished(tenant, child.pk)
    assert (parent.status, child.status) == ("cancelled", "cancelled")
    assert child.cancel_requested
    assert child.input == {"from": str(parent.pk)}
    assert by_node(tenant, parent)["kid"].status == "cancelled"
    assert by_node(tenant, child)["nap"].status == "cancelled"
    assert "after" not in by_node(tenant, parent)
    assert types(tenant, parent)[-2:] == ["cancel_requested", "cancelled"]
    assert types(tenant, child)[-1] == "cancelled"

    again = client_a.post(f"/api/v1/runs/{parent.pk}/cancel")
    assert again.status_code == 200
    assert again.json()["status"] == "cancelled"
    assert types(tenant, parent)[-1] == "cancelled"  # nothing recorded twice
    drained(tenant)


def test_a_run_past_its_timeout_fails_with_run_timed_out_and_cancels_its_child(stack, tenant_a):
    """The parent's spec bounds it to 2 s; its child sleeps two minutes: the coordinator's wake-up fails
    the parent and cancels the child, long before the sleep would end."""
    tenant = tenant_a[0]
    put(tenant, "napper", {"nodes": [{"id": "nap", "type": "sleep", "duration_s": 120}]})
    put(tenant, "bounded", {"timeout_s": 2, "nodes": [
        {"id": "kid", "type": "subworkflow", "workflow": "napper"}, echo("after", {}, "kid")]})
    parent = finished(tenant, start(tenant, "bounded").pk)

    assert parent.status == "failed"
    assert parent.error["node"] is None
    assert parent.error["error"]["code"] == "run_timed_out"
    assert "timeout_s of 2 s" in parent.error["error"]["message"]
    assert by_node(tenant, parent)["kid"].status == "cancelled"
    assert "after" not in by_node(tenant, parent)
    with tenant_context(tenant):
        child = WorkflowRun.objects.get(parent_run_id=parent.pk)
    child = finished(tenant, child.pk)
    assert child.status == "cancelled"
    assert by_node(tenant, child)["nap"].status == "cancelled"
    drained(tenant)


# -- pools -------------------------------------------------------------------------------------


def test_a_pool_with_max_concurrency_1_runs_4_parallel_steps_one_at_a_time_and_all_succeed(stack, tenant_a):
    tenant = tenant_a[0]
    with tenant_context(tenant):
        scheduling_services.connection_create(name="reports-api", kind="http", max_concurrency=1,
                                              config={"base_url": "https://reports.example.com"})
        scheduling_services.pool_create(name="reports", max_concurrency=1,
                                        members=[scheduling_services.MemberSpec("reports-api")])
    parts = [f"part_{n}" for n in range(4)]
    put(tenant, "report", {"nodes": [
        {"id": p, "type": "action", "action": "sleep_ms", "input": {"ms": 300}, "pool": "reports"} for p in parts]})
    run = finished(tenant, start(tenant, "report").pk)

    assert run.status == "succeeded", run.error
    latest = by_node(tenant, run)
    assert {latest[p].status for p in parts} == {"succeeded"}
    assert {latest[p].routing["connection"]["name"] for p in parts} == {"reports-api"}
    # A step is admitted once the one before it gave its slot back, after its 300 ms action.
    starts = sorted(latest[p].started_at for p in parts)
    assert all((later - earlier).total_seconds() >= 0.3 for earlier, later in itertools.pairwise(starts))
    drained(tenant)


def test_each_parked_step_of_a_full_pool_is_dispatched_once(stack, tenant_a):
    """4 steps through a pool of concurrency 1: each waits parked for the slot and is handed to
    the worker once (by a message or a handoff), never dispatched only to come back."""
    tenant = tenant_a[0]
    with tenant_context(tenant):
        scheduling_services.pool_create(name="narrow", max_concurrency=1)
    parts = [f"part_{n}" for n in range(4)]
    put(tenant, "narrowed", {"nodes": [
        {"id": p, "type": "action", "action": "sleep_ms", "input": {"ms": 100}, "pool": "narrow"} for p in parts]})
    run = finished(tenant, start(tenant, "narrowed").pk)

    assert run.status == "succeeded", run.error
    handed_out = Counter(line["item_id"] for text in (stack.dispatcher.output(), stack.worker.output())
                         for line in log_lines(text) if line.get("event") == "dispatched")
    for step in steps(tenant, run):
        assert handed_out[items.step_item_id(step.pk)] == 1, step.node_id
    drained(tenant)


def test_a_round_robin_pool_of_two_alternates_3_3_over_six_steps_and_explain_moves_no_turn(
    stack, tenant_a, client_a
):
    tenant = tenant_a[0]
    with tenant_context(tenant):
        for name in ("left", "right"):
            scheduling_services.connection_create(name=name, kind="http",
                                                  config={"base_url": f"https://{name}.example.com"})
        scheduling_services.pool_create(name="pair", members=[scheduling_services.MemberSpec("left"),
                                                              scheduling_services.MemberSpec("right")])
    put(tenant, "one-step", {"nodes": [echo("call", {}, pool="pair")]})
    used, predicted = [], []
    for _ in range(6):  # one run after the other, with dry runs between them
        for _ in range(2):
            response = client_a.post("/api/v1/routing/explain", {"workflow": "one-step", "action": "echo",
                                                                 "pool": "pair"}, format="json")
            assert response.status_code == 200
            predicted.append(response.json()["connection"]["name"])
        run = finished(tenant, start(tenant, "one-step").pk)
        assert run.status == "succeeded", run.error
        step = by_node(tenant, run)["call"]
        used.append(step.routing["connection"]["name"])
        assert step.routing["admitted"].startswith("round robin: turn ")
    assert used == ["right", "left", "right", "left", "right", "left"]
    assert Counter(used) == {"left": 3, "right": 3}
    assert predicted[1::2] == used  # what the dry run said right before is what the attempt got
    drained(tenant)


def test_a_step_longer_than_the_lease_keeps_its_pool_slot_so_the_next_step_waits(stack, tenant_a):
    tenant = tenant_a[0]
    with tenant_context(tenant):
        scheduling_services.pool_create(name="single", max_concurrency=1)
    ms = LEASE_MS + 800
    put(tenant, "two-long", {"nodes": [
        {"id": node, "type": "action", "action": "sleep_ms", "input": {"ms": ms}, "pool": "single"}
        for node in ("first", "second")]})
    run = finished(tenant, start(tenant, "two-long").pk, timeout=60)

    assert run.status == "succeeded", run.error
    earlier, later = sorted(step.started_at for step in steps(tenant, run))
    # Without renewal the first step's pool lease would end after LEASE_MS, letting the second in.
    assert (later - earlier).total_seconds() >= ms / 1000
    drained(tenant)


# -- lineage ------------------------------------------------------------------------------------


def test_sub_workflows_three_levels_deep_pass_output_up_and_a_fourth_level_is_refused_on_free(
    stack, make_tenant
):
    tenant, raw_key = make_tenant("free-nesting", plan="free")
    client = api_client(raw_key)
    put(tenant, "leaf", {"nodes": [echo("say", {"msg": "hello {{ $input.name }}"})],
                         "output": {"greeting": "$nodes.say.output.msg"}})
    put(tenant, "mid", {"nodes": [{"id": "kid", "type": "subworkflow", "workflow": "leaf",
                                   "input": {"name": "$input.name"}}],
                        "output": {"leaf": "$nodes.kid.output", "via": "mid"}})
    put(tenant, "top", {"nodes": [{"id": "kid", "type": "subworkflow", "workflow": "mid",
                                   "input": {"name": "$input.name"}}],
                        "output": {"mid": "$nodes.kid.output"}})
    put(tenant, "deeper", {"nodes": [{"id": "kid", "type": "subworkflow", "workflow": "top", "input": {}}]})
    top = start(tenant, "top", {"name": "ada"})
    deeper = start(tenant, "deeper")

    top = finished(tenant, top.pk)
    assert top.status == "succeeded", top.error
    assert top.output == {"mid": {"leaf": {"greeting": "hello ada"}, "via": "mid"}}
    with tenant_context(tenant):
        tree = list(WorkflowRun.objects.filter(root_run_id=top.pk).order_by("nesting_depth"))
    assert [(r.workflow_name, r.nesting_depth, r.status) for r in tree] == [
        ("top", 0, "succeeded"), ("mid", 1, "succeeded"), ("leaf", 2, "succeeded")]
    assert tree[1].parent_run_id == tree[0].pk
    assert tree[2].parent_run_id == tree[1].pk
    assert by_node(tenant, tree[0])["kid"].child_run_id == tree[1].pk
    lineage = client.get(f"/api/v1/runs/{tree[2].pk}/lineage").json()  # from any run of the tree
    assert lineage["root_run_id"] == str(top.pk)
    assert lineage["runs"] == 3
    (root,) = lineage["tree"]
    assert root["workflow_name"] == "top"
    assert root["children"][0]["workflow_name"] == "mid"
    assert root["children"][0]["children"][0]["workflow_name"] == "leaf"

    # deeper (0) -> top (1) -> mid (2) -> leaf would be 3: the free plan allows 2.
    deeper = finished(tenant, deeper.pk)
    assert deeper.status == "failed"
    with tenant_context(tenant):
        chain = list(WorkflowRun.objects.filter(root_run_id=deeper.pk).order_by("nesting_depth"))
    assert [(r.workflow_name, r.nesting_depth, r.status) for r in chain] == [
        ("deeper", 0, "failed"), ("top", 1, "failed"), ("mid", 2, "failed")]
    refused = by_node(tenant, chain[2])["kid"]
    assert refused.status == "failed"
    assert refused.child_run_id is None
    assert refused.error["code"] == "nesting_too_deep"
    assert not refused.error["retryable"]
    assert "nested 3 levels deep" in refused.error["message"]
    assert "allows 2" in refused.error["message"]
    assert by_node(tenant, chain[1])["kid"].error["code"] == "child_failed"
    assert chain[1].error["error"]["child_error"]["error"]["code"] == "nesting_too_deep"
    assert deeper.error["node"] == "kid"
    drained(tenant)


def test_a_continue_as_new_chain_of_5_keeps_one_root_and_links_each_run_to_the_last(stack, tenant_a, client_a):
    tenant = tenant_a[0]
    # No arithmetic in templates: the input nests one list deeper per run; the fifth run has
    # input.h.0.0.0.0, and its continuation is skipped.
    put(tenant, "looper", {
        "nodes": [
            echo("work", {"h": "$input.h"}),
            {"id": "again", "type": "continue_as_new", "depends_on": ["work"], "input": {"h": ["$input.h"]},
             "when": {"path": "input.h.0.0.0.0", "op": "exists", "value": False}},
        ],
        "output": {"h": "$nodes.work.output.h"},
    })
    first = start(tenant, "looper", {"h": []})

    def chain() -> list[WorkflowRun]:
        with tenant_context(tenant):
            return list(WorkflowRun.objects.filter(root_run_id=first.pk).order_by("created_at"))

    wait_for(lambda: len(runs := chain()) == 5 and runs[-1].status in TERMINAL, what="the fifth run to finish")
    time.sleep(0.3)  # a sixth run would appear now
    runs = chain()
    assert [r.status for r in runs] == ["continued"] * 4 + ["succeeded"]
    assert runs[-1].output == {"h": [[[[[]]]]]}
    for previous, run in itertools.pairwise(runs):
        assert run.continued_from_id == previous.pk
        assert run.root_run_id == first.pk
        assert run.input == {"h": [previous.input["h"]]}
        assert previous.output == {"continued_as": str(run.pk)}
        assert by_node(tenant, previous)["again"].output == {"run_id": str(run.pk)}
        assert types(tenant, previous)[-1] == "continued"
        assert run.parent_run_id is None
        assert run.nesting_depth == 0
    assert by_node(tenant, runs[-1])["again"].status == "skipped"

    lineage = client_a.get(f"/api/v1/runs/{runs[2].pk}/lineage").json()
    assert lineage["runs"] == 5
    assert lineage["root_run_id"] == str(first.pk)
    node, ids = lineage["tree"][0], []
    while node:
        ids.append(node["id"])
        node = node["successor"]
    assert ids == [str(r.pk) for r in runs]
    listed = client_a.get("/api/v1/runs", {"root_run_id": str(first.pk)}).json()["results"]
    assert sorted(r["id"] for r in listed) == sorted(str(r.pk) for r in runs)
    drained(tenant)


# -- idempotency --------------------------------------------------------------------------------


def test_a_duplicate_start_with_the_same_idempotency_key_returns_the_same_run_and_charges_once(
    stack, tenant_a, client_a
):
    tenant = tenant_a[0]
    put(tenant, "once", {"nodes": [echo("a", {"v": "$input.v"})], "output": "$nodes.a.output"})
    body = {"workflow": "once", "input": {"v": 1}, "idempotency_key": "order-42"}
    first = client_a.post("/api/v1/runs", body, format="json")
    second = client_a.post("/api/v1/runs", body, format="json")
    another = client_a.post("/api/v1/runs", {**body, "input": {"v": 2}}, format="json")  # the key, not the start

    assert (first.status_code, second.status_code, another.status_code) == (201, 200, 409)
    assert first.json()["id"] == second.json()["id"]
    run = finished(tenant, first.json()["id"])
    third = client_a.post("/api/v1/runs", body, format="json")
    assert third.status_code == 200
    assert third.json()["id"] == str(run.pk)
    assert third.json()["status"] == "succeeded"
    assert run.output == {"v": 1}
    with tenant_context(tenant):
        assert WorkflowRun.objects.count() == 1
        assert runs_this_month() == 1
    assert Counter(types(tenant, run))["created"] == 1
    drained(tenant)


def test_a_duplicate_tick_mid_run_or_after_the_end_changes_nothing(stack, tenant_a):
    tenant = tenant_a[0]
    put(tenant, "napping", {
        "nodes": [echo("first", {"v": 1}), {"id": "nap", "type": "sleep", "duration_s": 2.5, "depends_on": ["first"]},
                  echo("last", {"v": "$nodes.first.output.v"}, "nap")],
        "output": "$nodes.last.output",
    })
    run = start(tenant, "napping")
    item = items.tick_item_id(run.pk)

    def duplicate_tick() -> None:
        """A second delivery of the run's tick item, through the queue, plus a direct call."""
        seen = dispatches_of(stack, item)
        with tenant_context(tenant):
            fq.enqueue(item, tier=run.tier, partition=f"run:{run.pk}", payload={"kind": "tick", "run_id": str(run.pk)})
            engine_tick.tick(run.pk)
            engine_tick.tick(run.pk)
        wait_for(lambda: dispatches_of(stack, item) > seen, what="the duplicate tick to be dispatched")
        drained(tenant)

    wait_for(lambda: status_of(tenant, run, "nap") == "scheduled", what="the nap")
    during = snapshot(tenant, run)
    duplicate_tick()
    assert snapshot(tenant, run) == during  # the nap (2.5 s) is still on

    run = finished(tenant, run.pk)
    assert run.status == "succeeded"
    assert run.output == {"v": 1}
    after = snapshot(tenant, run)
    duplicate_tick()
    assert snapshot(tenant, run) == after
    assert Counter(types(tenant, run))["succeeded"] == 1
    assert len(steps(tenant, run)) == 3


# -- tenancy ------------------------------------------------------------------------------------


def test_idor_tenant_b_gets_404_on_every_run_and_workflow_of_tenant_a(stack, tenant_a, tenant_b, client_b):
    a = tenant_a[0]
    put(a, "secret", {"nodes": [echo("x", {"v": 1})]})
    put(a, "outer", {"nodes": [{"id": "kid", "type": "subworkflow", "workflow": "secret"}]})
    outer = finished(a, start(a, "outer").pk)
    with tenant_context(a):
        child = WorkflowRun.objects.get(parent_run_id=outer.pk)
    spec = {"nodes": [echo("y", {})]}

    for run_id in (outer.pk, child.pk):
        for method, path in (("get", ""), ("post", "/cancel"), ("get", "/events"), ("get", "/lineage")):
            response = getattr(client_b, method)(f"/api/v1/runs/{run_id}{path}")
            assert response.status_code == 404, (method, path)
            assert error_code(response) == "not_found"
    for response in (client_b.get("/api/v1/workflows/outer"), client_b.get("/api/v1/workflows/outer/versions"),
                     client_b.put("/api/v1/workflows/outer", {"spec": spec}, format="json")):
        assert response.status_code == 404
        assert error_code(response) == "not_found"
    assert client_b.post("/api/v1/runs", {"workflow": "outer"}, format="json").status_code == 404
    assert client_b.get("/api/v1/runs").json()["results"] == []
    assert client_b.get("/api/v1/runs", {"root_run_id": str(outer.pk)}).json()["results"] == []
    assert client_b.get("/api/v1/workflows").json()["results"] == []

    assert fresh(a, outer.pk).cancel_requested is False  # B's cancel changed nothing
    with tenant_context(a):
        from workflows.models import WorkflowDefinition

        assert WorkflowDefinition.objects.get(name="outer").latest_version == 1
    drained(a)


# -- crash safety -------------------------------------------------------------------------------


def test_after_a_redis_flush_the_coordinator_puts_back_lost_sleeps_and_retry_backoffs_at_once(stack, tenant_a):
    from ductor_project.core.redis import get_redis

    tenant = tenant_a[0]
    put(tenant, "timers", {
        "nodes": [
            {"id": "nap", "type": "sleep", "duration_s": 1.0},
            {"id": "flaky", "type": "action", "action": "fail", "input": {"succeed_on_attempt": 2},
             "retry": {"max_attempts": 2, "backoff_s": 1.0, "jitter": False}},
            echo("last", {"f": "$nodes.flaky.output"}, "nap", "flaky"),
        ],
        "output": "$nodes.last.output",
    })
    run = start(tenant, "timers")
    wait_for(lambda: status_of(tenant, run, "nap") == "scheduled" and len(steps(tenant, run)) == 3
             and status_of(tenant, run, "flaky") == "scheduled", what="the sleep and the retry backoff")
    get_redis().flushdb()  # both timers are lost with it, and the epoch key: no waiting for STALE_RUN_S

    run = finished(tenant, run.pk, timeout=reconcile.STALE_RUN_S / 2)
    assert any(line.get("event") == "redis_data_lost" for line in log_lines(stack.coordinator.output()))
    nap = by_node(tenant, run)["nap"]
    assert nap.finished_at >= nap.scheduled_for  # the sleep was put back as it was, not cut short
    assert run.status == "succeeded", run.error
    assert run.output == {"f": {"attempt": 2}}
    assert [(s.node_id, s.attempt, s.status) for s in steps(tenant, run)] == [
        ("flaky", 1, "failed"), ("flaky", 2, "succeeded"), ("last", 1, "succeeded"), ("nap", 1, "succeeded")]
    assert Counter(types(tenant, run))["succeeded"] == 1
    drained(tenant)


def test_a_run_survives_a_sigkilled_worker_mid_step_and_no_capacity_slot_leaks(stack, tenant_a):
    tenant = tenant_a[0]
    put(tenant, "crashy", {
        "nodes": [{"id": "long", "type": "action", "action": "sleep_ms", "input": {"ms": 2000}},
                  echo("after", {"long": "$nodes.long.output.ms"}, "long")],
        "output": "$nodes.after.output",
    })
    run = start(tenant, "crashy")
    wait_for(lambda: status_of(tenant, run, "long") == "running", what="the step to run")
    assert in_flight(tenant) == 1
    killed_at = timezone.now()
    stack.kill_worker()
    stack.new_worker()

    run = finished(tenant, run.pk, timeout=45)
    assert run.status == "succeeded", run.error
    assert run.output == {"long": 2000}
    latest = by_node(tenant, run)
    assert latest["long"].attempt == 1
    assert latest["long"].status == "succeeded"
    assert latest["long"].started_at > killed_at  # it ran again, on the new worker
    kinds = Counter(types(tenant, run))
    assert (kinds["step_succeeded"], kinds["succeeded"]) == (2, 1)  # finished once
    drained(tenant, timeout=30)
    assert in_flight(tenant) == 0
