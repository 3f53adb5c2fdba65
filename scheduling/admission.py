"""Admission at dequeue: what the fair queue admits besides the tenant, and the limits it uses.

Route once: the tick routes a step attempt (rule, tier, partition, pool:
``scheduling.routing``) and its queue item carries the pool's id. The dequeue
(``lua/admit_lib.lua``) admits it in the same atomic step as the tenant's slot
and rate: a slot and the rate of the pool, then one of the pool's connections,
chosen by the pool's strategy among those whose breaker is not open, that have
a free slot and whose rate admits a start. A head that cannot be admitted is
parked (a freed slot of its pool or connection wakes it) or looked at again
when its rate or breaker allows; it is never dispatched only to come back.

**Queue shares.** The team's worker queues listed in ``DUCTOR_TASK_QUEUE_SLOTS``
have slots that every tenant's task steps share: a celery connection to such a
queue carries the share (``queue_share``) in its conf, and a task step with no
pool is admitted by a pool of its own for its catalog queue (``queue_scope``).
The dequeue takes a slot of the share with the others, or parks the head among
the share's waiters, woken in the fair order as slots free (``admit_lib.lua``).
A connection naming a queue kept for other tenants (the task catalog's, which
``register_kept_queues`` installs) carries none: its steps are refused at their
publish, and meanwhile would hold those tenants' slots and learn how full they are.

The fair queue reads the limits from its own copy, kept here from the routing
table: written with every enqueue of a routed item (``scope_confs``) and, when
a tenant's routing changes, for all its pools and connections at once
(``configure``), so a raised limit, a new member or a removed connection counts
for the items already queued, and wakes those it may admit. The tenant's own
limits and status (suspension) are kept the same way (``configure_tenant``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import structlog
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from ductor_project.core.context import tenant_context
from scheduling import fair_queue
from scheduling.connection_config import DEFAULT_BROKER
from scheduling.routing_table import MemberInfo, PoolInfo, RoutingTable, routing_table
from tenants.models import Tenant

log = structlog.get_logger(__name__)

# The pool and connection ids of a catalog queue's own admission scope (a task step with no pool).
QUEUE_SCOPE_PREFIX = "queue:"


def queue_slots() -> dict[str, int]:
    """``DUCTOR_TASK_QUEUE_SLOTS`` as share name (``<broker>/<queue>``) -> slots."""
    slots: dict[str, int] = {}
    for name, value in settings.DUCTOR_TASK_QUEUE_SLOTS.items():
        try:
            count = int(value)
        except ValueError:
            count = -1
        if count < 1:  # 0 slots would hold every step of the queue, for good
            raise ImproperlyConfigured(f"DUCTOR_TASK_QUEUE_SLOTS: {name}={value} is not a number of slots "
                                       "(a whole number from 1)")
        slots[name if "/" in name else f"{DEFAULT_BROKER}/{name}"] = count
    return slots


def queue_share(broker: str, queue: str) -> tuple[str, int] | None:
    """The share of a team queue (its name and slots), or None when its slots are not shared."""
    name = f"{broker or DEFAULT_BROKER}/{queue}"
    slots = queue_slots().get(name)
    return None if slots is None else (name, slots)


# Whether a queue of Ductor's own broker is kept for tenants other than the one in context.
KeptQueues = Callable[[str], bool]
_kept_queues: list[KeptQueues] = []


def register_kept_queues(kept: KeptQueues) -> None:
    """Have ``kept(queue)`` say which queues of Ductor's own broker are kept for tenants other than
    the one in context: a connection of the tenant's naming one carries no part of its share."""
    _kept_queues[:] = [kept]


def _connection_share(member: MemberInfo) -> tuple[str, int] | None:
    """The share a celery connection's steps are admitted by: its queue's, unless kept for others."""
    if not member.queue:
        return None
    share = queue_share(member.broker, member.queue)
    if share is None or (member.broker or DEFAULT_BROKER) != DEFAULT_BROKER:
        return share
    return None if any(kept(member.queue) for kept in _kept_queues) else share


def _share_fields(share: tuple[str, int] | None) -> dict[str, Any]:
    return {} if share is None else {"share": share[0], "share_limit": share[1]}


def queue_scope(queue: str) -> tuple[str, dict[str, str]] | None:
    """The admission scope of a task step with no pool, for its catalog queue on Ductor's broker:
    its pool id and confs (one member, the queue itself, carrying the share). None when the
    queue's slots are not shared."""
    share = queue_share(DEFAULT_BROKER, queue)
    if share is None:
        return None
    scope = f"{QUEUE_SCOPE_PREFIX}{share[0]}"
    pool = {**_limits(None, None, None), "strategy": "failover", "members": [[scope, 1, 0]]}
    member = {**_limits(None, None, None), "pools": [scope], **_share_fields(share)}
    return scope, {f"pool:{scope}": json.dumps(pool, separators=(",", ":")),
                   f"connection:{scope}": json.dumps(member, separators=(",", ":"))}


# The scope of a tenant's webhook deliveries: their slots, of each tenant's own.
WEBHOOK_SCOPE = "webhooks"


def webhook_scope(limit: int) -> tuple[str, dict[str, str]]:
    """The admission scope of a tenant's webhook deliveries: at most ``limit`` of them in flight at
    once (a pool of the tenant's with one member, unbounded), so that its slow endpoints hold that
    many worker slots at most, besides its concurrency ceiling."""
    pool = {**_limits(limit, None, None), "strategy": "failover", "members": [[WEBHOOK_SCOPE, 1, 0]]}
    member = {**_limits(None, None, None), "pools": [WEBHOOK_SCOPE]}
    return WEBHOOK_SCOPE, {f"pool:{WEBHOOK_SCOPE}": json.dumps(pool, separators=(",", ":")),
                           f"connection:{WEBHOOK_SCOPE}": json.dumps(member, separators=(",", ":"))}


def _limits(max_concurrency: int | None, rate_per_s: float | None, burst: int | None) -> dict[str, Any]:
    return {
        "limit": -1 if max_concurrency is None else max_concurrency,
        "rate": rate_per_s or 0,
        "burst": burst or 1,
    }


def _members(pool: PoolInfo) -> list[MemberInfo]:
    """The pool's members in the order admission looks at them: by priority, then name."""
    return sorted(pool.members, key=lambda m: (m.priority, m.name))


def pool_conf(pool: PoolInfo) -> str:
    """The pool's conf as the dequeue reads it (``"pool:<id>"``)."""
    members = [[m.connection_id, m.weight, m.priority] for m in _members(pool)]
    return json.dumps({**_limits(pool.max_concurrency, pool.rate_per_s, pool.burst),
                       "strategy": pool.strategy, "members": members}, separators=(",", ":"))


def connection_conf(member: MemberInfo, table: RoutingTable) -> str:
    """A connection's conf as the dequeue reads it (``"connection:<id>"``), with the pools it serves."""
    pools = sorted(p.id for p in table.pools.values() if any(m.connection_id == member.connection_id
                                                             for m in p.members))
    return json.dumps({**_limits(member.max_concurrency, member.rate_per_s, member.burst), "pools": pools,
                       **_share_fields(_connection_share(member))}, separators=(",", ":"))


def scope_confs(pool: PoolInfo, table: RoutingTable) -> dict[str, str]:
    """The confs an item of ``pool`` is admitted by: the pool's and its connections'."""
    confs = {f"pool:{pool.id}": pool_conf(pool)}
    for member in pool.members:
        confs[f"connection:{member.connection_id}"] = connection_conf(member, table)
    return confs


def all_scope_confs(table: RoutingTable) -> dict[str, str]:
    """The confs of every pool and connection of the tenant's routing table, and of the shared
    queues' own scopes."""
    confs: dict[str, str] = {}
    for pool in table.pools.values():
        confs.update(scope_confs(pool, table))
    for name in queue_slots():
        broker, queue = name.split("/", 1)
        found = queue_scope(queue) if broker == DEFAULT_BROKER else None
        if found is not None:
            confs.update(found[1])
    return confs


def configure(tenant: Tenant) -> int:
    """The tenant's routing changed: replace the queue's copy of its pools' and connections'
    limits with the routing table's, waking the partitions parked on what changed. One round
    trip (plus the table's read when it is not cached). Returns how many confs changed."""
    with tenant_context(tenant):
        changed = fair_queue.configure(scopes=all_scope_confs(routing_table()), replace_scopes=True)
    if changed:
        log.info("admission_scopes_configured", tenant_id=str(tenant.pk), changed=changed)
    return changed


def configure_tenant(tenant: Tenant) -> None:
    """The tenant's limits or status changed: the queue's copy of them follows at once (a
    reactivated tenant, or one whose ceiling rose, is dispatched again without waiting)."""
    if tenant.is_system:
        return
    with tenant_context(tenant):
        fair_queue.configure()


def peek(pool: PoolInfo, table: RoutingTable) -> fair_queue.AdmissionView:
    """How the dequeue would admit an item of ``pool`` now, by the routing table of now, taking
    nothing (no slot, no rate, no round-robin turn). One round trip."""
    confs = scope_confs(pool, table)
    return fair_queue.admission_peek(pool.id, confs.pop(f"pool:{pool.id}"), confs)


# -- keeping the copy current (connected in SchedulingConfig.ready()) -------------------------------

def routing_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    """A connection, pool, member or rule was saved or deleted: configure after the commit."""
    tenant = instance.tenant
    transaction.on_commit(lambda: configure(tenant))


def limits_changed(sender: Any, tenant: Tenant, committed: bool, **kwargs: Any) -> None:
    """``tenants.entitlements.limits_changed``: the tenant's limits or status changed (read them
    once committed only)."""
    if committed:
        configure_tenant(tenant)
