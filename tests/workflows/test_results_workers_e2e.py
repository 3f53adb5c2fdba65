"""Results workers end to end: the outcomes of task nodes are recorded by workers of their own.

The module's processes are laid out as ``manage.py up`` lays them out (``start_workers``): one
worker of steps, of concurrency 1, on the work and system queues only, and one results worker
(``-Q ductor.results --pool solo``); a dispatcher, the coordinator, and the team's worker
(``tests.teamapp``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ductor_project.core.context import tenant_context
from ductor_project.management.commands.up import start_workers
from ductor_project.stack import Child
from tests.conftest import service_env, service_stack
from tests.workflows.test_engine_e2e import LEASE_MS, by_node, drained, finished, fresh, put, start, wait_for
from tests.workflows.test_task_nodes_e2e import TEAM_SLOTS, task, team_env
from workflows import services
from workflows.models import StepRun, TaskCatalogEntry, WorkflowRun

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

LONG_MS = 60_000  # an action that holds the steps' worker's only slot while the task steps run
SLOW_S = 5  # B's first task step: long enough for A's action to take that slot meanwhile


class Layout:
    """One worker of steps (concurrency 1), one results worker, a dispatcher, the coordinator and
    the team's worker, under one supervisor."""

    def __init__(self) -> None:
        self.stack = service_stack()

    def start(self) -> None:
        self.steps_worker, self.results_worker = start_workers(self.stack, workers=1, concurrency=1,
                                                               results_workers=1)
        name = "team-results"
        self.team: Child = self.stack.worker(name, app="tests.teamapp", concurrency=2, env=team_env(),
                                             hostname=f"{name}@localhost",
                                             extra=["-Q", "team", "--pool", "prefork", "--without-heartbeat"])
        dispatcher = self.stack.dispatcher(env=service_env())
        coordinator = self.stack.coordinator(env=service_env())
        self.stack.wait_ready(self.steps_worker, self.results_worker, self.team, dispatcher, coordinator,
                              timeout_s=60)


@pytest.fixture(scope="module")
def layout(django_db_setup: None) -> Iterator[Layout]:
    from ductor_project.core.redis import get_redis

    get_redis().flushdb()
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {"DUCTOR_LEASE_MS": str(LEASE_MS), "DUCTOR_LOG_FORMAT": "json",
                            "DUCTOR_TASK_QUEUE_SLOTS": TEAM_SLOTS}.items():
            mp.setenv(name, value)  # service_env() copies os.environ into every process started
        running = Layout()
        try:
            running.start()
            yield running
        finally:
            running.stack.stop_all(grace_s=20)


@pytest.fixture(autouse=True)
def team_slots(settings: Any) -> None:
    """This process enqueues too (a run's first tick runs in its transaction): the same slots."""
    settings.DUCTOR_TASK_QUEUE_SLOTS = dict([TEAM_SLOTS.split("=")])


def test_a_task_steps_outcome_is_recorded_while_every_slot_of_the_steps_worker_runs_a_long_action(
        layout, make_tenant):
    """Tenant B's first task step runs on the team's worker; tenant A's action then takes the
    steps' worker's only slot. B's outcomes go to the results worker, not behind A's action:
    B's run ends while A's action still runs, and so does a run B starts then, whose first step
    a dispatcher publishes with no work credit free."""
    TaskCatalogEntry.objects.create(name="team.slow_first", queue="team")
    TaskCatalogEntry.objects.create(name="team.add", queue="team")
    a, b = make_tenant()[0], make_tenant()[0]
    put(a, "long", {"nodes": [{"id": "hold", "type": "action", "action": "sleep_ms", "input": {"ms": LONG_MS}}]})
    put(b, "sum", {"nodes": [task("one", "team.slow_first", {"seconds": SLOW_S}),
                             task("two", "team.add", {"a": "$nodes.one.output.attempt", "b": 2}, "one"),
                             task("three", "team.add", {"a": "$nodes.two.output.sum", "b": 3}, "two")],
                   "output": "$nodes.three.output.sum"})
    summing = start(b, "sum")
    wait_for(lambda: "Task team.slow_first" in layout.team.output(), timeout=30,
             what="the team's worker to start B's first step")
    held = start(a, "long")
    wait_for(lambda: getattr(by_node(a, held).get("hold"), "status", None) == StepRun.Status.RUNNING,
             timeout=30, what="A's long action to start")

    summed = finished(b, summing.pk)
    assert summed.status == "succeeded", summed.error
    assert summed.output == 6
    # A's action held the only slot before B's first step ended, and holds it still.
    assert by_node(a, held)["hold"].started_at < by_node(b, summed)["one"].finished_at
    assert fresh(a, held.pk).status == WorkflowRun.Status.RUNNING
    assert by_node(a, held)["hold"].status == StepRun.Status.RUNNING
    received = "Task ductor.task_succeeded["  # a worker's line for each outcome it took
    assert layout.results_worker.output().count(received) >= 3
    assert received not in layout.steps_worker.output()
    # Each tenant sees its own run only.
    with pytest.raises(WorkflowRun.DoesNotExist):
        fresh(a, summed.pk)
    with pytest.raises(WorkflowRun.DoesNotExist):
        fresh(b, held.pk)

    # A run B starts now: its first task step goes out though no work credit is free (it uses none).
    put(b, "quick", {"nodes": [task("add", "team.add", {"a": 1, "b": 2})], "output": "$nodes.add.output.sum"})
    quick = finished(b, start(b, "quick").pk)
    assert (quick.status, quick.output) == ("succeeded", 3)
    assert by_node(a, held)["hold"].status == StepRun.Status.RUNNING

    drained(b)
    # No waiting out A's action: its worker goes at once, and the run is cancelled.
    layout.steps_worker.kill()
    layout.stack.stop(layout.steps_worker)
    with tenant_context(a):
        services.run_cancel(run=fresh(a, held.pk))
