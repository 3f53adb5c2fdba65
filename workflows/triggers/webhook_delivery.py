"""Sending webhooks: each delivery a fair-queue item of its tenant, each attempt one signed POST.

A delivery is the item ``webhook:<delivery id>`` (kind ``webhook``) of its tenant, in its run's
tier and in a partition of its own: it is dispatched in the tenant's fair share and under its
concurrency ceiling, so a tenant's slow or failing endpoint holds that tenant's slots and never
delays another tenant. A Ductor worker runs it (``execute_delivery``) in the tenant's context:

1. it claims the attempt: one conditional ``UPDATE`` moves a pending delivery that is due past the
   attempt's time bound, so a duplicate item, or one that comes early, sends nothing (nor does a
   delivery whose endpoint is disabled: it is stopped);
2. it signs the body (``signed_headers``) and POSTs it through
   ``scheduling.http_action.checked_request``: the address policy of ``http.request`` (a refused
   address is a failed attempt, and no socket is opened), the checked address pinned, no
   redirects followed, ``DUCTOR_WEBHOOK_TIMEOUT_S``, at most ``MAX_RESPONSE_BYTES`` of the answer
   read;
3. it records the attempt in the delivery's ``attempts``, in one transaction that locks the endpoint
   first (two deliveries of one endpoint take turns): a 2xx delivers it and zeroes the endpoint's
   ``consecutive_failures``. Anything else (another status, a timeout, a transport error, a refused
   address) counts one more consecutive failure and schedules the next attempt as a coordinator
   wake-up (``backoff_s``), or fails the delivery once it has had ``DUCTOR_WEBHOOK_MAX_ATTEMPTS``.
   At ``DUCTOR_WEBHOOK_DISABLE_AFTER`` consecutive failures the endpoint is disabled, with the
   reason, and its pending deliveries stop.

The handler never raises for an endpoint's failure (its item would run again): it records it, and
the item is acked. PostgreSQL holds every delivery's state, so ``reconcile_deliveries`` enqueues
again the pending deliveries whose attempt is overdue (Redis lost them, a wake-up was lost, a worker
died in the middle of an attempt).

A deleted endpoint's deliveries are not sent, nor enqueued again: ``purge_deleted_endpoints``, a
coordinator housekeeper, deletes them a batch at a time, then the endpoint's row.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
import structlog
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from ductor_project.core.context import current_tenant, tenant_context
from ductor_project.core.payloads import storable
from scheduling.action_errors import ActionError
from scheduling.coordinator.housekeeping import in_rounds
from scheduling.coordinator.wakeups import schedule_wakeup
from scheduling.dispatch.handlers import Failed, ItemContext
from scheduling.http_action import checked_request, parse_retry_after
from scheduling.response_body import iter_decoded
from scheduling.secrets import SecretError, decrypt
from tenants.models import Tenant
from tenants.scoping import in_tenant_turns
from workflows.engine.items import wakeup_on_commit
from workflows.models import WebhookDelivery, WebhookEndpoint
from workflows.spec import Retry, backoff_delay
from workflows.triggers.webhooks import (
    QUEUED_FIELDS,
    REDELIVER_NOTE,
    Queued,
    deliveries_stop,
    delivery_note,
    enqueue_deliveries,
    webhook_disable,
)

log = structlog.get_logger(__name__)

Status = WebhookDelivery.Status

# The coordinator wake-up that enqueues a delivery again when its next attempt is due.
WAKE_KIND = "webhook_retry"
USER_AGENT = "Ductor-Webhooks/1"
# The most of an answer that is read; the log keeps its first RESPONSE_LOGGED characters.
MAX_RESPONSE_BYTES = 4096
RESPONSE_LOGGED = 500
MAX_BACKOFF_S = 3600.0
# An item this early still attempts (the clocks of Redis and PostgreSQL differ a little).
EARLY_SLACK_S = 1.0
# An attempt claimed this long ago whose outcome never came (its worker died) is due again.
ATTEMPT_BOUND_S = 60.0
# A pending delivery this overdue is enqueued again by the reconciler (a wake-up and its item,
# dispatched on time, are long done by then); and the most it enqueues in one pass.
STALE_S = 30.0
RECONCILE_BATCH = 500


# --- signing ---------------------------------------------------------------------------------------------


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """HMAC-SHA256 of ``<timestamp>.<body>`` with ``secret`` (its UTF-8 bytes), in hex."""
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signed_headers(delivery_id: str, body: bytes, secrets: Sequence[str], *, timestamp: int) -> dict[str, str]:
    """The headers of an attempt: ``Ductor-Signature: t=<timestamp>,v1=<hex>`` with one ``v1`` per
    secret (the current one first; the previous one during a rotation's grace)."""
    signed = ",".join(f"v1={signature(secret, timestamp, body)}" for secret in secrets)
    return {"Content-Type": "application/json", "User-Agent": USER_AGENT, "Ductor-Webhook-Id": delivery_id,
            "Ductor-Webhook-Timestamp": str(timestamp), "Ductor-Signature": f"t={timestamp},{signed}"}


def signing_secrets(endpoint: WebhookEndpoint) -> list[str]:
    """The endpoint's current secret, then its previous one while the rotation's grace lasts.
    Raises ``SecretError`` when the configured keys cannot open one."""
    secrets = [decrypt(endpoint.secret)]
    expires = endpoint.previous_secret_expires_at
    if endpoint.previous_secret and expires is not None and expires > timezone.now():
        secrets.append(decrypt(endpoint.previous_secret))
    return secrets


def encoded_body(delivery: WebhookDelivery) -> bytes:
    """The bytes sent and signed: the delivery's body as compact JSON, in UTF-8."""
    return json.dumps(delivery.body, separators=(",", ":"), ensure_ascii=False).encode()


# --- one attempt -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """What one attempt got: an HTTP status, or the error that kept it from one."""

    at: datetime
    status_code: int | None
    error: str | None
    duration_ms: float
    response: str = ""
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300

    def as_json(self) -> dict[str, Any]:
        """The attempt as the delivery log keeps it: what the endpoint sent (its answer, an error
        quoting it) with a NUL replaced, which no ``jsonb`` text holds (``storable``)."""
        return {"at": self.at.isoformat().replace("+00:00", "Z"), "status_code": self.status_code,
                "error": storable(self.error), "duration_ms": self.duration_ms, "response": storable(self.response)}


def _attempt(delivery: WebhookDelivery, endpoint: WebhookEndpoint) -> Attempt:
    """POST the delivery to its endpoint once; never raises for what the endpoint or the network do."""
    at, started, timeout_s = timezone.now(), time.monotonic(), float(settings.DUCTOR_WEBHOOK_TIMEOUT_S)
    deadline = started + timeout_s

    def ended(status: int | None, error: str | None, **more: Any) -> Attempt:
        return Attempt(at, status, error, round((time.monotonic() - started) * 1000, 1), **more)

    url = httpx.URL(endpoint.url)
    if url.scheme != "https" and not settings.DUCTOR_HTTP_ALLOW_PRIVATE:
        return ended(None, "the URL must be https")
    body = encoded_body(delivery)
    try:
        headers = signed_headers(str(delivery.pk), body, signing_secrets(endpoint), timestamp=int(time.time()))
        with checked_request("POST", url, headers=headers, body=body, timeout_s=timeout_s) as response:
            # Each network phase has timeout_s; the answer as a whole must come within it too.
            if time.monotonic() > deadline:
                return ended(None, f"timed out after {timeout_s:g} s")
            text = _read_some(response, deadline)
            status = response.status_code
            wait = parse_retry_after(response.headers.get("retry-after")) if status in (429, 503) else None
    except ActionError as exc:  # a refused address, a name that does not resolve
        return ended(None, exc.message[:500])
    except httpx.TimeoutException:
        return ended(None, f"timed out after {timeout_s:g} s")
    except httpx.TransportError as exc:
        if time.monotonic() >= deadline:  # hung up at the deadline, the answer still coming (checked_request)
            return ended(None, f"timed out after {timeout_s:g} s")
        return ended(None, f"{type(exc).__name__}: {exc}"[:500])
    except SecretError as exc:
        return ended(None, str(exc))
    return ended(status, None if 200 <= status < 300 else f"HTTP {status}", response=text, retry_after_s=wait)


def _read_some(response: httpx.Response, deadline: float) -> str:
    """The first ``RESPONSE_LOGGED`` characters of the answer; at most ``MAX_RESPONSE_BYTES`` are
    read, and none after ``deadline``. An answer that does not decode as its ``Content-Encoding``
    says, or whose body was still coming when the connection was closed at ``deadline``, is kept as
    far as it came: its status is what counts."""
    raw = b""
    try:
        for chunk in iter_decoded(response):
            raw += chunk
            if len(raw) >= MAX_RESPONSE_BYTES or time.monotonic() > deadline:
                break
    except httpx.DecodingError:
        pass
    except httpx.TransportError:
        if time.monotonic() < deadline:
            raise
    return raw[:MAX_RESPONSE_BYTES].decode("utf-8", errors="replace")[:RESPONSE_LOGGED]


# --- the item --------------------------------------------------------------------------------------------


def execute_delivery(ctx: ItemContext, body: dict[str, Any]) -> Failed | None:
    """The ``webhook`` item handler: one attempt of a pending delivery that is due, recorded. A
    failed attempt is reported (``Failed``: Celery's tools show its task failed), never raised. A
    duplicate, early or stale item sends nothing."""
    delivery_id = str(body["delivery_id"])
    with structlog.contextvars.bound_contextvars(delivery_id=delivery_id, run_id=body.get("run_id")):
        delivery = _claim(delivery_id)
        if delivery is None:
            return None
        attempt = _attempt(delivery, delivery.endpoint)
        _record(delivery, attempt)
    return None if attempt.ok else Failed(f"webhook {delivery_id}: {attempt.error}"[:500])


def _claim(delivery_id: str) -> WebhookDelivery | None:
    """The delivery, if it is pending and due: its ``next_attempt_at`` moved past this attempt's
    bound, by one conditional ``UPDATE`` (a second claim finds it not due). One that is pending but
    not due yet has its wake-up scheduled again."""
    now = timezone.now()
    due = Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now + timedelta(seconds=EARLY_SLACK_S))
    pending = WebhookDelivery.objects.filter(pk=delivery_id, status=Status.PENDING)
    bound = now + timedelta(seconds=ATTEMPT_BOUND_S + 3 * float(settings.DUCTOR_WEBHOOK_TIMEOUT_S))
    if not pending.filter(due).update(next_attempt_at=bound):
        later = pending.values_list("next_attempt_at", flat=True).first()
        if later is not None:
            wake_at(delivery_id, later)
        return None
    found: WebhookDelivery | None = WebhookDelivery.objects.select_related("endpoint").filter(pk=delivery_id).first()
    if found is not None and found.endpoint.deleted_at is not None:
        return None  # its endpoint was deleted: the purge removes it, with the rest of the endpoint's log
    if found is not None and not found.endpoint.enabled:
        # Created by a process whose copy of the endpoints was older than the endpoint's disabling.
        deliveries_stop(found.endpoint_id, found.endpoint.disabled_reason)
        return None
    return found


def wake_at(delivery_id: Any, moment: datetime) -> None:
    """Have the coordinator enqueue the delivery again at ``moment`` (idempotent)."""
    schedule_wakeup(current_tenant(), str(delivery_id), moment, kind=WAKE_KIND)


def tries(attempts: Sequence[dict[str, Any]]) -> int:
    """The attempts of a delivery's log since its last redelivery (notes are not attempts)."""
    count = 0
    for entry in reversed(attempts):
        if entry.get("note") == REDELIVER_NOTE:
            break
        count += "status_code" in entry
    return count


def backoff_s(tried: int, retry_after_s: float | None = None) -> float:
    """The wait after the ``tried``-th failed attempt: ``DUCTOR_WEBHOOK_BACKOFF_S * 2**(tried - 1)``
    with equal jitter (``workflows.spec.backoff_delay``), at most ``MAX_BACKOFF_S``; at least a
    ``Retry-After`` (of a 429 or 503) up to that bound."""
    policy = Retry(backoff_s=float(settings.DUCTOR_WEBHOOK_BACKOFF_S), max_backoff_s=MAX_BACKOFF_S, jitter=True)
    delay = backoff_delay(policy, tried)
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, MAX_BACKOFF_S))
    return delay


def _record(delivery: WebhookDelivery, attempt: Attempt) -> None:
    """Keep the attempt and what follows from it (see the module docs), in one transaction."""
    with transaction.atomic():
        failures = _count(delivery.endpoint_id, attempt.ok)  # the endpoint's row first: see the module docs
        row = WebhookDelivery.objects.select_for_update().filter(pk=delivery.pk).first()
        if row is None or failures is None:
            return  # the endpoint was deleted meanwhile, and its deliveries with it
        row.attempts = [*row.attempts, attempt.as_json()]
        now, disable = timezone.now(), None
        if attempt.ok:
            row.status, row.next_attempt_at, row.finished_at = Status.DELIVERED, None, now
        elif row.status == Status.PENDING:
            disable = _after_failure(row, attempt, failures, now)
        row.save(update_fields=["attempts", "status", "next_attempt_at", "finished_at"])
        if disable is not None and webhook_disable(row.endpoint_id, disable):
            log.warning("webhook_disabled", webhook_id=str(row.endpoint_id), reason=disable)
    log.info("webhook_attempt", webhook_id=str(delivery.endpoint_id), status_code=attempt.status_code,
             error=attempt.error, duration_ms=attempt.duration_ms, delivery_status=row.status,
             attempt=tries(row.attempts))


def _count(endpoint_id: Any, ok: bool) -> int | None:
    """Zero the endpoint's consecutive failures, or add one (an atomic ``UPDATE``, which locks its
    row); their number now, or None when it is gone."""
    endpoint = WebhookEndpoint.objects.filter(pk=endpoint_id)
    endpoint.update(consecutive_failures=0 if ok else F("consecutive_failures") + 1)
    found: int | None = endpoint.values_list("consecutive_failures", flat=True).first()
    return found


def _after_failure(row: WebhookDelivery, attempt: Attempt, failures: int, now: datetime) -> str | None:
    """A pending delivery's failed attempt: its next attempt scheduled, or the delivery failed.
    Returns why its endpoint must be disabled, if it must."""
    tried = tries(row.attempts)
    if failures >= settings.DUCTOR_WEBHOOK_DISABLE_AFTER:
        reason = f"{failures} consecutive failed attempts; last: {attempt.error}"
        row.status, row.next_attempt_at, row.finished_at = Status.FAILED, None, now
        row.attempts = [*row.attempts, delivery_note(now, f"not sent again: this attempt disabled the endpoint "
                                                          f"({reason})")]
        return reason
    if tried >= settings.DUCTOR_WEBHOOK_MAX_ATTEMPTS:
        row.status, row.next_attempt_at, row.finished_at = Status.FAILED, None, now
        return None
    delay = backoff_s(tried, attempt.retry_after_s)
    row.next_attempt_at = now + timedelta(seconds=delay)
    wakeup_on_commit(str(row.pk), kind=WAKE_KIND, delay_s=delay)
    return None


def retry_due(ref: str, data: dict[str, Any]) -> None:
    """The ``webhook_retry`` wake-up, in the tenant's context: enqueue the delivery's item if it is
    still pending (its handler checks that it is due)."""
    found = WebhookDelivery.objects.filter(pk=ref, status=Status.PENDING).values_list(*QUEUED_FIELDS).first()
    if found is not None:
        enqueue_deliveries([Queued(*found)])


# --- the reconciler --------------------------------------------------------------------------------------


def reconcile_deliveries(*, full: bool = False) -> int:
    """Enqueue again the pending deliveries more than ``STALE_S`` overdue, of every tenant, at most
    ``RECONCILE_BATCH``, taken tenant by tenant (``stale_deliveries``); with ``full`` (Redis lost its
    data) every pending delivery, batch after batch: the due ones enqueued, the others' wake-ups
    scheduled again. Both are idempotent (a waiting item or wake-up keeps its place). Returns how
    many. Crosses tenants by design: it is the system's housekeeping."""
    now = timezone.now()
    pending = WebhookDelivery.all_tenants.filter(status=Status.PENDING, endpoint__deleted_at__isnull=True)
    if not full:
        stale = stale_deliveries(now - timedelta(seconds=STALE_S))
        return _repair(list(stale.values_list("tenant_id", "next_attempt_at", *QUEUED_FIELDS)[:RECONCILE_BATCH]), now)
    count, after = 0, None
    while True:
        rows = pending.order_by("pk") if after is None else pending.filter(pk__gt=after).order_by("pk")
        batch = list(rows.values_list("tenant_id", "next_attempt_at", *QUEUED_FIELDS)[:RECONCILE_BATCH])
        count += _repair(batch, now)
        if len(batch) < RECONCILE_BATCH:
            return count
        after = batch[-1][2]


def stale_deliveries(cutoff: datetime) -> QuerySet[WebhookDelivery]:
    """Every tenant's pending deliveries due before ``cutoff``, in turns: each tenant's most overdue
    one, then each one's next, and so on (the most overdue first within a turn). A tenant whose
    deliveries stay overdue while their items wait their turn (a slow endpoint's backlog, a
    suspension) takes one place of each turn, not the whole batch: taken the most overdue first
    whatever their tenant, they were taken again at every pass, and another tenant's delivery whose
    item was lost was never enqueued again while that backlog lasted. Those of a deleted endpoint
    are left to its purge."""
    return in_tenant_turns(WebhookDelivery.all_tenants.filter(status=Status.PENDING, next_attempt_at__lt=cutoff,
                                                              endpoint__deleted_at__isnull=True), "next_attempt_at")


def _repair(batch: list[tuple[Any, ...]], now: datetime) -> int:
    """Enqueue the due deliveries of ``batch`` (``tenant_id, next_attempt_at`` and ``QUEUED_FIELDS``),
    and wake the others when they are due, each in its tenant's context; returns how many."""
    tenants = {tenant.pk: tenant for tenant in Tenant.objects.filter(pk__in={row[0] for row in batch})}
    for tenant_id, tenant in tenants.items():
        rows = [row for row in batch if row[0] == tenant_id]
        with tenant_context(tenant):
            enqueue_deliveries([Queued(*row[2:]) for row in rows if row[1] is None or row[1] <= now])
            for row in rows:
                if row[1] is not None and row[1] > now:
                    wake_at(row[2], row[1])
    return len(batch)


# --- the purge of deleted endpoints ---------------------------------------------------------------------

# Most deliveries one batch deletes of one endpoint, most deleted endpoints one pass looks at, and how
# long a pass goes on taking batches (it ends the round under way, one batch per endpoint with more).
PURGE_BATCH = 1000
ENDPOINTS_PER_PASS = 50
PURGE_BUDGET_S = 1.0
# After each batch, a rest this many times as long as it took, as the runs' retention rests
# (``workflows.retention``): the hot path finds the server between two batches.
PURGE_REST_PER_BATCH = 1.0


def purge_deleted_endpoints(*, batch: int = PURGE_BATCH, endpoints_per_pass: int = ENDPOINTS_PER_PASS,
                            budget_s: float = PURGE_BUDGET_S, rest: float = PURGE_REST_PER_BATCH) -> int:
    """Remove the delivery logs of deleted endpoints (``webhooks.webhook_delete``), then their rows:
    of each of the first ``endpoints_per_pass`` deleted endpoints, taken tenant by tenant
    (``in_tenant_turns``: one tenant's many deletions take one place of each turn), a batch of up to
    ``batch`` deliveries, each in a short transaction of its own, in its tenant's context; then
    another batch of each endpoint that had a full one, in turn, while ``budget_s`` lasts (at least
    one batch each), resting ``rest`` times as long as each batch took after it. An endpoint whose
    log is empty goes. A coordinator housekeeper; returns how many rows it removed. Crosses tenants
    by design: it is the system's housekeeping."""
    def one_batch(endpoint: WebhookEndpoint) -> tuple[int, bool, float]:
        started = time.perf_counter()
        with tenant_context(endpoint.tenant):
            count = _purge_batch(endpoint.pk, batch)
        return count, count >= batch, time.perf_counter() - started

    deleted = WebhookEndpoint.all_tenants.filter(deleted_at__isnull=False).select_related("tenant")
    removed = in_rounds(list(in_tenant_turns(deleted, "deleted_at")[:endpoints_per_pass]), one_batch,
                        budget_s=budget_s, rest=rest)
    if removed:
        log.info("webhook_logs_purged", rows=removed)
    return removed


def _purge_batch(endpoint_id: Any, batch: int) -> int:
    """Delete up to ``batch`` deliveries of the deleted endpoint, and its row once that empties its
    log; how many rows. The endpoint's row is locked first, as an attempt's record locks it (then its
    delivery): taken the other way round, the two could deadlock."""
    with transaction.atomic():
        deleted = WebhookEndpoint.objects.select_for_update().filter(pk=endpoint_id, deleted_at__isnull=False)
        if not list(deleted.values_list("pk", flat=True)):
            return 0  # purged already
        logged = WebhookDelivery.objects.filter(endpoint_id=endpoint_id).values("pk")[:batch]
        count, _ = WebhookDelivery.objects.filter(pk__in=logged).delete()
        if count < batch:  # its log is empty now: the row goes too
            count += deleted.delete()[0]
        return count
