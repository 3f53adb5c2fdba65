"""Waiting for something outside the run: the ``wait_for_event`` node, events and signals.

A wait holds no worker and no slot: it is a ``waiting`` attempt and an ``EventWait`` row, the
index an event finds it by (its name and correlation key) and a signal by (its run and name).
Three things may resume it: an event of its name and key (``deliver``, in the transaction that
records the event), a signal of its name to its run (``signal_send``), or its timeout (a
coordinator wake-up, ``wait_timeout``). Each sets the row's ``matched_at`` with one conditional
``UPDATE``, so exactly one of them wins; the run's next tick (``apply``) then finishes the step:
with the event's or the signal's payload as its output, or at the timeout with the node's
``default`` (or failed, ``wait_timed_out``).

**No event is lost to a race.** An event counts for a wait if it is recorded while the wait is
open, or at most ``lookback_s`` before the wait was written. An event whose transaction could
not yet see the wait, because both were being written at once, is found by the wait's *arming*
(``arm``, just after the tick that wrote it commits): it looks through the events recorded since
the wait's start (less its lookback). An advisory lock per tenant, event name and key orders the
two: recording events takes it shared, before looking for waits; arming takes it exclusive,
before looking for events. So each pair is seen by one side or the other: the arming runs after
the events' transaction has committed, or the events' transaction sees the committed wait. Ticks
take no such lock, and arming takes one lock alone, so the locks cannot deadlock.

**Signals** are kept: a signal to a run whose wait for that name has not started yet resumes
that wait when it does, in the tick that starts it. The run's row lock orders a signal and the
tick that starts a wait.

The coordinator's reconciler puts back what Redis lost (a timeout's wake-up, an arming that did
not run): ``repair``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from ductor_project.core.context import current_tenant, tenant_context
from ductor_project.core.errors import Conflict, StepErrorCode, again_while_keys_are_taken, check_key_reuse
from scheduling import templates
from tenants.selectors import first_or_404, parse_uuid
from workflows.engine.attempts import Outcome, finish, new_step, refuse, rendered_payload
from workflows.engine.events import jsonable, record_event
from workflows.engine.items import enqueue_tick, enqueue_ticks, wakeup_on_commit
from workflows.models import Event, EventWait, RunSignal, StepRun, WorkflowRun

log = structlog.get_logger(__name__)

WAIT = "wait_for_event"
TIMEOUT_KIND = "wait_timeout"
SStatus = StepRun.Status
MAX_KEY_CHARS = 200
# A timeout woken this close to its end is over (timers fire a few ms early or late).
TIMEOUT_SLACK = timedelta(milliseconds=50)


# --- starting a wait (in the tick, the run's row locked) ------------------------------------------------


def start_wait(run: WorkflowRun, node: Mapping[str, Any], context: Mapping[str, Any], now: datetime) -> StepRun:
    """Start the wait ``node``: resumed at once by a signal kept for it, else written as open, to be
    armed once the tick commits, with a wake-up at its timeout."""
    name = str(node["event"])
    key, problem = _rendered_key(node, context)
    step = new_step(run, node["id"], WAIT, SStatus.WAITING, input={"event": name, "key": key})
    if problem is not None:
        refuse(run, step, Outcome.failed(StepErrorCode.INVALID_INPUT, f"key: {problem}", field="key"))
        return step
    step.bind_tenant(current_tenant())  # written with the tick: its tenant is known now, for the links to it
    kept = RunSignal.objects.filter(run=run, name=name, delivered_to__isnull=True).order_by("created_at").first()
    if kept is not None:
        kept.delivered_to = step
        kept.save(update_fields=["delivered_to"])
        finish(step, Outcome.succeeded(kept.payload))
        record_event(run, "step_succeeded", node["id"], attempt=step.attempt, error=None, signal=str(kept.id))
        return step
    expires = now + timedelta(seconds=float(node["timeout_s"])) if node.get("timeout_s") else None
    wait = EventWait.objects.create(run=run, step=step, event=name, key=key, expires_at=expires,
                                    lookback_s=float(node.get("lookback_s") or 0.0))
    record_event(run, "step_waiting", node["id"], event=name, key=key or None,
                 until=expires.isoformat() if expires else None)
    arm_on_commit(wait.pk)
    if expires is not None:
        wakeup_on_commit(str(wait.pk), kind=TIMEOUT_KIND, delay_s=(expires - now).total_seconds())
    return step


def _rendered_key(node: Mapping[str, Any], context: Mapping[str, Any]) -> tuple[str, str | None]:
    """The node's correlation key rendered ("" when it has none), and what is wrong with it."""
    if node.get("key") is None:
        return "", None
    try:
        value = templates.render(node["key"], context, max_chars=MAX_KEY_CHARS)
    except templates.TemplateTooLarge:
        return "", f"renders more than {MAX_KEY_CHARS} characters; at most {MAX_KEY_CHARS}"
    if isinstance(value, bool) or not isinstance(value, str | int | float) or value == "":
        return "", f"renders {_quoted(value)}: a correlation key must be a non-empty string or a number"
    text = templates.as_text(value)
    if len(text) > MAX_KEY_CHARS:
        return "", f"renders {len(text)} characters; at most {MAX_KEY_CHARS}"
    return text, None


# How much of a value that is no key the error quotes: the value may be as large as a payload.
QUOTED_CHARS = 100


def _quoted(value: Any) -> str:
    """``value`` as compact JSON, as the API writes it (``null``, ``true``), cut at ``QUOTED_CHARS``."""
    text = json.dumps(jsonable(value), separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= QUOTED_CHARS else f"{text[:QUOTED_CHARS]}…"


# --- the advisory locks ---------------------------------------------------------------------------------


def _lock_id(name: str, key: str) -> int:
    """The advisory lock of the tenant's waits for ``name`` and ``key``: a signed 64-bit number."""
    digest = hashlib.blake2b(f"{current_tenant().pk}\x00{name}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def lock_in_order(ids: set[int], *, shared: bool = False) -> None:
    """Take the advisory locks ``ids`` for the transaction, in one statement, in ascending order (so
    that two callers never hold one each of two they both want)."""
    statement = _LOCK_SHARED if shared else _LOCK
    with connection.cursor() as cursor:
        cursor.execute(statement, [sorted(ids)])


_LOCK = "SELECT count(pg_advisory_xact_lock(id)) FROM unnest(%s::bigint[]) AS id"
_LOCK_SHARED = "SELECT count(pg_advisory_xact_lock_shared(id)) FROM unnest(%s::bigint[]) AS id"


def name_lock_id(kind: str, name: str) -> int:
    """The advisory lock of the tenant's ``kind`` of thing named ``name``, which its creations take
    in turn: a workflow's name, an event's idempotency key (``idempotency_key``). An event name is
    never empty, so no wait's lock is one of these."""
    return _lock_id("", f"{kind}\x00{name}")


def _lock_shared(pairs: set[tuple[str, str]]) -> None:
    lock_in_order({_lock_id(name, key) for name, key in pairs}, shared=True)


def _lock_exclusive(name: str, key: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_id(name, key)])


# --- what resumes a wait --------------------------------------------------------------------------------


def _match(where: str, params: list[Any], matched_by: dict[str, Any], payload: Any) -> list[Any]:
    """Resume the tenant's open waits that ``where`` (a condition of this module's, its values
    placeholders) selects, with ``payload``; the ids of their runs. The one conditional ``UPDATE``
    that decides who resumes a wait."""
    sql = (f"UPDATE {EventWait._meta.db_table} SET matched_at = now(), matched_by = %s::jsonb, "  # noqa: S608
           f"payload = %s::jsonb WHERE tenant_id = %s AND matched_at IS NULL AND {where} RETURNING run_id")
    with connection.cursor() as cursor:
        cursor.execute(sql, [json.dumps(matched_by), json.dumps(payload, default=str), current_tenant().pk, *params])
        return [row[0] for row in cursor.fetchall()]


def _tick_runs(run_ids: list[Any]) -> None:
    if run_ids:
        enqueue_ticks(list(WorkflowRun.objects.filter(pk__in=run_ids).only("id", "tier")))


def deliver(events: list[Event]) -> int:
    """Resume the tenant's open waits that ``events`` (just recorded, in order, in the caller's
    transaction) match: a wait for the event's name and key, or for its name and any key. Each
    wait takes the first that matches it. Returns how many waits resumed."""
    if not events:
        return 0
    _lock_shared({pair for event in events for pair in ((event.name, event.key), (event.name, ""))})
    resumed: list[Any] = []
    for event in events:
        resumed += _match("event = %s AND key IN (%s, '')", [event.name, event.key],
                          {"event": str(event.id)}, event.payload)
    _tick_runs(resumed)
    return len(resumed)


def arm_on_commit(wait_id: Any) -> None:
    tenant = current_tenant()

    def go() -> None:
        with tenant_context(tenant):
            try:
                arm(wait_id)
            except Exception:  # the reconciler arms it again (``repair``)
                log.exception("wait_arm_failed", wait_id=str(wait_id))

    transaction.on_commit(go)


def arm(wait_id: Any) -> bool:
    """Look through the events recorded since the wait started (less its ``lookback_s``) that no
    event transaction could have matched it with: the first resumes it. Idempotent; returns
    whether it resumed the wait."""
    with transaction.atomic():
        wait = EventWait.objects.filter(pk=wait_id, armed_at__isnull=True).first()
        if wait is None:
            return False
        _lock_exclusive(wait.event, wait.key)
        resumed: list[Any] = []
        events = Event.objects.filter(name=wait.event, created_at__gte=wait.created_at
                                      - timedelta(seconds=wait.lookback_s))
        if wait.key:
            events = events.filter(key=wait.key)
        first = events.order_by("created_at").only("id", "payload").first()
        if first is not None:
            resumed = _match("id = %s", [wait.pk], {"event": str(first.id)}, first.payload)
        EventWait.objects.filter(pk=wait.pk).update(armed_at=timezone.now())
        _tick_runs(resumed)
        return bool(resumed)


def wait_timeout(ref: str, data: dict[str, Any]) -> None:
    """A wait's timeout fell due (a wake-up; early ones are scheduled again for the rest)."""
    wait = EventWait.objects.filter(pk=ref, matched_at__isnull=True).only("expires_at").first()
    if wait is None or wait.expires_at is None:
        return
    left = (wait.expires_at - timezone.now()).total_seconds()
    if left > TIMEOUT_SLACK.total_seconds():
        wakeup_on_commit(ref, kind=TIMEOUT_KIND, delay_s=left)
        return
    with transaction.atomic():
        _tick_runs(_match("id = %s", [wait.pk], {"timeout": True}, None))


def signal_send(run_id: Any, *, name: str, payload: Any, idempotency_key: str | None = None) -> tuple[RunSignal, bool]:
    """Send a signal to one of the tenant's runs: it resumes the run's open wait for ``name`` (the
    oldest), or is kept for the next one. Returns ``(signal, created)``: a signal sent again with
    its ``idempotency_key`` answers the first, changing nothing. A run that ended or was asked to
    cancel, or that has ``DUCTOR_MAX_SIGNALS_PER_RUN`` signals already, answers ``409``."""
    return again_while_keys_are_taken(lambda: _send_signal(run_id, name, payload, idempotency_key), 1)


def _send_signal(run_id: Any, name: str, payload: Any, key: str | None) -> tuple[RunSignal, bool]:
    with transaction.atomic():
        # The run's row lock orders a signal and the tick that starts a wait.
        run: WorkflowRun = first_or_404(WorkflowRun.objects.select_for_update().filter(pk=parse_uuid(run_id)))
        if key:
            known = RunSignal.objects.filter(run=run, idempotency_key=key).first()
            if known is not None:
                check_key_reuse("idempotency_key", key, f"signal {known.pk}",
                                {"name": (known.name, name), "payload": (known.payload, payload)})
                return known, False
        if run.is_terminal:
            raise Conflict(f"Run {run.pk} is {run.status}: a signal can only go to an active run.",
                           details={"status": [run.status]})
        if run.cancel_requested:  # its cancel ends its waits: a signal would resume one only to drop it
            raise Conflict(f"Run {run.pk} was asked to cancel: a signal can only go to an active run.",
                           details={"cancel_requested": ["The run is being cancelled."]})
        limit = settings.DUCTOR_MAX_SIGNALS_PER_RUN
        if RunSignal.objects.filter(run=run).order_by().values("pk")[limit - 1:limit].exists():
            raise Conflict(f"Run {run.pk} has {limit} signals, as many as a run keeps: continue it as new to "
                           "take more.", details={"signals": [f"At most {limit} per run."]})
        signal = RunSignal.objects.create(run=run, name=name, payload=payload, idempotency_key=key or None)
        wait = (EventWait.objects.filter(run=run, event=name, matched_at__isnull=True)
                .order_by("created_at").only("id", "step_id").first())
        node_id = ""
        if wait is not None and _match("id = %s", [wait.pk], {"signal": str(signal.pk)}, payload):
            signal.delivered_to_id = wait.step_id
            RunSignal.objects.filter(pk=signal.pk).update(delivered_to=wait.step_id)
            node_id = StepRun.objects.filter(pk=wait.step_id).values_list("node_id", flat=True).first() or ""
            enqueue_tick(run)
        record_event(run, "signal_received", node_id, name=name, signal=str(signal.pk),
                     delivered=bool(node_id))
        return signal, True


# --- the tick: finishing the waits that were resumed ------------------------------------------------------


def apply(run: WorkflowRun, latest: dict[str, StepRun], node_of: Callable[[str], Mapping[str, Any]],
          context: Callable[[], Mapping[str, Any]]) -> None:
    """Finish each of the run's waiting ``wait_for_event`` steps that was resumed: with the event's
    or the signal's payload, or at its timeout with its ``default`` (failed without one)."""
    waiting = {step.pk: step for step in latest.values() if step.status == SStatus.WAITING and step.node_type == WAIT}
    if not waiting:
        return
    resumed = list(EventWait.objects.filter(step_id__in=list(waiting), matched_at__isnull=False)
                   .values("step_id", "matched_by", "payload"))
    for row in resumed:
        step, by = waiting[row["step_id"]], row["matched_by"] or {}
        node = node_of(step.node_id)
        if not by.get("timeout"):
            finish(step, Outcome.succeeded(row["payload"]))
            record_event(run, "step_succeeded", step.node_id, attempt=step.attempt, error=None,
                         **{k: v for k, v in by.items() if k != "timeout"})
        elif "default" in node:
            output, refusal = rendered_payload(node["default"], context(), "default")
            if refusal is None:
                finish(step, Outcome.succeeded(jsonable(output)))
                record_event(run, "step_succeeded", step.node_id, attempt=step.attempt, error=None, timed_out=True)
            else:
                refuse(run, step, refusal)
        else:
            finish(step, Outcome.failed(StepErrorCode.WAIT_TIMED_OUT, f"no '{node['event']}' came within "
                                        f"{node.get('timeout_s')} s"))
            record_event(run, "step_timed_out", step.node_id)
    if resumed:
        EventWait.objects.filter(step_id__in=[row["step_id"] for row in resumed]).delete()


# --- the reconciler ------------------------------------------------------------------------------------


def repair(step: StepRun) -> None:
    """Put back what Redis lost of a waiting step: its timeout's wake-up, and its arming."""
    wait = EventWait.objects.filter(step_id=step.pk, matched_at__isnull=True).first()
    if wait is None:
        return
    if wait.armed_at is None:
        arm_on_commit(wait.pk)
    if wait.expires_at is not None:
        wakeup_on_commit(str(wait.pk), kind=TIMEOUT_KIND,
                         delay_s=max(0.0, (wait.expires_at - timezone.now()).total_seconds()))
