"""Running a tenant's queued items in the test's own process, as a worker would."""

from __future__ import annotations

from ductor_project.core.context import tenant_context
from ductor_project.core.keys import shard_of
from scheduling import fair_queue as fq
from scheduling.dispatch.handlers import ItemContext
from tenants.models import Tenant
from workflows.engine import items, steps
from workflows.engine import tick as engine_tick


def run_items(tenant: Tenant, limit: int = 1000) -> list[tuple[str, str]]:
    """Dispatch and run the tenant's items one at a time, as a worker would; (kind, run id) of each."""
    ran = []
    while len(ran) < limit and (item := fq.dequeue(shard=shard_of(str(tenant.pk)), lease_ms=60_000)):
        body = item.payload
        ran.append((body["kind"], body["run_id"]))
        ctx = ItemContext(tenant_id=str(tenant.pk), item_id=item.item_id, tier=item.tier, partition=item.partition,
                          delivery=item.delivery, waited_ms=item.waited_ms)
        with tenant_context(tenant):
            (engine_tick.execute_tick if body["kind"] == items.TICK else steps.execute_step)(ctx, body)
            assert fq.ack(item.item_id, delivery=item.delivery, work_ms=1.0)
    return ran
