"""``/metrics``: Prometheus metrics of every process, and the shared state read when scraped.

What processes record (dispatch waits, item and step durations, reaped leases,
repairs, loop passes, breaker openings, HTTP requests) is defined in
``ductor_project.core.metrics``; with ``PROMETHEUS_MULTIPROC_DIR`` set it is
merged from every process of the host (``MultiProcessCollector``). The state
that lives in Redis is read at scrape time by ``SharedStateCollector``, at most
every ``DUCTOR_METRICS_QUEUE_EVERY_S`` per web process:

- per shard and tier: items waiting, due, in flight, and the age of the oldest
  due item (``fair_queue.depth``); tenants ready and parked;
- per shard: leases in flight and leases ended but not reaped yet;
- per Celery queue: worker slots and dispatch credits in use;
- connection breakers open and half-open;
- per coordinator and dispatcher process: the seconds since its loop last
  completed a pass (its heartbeat), which is its lag.

Per-tenant series are the ``DUCTOR_METRICS_TOP_TENANTS`` tenants with the most
items, plus one ``tenant_id="other"`` series with the rest, so the number of
series is bounded whatever the number of tenants. Served when
``DUCTOR_METRICS_ENABLED``: with ``DUCTOR_METRICS_TOKEN`` set, only to
``Authorization: Bearer <token>``; without one, only to this machine (a
request from loopback that no proxy forwarded), since the per-tenant series
name tenants (docs/operations.md).
"""

from __future__ import annotations

import hmac
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import structlog
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from ductor_project.celery import SYSTEM_QUEUE, WORK_QUEUE
from ductor_project.core import heartbeats
from ductor_project.core.context import no_tenant
from ductor_project.core.errors import ErrorCode, error_body
from ductor_project.core.keys import queue_shards
from scheduling import circuit, fair_queue
from scheduling.dispatch import credits

log = structlog.get_logger(__name__)

OTHER = "other"
# Where a scrape may come from while no metrics token is set.
LOOPBACK = frozenset({"127.0.0.1", "::1"})


@dataclass(frozen=True)
class Snapshot:
    """The shared state, as one scrape read it."""

    depths: list[fair_queue.ShardDepth]
    stats: list[fair_queue.GlobalStats]
    slots: dict[str, int]
    busy: dict[str, int]
    breakers: tuple[int, int]
    lags: dict[str, dict[str, float]]


def read_snapshot() -> Snapshot:
    """Read the shared state from Redis, outside any tenant (it crosses them, counts only)."""
    top = settings.DUCTOR_METRICS_TOP_TENANTS
    shards = queue_shards()
    with no_tenant():
        return Snapshot(
            depths=[fair_queue.depth(shard, top=top) for shard in shards],
            stats=[fair_queue.global_stats(shard) for shard in shards],
            slots={queue: credits.worker_slots(queue) for queue in (WORK_QUEUE, SYSTEM_QUEUE)},
            busy={queue: credits.busy(queue) for queue in (WORK_QUEUE, SYSTEM_QUEUE)},
            breakers=circuit.open_breakers(),
            lags={kind: heartbeats.ages(kind) for kind in heartbeats.KINDS},
        )


class _Cache:
    """The last snapshot of this process, reused for ``DUCTOR_METRICS_QUEUE_EVERY_S``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._snapshot: Snapshot | None = None

    def get(self) -> Snapshot:
        with self._lock:
            if self._snapshot is None or time.monotonic() - self._at >= settings.DUCTOR_METRICS_QUEUE_EVERY_S:
                self._snapshot = read_snapshot()
                self._at = time.monotonic()
            return self._snapshot


_cache = _Cache()


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class SharedStateCollector(Collector):
    """The gauges of the state shared in Redis (see the module docs)."""

    def collect(self) -> Iterator[Metric]:
        up = _gauge("ductor_shared_state_up", "Whether this scrape could read the shared state in Redis.", [])
        try:
            snapshot = _cache.get()
        except Exception:
            log.warning("metrics_shared_state_unreadable", exc_info=True)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from _queue_metrics(snapshot)
        yield from _tenant_metrics(snapshot)
        yield from _lease_metrics(snapshot)
        yield from _loop_metrics(snapshot)


def _queue_metrics(snapshot: Snapshot) -> Iterator[Metric]:
    waiting = _gauge("ductor_queue_waiting", "Items waiting in the fair queue (due or not).", ["shard", "tier"])
    due = _gauge("ductor_queue_due", "Items waiting and due now.", ["shard", "tier"])
    flight = _gauge("ductor_queue_in_flight", "Items dispatched and not finished.", ["shard", "tier"])
    age = _gauge("ductor_queue_oldest_due_age_seconds", "How long the oldest due item has been due.",
                 ["shard", "tier"])
    ready = _gauge("ductor_queue_tenants_ready", "Tenants with due work that may be served.", ["shard", "tier"])
    blocked = _gauge("ductor_queue_tenants_parked", "Tenants parked at their ceiling, or suspended.",
                     ["shard", "tier"])
    with_work = _gauge("ductor_queue_tenants_with_items", "Tenants with items waiting or in flight.", ["shard"])
    for shard_depth, stats in zip(snapshot.depths, snapshot.stats, strict=True):
        shard = str(shard_depth.shard)
        for tier, row in shard_depth.tiers.items():
            waiting.add_metric([shard, tier], row.backlog)
            due.add_metric([shard, tier], row.due)
            flight.add_metric([shard, tier], row.in_flight)
            age.add_metric([shard, tier], row.oldest_waiting_ms / 1000)
        for tier, tier_stats in stats.tiers.items():
            ready.add_metric([shard, tier], tier_stats.ready_tenants)
            blocked.add_metric([shard, tier], tier_stats.blocked_tenants)
        with_work.add_metric([shard], shard_depth.tenants)
    yield from (waiting, due, flight, age, ready, blocked, with_work)


def largest_tenants(depths: list[fair_queue.ShardDepth], top: int) -> tuple[list[fair_queue.TenantDepth],
                                                                            fair_queue.TenantDepth]:
    """The ``top`` tenants with the most items over every shard, and the rest summed as ``other``."""
    named = sorted((t for d in depths for t in d.largest), key=lambda t: (-(t.backlog + t.in_flight), t.tenant_id))
    named = named[:top]
    totals = [sum(getattr(row, field) for d in depths for row in d.tiers.values())
              for field in ("backlog", "due", "in_flight")]
    shown = [sum(getattr(t, field) for t in named) for field in ("backlog", "due", "in_flight")]
    other = fair_queue.TenantDepth(OTHER, *(max(0, total - part) for total, part in zip(totals, shown, strict=True)))
    return named, other


def _tenant_metrics(snapshot: Snapshot) -> Iterator[Metric]:
    named, other = largest_tenants(snapshot.depths, settings.DUCTOR_METRICS_TOP_TENANTS)
    waiting = _gauge("ductor_tenant_queue_waiting", "A tenant's items waiting (the largest tenants, and other).",
                     ["tenant_id"])
    due = _gauge("ductor_tenant_queue_due", "A tenant's items due now (the largest tenants, and other).",
                 ["tenant_id"])
    flight = _gauge("ductor_tenant_queue_in_flight", "A tenant's items in flight (the largest tenants, and other).",
                    ["tenant_id"])
    for row in [*named, other]:
        waiting.add_metric([row.tenant_id], row.backlog)
        due.add_metric([row.tenant_id], row.due)
        flight.add_metric([row.tenant_id], row.in_flight)
    yield from (waiting, due, flight)


def _lease_metrics(snapshot: Snapshot) -> Iterator[Metric]:
    leases = _gauge("ductor_leases_in_flight", "Leases of dispatched items, live or ended.", ["shard"])
    expired = _gauge("ductor_leases_expired", "Leases ended and not reaped yet.", ["shard"])
    for stats in snapshot.stats:
        leases.add_metric([str(stats.shard)], stats.in_flight)
        expired.add_metric([str(stats.shard)], stats.expired_leases)
    slots = _gauge("ductor_worker_slots", "Worker slots registered on a Celery queue.", ["queue"])
    busy = _gauge("ductor_dispatch_credits_in_use", "Dispatch credits in use: messages published, not finished.",
                  ["queue"])
    for queue, count in snapshot.slots.items():
        slots.add_metric([queue], count)
        busy.add_metric([queue], snapshot.busy[queue])
    breakers = _gauge("ductor_breakers", "Connection breakers by state (closed ones are not counted).", ["state"])
    opened, half_open = snapshot.breakers
    breakers.add_metric([circuit.BreakerState.OPEN], opened)
    breakers.add_metric([circuit.BreakerState.HALF_OPEN], half_open)
    yield from (leases, expired, slots, busy, breakers)


def _loop_metrics(snapshot: Snapshot) -> Iterator[Metric]:
    lag = _gauge("ductor_loop_lag_seconds", "Seconds since a coordinator's or dispatcher's loop last completed "
                 "a pass (its heartbeat).", ["kind", "process"])
    fresh = _gauge("ductor_loops_fresh", "Coordinators or dispatchers that beat within DUCTOR_HEARTBEAT_STALE_S.",
                   ["kind"])
    for kind, ages in snapshot.lags.items():
        for process, age in sorted(ages.items()):
            lag.add_metric([kind, process], age)
        fresh.add_metric([kind], sum(1 for age in ages.values() if age <= settings.DUCTOR_HEARTBEAT_STALE_S))
    yield from (lag, fresh)


class _ThisProcess(Collector):
    """This process's own metrics, when processes do not share a multiprocess directory."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def registry() -> CollectorRegistry:
    """What one scrape serves: every process's recorded metrics, and the shared state."""
    served = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(served)
    else:
        served.register(_ThisProcess())
    served.register(SharedStateCollector())
    return served


def _refusal(request: HttpRequest) -> JsonResponse | None:
    if not settings.DUCTOR_METRICS_ENABLED:
        return JsonResponse(error_body(ErrorCode.NOT_FOUND, "Metrics are off (DUCTOR_METRICS_ENABLED)."), status=404)
    token = settings.DUCTOR_METRICS_TOKEN
    if not token:
        if request.META.get("REMOTE_ADDR") in LOOPBACK and not _forwarded(request):
            return None
        return JsonResponse(error_body(ErrorCode.PERMISSION_DENIED, "Without DUCTOR_METRICS_TOKEN the metrics are "
                                       "served to this machine only (they name the busiest tenants)."), status=403)
    given = request.headers.get("Authorization", "")
    if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return None
    refusal = JsonResponse(error_body(ErrorCode.NOT_AUTHENTICATED,
                                      "The metrics need the metrics token: Authorization: Bearer <token>."),
                           status=401)
    refusal["WWW-Authenticate"] = "Bearer"
    return refusal


# Headers a reverse proxy adds to what it forwards: behind one on this host, every request comes
# from loopback, whoever sent it.
FORWARDED = ("Forwarded", "X-Forwarded-For", "X-Real-IP")


def _forwarded(request: HttpRequest) -> bool:
    return any(name in request.headers for name in FORWARDED)


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    refused = _refusal(request)
    if refused is not None:
        return refused
    return HttpResponse(generate_latest(registry()), content_type="text/plain; version=0.0.4; charset=utf-8")

