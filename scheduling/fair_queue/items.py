"""What goes in and comes out of the fair queue: items, a tenant's conf, a dispatch, and their
encoding as script arguments.

``segments`` turns one tenant's items into ``fq_enqueue`` calls of at most ``ITEMS_PER_CALL``
items each, every item validated before any is written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from ductor_project.core.context import id_text
from scheduling.fair_queue.layout import (
    ITEMS_PER_CALL,
    MAX_NAME_LENGTH,
    MAX_PAYLOAD_BYTES,
    SCOPE_FIELDS,
    SYSTEM_TIER,
    TIERS,
    at_least,
    ms_arg,
    name_arg,
)
from tenants.entitlements import effective_entitlements
from tenants.models import Tenant


class TierNotAllowed(ValueError):
    """The tenant may not use this tier (its plan's ``allowed_tiers``; ``system`` is the system tenant's)."""


class EnqueueResult(StrEnum):
    QUEUED = "queued"  # a new item
    EXISTS = "exists"  # already waiting, unchanged
    ADVANCED = "advanced"  # already waiting, now due earlier
    RERUN = "rerun"  # in flight: it runs again after its ack


ENQUEUE_CODES = {
    1: EnqueueResult.QUEUED,
    2: EnqueueResult.EXISTS,
    3: EnqueueResult.ADVANCED,
    4: EnqueueResult.RERUN,
}


@dataclass(frozen=True)
class NewItem:
    """An item to enqueue. ``payload`` is any JSON-serializable value (keep it small: references).

    ``scope`` is the id of the tenant's pool whose slots and rate (and one of whose
    connections) the item needs at dequeue, besides its tenant's; None for none.
    ``kind`` names what its work is estimated by (the tenant's moving average of that
    kind's measured work; default: the payload's ``"kind"``). ``order_ms`` (Unix ms) is its
    order key among the tenant's items due now, when earlier than its due time: the
    engine gives a run's items the run's start, so a tenant's older runs go first.
    ``key`` is its fairness key inside the tenant ("" for none): the tenant's backlogged keys
    share its dispatches by their weights (equal by default) before its partitions do. A
    partition keeps the key of the item it was created with.
    """

    item_id: str
    tier: str
    partition: str
    payload: Any = None
    delay_ms: int = 0
    cost: int = 1
    scope: str | None = None
    kind: str | None = None
    order_ms: float | None = None
    key: str = ""


@dataclass(frozen=True)
class TenantConf:
    """What the fair queue needs of a tenant's entitlements. ``None`` limits mean none."""

    weight: int
    max_concurrency: int | None
    rate_per_s: float | None
    burst: int
    tiers: tuple[str, ...]
    suspended: bool = False
    # The version of the tenant row ``suspended`` was read from (its ``updated_at``, µs): the
    # queue keeps the status of the newest row it was told, whatever order processes write in.
    status_version: int = 0

    def __post_init__(self) -> None:
        at_least("weight", self.weight, 1)
        at_least("burst", self.burst, 1)
        if self.max_concurrency is not None:
            at_least("max_concurrency", self.max_concurrency, 0)
        if self.rate_per_s is not None and not 0 < self.rate_per_s < math.inf:
            raise ValueError(f"rate_per_s is a finite number > 0 or None, not {self.rate_per_s!r}")
        if not set(self.tiers) <= set(TIERS):
            raise ValueError(f"tiers are a subset of {list(TIERS)}, not {list(self.tiers)!r}")

    @classmethod
    def for_tenant(cls, tenant: Tenant) -> TenantConf:
        """From the tenant's effective entitlements; the system tenant has its tier and no limits."""
        if tenant.is_system:
            return cls(weight=1, max_concurrency=None, rate_per_s=None, burst=1, tiers=(SYSTEM_TIER,))
        ent = effective_entitlements(tenant)
        return cls(
            weight=ent.weight,
            max_concurrency=ent.max_concurrency,
            rate_per_s=ent.step_rate_per_s,
            burst=ent.step_burst,
            tiers=tuple(ent.allowed_tiers),
            suspended=not tenant.is_active,
            status_version=int(tenant.updated_at.timestamp() * 1_000_000) if tenant.updated_at else 0,
        )


@dataclass(frozen=True)
class TenantBatch:
    """One tenant's items for ``bulk_enqueue``; ``conf`` defaults to ``TenantConf.for_tenant``;
    ``scopes`` are the admission scope confs its items use, ``key_weights`` the weights of its
    items' fairness keys (see ``enqueue_many``)."""

    tenant: Tenant
    items: Sequence[NewItem]
    conf: TenantConf | None = None
    scopes: Mapping[str, str] = field(default_factory=dict)
    key_weights: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Dequeued:
    """A dispatched item.

    ``waited_ms`` is how long it was due before this dispatch; ``attempt`` counts
    its deliveries (1 the first time). ``delivery`` is this delivery's token,
    unique per tenant: pass it to ack/nack/extend_lease so that a worker whose
    lease ended cannot touch a later delivery of the same item. ``lease_until_ms``
    is when its lease ends (Unix ms, Redis's clock) unless extended.
    ``connection_id`` is the connection of its pool that its admission chose ("" for
    none), ``admitted`` why that one.
    """

    tenant_id: str
    item_id: str
    tier: str
    partition: str
    payload: Any
    waited_ms: int
    attempt: int
    delivery: int
    lease_until_ms: int
    connection_id: str = ""
    admitted: str = ""


class Finished(NamedTuple):
    """An item a worker finished, in the delivery it ran: what ``handoff`` and ``queue_ack`` ack;
    ``work_ms`` is the work it did, measured on the worker (None: unreported, see ``ack``)."""

    tenant: Tenant
    item_id: str
    delivery: int
    work_ms: float | None = None


def item_args(item: NewItem, conf: TenantConf) -> list[Any]:
    if item.tier not in conf.tiers:
        raise TierNotAllowed(f"tier {item.tier!r} is not allowed; allowed: {list(conf.tiers)}")
    if isinstance(item.cost, bool) or not isinstance(item.cost, int) or item.cost < 1:
        raise ValueError(f"cost is an int >= 1, not {item.cost!r}")
    payload = json.dumps(item.payload, separators=(",", ":"))
    if len(payload.encode()) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"payload is larger than {MAX_PAYLOAD_BYTES} bytes")
    kind = item.kind
    if kind is None:
        kind = str(item.payload.get("kind", "")) if isinstance(item.payload, dict) else ""
    return [
        name_arg("item_id", item.item_id),
        item.tier,
        name_arg("partition", item.partition),
        at_least("delay_ms", item.delay_ms, 0),
        item.cost,
        payload,
        "" if item.scope is None else name_arg("scope", item.scope),
        kind[:MAX_NAME_LENGTH],
        "" if item.order_ms is None else ms_arg("order_ms", item.order_ms),
        fairness_key(item.key),
    ]


def fairness_key(key: str) -> str:
    if not isinstance(key, str) or len(key) > MAX_NAME_LENGTH:
        raise ValueError(f"key is a str of at most {MAX_NAME_LENGTH} characters, not {key!r}")
    return key


def key_weight_args(weights: Mapping[str, int]) -> list[Any]:
    for key, weight in weights.items():
        fairness_key(key)
        at_least(f"the weight of key {key!r}", weight, 1)
    return [len(weights), *(part for key, weight in weights.items() for part in (key, weight))]


def conf_args(conf: TenantConf) -> list[Any]:
    return [
        conf.weight,
        -1 if conf.max_concurrency is None else conf.max_concurrency,
        0 if conf.rate_per_s is None else repr(float(conf.rate_per_s)),
        conf.burst,
        1 if conf.suspended else 0,
        conf.status_version,
    ]


def scope_args(scopes: Mapping[str, str]) -> list[Any]:
    for name in scopes:
        if not name.startswith(SCOPE_FIELDS):
            raise ValueError(f"an admission scope is named 'pool:<id>' or 'connection:<id>', not {name!r}")
    return [len(scopes), *(part for name, conf in scopes.items() for part in (name, conf))]


def segments(
    tenant: Tenant, items: Sequence[NewItem], conf: TenantConf, scopes: Mapping[str, str],
    key_weights: Mapping[str, int] | None = None,
) -> list[tuple[int, list[Any]]]:
    """The tenant's items as script ARGV segments of at most ``ITEMS_PER_CALL`` items each:
    (item count, args), each with the weights of ``key_weights`` (fairness key -> weight; 1 puts a
    key back to the default). Every item is validated before any is written."""
    flat = [item_args(item, conf) for item in items]
    head = [id_text(tenant), *conf_args(conf), *scope_args(scopes), *key_weight_args(key_weights or {})]
    return [
        (len(chunk), [*head, len(chunk), *(arg for args in chunk for arg in args)])
        for chunk in (flat[i : i + ITEMS_PER_CALL] for i in range(0, len(flat), ITEMS_PER_CALL))
    ]

