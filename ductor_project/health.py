"""``/healthz`` (liveness) and ``/readyz`` (readiness), for load balancers and orchestrators.

``/healthz`` answers 200 while the web process serves requests; it checks
nothing else, so a database outage does not get every web process restarted.
``/readyz`` answers 200 only when PostgreSQL and Redis (Ductor's own: every primary of a
cluster) answer and at least one
coordinator and one dispatcher beat within ``DUCTOR_HEARTBEAT_STALE_S``
(``ductor_project.core.heartbeats``), and the apps' own checks pass (``register_check``: every
fair-queue shard served by a live dispatcher, ``scheduling.dispatch.shards``; a live worker on each
of Ductor's queues, ``scheduling.dispatch.credits``); else 503. Both answer JSON, need no
credentials and show no tenant data: what is checked, whether it passed, how
long it took, and the heartbeat ages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import structlog
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from ductor_project.core import heartbeats, redis

log = structlog.get_logger(__name__)

# The apps' own readiness checks (``register_check``): name -> a function that returns its details,
# with ``"ok"`` False (and an ``"error"``) when not ready, or raises.
_CHECKS: dict[str, Callable[[], dict[str, Any]]] = {}


def register_check(name: str, check: Callable[[], dict[str, Any]]) -> None:
    """An app's readiness check, run by every ``/readyz`` (from its ``AppConfig.ready``)."""
    _CHECKS[name] = check


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, dict[str, Any]] = {"database": _timed(_database), "redis": _timed(_redis)}
    # The rest read Redis: out of reach, each would wait for its own timeout to say so again.
    reached = checks["redis"]["ok"]
    rest: dict[str, Callable[[], dict[str, Any]]] = {
        **{kind: partial(_loop, kind) for kind in heartbeats.KINDS}, **_CHECKS}
    checks.update({name: _timed(check) if reached else {**_UNCHECKED, "ms": 0.0} for name, check in rest.items()})
    failed = [name for name, check in checks.items() if not check["ok"]]
    response = JsonResponse({"status": "unavailable" if failed else "ok", "checks": checks},
                            status=503 if failed else 200)
    if failed:
        # A probe doing its job, said once as a warning: not Django's error line of a 5xx.
        log.warning("not_ready", failed=failed)
        response._has_been_logged = True  # type: ignore[attr-defined]  # Django's own flag (log_response)
    return response


_UNCHECKED = {"ok": False, "error": "not checked: Redis is out of reach"}


def _timed(check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        result: dict[str, Any] = {"ok": True, **check()}
    except Exception as exc:  # a health check reports a failure, it does not raise it
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    result["ms"] = round((time.perf_counter() - started) * 1000, 2)
    return result


def _database() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {}


def _redis() -> dict[str, Any]:
    redis.ping()
    return {}


def _loop(kind: str) -> dict[str, Any]:
    """Fresh when at least one process of ``kind`` beat within the stale bound."""
    stale_s = settings.DUCTOR_HEARTBEAT_STALE_S
    ages = heartbeats.ages(kind)
    fresh = sorted(name for name, age in ages.items() if age <= stale_s)
    newest = min(ages.values(), default=None)
    result: dict[str, Any] = {"ok": bool(fresh), "fresh": len(fresh), "stale": len(ages) - len(fresh),
                              "newest_age_s": None if newest is None else round(newest, 3)}
    if not fresh:
        result["error"] = (f"no {kind} beat in the last {stale_s:g} s" if ages
                           else f"no {kind} has ever beaten (or its beat was lost with Redis's data)")
    return result
