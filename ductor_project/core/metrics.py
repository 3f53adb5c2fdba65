"""The Prometheus metrics each process records, and the web side's request metrics.

Every process records into ``prometheus_client``'s metrics defined here. With
``PROMETHEUS_MULTIPROC_DIR`` set (``manage.py up`` sets it for its children;
a deployment sets it per host, to an empty directory), each process writes its
samples to files there, so gunicorn's and Celery's prefork children are all
counted, and ``/metrics`` (``scheduling.metrics``) merges them; without it, a
process serves only its own. The gauges of shared state (queue depth, leases,
credits, breakers, heartbeats) are not recorded by anyone: ``/metrics`` reads
them from Redis when scraped.

Labels are bounded: kinds, tiers, outcomes, HTTP methods (a made-up one is "other"), URL patterns (not
paths) and status codes; never a tenant, run or item id (per-tenant series
are the scrape-time top N, ``scheduling.metrics``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from prometheus_client import Counter, Histogram

_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SLOW = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)

DISPATCH_WAIT = Histogram(
    "ductor_dispatch_wait_seconds", "From an item being due to its dispatch (by a dispatcher or by handoff).",
    ["tier"], buckets=(*_FAST, 30.0, 60.0, 300.0))
ITEM_DURATION = Histogram(
    "ductor_item_duration_seconds", "How long a worker ran one fair-queue item, by kind and outcome.",
    ["kind", "outcome"], buckets=(*_FAST, 30.0, 60.0, 300.0))
STEP_DURATION = Histogram(
    "ductor_step_duration_seconds", "A step attempt, from its start to its recorded outcome.",
    ["node_type", "outcome"], buckets=_SLOW)
REAPED = Counter("ductor_reaped_leases_total", "Expired leases the coordinator returned to the queue.")
REPAIRS = Counter("ductor_reconciler_repairs_total", "Things the reconcilers repaired in Redis from PostgreSQL.")
LOOP_PASS = Histogram(
    "ductor_loop_pass_seconds", "One pass of a coordinator's or a dispatcher's loop.", ["kind"], buckets=_FAST)
BREAKER_OPENED = Counter("ductor_breaker_opened_total", "Connection calls that found or left their breaker open.")
HTTP_DURATION = Histogram(
    "ductor_http_request_duration_seconds", "API and admin requests, by method, URL pattern and status.",
    ["method", "route", "status"], buckets=_FAST)
# The methods that are labels of their own; any other is "other".
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestMetricsMiddleware:
    """Times each request into ``HTTP_DURATION``, labelled by its URL pattern (``<unmatched>`` for a
    404 that matched none), so that ids in paths never become labels."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = getattr(match, "route", None) or "<unmatched>"
        method = request.method if request.method in _METHODS else "other"  # any name a client makes up
        HTTP_DURATION.labels(method, route, str(response.status_code)).observe(time.perf_counter() - started)
        return response
