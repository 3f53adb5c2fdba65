"""``GET /api/v1/runs/{id}/why``: what holds each waiting step, every cause produced for real.

The engine runs in this process (no workers): a run's start creates its first attempts and, once
committed, their items in the real fair queue; a dispatcher's dequeue (``take``) then leaves the
items in flight that hold a partition, a slot or a rate, as a worker running them would.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from ductor_project.core.context import no_tenant, tenant_context
from ductor_project.core.keys import shard_of
from scheduling import fair_queue as fq
from scheduling import services as scheduling_services
from scheduling.circuit import record_failure
from scheduling.dispatch.handlers import ItemContext
from scheduling.models import Connection, Pool, PoolMember
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.conftest import api_client
from workflows import services
from workflows.engine import tick as engine_tick
from workflows.engine.items import enqueue_tick
from workflows.models import RunEvent, StepRun, WorkflowRun
from workflows.why import Cause, why_waiting

pytestmark = pytest.mark.django_db(transaction=True)

NOOP = {"nodes": [{"id": "work", "type": "action", "action": "noop"}]}
LEASE_MS = 60_000


@pytest.fixture
def tenant(redis_client: Any, tenant_a: tuple[Tenant, str]) -> Tenant:
    return tenant_a[0]


def put(tenant: Tenant, spec: dict[str, Any], name: str = "w") -> None:
    with tenant_context(tenant):
        services.workflow_put(name=name, spec=spec)


def start(tenant: Tenant, name: str = "w", input: dict[str, Any] | None = None) -> WorkflowRun:
    with tenant_context(tenant):
        run, created = services.run_start(workflow=name, input=input or {})
    assert created
    return run


def take(tenant: Tenant) -> fq.Dequeued | None:
    """The next dispatch of the tenant's shard, as a dispatcher takes it (the item stays in flight)."""
    with no_tenant():
        return fq.dequeue(shard=shard_of(str(tenant.pk)), lease_ms=LEASE_MS)


def why(client: Any, run: WorkflowRun) -> list[dict[str, Any]]:
    response = client.get(f"/api/v1/runs/{run.pk}/why")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["run_id"], body["status"]) == (str(run.pk), run.status)
    return [w for w in body["waiting"] if w["node_id"]]  # the steps (a run's tick has no node)


def only(client: Any, run: WorkflowRun) -> dict[str, Any]:
    [waiting] = why(client, run)
    return waiting


def until(waiting: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(waiting["until"])


def in_pool(tenant: Tenant, *, pool_limit: int | None = None, conn_limit: int | None = None) -> Connection:
    """A pool ``main`` of one connection, and the workflow ``w`` whose one step runs through it."""
    with tenant_context(tenant):
        connection = Connection.objects.create(name="api", kind="http", config={"base_url": "https://api.example.com"},
                                               max_concurrency=conn_limit)
        pool = Pool.objects.create(name="main", max_concurrency=pool_limit)
        PoolMember.objects.create(pool=pool, connection=connection, weight=1, priority=0)
    put(tenant, {"nodes": [{"id": "work", "type": "action", "action": "noop", "pool": "main"}]})
    return connection


def test_a_due_step_with_nothing_holding_it_waits_in_line(tenant, client_a):
    put(tenant, NOOP)
    waiting = only(client_a, start(tenant))
    assert (waiting["node_id"], waiting["attempt"], waiting["status"], waiting["cause"]) == (
        "work", 1, "queued", Cause.IN_LINE)
    assert waiting["details"] == {"tier": "standard"}


def test_a_step_in_line_tells_nothing_of_other_tenants_due_work(tenant, client_a, tenant_b):
    """Tenant B's due steps in the same tier would make "among the 2 tenants": B's activity."""
    other = tenant_b[0]
    put(other, NOOP)
    start(other)
    start(other)
    put(tenant, NOOP)
    waiting = only(client_a, start(tenant))
    assert waiting["cause"] == Cause.IN_LINE
    assert waiting["details"] == {"tier": "standard"}
    assert waiting["message"] == ("due and admissible: it waits for its turn among the tenants with due work in "
                                  "tier 'standard', after any due work of the tiers above it (interactive)")


def test_a_batch_step_in_line_names_the_tiers_served_before_it(tenant, client_a):
    """Tiers are strict: a batch step waits while any tenant has due work above it, and its "why" says so
    (without telling whether any has: that is other tenants' activity)."""
    put(tenant, NOOP)
    with tenant_context(tenant):
        run, _ = services.run_start(workflow="w", input={}, tier="batch")
    waiting = only(client_a, run)
    assert (waiting["cause"], waiting["details"]) == (Cause.IN_LINE, {"tier": "batch"})
    assert waiting["message"] == ("due and admissible: it waits for its turn among the tenants with due work in "
                                  "tier 'batch', after any due work of the tiers above it (interactive, standard)")


def test_a_dispatched_step_is_on_its_way_and_a_finished_run_waits_for_nothing(tenant, client_a):
    put(tenant, NOOP)
    run = start(tenant)
    assert take(tenant) is not None
    assert only(client_a, run)["cause"] == Cause.DISPATCHING
    with tenant_context(tenant):
        services.run_cancel(run=run)
    WorkflowRun.all_tenants.filter(pk=run.pk).update(status=WorkflowRun.Status.CANCELLED)
    response = client_a.get(f"/api/v1/runs/{run.pk}/why").json()
    assert (response["status"], response["waiting"]) == ("cancelled", [])


def test_a_sleep_past_its_end_waits_for_its_wake_up_not_for_a_time_gone_by(tenant, client_a):
    """The sleep's wake-up, due, still waits in the system tier for its turn: "not due until" a past
    time would say nothing holds it."""
    put(tenant, {"nodes": [{"id": "nap", "type": "sleep", "duration_s": 600}]})
    run = start(tenant)
    StepRun.all_tenants.filter(run=run, node_id="nap").update(scheduled_for=timezone.now() - timedelta(seconds=30))
    waiting = only(client_a, run)
    assert (waiting["node_id"], waiting["status"], waiting["cause"]) == ("nap", "scheduled", Cause.IN_LINE)
    assert waiting["details"] == {"tier": "system"}
    assert waiting["message"].startswith("its sleep or backoff ended at ")
    assert waiting["until"] is None


def test_a_sleeping_step_is_not_due_until_its_end(tenant, client_a):
    put(tenant, {"nodes": [{"id": "nap", "type": "sleep", "duration_s": 600}]})
    before = timezone.now()
    waiting = only(client_a, start(tenant))
    assert (waiting["node_id"], waiting["status"], waiting["cause"]) == ("nap", "scheduled", Cause.NOT_DUE)
    assert before + timedelta(seconds=599) < until(waiting) < timezone.now() + timedelta(seconds=601)


def test_a_step_behind_its_partition_counts_what_is_ahead_of_it(tenant, client_a):
    with tenant_context(tenant):
        scheduling_services.rule_create(name="per-account", priority=1, match={"action": "noop"},
                                        action={"partition_key": "acct-{{ $input.account }}"})
    put(tenant, {"nodes": [{"id": "work", "type": "action", "action": "noop",
                            "input": {"account": "$input.account"}}]})
    first, second, third = (start(tenant, input={"account": 7}) for _ in range(3))
    assert take(tenant).item_id.endswith(str(only(client_a, first)["step_id"]))  # in flight: holds acct-7
    held = only(client_a, second)
    assert (held["cause"], held["details"]["partition"], held["details"]["ahead"]) == (
        Cause.PARTITION, "acct-7", 1)
    assert only(client_a, third)["details"]["ahead"] == 2
    other = start(tenant, input={"account": 8})  # another partition is not held
    assert only(client_a, other)["cause"] == Cause.IN_LINE


def test_a_step_of_a_tenant_at_its_ceiling_shows_k_of_k(tenant, client_a):
    tenant_services.override_set(tenant=tenant, field="max_concurrency", value=1)
    put(tenant, NOOP)
    start(tenant)
    second = start(tenant)
    assert take(tenant) is not None
    held = only(client_a, second)
    assert (held["cause"], held["details"]) == (Cause.TENANT_CONCURRENCY, {"in_flight": 1, "limit": 1})
    assert "1 of 1" in held["message"]


def test_a_step_of_a_tenant_at_its_rate_waits_until_the_rate_admits_it(tenant, client_a, redis_client):
    tenant_services.override_set(tenant=tenant, field="step_rate_per_s", value=0.01)
    tenant_services.override_set(tenant=tenant, field="step_burst", value=1)
    put(tenant, NOOP)
    start(tenant)
    second = start(tenant)
    assert take(tenant) is not None
    held = only(client_a, second)
    assert (held["cause"], held["details"]) == (Cause.RATE_LIMITED, {"scope": "tenant"})
    now = datetime.fromtimestamp(redis_client.time()[0], tz=UTC)
    assert now + timedelta(seconds=90) < until(held) <= now + timedelta(seconds=101)


def test_a_step_whose_pool_is_full_says_so(tenant, client_a):
    in_pool(tenant, pool_limit=1)
    start(tenant)
    second = start(tenant)
    assert take(tenant) is not None
    held = only(client_a, second)
    assert (held["cause"], held["details"]) == (Cause.POOL_FULL, {"in_flight": 1, "limit": 1})
    assert "pool 'main'" in held["message"]


def test_a_step_whose_connections_are_full_says_so(tenant, client_a):
    in_pool(tenant, conn_limit=1)
    start(tenant)
    second = start(tenant)
    assert take(tenant) is not None
    held = only(client_a, second)
    assert held["cause"] == Cause.CONNECTION_FULL
    [member] = held["details"]["connections"]
    assert (member["name"], member["in_flight"], member["limit"]) == ("api", 1, 1)


def test_a_task_step_at_its_queues_shared_slots_names_the_queue_not_a_pool(tenant, client_a, settings):
    """A task step with no pool waits for a slot of its catalog queue (DUCTOR_TASK_QUEUE_SLOTS): it was
    told as 'every usable connection of its pool is full: queue:default/… its queue default/… at its
    slots (1)', of a pool and a connection it does not have."""
    from workflows.models import TaskCatalogEntry

    queue = f"why-slots-{tenant.pk.hex[:8]}"
    settings.DUCTOR_TASK_QUEUE_SLOTS = {queue: "1"}
    TaskCatalogEntry.objects.create(name="team.slots", queue=queue, timeout_s=120)
    put(tenant, {"nodes": [{"id": "charge", "type": "task", "task": "team.slots", "input": {}}]})
    start(tenant)
    second = start(tenant)
    assert take(tenant) is not None  # the first holds the queue's one slot
    held = only(client_a, second)
    assert (held["cause"], held["details"]) == (Cause.QUEUE_FULL, {"queue": queue, "broker": "default", "limit": 1})
    assert held["message"] == (f"queue '{queue}' is at its 1 slot, which every tenant's task steps share "
                               "(DUCTOR_TASK_QUEUE_SLOTS): it takes the next one freed, in the fair order")


def test_a_step_whose_connections_breakers_are_open_waits_until_the_first_closes(tenant, client_a, settings,
                                                                                  redis_client):
    settings.DUCTOR_BREAKER_FAILURES = 1
    settings.DUCTOR_BREAKER_COOLDOWN_S = 300
    connection = in_pool(tenant)
    with tenant_context(tenant):
        record_failure(connection.pk)
    opened = datetime.fromtimestamp(redis_client.time()[0], tz=UTC)
    held = only(client_a, start(tenant))
    assert held["cause"] == Cause.BREAKER_OPEN
    assert opened + timedelta(seconds=290) < until(held) <= opened + timedelta(seconds=301)
    assert held["details"]["connections"][0]["breaker"] == "open"


def test_a_suspended_tenants_step_says_the_tenant_is_suspended(tenant, django_capture_on_commit_callbacks):
    put(tenant, NOOP)
    run = start(tenant)
    with django_capture_on_commit_callbacks(execute=True):
        tenant_services.tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)
    tenant.refresh_from_db()
    with tenant_context(tenant):
        [held] = [w for w in why_waiting(run) if w.node_id]
    assert held.cause == Cause.SUSPENDED


def test_a_node_that_would_start_a_run_is_held_by_a_used_up_quota(tenant, client_a):
    put(tenant, NOOP, name="child")
    put(tenant, {"nodes": [{"id": "nap", "type": "sleep", "duration_s": 600},
                           {"id": "spawn", "type": "subworkflow", "workflow": "child", "depends_on": ["nap"]}]})
    tenant_services.override_set(tenant=tenant, field="monthly_run_quota", value=1)
    run = start(tenant)  # the quota's one run
    held = {w["node_id"]: w for w in why(client_a, run)}
    assert held["nap"]["cause"] == Cause.NOT_DUE
    spawn = held["spawn"]
    assert (spawn["cause"], spawn["status"], spawn["attempt"], spawn["details"]) == (
        Cause.QUOTA_EXHAUSTED, "pending", 0, {"used": 1, "quota": 1})
    tenant_services.override_set(tenant=tenant, field="monthly_run_quota", value=2)
    assert [w["node_id"] for w in why(client_a, run)] == ["nap"]


def test_a_step_waiting_for_its_child_run_names_it(tenant, client_a):
    put(tenant, NOOP, name="child")
    put(tenant, {"nodes": [{"id": "spawn", "type": "subworkflow", "workflow": "child"}]})
    run = start(tenant)
    waiting = {w["node_id"]: w for w in why(client_a, run)}["spawn"]
    child = WorkflowRun.all_tenants.get(parent_run_id=run.pk)
    assert (waiting["cause"], waiting["details"]["child_run_id"]) == (Cause.CHILD_RUN, str(child.pk))
    [tick] = client_a.get(f"/api/v1/runs/{child.pk}/why").json()["waiting"]  # its first tick, not run yet
    assert (tick["node_id"], tick["status"], tick["cause"]) == ("", "tick", Cause.IN_LINE)


def test_a_step_whose_child_continued_as_new_names_the_run_it_waits_for_now(tenant, client_a):
    put(tenant, {"nodes": [
        {"id": "again", "type": "continue_as_new", "input": {"second": True},
         "when": {"path": "input.second", "op": "exists", "value": False}},
        {"id": "nap", "type": "sleep", "duration_s": 3600}]}, name="loop")
    put(tenant, {"nodes": [{"id": "spawn", "type": "subworkflow", "workflow": "loop"}]})
    run = start(tenant)
    child = WorkflowRun.all_tenants.get(parent_run_id=run.pk, continued_from=None)
    with tenant_context(tenant):
        engine_tick.tick(child.pk)  # it continues as new at once
    successor = WorkflowRun.all_tenants.get(continued_from=child.pk)

    waiting = {w["node_id"]: w for w in why(client_a, run)}["spawn"]

    assert waiting["cause"] == Cause.CHILD_RUN
    assert waiting["details"] == {"child_run_id": str(successor.pk), "child_status": "pending"}


def test_another_tenants_run_is_not_found(tenant, tenant_b, client_a):
    put(tenant, NOOP)
    run = start(tenant)
    response = api_client(tenant_b[1]).get(f"/api/v1/runs/{run.pk}/why")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert client_a.get("/api/v1/runs/not-a-uuid/why").status_code == 404


def test_a_tick_that_keeps_failing_is_in_the_runs_history_and_its_why(tenant, client_a, monkeypatch):
    """Each failed delivery of the run's tick is delivered again; its 1st, 2nd, 4th … failure is a
    ``tick_failed`` event, and the run's why names the last one until a tick succeeds."""
    put(tenant, {"nodes": [{"id": "nap", "type": "sleep", "duration_s": 3600}]})
    run = start(tenant)

    def poisoned(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a row the engine cannot read")

    monkeypatch.setattr(engine_tick.waits, "apply", poisoned)
    with tenant_context(tenant):
        enqueue_tick(run)
    for delivery in range(1, 6):
        item = take(tenant)
        assert item is not None
        assert (item.payload["kind"], item.delivery) == ("tick", delivery)
        ctx = ItemContext(tenant_id=str(tenant.pk), item_id=item.item_id, tier=item.tier, partition=item.partition,
                          delivery=item.delivery, waited_ms=item.waited_ms)
        with tenant_context(tenant), pytest.raises(RuntimeError):
            engine_tick.execute_tick(ctx, item.payload)
        with tenant_context(tenant):
            assert fq.nack(item.item_id, delay_ms=0, delivery=item.delivery)

    with tenant_context(tenant):
        failures = [event.data for event in RunEvent.objects.filter(run=run, type="tick_failed").order_by("seq")]
    assert [data["failures"] for data in failures] == [1, 2, 4]
    assert failures[-1]["error"] == {"type": "RuntimeError", "message": "a row the engine cannot read"}
    [tick] = [w for w in client_a.get(f"/api/v1/runs/{run.pk}/why").json()["waiting"] if not w["node_id"]]
    assert "RuntimeError: a row the engine cannot read" in tick["message"]
    assert tick["details"]["tick_failed"]["failures"] == 4

    monkeypatch.undo()  # the data or the code is fixed: the next delivery goes through
    item = take(tenant)
    assert item is not None
    with tenant_context(tenant):
        engine_tick.execute_tick(ItemContext(tenant_id=str(tenant.pk), item_id=item.item_id, tier=item.tier,
                                             partition=item.partition, delivery=item.delivery, waited_ms=0),
                                 item.payload)
        assert fq.ack(item.item_id, delivery=item.delivery)
        enqueue_tick(run)  # a later tick waits in the queue: the failure is history, not what holds it
    [tick] = [w for w in client_a.get(f"/api/v1/runs/{run.pk}/why").json()["waiting"] if not w["node_id"]]
    assert (tick["cause"], tick["message"]) == (Cause.IN_LINE, tick["message"].split(";")[0])
    assert "tick_failed" not in tick["details"]


def test_a_published_task_step_waits_for_the_teams_worker_and_counts_its_queues_messages(
        tenant, client_a, redis_client):
    from workflows.engine import task_nodes
    from workflows.models import TaskCatalogEntry

    queue = f"why-team-{tenant.pk.hex[:8]}"
    TaskCatalogEntry.objects.create(name="team.why", queue=queue, timeout_s=120)
    put(tenant, {"nodes": [{"id": "charge", "type": "task", "task": "team.why", "input": {}}]})
    run = start(tenant)
    item = take(tenant)
    assert item is not None
    with no_tenant():
        task_nodes.publish([item])  # as the dispatcher does; no worker consumes the queue
    try:
        waiting = only(client_a, run)
        assert (waiting["node_id"], waiting["status"], waiting["cause"]) == ("charge", "running", Cause.TASK_PUBLISHED)
        assert waiting["details"] == {"task": "team.why", "timeout_s": 120.0,
                                      "queues": [{"queue": queue, "broker": "default", "messages_waiting": True}]}
        assert f"messages wait in queue '{queue}' that no worker has taken" in waiting["message"]
        assert f"-Q {queue}?" in waiting["message"]
        with tenant_context(tenant):
            started = WorkflowRun.objects.get(pk=run.pk).steps.get().started_at
        assert until(waiting) == started + timedelta(seconds=120)  # its timeout, which is its lease

        assert redis_client.rpop(queue) is not None  # a worker took it: the step runs there
        waiting = only(client_a, run)
        assert waiting["details"]["queues"][0]["messages_waiting"] is False
        assert f"no message waits in queue '{queue}': a worker has taken it" in waiting["message"]
    finally:
        redis_client.delete(queue)


def test_idor_a_published_task_step_tells_nothing_of_a_queue_its_message_did_not_go_to(
        tenant, client_a, tenant_b, redis_client):
    """Whether messages wait was read in every queue of the step's pool as it is now: a tenant that
    put in its pool, once its step was published, a connection naming a queue the catalog keeps for
    another tenant learned, run after run, whether that tenant's tasks waited there. Only the queue
    the step's message went to is read."""
    from workflows.engine import task_nodes
    from workflows.models import TaskCatalogEntry

    mine, theirs = f"why-mine-{tenant.pk.hex[:8]}", f"why-theirs-{tenant.pk.hex[:8]}"
    TaskCatalogEntry.objects.create(name="team.why", queue=mine, timeout_s=120)
    TaskCatalogEntry.objects.create(name="team.theirs", queue=theirs, tenants=[tenant_b[0].slug])
    with tenant_context(tenant):
        scheduling_services.connection_create(name="team", kind="celery", config={"queue": mine})
        scheduling_services.pool_create(name="workers", members=[scheduling_services.MemberSpec("team")])
    put(tenant, {"nodes": [{"id": "charge", "type": "task", "task": "team.why", "input": {}, "pool": "workers"}]})
    run = start(tenant)
    item = take(tenant)
    assert item is not None
    with no_tenant():
        task_nodes.publish([item])
    try:
        assert redis_client.rpop(mine) is not None  # a worker took it
        redis_client.lpush(theirs, "a task of the other tenant's")
        with tenant_context(tenant):
            scheduling_services.connection_create(name="peek", kind="celery", config={"queue": theirs})
            pool = Pool.objects.get(name="workers")
            scheduling_services.pool_update(pool=pool, members=[scheduling_services.MemberSpec("team"),
                                                                scheduling_services.MemberSpec("peek")])

        waiting = only(client_a, run)

        assert waiting["cause"] == Cause.TASK_PUBLISHED
        assert waiting["details"]["queues"] == [{"queue": mine, "broker": "default", "messages_waiting": False}]
        assert theirs not in waiting["message"]
    finally:
        redis_client.delete(mine, theirs)


def test_a_task_step_published_through_another_broker_reads_its_queue_there(
        tenant, client_a, redis_client, settings):
    """The broker its message went to is on its trace, and is the one read: its connection changed
    since (another broker, whose queue of that name it never sent to) reads nothing else."""
    from workflows.engine import brokers, task_nodes
    from workflows.models import TaskCatalogEntry

    queue = f"why-team-{tenant.pk.hex[:8]}"
    settings.DUCTOR_TASK_BROKERS = {"team": settings.CELERY_BROKER_URL}
    brokers._named_broker.cache_clear()
    TaskCatalogEntry.objects.create(name="team.why", queue="", timeout_s=120)
    with tenant_context(tenant):
        connection = scheduling_services.connection_create(name="team", kind="celery",
                                                           config={"queue": queue, "broker": "team"})
        scheduling_services.pool_create(name="workers", members=[scheduling_services.MemberSpec("team")])
    put(tenant, {"nodes": [{"id": "charge", "type": "task", "task": "team.why", "input": {}, "pool": "workers"}]})
    run = start(tenant)
    item = take(tenant)
    assert item is not None
    try:
        with no_tenant():
            task_nodes.publish([item])
        with tenant_context(tenant):
            assert WorkflowRun.objects.get(pk=run.pk).steps.get().routing["broker"] == "team"
            scheduling_services.connection_update(connection=connection, config={"queue": "elsewhere"})

        waiting = only(client_a, run)

        assert waiting["details"]["queues"] == [{"queue": queue, "broker": "team", "messages_waiting": True}]
    finally:
        redis_client.delete(queue)
        brokers._named_broker.cache_clear()


def test_idor_a_connection_naming_a_queue_kept_for_another_tenant_takes_no_part_of_its_shared_slots(
        tenant, client_a, tenant_b, settings, redis_client):
    """Tenant B's catalog queue has one slot (DUCTOR_TASK_QUEUE_SLOTS), which B's step holds. Tenant A's
    pool has a connection naming that queue: A's step through it is refused at its publish, and until
    then it took part in the queue's slots, so it waited while B's work held them and ``why`` told A
    that B's queue was full. It takes no part of them: admitted at once, it goes on to its refusal."""
    from workflows.models import TaskCatalogEntry

    mine, theirs = f"kept-mine-{tenant.pk.hex[:8]}", f"kept-theirs-{tenant.pk.hex[:8]}"
    settings.DUCTOR_TASK_QUEUE_SLOTS = {theirs: "1"}
    TaskCatalogEntry.objects.create(name="team.mine", queue=mine, timeout_s=120)
    TaskCatalogEntry.objects.create(name="team.theirs", queue=theirs, tenants=[tenant_b[0].slug], timeout_s=120)
    put(tenant_b[0], {"nodes": [{"id": "charge", "type": "task", "task": "team.theirs", "input": {}}]})
    start(tenant_b[0])
    assert take(tenant_b[0]) is not None  # B's step holds its queue's one slot
    with tenant_context(tenant):
        scheduling_services.connection_create(name="peek", kind="celery", config={"queue": theirs})
        scheduling_services.pool_create(name="workers", members=[scheduling_services.MemberSpec("peek")])
    put(tenant, {"nodes": [{"id": "charge", "type": "task", "task": "team.mine", "input": {}, "pool": "workers"}]})
    run = start(tenant)

    assert only(client_a, run)["cause"] == Cause.IN_LINE
    item = take(tenant)
    assert item is not None
    assert item.payload["step_id"] == str(StepRun.all_tenants.get(run_id=run.pk).pk)
