"""Task nodes end to end: a team's own Celery app and worker run the steps of Ductor workflows.

The team's project (``tests.teamapp``) is not Ductor: its own module, its own
Celery app instance, its own worker process, no Django (``tests.teamapp.with_sdk``
is another with ``ductor_sdk``'s worker hook). Ductor's worker,
dispatcher and coordinator serve the module, as in ``test_engine_e2e``; the
team's worker is started per test where a test kills it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings

from ductor_project.core.context import tenant_context
from ductor_project.stack import Child
from scheduling import services as scheduling_services
from scheduling.services import MemberSpec
from tenants.models import Tenant
from tests.conftest import api_client, error_code, service_env
from tests.workflows.test_engine_e2e import (
    Processes,
    by_node,
    drained,
    finished,
    fresh,
    module_processes,
    put,
    start,
    steps,
    types,
    wait_for,
)
from workflows import services
from workflows.models import TaskCatalogEntry

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# The team's queue has two slots that every tenant shares (the team's worker runs two at a time).
TEAM_SLOTS = "team=2"


def team_env() -> dict[str, str]:
    """The team's worker's environment: Ductor's broker and result backend, and nothing of Django."""
    env = {k: v for k, v in service_env().items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(TEAM_BROKER_URL=settings.CELERY_BROKER_URL, TEAM_RESULT_BACKEND=settings.CELERY_RESULT_BACKEND)
    return env


class TeamWorkers:
    def __init__(self, processes: Processes) -> None:
        self.stack = processes.stack
        self.count = 0

    def start(self, concurrency: int = 2, *, app: str = "tests.teamapp", queue: str = "team") -> Child:
        self.count += 1
        name = f"team-{os.getpid()}-{self.count}"
        worker = self.stack.worker(name, app=app, concurrency=concurrency, env=team_env(),
                                   hostname=f"{name}@localhost",
                                   extra=["-Q", queue, "--pool", "prefork", "--without-heartbeat"])
        self.stack.wait_ready(worker, timeout_s=60)
        return worker

    def kill(self, worker: Child) -> None:
        worker.kill()
        self.stack.stop(worker)


@pytest.fixture(scope="module")
def stack(django_db_setup: None) -> Iterator[Processes]:
    with module_processes(DUCTOR_TASK_QUEUE_SLOTS=TEAM_SLOTS, DUCTOR_BREAKER_FAILURES="1") as running:
        yield running


@pytest.fixture(autouse=True)
def team_slots(settings: Any) -> None:
    """This process enqueues too (a run's first tick runs in the request): the same slots."""
    settings.DUCTOR_TASK_QUEUE_SLOTS = dict([TEAM_SLOTS.split("=")])


@pytest.fixture
def team(stack: Processes) -> Iterator[TeamWorkers]:
    workers = TeamWorkers(stack)
    try:
        yield workers
    finally:
        for child in list(stack.stack.children):
            if child.name.startswith("team-"):
                stack.stack.stop(child, grace_s=10)


@pytest.fixture
def catalogued(transactional_db: None) -> Callable[..., TaskCatalogEntry]:
    def add(name: str, **fields: Any) -> TaskCatalogEntry:
        fields.setdefault("queue", "team")
        return TaskCatalogEntry.objects.create(name=name, **fields)

    return add


def task(node_id: str, name: str, input: Any = None, *deps: str, **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "task", "task": name, "input": {} if input is None else input,
            "depends_on": list(deps), **extra}


def test_two_tenants_run_team_tasks_whose_outputs_flow_on_and_which_see_their_tenant_in_the_headers(
        stack, team, catalogued, make_tenant):
    catalogued("team.add")
    catalogued("team.whoami")
    team.start()
    tenants = [make_tenant()[0], make_tenant()[0]]
    runs: list[tuple[Tenant, Any]] = []
    for n, tenant in enumerate(tenants):
        put(tenant, "sum", {"nodes": [
            task("add", "team.add", {"a": "$input.a", "b": n}),
            task("who", "team.whoami", {}, "add"),
            {"id": "out", "type": "action", "action": "echo", "input": {"sum": "$nodes.add.output.sum"},
             "depends_on": ["who"]},
        ], "output": {"sum": "$nodes.out.output.sum", "who": "$nodes.who.output"}})
        runs.append((tenant, start(tenant, "sum", {"a": 40}).pk))
    for n, (tenant, run_id) in enumerate(runs):
        run = finished(tenant, run_id)
        assert run.status == "succeeded", run.error
        assert run.output["sum"] == 40 + n
        who = run.output["who"]
        step = by_node(tenant, run)["who"]
        assert who["ductor_tenant_id"] == str(tenant.pk)
        assert who["ductor_run_id"] == str(run.pk)
        assert who["ductor_step_id"] == str(step.id)
        assert who["ductor_node_id"] == "who"
        assert int(who["ductor_attempt"]) == 1
        assert who["ductor_idempotency_key"] == f"{run.pk}:who:1"
        assert who["ductor_workflow"] == "sum"
        assert step.routing["task"]["name"] == "team.whoami"
        assert step.started_at is not None
        assert step.finished_at is not None
    drained(*tenants)


def test_a_task_that_takes_its_input_as_one_argument(stack, team, catalogued, make_tenant):
    catalogued("team.total", arguments="single", input_schema={"type": "array", "items": {"type": "integer"}})
    team.start()
    tenant = make_tenant()[0]
    put(tenant, "total", {"nodes": [task("sum", "team.total", "$input.values")],
                          "output": "$nodes.sum.output"})
    run = finished(tenant, start(tenant, "total", {"values": [1, 2, 3]}).pk)
    assert run.status == "succeeded"
    assert run.output == 6
    bad = finished(tenant, start(tenant, "total", {"values": ["x"]}).pk)
    assert bad.status == "failed"
    step = by_node(tenant, bad)["sum"]
    assert step.error["code"] == "invalid_input"
    assert step.error["field"] == "input[0]"
    drained(tenant)


def test_an_exception_in_the_task_follows_the_retry_policy_with_its_type_and_message(
        stack, team, catalogued, make_tenant):
    catalogued("team.fail")
    team.start()
    tenant = make_tenant()[0]
    put(tenant, "fails", {"nodes": [task("boom", "team.fail", {"message": "card declined"},
                                         retry={"max_attempts": 2, "backoff_s": 0.1, "jitter": False})]})
    run = finished(tenant, start(tenant, "fails").pk)
    assert run.status == "failed"
    attempts = steps(tenant, run)
    assert [(s.attempt, s.status) for s in attempts] == [(1, "failed"), (2, "failed")]
    for step in attempts:
        assert step.error["code"] == "task_failed"
        assert step.error["message"] == "ValueError: card declined"
        assert step.error["exception"]["type"] == "ValueError"
    drained(tenant)


def test_a_team_worker_killed_mid_task_is_caught_by_the_timeout_and_the_retry_runs_elsewhere(
        stack, team, catalogued, make_tenant):
    catalogued("team.slow_first")
    first = team.start(concurrency=1)
    tenant = make_tenant()[0]
    put(tenant, "slow", {"nodes": [task("slow", "team.slow_first", {"seconds": 60}, timeout_s=3,
                                        retry={"max_attempts": 2, "backoff_s": 0.1, "jitter": False})],
                         "output": "$nodes.slow.output"})
    run = start(tenant, "slow")
    wait_for(lambda: "Task team.slow_first" in first.output(), timeout=30, what="the team's worker to start the task")
    team.kill(first)
    team.start(concurrency=1)
    run = finished(tenant, run.pk, timeout=40)
    assert run.status == "succeeded"
    assert run.output == {"attempt": 2}
    attempts = steps(tenant, run)
    assert [(s.attempt, s.status, (s.error or {}).get("code")) for s in attempts] == [
        (1, "failed", "timeout"), (2, "succeeded", None)]
    assert "task 'team.slow_first' on queue 'team' within its timeout of 3 s" in attempts[0].error["message"]
    assert "step_timed_out" in types(tenant, run)
    drained(tenant)


def test_a_result_after_the_timeout_is_recorded_in_the_history_and_changes_nothing_else(
        stack, team, catalogued, make_tenant):
    catalogued("team.slow_first")
    team.start()
    tenant = make_tenant()[0]
    put(tenant, "late", {"nodes": [task("slow", "team.slow_first", {"seconds": 3}, timeout_s=1,
                                        retry={"max_attempts": 2, "backoff_s": 0.1, "jitter": False})],
                         "output": "$nodes.slow.output"})
    run = start(tenant, "late")
    run = finished(tenant, run.pk)
    assert run.status == "succeeded"
    assert run.output == {"attempt": 2}
    wait_for(lambda: "step_result_discarded" in types(tenant, run), timeout=20,
             what="the first attempt's late result")
    first, second = steps(tenant, run)
    assert (first.status, first.error["code"], first.output) == ("failed", "timeout", None)
    assert second.status == "succeeded"
    drained(tenant)


def test_a_tenant_cannot_call_a_task_outside_the_catalog_or_its_plan(stack, catalogued, make_tenant):
    catalogued("team.add", plans=["enterprise"])
    _free, free_key = make_tenant(plan="free")
    client = api_client(free_key)
    for name, why in (("team.add", "not in the task catalog"), ("team.unknown", "not in the task catalog"),
                      ("ductor.execute_item", "internal task")):
        response = client.post("/api/v1/workflows", {"name": "w", "spec": {"nodes": [task("a", name)]}},
                               format="json")
        assert response.status_code == 400, response.content
        assert error_code(response) == "invalid"
        body = response.json()["error"]
        assert why in str(body), body
        assert "nodes[0].task" in str(body)


def celery_pool(tenant: Tenant, strategy: str, queues: dict[str, str]) -> None:
    """The pool ``team`` of ``tenant``'s: a celery connection per entry of ``queues`` (its name: its
    queue), first the one of the highest priority."""
    from ductor_project.core.context import tenant_context

    with tenant_context(tenant):
        for name, queue in queues.items():
            scheduling_services.connection_create(name=name, kind="celery", config={"queue": queue})
        scheduling_services.pool_create(name="team", strategy=strategy, is_default=False,
                                        members=[MemberSpec(name, priority=n) for n, name in enumerate(queues)])


def test_a_celery_pool_balances_two_queues_round_robin(stack, team, catalogued, make_tenant):
    catalogued("team.whoami", queue="")
    tenant = make_tenant()[0]
    celery_pool(tenant, "round_robin", {"team-a": "team", "team-b": "team"})
    team.start()
    put(tenant, "rr", {"nodes": [task(f"s{i}", "team.whoami", {}, *([f"s{i - 1}"] if i else []), pool="team")
                                 for i in range(4)]})
    run = finished(tenant, start(tenant, "rr").pk)
    assert run.status == "succeeded", run.error
    chosen = [by_node(tenant, run)[f"s{i}"].routing["connection"]["name"] for i in range(4)]
    assert chosen.count("team-a") == 2
    assert chosen.count("team-b") == 2
    drained(tenant)


def test_a_failover_pool_sends_the_retry_elsewhere_once_its_first_queue_timed_out(stack, team, catalogued, make_tenant):
    """The first member's queue has no worker (its worker group is gone): the task times out, which
    opens that connection's breaker (``DUCTOR_BREAKER_FAILURES`` is 1 here), and the retry goes to
    the next member, whose workers run it."""
    catalogued("team.whoami", queue="")
    tenant = make_tenant()[0]
    celery_pool(tenant, "failover", {"gone": "team-gone", "there": "team"})
    team.start()
    put(tenant, "fo", {"nodes": [task("who", "team.whoami", {}, pool="team", timeout_s=2,
                                      retry={"max_attempts": 2, "backoff_s": 0.1, "jitter": False})]})
    run = finished(tenant, start(tenant, "fo").pk)
    assert run.status == "succeeded", run.error
    attempts = steps(tenant, run)
    assert [(s.attempt, s.status, (s.error or {}).get("code"), s.routing["connection"]["name"]) for s in attempts] == [
        (1, "failed", "timeout", "gone"), (2, "succeeded", None, "there")]
    drained(tenant)


def test_the_team_queues_slots_bound_the_tasks_in_flight_across_tenants(stack, team, catalogued, make_tenant):
    catalogued("team.slow_first")
    team.start(concurrency=4)
    tenants = [make_tenant()[0] for _ in range(3)]
    runs = []
    for tenant in tenants:
        put(tenant, "slow", {"nodes": [task("slow", "team.slow_first", {"seconds": 0.4})]})
        runs += [(tenant, start(tenant, "slow").pk) for _ in range(3)]
    for tenant, run_id in runs:
        assert finished(tenant, run_id).status == "succeeded"
    spans = sorted((s.started_at, s.finished_at)
                   for tenant, run_id in runs for s in steps(tenant, fresh(tenant, run_id)))
    most = max(sum(1 for start_, end in spans if start_ <= moment < end) for moment, _ in spans)
    assert most <= 2  # never more than the queue's slots, though the team's worker could run four
    drained(*tenants)


def test_a_teams_remote_control_reaches_its_own_workers_only(stack, team):
    from celery import Celery

    from ductor_project.celery import app

    team_worker = team.start(concurrency=1)
    teams = Celery("team-control", broker=settings.CELERY_BROKER_URL, set_as_current=False)
    try:
        # A broadcast of the team's app (``celery -A warehouse inspect ping``, or ``control shutdown``).
        theirs = {name for reply in teams.control.ping(timeout=1.0) for name in reply}
        ours = {name for reply in app.control.ping(timeout=1.0) for name in reply}
    finally:
        teams.close()
    teams_worker, ductors_worker = f"{team_worker.name}@localhost", f"{stack.worker.name}@localhost"
    assert teams_worker in theirs
    assert ductors_worker not in theirs
    assert ductors_worker in ours
    assert teams_worker not in ours


def test_a_long_task_that_heartbeats_runs_past_its_heartbeat_s(stack, team, catalogued, make_tenant):
    catalogued("team_sdk.beat", queue="team_sdk")
    team.start(app="tests.teamapp.with_sdk", queue="team_sdk")
    tenant = make_tenant()[0]
    put(tenant, "beats", {"nodes": [task("work", "team_sdk.beat", {"seconds": 3, "every_s": 0.2}, heartbeat_s=1,
                                         timeout_s=60)], "output": "$nodes.work.output"})
    run = finished(tenant, start(tenant, "beats").pk)
    assert run.status == "succeeded", run.error
    assert run.output["attempt"] == 1
    (work,) = steps(tenant, run)
    assert work.heartbeat_at is not None
    assert work.heartbeat_details["beats"] >= 1
    drained(tenant)


def test_a_stuck_task_times_out_at_its_heartbeat_s_and_its_retry_resumes_from_its_progress(
        stack, team, catalogued, make_tenant):
    """The first attempt reports three chunks done, then hangs without a heartbeat for longer than the
    whole wait here: it times out at its heartbeat_s (its timeout_s is a minute), and the retry is
    given the progress it reported."""
    catalogued("team_sdk.resume", queue="team_sdk")
    team.start(app="tests.teamapp.with_sdk", queue="team_sdk")
    tenant = make_tenant()[0]
    put(tenant, "resume", {"nodes": [task("work", "team_sdk.resume", {"chunks": 3, "hang_s": 120}, heartbeat_s=1,
                                          timeout_s=60,
                                          retry={"max_attempts": 2, "backoff_s": 0.1, "jitter": False})],
                           "output": "$nodes.work.output"})
    run = finished(tenant, start(tenant, "resume").pk)
    assert run.status == "succeeded", run.error
    assert run.output == {"attempt": 2, "resumed_from": 3, "chunks": 3}
    first, second = steps(tenant, run)
    assert (first.status, first.error["code"]) == ("failed", "timeout")
    assert "no heartbeat from the task within its heartbeat_s of 1 s" in first.error["message"]
    assert first.heartbeat_details == {"chunks": 3}
    assert second.status == "succeeded"
    drained(tenant)


def test_a_task_step_cancelled_before_its_task_started_is_discarded_unrun_by_the_team_worker(
        stack, team, catalogued, make_tenant):
    """The team's one process is busy with another run's slow task while a second run's task waits
    behind it; the second run is cancelled: its message is revoked, and the worker discards it."""
    catalogued("team.slow_first")
    catalogued("team.whoami")
    worker = team.start(concurrency=1)
    tenant = make_tenant()[0]
    put(tenant, "slow", {"nodes": [task("slow", "team.slow_first", {"seconds": 4})]})
    put(tenant, "who", {"nodes": [task("who", "team.whoami")]})
    slow = start(tenant, "slow")
    wait_for(lambda: "Task team.slow_first" in worker.output(), timeout=30, what="the slow task to start")
    waiting = start(tenant, "who")
    wait_for(lambda: by_node(tenant, fresh(tenant, waiting.pk)).get("who") is not None
             and by_node(tenant, fresh(tenant, waiting.pk))["who"].status == "running", what="its task to be sent")
    with tenant_context(tenant):
        services.run_cancel(run=fresh(tenant, waiting.pk))
    assert finished(tenant, waiting.pk).status == "cancelled"
    assert finished(tenant, slow.pk).status == "succeeded"
    (who,) = steps(tenant, fresh(tenant, waiting.pk))
    wait_for(lambda: f"Discarding revoked task: team.whoami[{who.pk}]" in worker.output(), timeout=20,
             what="the team's worker to discard the revoked task")
    assert f"Task team.whoami[{who.pk}] succeeded" not in worker.output()
    assert "step_result_discarded" not in types(tenant, fresh(tenant, waiting.pk))
    drained(tenant)


def test_a_task_that_heartbeats_is_told_its_cancelled_step_ended_and_stops(stack, team, catalogued, make_tenant):
    """The run is cancelled while its task runs: the worker its heartbeats named is told, its next
    ``heartbeat()`` raises ``StepCancelled``, and its late failure stays in the history."""
    catalogued("team_sdk.until_cancelled", queue="team_sdk")
    worker = team.start(app="tests.teamapp.with_sdk", queue="team_sdk")
    tenant = make_tenant()[0]
    put(tenant, "endless", {"nodes": [task("work", "team_sdk.until_cancelled", {"every_s": 0.1}, heartbeat_s=1,
                                           timeout_s=300)]})
    run = start(tenant, "endless")

    def beating() -> bool:
        work = by_node(tenant, fresh(tenant, run.pk)).get("work")
        return work is not None and work.heartbeat_at is not None

    wait_for(beating, timeout=30, what="its task to send heartbeats")
    with tenant_context(tenant):
        services.run_cancel(run=fresh(tenant, run.pk))
    assert finished(tenant, run.pk).status == "cancelled"
    (work,) = steps(tenant, fresh(tenant, run.pk))
    wait_for(lambda: f"team_sdk.until_cancelled[{work.pk}] raised unexpected: StepCancelled" in worker.output(),
             timeout=30, what="the task to learn that its step ended")
    wait_for(lambda: "step_result_discarded" in types(tenant, fresh(tenant, run.pk)), timeout=30,
             what="its late failure to be kept in the run's history")
    drained(tenant)
