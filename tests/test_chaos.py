"""Chaos: the whole stack runs a DAG workload while each fault strikes in turn.

Two workers, a dispatcher and the coordinator run under the product's
supervisor on this run's PostgreSQL and Redis. Before each fault, two tenants
start a wave of runs (a diamond with a step that fails once and is retried),
and the fault strikes once the wave is under way:

1. a worker's whole process group is SIGKILLed (a new worker takes its place);
2. the dispatcher is SIGKILLed and started again;
3. the coordinator is SIGKILLed and started again;
4. Redis is flushed (``FLUSHDB`` of the run's database): every queue, lease, timer and Celery message;
5. every PostgreSQL backend of the app is terminated (``pg_terminate_backend``).

Then every run must end, once; no step may succeed twice; each history must
be in order; and nothing may stay in flight.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

from ductor_project.core import capacity
from ductor_project.core.context import tenant_context
from ductor_project.core.redis import get_redis
from ductor_project.stack import Child, Stack
from scheduling import fair_queue as fq
from tenants.models import Tenant
from tests.conftest import celery_worker_child, service_env, service_stack
from tests.waiting import wait_for
from workflows import services
from workflows.models import RunEvent, StepRun, WorkflowRun

pytestmark = [pytest.mark.chaos, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

LEASE_MS = 3000  # a killed worker's items come back within seconds
RUNS_PER_WAVE = 8  # per tenant, before each fault
# How long the workload may take to finish after the last fault, at most.
FINISH_S = 90.0
TERMINAL_EVENTS = {"succeeded", "failed", "cancelled", "continued"}

DIAMOND = {
    "nodes": [
        {"id": "a", "type": "action", "action": "sleep_ms", "input": {"ms": 150}},
        {"id": "b", "type": "action", "action": "sleep_ms", "input": {"ms": 250}, "depends_on": ["a"]},
        {"id": "c", "type": "action", "action": "fail", "input": {"succeed_on_attempt": 2}, "depends_on": ["a"],
         "retry": {"max_attempts": 5, "backoff_s": 0.2, "jitter": False}},
        {"id": "d", "type": "action", "action": "echo", "depends_on": ["b", "c"],
         "input": {"b": "$nodes.b.output", "c": "$nodes.c.output"}},
    ],
    "output": {"d": "$nodes.d.output"},
}


class Chaos:
    """The stack under test, and the faults it suffers."""

    def __init__(self) -> None:
        self.stack: Stack = service_stack()
        self.workers: list[Child] = []

    def start(self) -> None:
        self.workers = [self.new_worker(), self.new_worker()]
        self.dispatcher = self.stack.dispatcher(env=service_env())
        self.coordinator = self.stack.coordinator(env=service_env())
        self.stack.wait_ready(self.dispatcher, self.coordinator, timeout_s=60)

    def new_worker(self) -> Child:
        return celery_worker_child(self.stack, concurrency=2)

    def kill_worker(self) -> None:
        """SIGKILL the first worker's process group (no warm shutdown, no acks) and start another."""
        victim = self.workers.pop(0)
        victim.kill()
        self.stack.stop(victim)
        self.workers.append(self.new_worker())

    def kill_dispatcher(self) -> None:
        self.dispatcher = self._restart(self.dispatcher, self.stack.dispatcher)

    def kill_coordinator(self) -> None:
        self.coordinator = self._restart(self.coordinator, self.stack.coordinator)

    def _restart(self, child: Child, start: Callable[..., Child]) -> Child:
        """SIGKILL ``child`` and start it again, as a supervisor would after a crash."""
        child.kill()
        self.stack.stop(child)
        again = start(env=service_env())
        self.stack.wait_ready(again, timeout_s=60)
        return again

    def flush_redis(self) -> None:
        get_redis().flushdb()

    def terminate_postgres_backends(self) -> None:
        """Terminate every backend of this database but the test's own."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            assert cursor.fetchone()[0] > 0  # the workers' and the coordinator's at least

    def stop(self) -> None:
        self.stack.stop_all(grace_s=20)


@pytest.fixture
def chaos(transactional_db: None, redis_client: Any) -> Iterator[Chaos]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DUCTOR_LEASE_MS", str(LEASE_MS))  # service_env() copies os.environ
        running = Chaos()
        try:
            running.start()
            yield running
        finally:
            running.stop()


def succeeded_steps(tenants: list[Tenant]) -> int:
    total = 0
    for tenant in tenants:
        with tenant_context(tenant):
            total += StepRun.objects.filter(status="succeeded").count()
    return total


def progress(tenants: list[Tenant], steps: int) -> Callable[[], bool]:
    """True once ``steps`` more steps than now have succeeded."""
    target = succeeded_steps(tenants) + steps
    return lambda: succeeded_steps(tenants) >= target


def all_terminal(tenants: list[Tenant]) -> bool:
    for tenant in tenants:
        with tenant_context(tenant):
            if WorkflowRun.objects.exclude(status__in=WorkflowRun.TERMINAL).exists():
                return False
    return True


def nothing_in_flight(tenants: list[Tenant]) -> bool:
    for tenant in tenants:
        stats = fq.stats(tenant)
        with tenant_context(tenant):
            held = capacity.tenant_in_flight()
        if stats.backlog or stats.in_flight or held:
            return False
    return True


def check_histories(tenant: Tenant) -> None:
    with tenant_context(tenant):
        runs = list(WorkflowRun.objects.all())
        assert {run.status for run in runs} == {"succeeded"}, Counter(run.status for run in runs)
        for run in runs:
            events = list(RunEvent.objects.filter(run=run).order_by("seq"))
            assert [e.seq for e in events] == list(range(1, len(events) + 1)), run.pk  # in order, no gaps
            assert events[0].type == "created"
            assert [e.type for e in events if e.type in TERMINAL_EVENTS] == ["succeeded"], run.pk  # ended once
            end = next(i for i, e in enumerate(events) if e.type == "succeeded")
            # After its end, a run's history takes only the results that came late (a step a
            # fault made run twice: a vanished lease's item delivered again), which change nothing.
            assert {e.type for e in events[end + 1:]} <= {"step_result_discarded"}, run.pk
            times = [e.created_at for e in events]
            assert times == sorted(times), run.pk
            wins = Counter(step.node_id for step in StepRun.objects.filter(run=run, status="succeeded"))
            assert wins == {"a": 1, "b": 1, "c": 1, "d": 1}, (run.pk, wins)  # none succeeded twice
            told = Counter(e.node_id for e in events if e.type == "step_succeeded")
            assert told == wins, (run.pk, told)


def start_wave(tenants: list[Tenant]) -> None:
    for tenant in tenants:
        with tenant_context(tenant):
            services.run_start_many(runs=[{"workflow": "diamond"} for _ in range(RUNS_PER_WAVE)])


def test_every_run_ends_once_through_worker_dispatcher_coordinator_redis_and_postgres_faults(chaos, make_tenant):
    tenants = [make_tenant("chaos-a")[0], make_tenant("chaos-b")[0]]
    for tenant in tenants:
        with tenant_context(tenant):
            services.workflow_put(name="diamond", spec=DIAMOND)
    faults = [("a worker's process group is killed", chaos.kill_worker),
              ("the dispatcher is killed", chaos.kill_dispatcher),
              ("the coordinator is killed", chaos.kill_coordinator),
              ("Redis is flushed", chaos.flush_redis),
              ("PostgreSQL's backends are terminated", chaos.terminate_postgres_backends)]

    for what, fault in faults:
        start_wave(tenants)
        wait_for(progress(tenants, RUNS_PER_WAVE), timeout=60, what=f"a wave under way before {what}")
        fault()

    wait_for(lambda: all_terminal(tenants), timeout=FINISH_S, what="every run to end")
    for tenant in tenants:
        check_histories(tenant)
    wait_for(lambda: nothing_in_flight(tenants), timeout=LEASE_MS / 1000 * 3, what="nothing left in flight")
    for _ in range(3):  # and it stays so, for longer than a lease
        time.sleep(LEASE_MS / 1000 / 2)
        assert nothing_in_flight(tenants)
    for child in [*chaos.workers, chaos.dispatcher, chaos.coordinator]:
        assert child.alive(), child.failure("died")
