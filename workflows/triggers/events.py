"""Events and event triggers: an event a tenant reports starts a run of each workflow it triggers.

``POST /api/v1/events`` records an event (``name``, optional ``key`` and ``payload``) and, in the
same transaction, starts a run of each of the tenant's workflows with an enabled ``EventTrigger``
for that name whose ``filter`` holds on the event. Each run starts on the workflow's latest
version with the event as its input (``{"id", "name", "key", "payload", "created_at"}``), tagged
``event:<name>``, with the idempotency key ``event:<event id>:<trigger id>``. So:

- an event is recorded with its runs, or not at all: a refused start (the monthly run quota, a
  tier the plan does not allow) refuses the event, and nothing is left of it;
- an event sent again with its ``idempotency_key`` answers the event recorded the first time,
  and starts nothing;
- a trigger whose workflow's ``input_schema`` refuses the event, or whose workflow is archived,
  starts nothing for it (the event's ``refused`` names it, its workflow and why, by field; logged once per event as
  ``event_trigger_input_refused``, with how many refused it and the first): the
  event, and the other triggers' runs, stand;
- only the tenant's own triggers are read: another tenant's event never starts a run here;
- the tenant's runs waiting for the event (a ``wait_for_event`` node of its name and key) are
  resumed in the same transaction (``workflows.engine.waits.deliver``).

Filters are conditions of the one language (``scheduling.templates``, ``EVENTS``): paths
``event.name``, ``event.key`` and ``event.payload…``; anything else is a ``400`` naming
``filter``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from ductor_project.core.context import across_tenants, tenant_context
from ductor_project.core.errors import ApiError, ErrorCode, again_while_keys_are_taken, check_key_reuse
from scheduling import templates
from scheduling.coordinator.housekeeping import TenantRound, in_rounds
from tenants.entitlements import resolve_many
from tenants.models import Tenant
from tenants.selectors import first_or_404, parse_uuid
from tenants.usage import enforce_setting_limit
from workflows.engine.attempts import run_input_problems
from workflows.engine.statements import version_to_start
from workflows.engine.waits import deliver, lock_in_order, name_lock_id
from workflows.models import Event, EventTrigger, WorkflowDefinition
from workflows.services import MAX_BULK_RUNS, check_payload, run_start_many

log = structlog.get_logger(__name__)

# Most events one bulk call may hold.
MAX_BULK_EVENTS = 100


def event_input(event: Event) -> dict[str, Any]:
    """The input of the runs an event starts, and what a trigger's filter reads (as ``event``)."""
    return {"id": str(event.id), "name": event.name, "key": event.key, "payload": event.payload,
            "created_at": event.created_at.isoformat().replace("+00:00", "Z")}


def _invalid(field: str, message: str) -> ApiError:
    return ApiError(f"Invalid field(s): {field}. {message}", code=ErrorCode.INVALID, details={field: [message]})


def checked_filter(value: Any, field: str = "filter") -> dict[str, Any] | None:
    """A trigger's filter normalized (None: every event), or a ``400`` naming the bad part of it."""
    if value is None:
        return None
    clean, problems = templates.when_errors(value, field=field, language=templates.EVENTS)
    if problems:
        where, message = problems[0]
        raise ApiError(f"Invalid field(s): {where}. {message}", code=ErrorCode.INVALID,
                       details={where: [message] for where, message in problems})
    return clean


def events_send(items: list[Mapping[str, Any]], *, bulk: bool = True) -> list[tuple[Event, bool]]:
    """Record the tenant's events and start the runs they trigger, all or none, in one transaction.
    Returns ``(event, created)`` per item, in order: an item whose ``idempotency_key`` was used
    already (or by an earlier item) answers that event and starts nothing. A refusal names an item's
    field by its place in ``events`` (``events[3].payload``); ``bulk`` False: the one event sent
    alone, whose fields are named as they are (``payload``)."""
    if not items or len(items) > MAX_BULK_EVENTS:
        raise _invalid("events", f"Give 1 to {MAX_BULK_EVENTS} events, not {len(items)}.")
    for index, item in enumerate(items):
        payload = {} if item.get("payload") is None else item["payload"]
        check_payload(payload, _item_field(index, "payload", bulk))
    return again_while_keys_are_taken(lambda: _send(items, bulk), len(items))


def _item_field(index: int, name: str, bulk: bool) -> str:
    """How a refusal names the field ``name`` of the item at ``index`` (see ``events_send``)."""
    return f"events[{index}].{name}" if bulk else name


def _send(items: list[Mapping[str, Any]], bulk: bool) -> list[tuple[Event, bool]]:
    keys = [item["idempotency_key"] for item in items if item.get("idempotency_key")]
    known = {event.idempotency_key: event for event in Event.objects.filter(idempotency_key__in=keys)} if keys else {}
    results: list[tuple[Event, bool]] = []
    with transaction.atomic():
        # Two sends of the same new keys in other orders would each insert one, then wait on the
        # other's (a deadlock): the keys are locked first, in one order.
        fresh = {key for item in items if (key := item.get("idempotency_key")) and key not in known}
        if len(fresh) > 1:
            lock_in_order({name_lock_id("idempotency_key", key) for key in fresh})
        new: list[Event] = []
        fields: dict[Any, str] = {}  # a new event -> its payload's field in the request
        in_batch: dict[str, int] = {}  # a key this batch records -> the index of its first item
        for index, item in enumerate(items):
            key = item.get("idempotency_key") or None
            name, event_key = item["name"], item.get("key") or ""
            payload = {} if item.get("payload") is None else item["payload"]
            if key is not None and key in known:
                first = known[key]
                field = _item_field(index, "idempotency_key", bulk)
                # An event of this very batch has no id to cite: it is kept only if the batch is.
                cited = f"events[{in_batch[key]}]" if key in in_batch else f"event {first.pk}"
                check_key_reuse(field, key, cited, {
                    "name": (first.name, name), "key": (first.key, event_key), "payload": (first.payload, payload)})
                results.append((first, False))
                continue
            event = Event.objects.create(name=name, key=event_key, payload=payload, idempotency_key=key)
            if key is not None:
                known[key], in_batch[key] = event, index
            fields[event.pk] = _item_field(index, "payload", bulk)
            new.append(event)
            results.append((event, True))
        deliver(new)
        _start_triggered(new, fields)
    for event in (event for event, created in results if created):
        log.info("event_received", event_id=str(event.id), event_name=event.name, runs=len(event.runs))
    return results


# What a 413 of an event's runs' input says it measured.
RUN_INPUT_MEASURED = ("The runs this event starts take it as their input, its id, name, key and time around its "
                      "payload: ")


def _start_triggered(events: list[Event], fields: dict[Any, str]) -> None:
    """Start the runs ``events`` trigger (one ``run_start_many``) and record them on each event
    (``fields``: each one's payload field in the request, for a ``413``)."""
    names = {event.name for event in events}
    triggers = list(EventTrigger.objects.filter(event__in=names, enabled=True)
                    .select_related("workflow").order_by("created_at"))
    starts: list[tuple[Event, dict[str, Any]]] = []
    versions: dict[str, Any] = {}  # the latest version of each workflow triggered, read once
    for event in events:
        data = event_input(event)
        matching = [trigger for trigger in triggers
                    if trigger.event == event.name and templates.evaluate_when(trigger.filter, {"event": data})]
        if matching:  # its runs' input, measured once whatever the number of triggers, named by its payload
            check_payload(data, fields[event.pk], measured=RUN_INPUT_MEASURED)
        for trigger in matching:
            name = trigger.workflow.name
            if trigger.workflow.archived_at is not None:  # it stays, and starts nothing until unarchived
                event.refused.append({"trigger": str(trigger.id), "workflow": name,
                                      "details": {"workflow": f"Workflow '{name}' is archived and starts no new run."}})
                continue
            if name not in versions:
                versions[name] = version_to_start(name)
            problems = run_input_problems(versions[name].pk, data) if versions[name] is not None else []
            if problems:
                event.refused.append({"trigger": str(trigger.id), "workflow": name, "details": dict(problems)})
                continue
            starts.append((event, {"workflow": name, "input": data, "tags": [f"event:{event.name}"],
                                   "idempotency_key": f"event:{event.id}:{trigger.id}"}))
    for first in range(0, len(starts), MAX_BULK_RUNS):
        chunk = starts[first:first + MAX_BULK_RUNS]
        for (event, _), (run, _) in zip(chunk, run_start_many(runs=[start for _, start in chunk]), strict=True):
            event.runs.append(str(run.id))
    for event in events:
        if event.runs or event.refused:
            Event.objects.filter(pk=event.pk).update(runs=event.runs, refused=event.refused)
        if event.refused:  # one line per event, however many triggers refused it
            first = event.refused[0]
            log.warning("event_trigger_input_refused", event_id=str(event.id), refused=len(event.refused),
                        trigger_id=first["trigger"], workflow=first["workflow"], fields=first["details"])


# --- triggers -------------------------------------------------------------------------------------------


def _workflow(name: Any) -> WorkflowDefinition:
    """The workflow a trigger names, locked until the trigger is written (``lock_definitions``)."""
    found = WorkflowDefinition.objects.select_for_update().filter(name=name).first() if isinstance(name, str) else None
    if found is None:
        raise _invalid("workflow", f"No workflow named {name!r}.")
    if found.archived_at is not None:
        raise _invalid("workflow", f"Workflow '{name}' is archived and starts no new run: unarchive it first.")
    return found


def trigger_create(*, workflow: str, event: str, filter: Any = None, enabled: bool = True) -> EventTrigger:
    """Subscribe ``workflow`` to the events named ``event`` (that meet ``filter``); ``403
    plan_limit_reached`` past ``DUCTOR_TRIGGERS_PER_TENANT``."""
    with transaction.atomic():
        enforce_setting_limit("event triggers", settings.DUCTOR_TRIGGERS_PER_TENANT, EventTrigger.objects.all(),
                              kind="triggers", setting="DUCTOR_TRIGGERS_PER_TENANT")
        return EventTrigger.objects.create(workflow=_workflow(workflow), event=event, filter=checked_filter(filter),
                                           enabled=enabled)


def trigger_update(trigger: EventTrigger, changes: Mapping[str, Any]) -> EventTrigger:
    """Change a trigger's workflow, event name, filter or state. The changes go onto its row read
    again, locked (after the workflow it moves to, in the order of a workflow's deletion, which locks
    the workflow, then deletes its triggers): a trigger deleted since the request read it, or with
    its workflow, is a 404, not inserted again (nor, its workflow gone, a failed reference at the
    commit); and of two changes at once, the second keeps the first's other fields."""
    with transaction.atomic():
        workflow = _workflow(changes["workflow"]) if "workflow" in changes else None
        row: EventTrigger = first_or_404(EventTrigger.objects.select_for_update(of=("self",))
                                         .select_related("workflow").filter(pk=trigger.pk))
        if workflow is not None:
            row.workflow = workflow
        if "event" in changes:
            row.event = changes["event"]
        if "filter" in changes:
            row.filter = checked_filter(changes["filter"])
        if "enabled" in changes:
            row.enabled = bool(changes["enabled"])
        row.save()
        return row


def trigger_of(trigger_id: Any) -> EventTrigger:
    """A trigger of the tenant in context, or ``NotFound`` (also for another tenant's, or a bad id)."""
    found: EventTrigger = first_or_404(EventTrigger.objects.select_related("workflow")
                                       .filter(pk=parse_uuid(trigger_id)))
    return found


# --- retention ------------------------------------------------------------------------------------------

# Most events one batch deletes of one tenant, most tenants one pass looks at, and how long a pass
# goes on taking batches (it ends the round under way, one batch per tenant with more to do).
EXPIRE_BATCH = 1000
TENANTS_PER_PASS = 100
PASS_BUDGET_S = 1.0
# After each batch that deleted something, a rest this many times as long as the batch took, as the
# runs' retention rests (``workflows.retention``): the hot path finds the server between two batches.
REST_PER_BATCH = 1.0
_expiry_round = TenantRound()
# Of some tenants (their ids and cutoffs), those whose oldest event is older than their cutoff: one
# step into ``event_tenant_age`` each, in one statement. (Asked whether any event is older, the planner
# may guess that a scan of the table finds one soon, and scan it once per tenant.)
WITH_EXPIRED = (f"SELECT t.id FROM unnest(%s::uuid[], %s::timestamptz[]) AS t(id, cutoff) WHERE "  # noqa: S608
                f"(SELECT e.created_at FROM {Event._meta.db_table} e WHERE e.tenant_id = t.id "
                "ORDER BY e.created_at LIMIT 1) < t.cutoff")


def expire_events(*, batch: int = EXPIRE_BATCH, tenants_per_pass: int = TENANTS_PER_PASS,
                  budget_s: float = PASS_BUDGET_S, rest: float = REST_PER_BATCH) -> int:
    """Delete events older than their tenant's ``event_retention_days``: of each of the next
    ``tenants_per_pass`` tenants (by id, on from where the previous pass stopped, round and round)
    a batch of up to ``batch``, each in one statement of its own, then another batch of each
    tenant that had a full one, in turn, while ``budget_s`` lasts (at least one batch each),
    resting ``rest`` times as long as each batch took after it. A coordinator housekeeper; returns
    how many it deleted. The runs an event started keep it as their input.

    A tenant may send events faster than one batch a pass (a bulk call holds 100 of them): with
    one batch a pass, its events past their retention piled up without end.

    The tenants with nothing to delete cost the pass nothing of their own: their retentions are read
    together, and which of them have an event past it is one statement (``_expiring``). The
    retentions are read before the deletes, not in their transactions: a transaction that held the
    read's lock on the entitlements' tables while it waited for the events table could deadlock with
    a statement that locks both tables in the other order (a ``TRUNCATE``, an ``ALTER TABLE``)."""
    def one_batch(waiting: tuple[Tenant, datetime]) -> tuple[int, bool, float]:
        tenant, cutoff = waiting
        with tenant_context(tenant):
            old = Event.objects.filter(created_at__lt=cutoff).order_by("created_at").values("pk")[:batch]
            started = time.perf_counter()
            count, _ = Event.objects.filter(pk__in=old).delete()
            took = time.perf_counter() - started
        if count:
            log.info("events_expired", tenant_id=str(tenant.pk), tenant=tenant.slug, count=count)
        return count, count >= batch, took

    return in_rounds(_expiring(_expiry_round.next(tenants_per_pass), timezone.now()), one_batch,
                     budget_s=budget_s, rest=rest)


def _expiring(tenants: list[Tenant], now: datetime) -> list[tuple[Tenant, datetime]]:
    """Those of ``tenants`` that have an event older than their ``event_retention_days``, each with
    its cutoff: three queries for them all, however many they are."""
    limits = resolve_many(tenants)
    cutoffs = {pk: now - timedelta(days=limit.event_retention_days) for pk, limit in limits.items()}
    with across_tenants("the events' retention"), connection.cursor() as cursor:
        cursor.execute(WITH_EXPIRED, [list(cutoffs), list(cutoffs.values())])
        found = {row[0] for row in cursor.fetchall()}
    return [(tenant, cutoffs[tenant.pk]) for tenant in tenants if tenant.pk in found]


def event_of(event_id: Any) -> Event:
    """An event of the tenant in context, or ``NotFound`` (also for another tenant's, or a bad id)."""
    found: Event = first_or_404(Event.objects.filter(pk=parse_uuid(event_id)))
    return found
