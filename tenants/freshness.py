"""Whether what a process holds about a tenant is still current: one stamp per tenant.

Every process keeps copies of what its hot paths read about a tenant: its row, its limits, its
routing table, its webhook endpoints. Each copy is good for the tenant's *stamp*, a random value that
every change of any of them replaces, at the change and again once it commits (``bump``); a plan
edit replaces the plans' stamp, which is part of every tenant's. A process reads the stamps at most
every ``LOCAL_TTL_S`` (one round trip, both keys in one ``MGET`` of the cache) and keeps every copy
whose stamp is unchanged. So a tenant whose work comes now and then costs a process one round trip
per ``LOCAL_TTL_S``, whatever it reads, instead of a reload of each copy (PostgreSQL queries among
them), and its work is no dearer than a busy tenant's: what the fair queue charges each tenant is the
work of its own items, not the refreshes of the caches.

A change is seen at once by the process that made it, and by every other within ``LOCAL_TTL_S``. A
stamp the cache lost (a flush, an eviction) reads as a new one: every copy is read again.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

from cachetools import LRUCache
from django.core.cache import cache
from django.db import transaction

from ductor_project.core.context import TenantLike, id_text, no_tenant
from ductor_project.core.keys import global_key, tenant_key

LOCAL_TTL_S = 2.0
PLANS_KEY = global_key("plans", "version")

T = TypeVar("T")

# tenant id -> (its stamp, when this process read it: time.monotonic())
_stamps: LRUCache[str, tuple[str, float]] = LRUCache(maxsize=10_000)
_lock = threading.Lock()


class TenantRef(NamedTuple):
    """A tenant known by its id alone: all a stamp needs (a process that has not read the row yet)."""

    pk: Any
    slug: str = ""
    is_system: bool = False


def _key(tenant: TenantLike) -> str:
    return tenant_key("stamp", tenant=tenant)


def stamp(tenant: TenantLike) -> str:
    """The tenant's stamp: this process's reading of it if at most ``LOCAL_TTL_S`` old, else read
    again (one round trip)."""
    tenant_id, now = id_text(tenant), time.monotonic()
    with _lock:
        known = _stamps.get(tenant_id)
    if known is not None and now - known[1] < LOCAL_TTL_S:
        return known[0]
    key = _key(tenant)
    with no_tenant():  # whichever tenant is in context: a stamp tells nothing of the tenant's data
        found = cache.get_many([key, PLANS_KEY])
    current = f"{found.get(key, '-')}/{found.get(PLANS_KEY, 0)}"
    with _lock:
        _stamps[tenant_id] = (current, now)
    return current


def renew(tenant: TenantLike) -> None:
    """Give ``tenant`` a new stamp now, and forget this process's reading of it (so that this
    process sees the change at its next read). Outside a transaction; else see ``bump``."""
    with no_tenant():
        cache.set(_key(tenant), uuid.uuid4().hex, None)
    forget(tenant)


def bump(tenant: TenantLike) -> None:
    """Something the processes keep about ``tenant`` changed: ``renew`` its stamp now and again once
    the surrounding transaction commits (a copy read in between would keep what a rollback undoes)."""
    renew(tenant)
    transaction.on_commit(lambda: renew(tenant))


def bump_plans() -> None:
    """A plan changed: every tenant's stamp changes (the plans' stamp is part of each), now and again
    once the surrounding transaction commits."""

    def renew() -> None:
        try:
            cache.incr(PLANS_KEY)
        except ValueError:
            cache.set(PLANS_KEY, 1, None)
        forget()

    renew()
    transaction.on_commit(renew)


def forget(tenant: TenantLike | None = None) -> None:
    """Forget this process's reading of ``tenant``'s stamp (of every tenant's with None)."""
    with _lock:
        if tenant is None:
            _stamps.clear()
        else:
            _stamps.pop(id_text(tenant), None)


class Copies(Generic[T]):
    """A process's copies of one kind of a tenant's data, each kept while the tenant's stamp is the
    one it was read at. Thread-safe; the copies are shared by the process's threads (read only)."""

    def __init__(self, maxsize: int = 10_000) -> None:
        self._copies: LRUCache[str, tuple[T, str]] = LRUCache(maxsize=maxsize)
        self._lock = threading.Lock()

    def get(self, tenant: TenantLike, load: Callable[[], T]) -> T:
        """The tenant's copy, read with ``load`` when this process holds none for its stamp. At most
        one round trip (the stamp) besides ``load``."""
        current, tenant_id = stamp(tenant), id_text(tenant)
        with self._lock:
            held = self._copies.get(tenant_id)
        if held is not None and held[1] == current:
            return held[0]
        value = load()
        with self._lock:
            self._copies[tenant_id] = (value, current)
        return value

    def forget(self, tenant: TenantLike | None = None) -> None:
        """Drop this process's copy of ``tenant``'s (of every tenant's with None)."""
        with self._lock:
            if tenant is None:
                self._copies.clear()
            else:
                self._copies.pop(id_text(tenant), None)

