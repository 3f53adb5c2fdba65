"""The payloads of the fair queue's items, pinned: what an item written by one release carries,
which the next release's workers read while it waits or runs (docs/operations.md, Upgrading).

``PINNED`` is each kind's payload as today's producers write it. A change of a producer that
adds, drops or renames a key fails ``test_today's_producers_write_the_pinned_payloads``; keep
the key (or read both) for at least one release, and pin the new one here. Today's handlers run
the pinned payloads with a key added by a later release, as a worker of this release would run
the items a newer one enqueued during a rolling deploy.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import pytest
from django.utils import timezone

from ductor_project.core.context import tenant_context
from ductor_project.core.keys import shard_of
from scheduling import fair_queue as fq
from scheduling.coordinator import wakeups
from scheduling.dispatch import handlers
from scheduling.dispatch.credits import SYSTEM_TIER
from scheduling.dispatch.handlers import ItemContext
from tenants.models import Tenant
from workflows import services
from workflows.engine import items, nodes
from workflows.models import StepRun, WorkflowRun
from workflows.triggers import webhooks

pytestmark = pytest.mark.django_db(transaction=True)

RUN, STEP, DELIVERY, TENANT = (str(uuid.UUID(int=n)) for n in (1, 2, 3, 4))
# Each kind's payload, key by key: the keys and their types. ``trace`` (the enqueuer's trace
# context, while tracing is on) may be added to any of them.
PINNED: dict[str, dict[str, Any]] = {
    "tick": {"kind": "tick", "run_id": RUN},
    "step": {"kind": "step", "step_id": STEP, "run_id": RUN, "node_id": "a", "attempt": 1, "workflow": "w"},
    "task": {"kind": "task", "step_id": STEP, "workflow": "w", "name": "team.charge", "arguments": "kwargs",
             "queue": "", "timeout_s": 30.0, "heartbeat_s": 5.0},
    "wakeup": {"kind": "wakeup", "tenant_id": TENANT, "wake": "run_cancel", "ref": RUN, "data": {}},
    "webhook": {"kind": "webhook", "delivery_id": DELIVERY, "run_id": RUN, "workflow": "w"},
}
# The wake-ups a ``wakeup`` item may name.
WAKE_KINDS = {"step_retry", "sleep_done", "step_timeout", "heartbeat_due", "wait_timeout", "run_timeout",
              "run_cancel", "schedules_due", "webhook_retry"}
# A key a later release's producer may add: today's readers pass over it.
LATER = {"added_by_a_later_release": {"any": ["value"]}}
SPEC = {"nodes": [{"id": "a", "type": "action", "action": "echo", "input": {"x": 1}}]}


@pytest.fixture
def tenant(redis_client: Any, tenant_a: tuple[Tenant, str]) -> Tenant:
    return tenant_a[0]


def shape(payload: dict[str, Any]) -> dict[str, type]:
    return {key: type(value) for key, value in payload.items() if key != "trace"}


def queued(shard_of_tenant: Tenant, tiers: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """The payload of each kind of item waiting in the tenant's shard, dequeued as a dispatcher would."""
    found = {}
    while item := fq.dequeue(shard=shard_of(str(shard_of_tenant.pk)), lease_ms=60_000, tiers=tiers):
        found[handlers.kind_of(item)] = item.payload
    return found


def started(tenant: Tenant) -> WorkflowRun:
    with tenant_context(tenant):
        services.workflow_put(name="w", spec=SPEC)
        run, _ = services.run_start(workflow="w", input={})
    return run


def the_apps(kinds: Iterable[str]) -> set[str]:
    """The kinds the apps register, without those other tests and the benchmarks register."""
    return {kind for kind in kinds if not kind.startswith(("test.", "bench."))}


def test_every_item_kind_and_wake_up_kind_is_pinned() -> None:
    assert the_apps([*handlers._handlers, *handlers.publisher_kinds()]) == set(PINNED)
    assert the_apps(wakeups._wakeups) == WAKE_KINDS


def test_todays_producers_write_the_pinned_payloads(tenant: Tenant) -> None:
    run = started(tenant)
    task = StepRun(id=uuid.uuid4(), run=run, tenant=tenant, node_id="b", node_type=items.TASK, attempt=1,
                   routing={"task": nodes.task_call({"task": "team.charge", "timeout_s": 30, "heartbeat_s": 5})})
    with tenant_context(tenant):
        items.enqueue_tick(run)
        items.enqueue_step(task, run)
        webhooks.enqueue_deliveries([webhooks.Queued(uuid.uuid4(), run.tier, run.pk, run.workflow_name)])
    wakeups.schedule_wakeup(tenant, str(run.pk), kind=items.RUN_CANCEL, delay_s=0)
    written = {**queued(tenant), **queued(Tenant.system(), [SYSTEM_TIER])}
    assert {kind: shape(payload) for kind, payload in written.items()} == {
        kind: shape(payload) for kind, payload in PINNED.items()}


def context(tenant: Tenant, item_id: str) -> ItemContext:
    return ItemContext(tenant_id=str(tenant.pk), item_id=item_id, tier="standard", partition=item_id, delivery=1,
                       waited_ms=0)


def test_a_tick_and_a_step_of_the_pinned_payloads_with_a_later_key_run_the_run(tenant: Tenant) -> None:
    run = started(tenant)
    with tenant_context(tenant):
        handlers.handler_for("tick")(context(tenant, items.tick_item_id(run.pk)),
                                     {**PINNED["tick"], "run_id": str(run.pk), **LATER})
        step = StepRun.objects.get(run=run, node_id="a")
        body = {**PINNED["step"], "step_id": str(step.pk), "run_id": str(run.pk), **LATER}
        handlers.handler_for("step")(context(tenant, items.step_item_id(step.pk)), body)
        run.refresh_from_db()
    assert run.status == "succeeded"


def test_a_wake_up_of_the_pinned_payload_with_a_later_key_acts_for_its_tenant(tenant: Tenant) -> None:
    run = started(tenant)
    WorkflowRun.all_tenants.filter(pk=run.pk).update(cancel_requested=True, updated_at=timezone.now())
    body = {**PINNED["wakeup"], "tenant_id": str(tenant.pk), "ref": str(run.pk), **LATER}
    with tenant_context(Tenant.system()):
        handlers.handler_for("wakeup")(context(Tenant.system(), "wake"), body)
    assert WorkflowRun.all_tenants.get(pk=run.pk).status == "cancelled"


def test_a_webhook_delivery_of_the_pinned_payload_with_a_later_key_is_read(tenant: Tenant) -> None:
    with tenant_context(tenant):  # no such delivery (gone, or delivered): nothing is sent
        assert handlers.handler_for("webhook")(context(tenant, "webhook"), {**PINNED["webhook"], **LATER}) is None
