"""Enqueue: one tenant's items (``enqueue``, ``enqueue_many``), many tenants' (``bulk_enqueue``),
and the enqueues a worker holds for its next round trip (``holding_enqueues``, ``enqueue_soon``).

An enqueue also writes the tenant's conf (its limits and status) and the admission scopes its items
need, so that the dequeue admits them by the limits of now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any

import structlog

from ductor_project.core import scripts, tenant_moves
from ductor_project.core.context import id_text
from ductor_project.core.keys import redis_key, shard_of
from scheduling.fair_queue.items import ENQUEUE_CODES, EnqueueResult, NewItem, TenantBatch, TenantConf, segments
from scheduling.fair_queue.layout import ITEMS_PER_CALL, dispatcher_side, run_script, script_header, tenant_of
from tenants.models import Tenant

log = structlog.get_logger(__name__)


def enqueue(
    item_id: str,
    *,
    tier: str,
    partition: str,
    payload: Any = None,
    delay_ms: int = 0,
    cost: int = 1,
    scope: str | None = None,
    scopes: Mapping[str, str] | None = None,
    kind: str | None = None,
    order_ms: float | None = None,
    key: str = "",
    tenant: Tenant | None = None,
) -> EnqueueResult:
    """Enqueue one item of the tenant, due ``delay_ms`` after now (Redis TIME); ``scope`` and
    ``scopes`` as ``NewItem.scope`` and ``enqueue_many`` say.

    One Redis round trip for the queue (the tenant's entitlements come from their
    cache), atomic, O(log n). Idempotent and coalescing: an id already waiting
    keeps its item and takes the earlier due time (``EXISTS``/``ADVANCED``); an id
    in flight runs again after its ack, with this payload (``RERUN``). Also
    records the tenant's weight and limits for dequeue. Raises ``TierNotAllowed``
    for a tier outside the tenant's plan, ``ValueError`` for a bad argument and
    ``TenantScopeError`` without a tenant.
    """
    item = NewItem(item_id, tier, partition, payload, delay_ms, cost, scope, kind, order_ms, key)
    return enqueue_many([item], scopes=scopes, tenant=tenant)[0]


def enqueue_many(
    items: Sequence[NewItem], *, scopes: Mapping[str, str] | None = None,
    key_weights: Mapping[str, int] | None = None, tenant: Tenant | None = None,
) -> list[EnqueueResult]:
    """Enqueue several items of one tenant, like ``enqueue`` for each, in order.

    ``scopes`` are the confs (``"pool:<id>"`` / ``"connection:<id>"`` -> JSON, from
    ``scheduling.admission``) of the pools the items need and of their connections:
    written with the items, so dequeue admits them by the routing table of now.
    ``key_weights`` (fairness key -> weight >= 1; a key not named keeps the weight it has,
    1 by default) are written with them too. One
    round trip per ``ITEMS_PER_CALL`` items, each atomic; every item is validated
    before any is written. Raises like ``enqueue``.
    """
    tenant = tenant_of(tenant)
    results: list[EnqueueResult] = []
    for _, args in segments(tenant, items, TenantConf.for_tenant(tenant), scopes or {}, key_weights):
        results.extend(ENQUEUE_CODES[int(code)] for code in _enqueue_segment(tenant, args))
    return results


def _enqueue_segment(tenant: Tenant, args: list[Any]) -> list[Any]:
    """One ``fq_enqueue`` call of one tenant's segment, in its shard, followed should it move."""
    return list(tenant_moves.follow(id_text(tenant), lambda: _enqueue_call(tenant, args)))


def _enqueue_call(tenant: Tenant, args: list[Any], batch: scripts.Batch | None = None,
                  again: Callable[[], Any] | None = None) -> Any:
    """The ``fq_enqueue`` call of one tenant's segment, in its shard (``run_script``'s ``batch``, ``again``)."""
    return run_script("fq_enqueue", [redis_key("fq", "items", tenant=tenant)],
                [*script_header(shard_of(id_text(tenant))), *args], batch, again)


# The enqueues held for the next ``handoff`` of the context (``holding_enqueues``): each one
# tenant's segment, as ``segments`` made it.
_held: ContextVar[list[tuple[Tenant, list[Any]]] | None] = ContextVar("ductor_held_enqueues", default=None)


def enqueue_soon(items: Sequence[NewItem], *, scopes: Mapping[str, str] | None = None,
                 tenant: Tenant | None = None) -> None:
    """``enqueue_many`` without its results: inside ``holding_enqueues()`` the items wait for that
    block's next ``handoff`` and travel in its round trip; elsewhere they are sent at once. Validated
    now either way (raises like ``enqueue_many``)."""
    held = _held.get()
    if held is None:
        enqueue_many(items, scopes=scopes, tenant=tenant)
        return
    tenant = tenant_of(tenant)
    held.extend((tenant, args) for _, args in segments(tenant, items, TenantConf.for_tenant(tenant), scopes or {}))


@contextmanager
def holding_enqueues() -> Iterator[None]:
    """A worker's block in which ``enqueue_soon`` holds its items for the block's next ``handoff``,
    which sends them first in its round trip (so its dequeue already sees them): the next steps
    that an item's commit makes ready cost no round trip of their own. Whatever is still held
    when the block ends (no handoff followed, or it failed) is sent then; should that fail too,
    it is logged and left to the reconciler, as a lost enqueue after any commit is."""
    held: list[tuple[Tenant, list[Any]]] = []
    token = _held.set(held)
    try:
        yield
    finally:
        _held.reset(token)
        if held:
            batch = scripts.Batch()
            _queue_held(batch, held)
            try:
                failed = _settle_held(held, batch.execute())
            except Exception as exc:
                failed = [exc]
            if failed:
                log.error("held_enqueues_lost", segments=len(held), error=repr(failed[0]))


def holding() -> bool:
    """Whether enqueues are held in this context now (``holding_enqueues``), waiting for a round trip."""
    return bool(_held.get())


def after_held(calls: Callable[[scripts.Batch], None]) -> list[Any]:
    """The replies of the script calls that ``calls`` puts on a batch, sent after the enqueues
    held in this context (``holding_enqueues``), in one round trip. Held segments that failed stay
    held, for the block's end."""
    batch, held = scripts.Batch(), _held.get() or []
    _queue_held(batch, held)
    sent = len(held)
    calls(batch)
    replies = batch.execute()
    if sent and (failed := _settle_held(held, replies[:sent])):
        log.warning("held_enqueues_failed", segments=len(failed), error=repr(failed[0]))
    return replies[sent:]


def _queue_held(batch: scripts.Batch, held: list[tuple[Tenant, list[Any]]]) -> None:
    """The held segments' ``fq_enqueue`` calls on ``batch`` (each followed where its tenant moved)."""
    for tenant, args in held:
        _enqueue_call(tenant, args, batch, again=partial(_enqueue_segment, tenant, args))


def _settle_held(held: list[tuple[Tenant, list[Any]]], replies: list[Any]) -> list[Exception]:
    """Let go of the held segments that ``replies`` (theirs first) say were enqueued; those that
    failed stay held (an enqueue sent again is coalesced). Returns their errors."""
    failed = [(segment, reply) for segment, reply in zip(held, replies, strict=False) if isinstance(reply, Exception)]
    held[:] = [segment for segment, _ in failed]
    return [reply for _, reply in failed]


def bulk_enqueue(batches: Iterable[TenantBatch], *, pipeline_size: int = 20) -> int:
    """Enqueue the items of many tenants, like ``enqueue_many`` for each: rebuilds and bulk loads.

    The tenants of a shard share script calls (up to ``ITEMS_PER_CALL`` items
    each, every call atomic), sent ``pipeline_size`` calls per round trip (per node of a cluster). A
    batch's ``conf`` (default: the tenant's entitlements) lets a loader that has
    no tenant rows (a benchmark) name the limits. Dispatcher side: refused inside
    a customer tenant's context. Returns how many new items were queued. A call one of whose
    tenants is moving to another shard wrote nothing: each of its tenants' segments is sent
    again alone, where that tenant is (``tenant_moves``).
    """
    dispatcher_side()
    queued = 0
    calls: list[tuple[list[str], list[Any], list[tuple[Tenant, list[Any]]]]] = []
    # Per shard: the call being filled (its first tenant's items key routes it; its tenants'
    # segments), and its size.
    filling: dict[int, tuple[list[str], list[Any], list[tuple[Tenant, list[Any]]]]] = {}
    sizes: dict[int, int] = {}

    def alone(parts: list[tuple[Tenant, list[Any]]]) -> Callable[[], list[Any]]:
        return lambda: [code for tenant, args in parts for code in _enqueue_segment(tenant, args)]

    def send() -> None:
        nonlocal queued
        batch = scripts.Batch()
        for keys, args, parts in calls:
            run_script("fq_enqueue", keys, args, batch, again=alone(parts))
        for codes in batch.execute():
            if isinstance(codes, Exception):
                raise codes
            queued += sum(1 for code in codes if int(code) == 1)
        calls.clear()

    def close(shard: int) -> None:
        calls.append(filling.pop(shard))
        sizes.pop(shard)
        if len(calls) >= pipeline_size:
            send()

    for batch in batches:
        tenant_id = str(batch.tenant.pk)
        shard = shard_of(tenant_id)
        conf = batch.conf or TenantConf.for_tenant(batch.tenant)
        for count, args in segments(batch.tenant, batch.items, conf, batch.scopes, batch.key_weights):
            if shard in filling and sizes[shard] + count > ITEMS_PER_CALL:
                close(shard)
            if shard not in filling:
                filling[shard] = ([redis_key("fq", "items", tenant=batch.tenant)], list(script_header(shard)), [])
                sizes[shard] = 0
            filling[shard][1].extend(args)
            filling[shard][2].append((batch.tenant, args))
            sizes[shard] += count
    for shard in list(filling):
        close(shard)
    if calls:
        send()
    return queued

