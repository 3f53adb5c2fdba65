"""Schedules end to end: real Celery worker, dispatcher and two coordinators, and the faults they survive.

One worker (concurrency 2), one ``manage.py run_dispatcher`` and two ``manage.py run_coordinator``
serve the whole module; every test is transactional, so those processes see its rows. Fires are
counted by their nominal times (from their runs' idempotency keys), never by when they arrived: a
fire is the same fire however late it starts, so the counts do not depend on how busy the machine is.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from ductor_project.core.context import tenant_context
from ductor_project.core.redis import get_redis
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.conftest import service_env
from tests.processes import Processes, running_processes
from tests.waiting import queue_is_empty, wait_for
from workflows import services as workflow_services
from workflows.models import Schedule, WorkflowRun
from workflows.triggers import services as schedules
from workflows.triggers.timing import fire_of_key

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

LEASE_MS = 3000
SECOND = timedelta(seconds=1)
NOOP = {"nodes": [{"id": "a", "type": "action", "action": "noop"}]}


@pytest.fixture(scope="module")
def stack(django_db_setup: None) -> Iterator[Processes]:
    with running_processes(coordinators=2, env={"DUCTOR_LEASE_MS": str(LEASE_MS)}) as running:
        yield running


@pytest.fixture(autouse=True)
def quiet_after(stack: Processes, transactional_db: None) -> Iterator[None]:
    """After each test, before its tables are flushed: no schedule fires any more, and nothing it
    started is still queued or running. A fire or a step that wrote while the flush truncates the
    tables would deadlock with it (the processes serve the whole module and outlive the test)."""
    yield
    Schedule.all_tenants.update(paused=True, wake_at=None)
    wait_for(queue_is_empty, timeout=30, what="the schedules' last wake-ups and their runs to finish")


def tenant_with_flow(make_tenant: Any, slug: str, spec: dict[str, Any] = NOOP) -> Tenant:
    tenant = make_tenant(slug)[0]
    with tenant_context(tenant):
        workflow_services.workflow_put(name="flow", spec=spec)
    return tenant


def every_second(tenant: Tenant, name: str = "tick", **fields: Any) -> Schedule:
    with tenant_context(tenant):
        return schedules.schedule_create(name=name, workflow="flow", interval_s=1, **fields)


def runs_of(tenant: Tenant, schedule: Schedule) -> list[tuple[datetime, WorkflowRun]]:
    """The runs the schedule started, as (nominal fire time, run), by fire time."""
    with tenant_context(tenant):
        runs = list(WorkflowRun.objects.filter(idempotency_key__startswith=f"schedule:{schedule.pk}:"))
    found = [(fire_of_key(run.idempotency_key or ""), run) for run in runs]
    return sorted(((key[1], run) for key, run in found if key), key=lambda pair: pair[0])


def fires_of(tenant: Tenant, schedule: Schedule) -> list[datetime]:
    return [fire for fire, _ in runs_of(tenant, schedule)]


def fired_through(tenant: Tenant, schedule: Schedule, moment: datetime) -> Callable[[], bool]:
    return lambda: any(fire >= moment for fire in fires_of(tenant, schedule))


def stored(tenant: Tenant, schedule: Schedule) -> Schedule:
    with tenant_context(tenant):
        return Schedule.objects.get(pk=schedule.pk)


def assert_once_each(tenant: Tenant, schedule: Schedule) -> list[datetime]:
    """Every fire started at most one run, and the schedule counted each once; its fire times."""
    fires = fires_of(tenant, schedule)
    assert max(Counter(fires).values(), default=1) == 1, Counter(fires).most_common(3)
    assert stored(tenant, schedule).fired_count == len(fires)
    return fires


def test_an_every_second_schedule_fires_once_a_second_through_two_coordinators_a_sigkill_and_a_flush(
    stack: Processes, make_tenant: Any
) -> None:
    tenant = tenant_with_flow(make_tenant, "every-second")
    schedule = every_second(tenant, overlap="allow_all")
    first = schedule.next_fire_at
    assert first is not None
    wait_for(fired_through(tenant, schedule, first + 2 * SECOND), timeout=30, what="three fires")

    stack.coordinators[0] = stack.restart(stack.coordinators[0], lambda: stack.stack.coordinator(
        "coordinator-0", env=service_env()))
    killed = timezone.now()
    wait_for(fired_through(tenant, schedule, killed + SECOND), timeout=30, what="fires after a coordinator died")

    get_redis().flushdb()  # every queue, lease and wake-up: only PostgreSQL knows the schedule now
    flushed = timezone.now()
    wait_for(fired_through(tenant, schedule, flushed + 2 * SECOND), timeout=60, what="fires after the flush")

    last = fires_of(tenant, schedule)[-1]
    fires = assert_once_each(tenant, schedule)
    seconds = round((last - first) / SECOND) + 1
    assert fires == [first + n * SECOND for n in range(seconds)]  # N fires in N seconds: none lost, none twice
    assert stored(tenant, schedule).missed_count == 0


def test_skip_starts_no_run_while_the_schedule_s_run_is_still_active(stack: Processes, make_tenant: Any) -> None:
    slow = {"nodes": [{"id": "nap", "type": "sleep", "duration_s": 1.5}]}
    tenant = tenant_with_flow(make_tenant, "skipper", spec=slow)
    schedule = every_second(tenant, overlap="skip")
    wait_for(lambda: len(runs_of(tenant, schedule)) >= 2, timeout=30, what="two runs of the schedule")
    runs = [run for _, run in runs_of(tenant, schedule)]
    with tenant_context(tenant):
        first = WorkflowRun.objects.get(pk=runs[0].pk)
    assert first.finished_at is not None
    assert runs[1].created_at >= first.finished_at  # the next run started only after the first ended
    fires = assert_once_each(tenant, schedule)
    assert fires[1] - fires[0] >= 2 * SECOND  # the fire in between was skipped
    assert stored(tenant, schedule).skipped_count >= 1


def test_after_ten_seconds_down_the_catch_up_window_starts_what_it_covers_and_nothing_else(
    stack: Processes, make_tenant: Any
) -> None:
    tenant = tenant_with_flow(make_tenant, "catch-up")
    window = 4
    schedule = every_second(tenant, overlap="allow_all", catchup_window_s=window)
    first = schedule.next_fire_at
    assert first is not None
    wait_for(fired_through(tenant, schedule, first + SECOND), timeout=30, what="two fires")

    stack.dispatcher.kill()  # nothing is dispatched any more: no wake-up runs
    stack.stack.stop(stack.dispatcher)
    time.sleep(10)
    stack.dispatcher = stack.stack.dispatcher(env=service_env())
    stack.stack.wait_ready(stack.dispatcher, timeout_s=60)
    wait_for(fired_through(tenant, schedule, timezone.now() + SECOND), timeout=30, what="the schedule to catch up")

    assert_once_each(tenant, schedule)
    runs = runs_of(tenant, schedule)
    gaps = [n for n in range(1, len(runs)) if runs[n][0] - runs[n - 1][0] > SECOND]
    assert len(gaps) == 1, [fire for fire, _ in runs]  # the outage's, and no other
    resumed_at, caught_up = runs[gaps[0]]  # the first fire started after the outage, and its run
    missed = round((resumed_at - runs[gaps[0] - 1][0]) / SECOND) - 1
    assert missed >= 10 - window - 1  # the outage's fires that the window no longer covered...
    assert stored(tenant, schedule).missed_count == missed  # ...each counted as missed, never started
    catch_up = caught_up.created_at  # when the first wake-up after the outage started its fires
    assert catch_up - (resumed_at - SECOND) > timedelta(seconds=window)  # the last missed fire: outside the window
    assert catch_up - resumed_at <= timedelta(seconds=window + 0.5)  # the first caught up: inside it
    covered = [fire for fire, _ in runs[gaps[0]:] if fire <= catch_up]
    assert window - 1 <= len(covered) <= window + 1  # four seconds' fires, one either side


def test_a_paused_schedule_and_a_suspended_tenant_s_schedule_do_not_fire(
    stack: Processes, make_tenant: Any
) -> None:
    active = tenant_with_flow(make_tenant, "active")
    suspended = tenant_with_flow(make_tenant, "suspended")
    tenant_services.tenant_set_status(tenant=suspended, status=Tenant.Status.SUSPENDED)
    idle = every_second(suspended, overlap="allow_all")
    paused = every_second(active, "paused", paused=True)
    control = every_second(active, "control", overlap="allow_all")
    assert control.next_fire_at is not None
    wait_for(fired_through(active, control, control.next_fire_at + 3 * SECOND), timeout=30,
             what="four fires of the control schedule")
    assert fires_of(active, paused) == []
    assert fires_of(suspended, idle) == []
    wait_for(lambda: stored(suspended, idle).missed_count >= 3, timeout=10,
             what="the suspended tenant's fires to be counted as missed")  # its wake-ups ran, and started nothing
    assert fires_of(suspended, idle) == []
    with tenant_context(suspended):
        assert not WorkflowRun.objects.exists()
