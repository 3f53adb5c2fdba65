"""Why is it waiting? For each waiting step of a run, what holds it now.

``why_waiting(run)`` reads the run's attempts, then asks the fair queue about
each queued attempt's item (``fair_queue.holds_of``: one read-only round trip
for them all) and names the first thing that holds it, in the order the dequeue looks:

1. not due until T (a sleep, a retry's backoff, a delayed item);
2. behind N items of its partition (one item in flight per partition);
3. its tenant suspended;
4. its tenant's step rate: rate-limited until T;
5. its tenant's concurrency ceiling: k of k;
6. its pool: the pool's slots (pool full), the pool's rate (until T), its
   connections' breakers (open until T), their slots (connection full) or
   rates (until T);
7. none of these: it is due and admissible, and waits for its turn among the
   tenants ready in its tier, after any due work of the tiers above it (``in_line``;
   how many, or whether any above has some, is not told: they are other tenants).

A step waiting for its child run says so, a ``wait_for_event`` step names the
event (and key) or signal it waits for and its timeout, and a sub-workflow or
continue-as-new node yet to start, while the tenant's monthly run quota is
used up, is reported as held by the quota (it cannot start a run). The run's
own tick, when it waits in the queue, is reported too (node ``""``). Nothing is
taken or charged: the fair queue's own copy of the limits is read, as the
dequeue will read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.utils import timezone

from ductor_project.core.context import current_tenant
from scheduling import fair_queue
from scheduling.admission import QUEUE_SCOPE_PREFIX, queue_slots
from scheduling.connection_config import DEFAULT_BROKER
from scheduling.fair_queue import AdmissionView, ItemHold
from scheduling.routing_table import routing_table
from tenants.entitlements import effective_entitlements
from tenants.usage import next_reset, runs_this_month
from workflows.engine.attempts import latest_attempts, spec_of
from workflows.engine.items import TASK, step_item_id, tick_item_id
from workflows.engine.statements import chain_end
from workflows.engine.task_nodes import queue_depth
from workflows.engine.waits import WAIT
from workflows.models import EventWait, RunEvent, StepRun, WorkflowRun

SStatus = StepRun.Status
RUN_STARTING_NODES = ("subworkflow", "continue_as_new")
NOT_STARTED, TICK = "pending", "tick"  # a waiting entry's status beside a step's: a node not started, the run's tick
STATUSES = (*StepRun.Status.values, NOT_STARTED, TICK)


class Cause(StrEnum):
    NOT_DUE = "not_due"  # not due until ``until``
    PARTITION = "partition"  # behind ``details["ahead"]`` items of its partition
    TENANT_CONCURRENCY = "tenant_concurrency"  # tenant concurrency k of k
    RATE_LIMITED = "rate_limited"  # rate-limited until ``until``
    POOL_FULL = "pool_full"  # the pool's slots are all taken
    CONNECTION_FULL = "connection_full"  # every usable connection of the pool is full
    QUEUE_FULL = "queue_full"  # a task step with no pool: its catalog queue's shared slots are all taken
    BREAKER_OPEN = "breaker_open"  # every connection's breaker is open until ``until``
    SUSPENDED = "suspended"  # the tenant is suspended
    QUOTA_EXHAUSTED = "quota_exhausted"  # the monthly run quota is used up: the node cannot start its run
    CHILD_RUN = "child_run"  # waiting for its child run to finish
    EVENT = "event"  # a wait_for_event: waiting for its event (or signal), until ``until`` at most
    DISPATCHING = "dispatching"  # admitted and dispatched: a worker is starting it
    TASK_PUBLISHED = "task_published"  # a task node's message is on the team's queue: its worker has not answered
    IN_LINE = "in_line"  # due and admissible: waiting for its turn in the fair order
    LOST = "lost"  # its queue item is missing: the coordinator's reconciler enqueues it again


@dataclass(frozen=True)
class Waiting:
    """One waiting step and what holds it."""

    node_id: str
    attempt: int
    step_id: str
    status: str
    cause: Cause
    message: str
    until: datetime | None = None
    details: dict[str, Any] = field(default_factory=dict)


def why_waiting(run: WorkflowRun) -> list[Waiting]:
    """What holds each waiting step of ``run`` (in the tenant's context), taking nothing."""
    if run.is_terminal:
        return []
    latest = latest_attempts(run)
    queued = [step for step in latest.values() if step.status == SStatus.QUEUED]
    tick, *holds = fair_queue.holds_of([tick_item_id(run.pk), *(step_item_id(step.pk) for step in queued)])
    found: list[Waiting] = []
    if tick is not None:
        found.append(_of_tick(run, tick))
    held = {step.pk: hold for step, hold in zip(queued, holds, strict=True)}
    for step in latest.values():
        waiting = _of_queued(step, held[step.pk]) if step.pk in held else _of_step(step)
        if waiting is not None:
            found.append(waiting)
    return found + _quota_holds(run, latest)


def _of_tick(run: WorkflowRun, hold: ItemHold) -> Waiting:
    """The run's own tick in the queue; and, when it waits to be delivered again after a failure,
    the last failure its history has (it is delivered again until it succeeds)."""
    waiting = _held(Waiting("", 0, "", TICK, Cause.IN_LINE, "the run's next tick"), hold)
    if hold.state != "waiting" or not hold.deliveries:
        return waiting
    last = RunEvent.objects.filter(run=run, type="tick_failed").order_by("-seq").values("data").first()
    if last is None:
        return waiting
    error = last["data"].get("error") or {}
    failed = (f"; the run's tick keeps failing ({last['data'].get('failures')} failures when last recorded, "
              f"with {error.get('type')}: {error.get('message')}), and is delivered again until it succeeds")
    return replace(waiting, message=waiting.message + failed, details={**waiting.details, "tick_failed": last["data"]})


def _base(step: StepRun) -> Waiting:
    return Waiting(step.node_id, step.attempt, str(step.pk), step.status, Cause.IN_LINE, "")


def _of_step(step: StepRun) -> Waiting | None:
    """A step that is not in the queue: a timer's (scheduled), or one waiting for its child run."""
    base = _base(step)
    if step.status == SStatus.SCHEDULED:
        until = step.scheduled_for
        if until is not None and until <= timezone.now():
            # Its timer is due: the wake-up waits for its turn in the system tier, which every tenant's
            # wake-ups share (how many others wait there is not told).
            return _with(base, Cause.IN_LINE, f"its sleep or backoff ended at {_iso(until)}: its wake-up is due, "
                         f"and waits for its turn among the tenants' wake-ups in tier {fair_queue.SYSTEM_TIER!r}",
                         details={"tier": fair_queue.SYSTEM_TIER})
        return _with(base, Cause.NOT_DUE, f"not due until {_iso(until)} (a sleep or a retry's backoff)", until)
    if step.status == SStatus.RUNNING and step.node_type == TASK:
        return _of_task(base, step)
    if step.status == SStatus.WAITING and step.node_type == WAIT:
        return _of_wait(base, step)
    if step.status == SStatus.WAITING:
        # The run it waits for: its child, or the run its child continued as (ContinueAsNew).
        child = chain_end(step.child_run_id) if step.child_run_id is not None else None
        if child is None:
            return _with(base, Cause.CHILD_RUN, "waiting for its child run to start")
        return _with(base, Cause.CHILD_RUN, f"waiting for its child run {child.pk} ({child.status})",
                     details={"child_run_id": str(child.pk), "child_status": child.status})
    return None


def _of_wait(base: Waiting, step: StepRun) -> Waiting:
    """A ``wait_for_event`` step: what it waits for, and until when; or resumed, for its next tick."""
    wait = EventWait.objects.filter(step_id=step.pk).first()
    name, key = (step.input or {}).get("event", ""), (step.input or {}).get("key", "")
    if wait is not None and wait.matched_at is not None:
        return _with(base, Cause.IN_LINE, "resumed: the run's next tick finishes it", details=wait.matched_by or {})
    until = wait.expires_at if wait is not None else None
    what = f"an event '{name}'" + (f" with key '{key}'" if key else "") + f", or a signal '{name}' to the run"
    limit = f", until {_iso(until)} (its timeout)" if until else ""
    return _with(base, Cause.EVENT, f"waiting for {what}{limit}", until, details={"event": name, "key": key})


def _of_task(base: Waiting, step: StepRun) -> Waiting:
    """A task node's attempt, published: it waits for the team's worker to answer, until its timeout
    (its lease). Whether messages wait in the queue its message went to (its trace's ``queue`` and
    ``broker``) tells a worker that does not consume it (stopped, or started without ``-Q``) from one
    that is busy; how many is not told (a queue may carry other tenants' tasks too). No other queue is
    read: the queues of its pool as it is now named any the tenant liked, one the catalog keeps for
    another tenant's tasks too, whose waiting messages were not this tenant's to learn of."""
    trace = step.routing or {}
    call = trace.get("task") or {}
    timeout_s = float(call.get("timeout_s") or settings.DUCTOR_TASK_TIMEOUT_S)
    until = step.started_at + timedelta(seconds=timeout_s) if step.started_at is not None else None
    sent_to = trace.get("queue") or call.get("queue")
    queues = [(str(sent_to), str(trace.get("broker") or DEFAULT_BROKER))] if sent_to else []
    found = [(queue, broker, _messages_waiting(queue, broker)) for queue, broker in queues]
    waiting = [queue for queue, _, messages in found if messages]
    taken = [queue for queue, _, messages in found if messages is False]
    if waiting:
        state = (f"messages wait in {_names(waiting)} that no worker has taken (if that lasts, is a worker "
                 f"consuming {'it' if len(waiting) == 1 else 'them'}, with -Q {','.join(waiting)}?)")
    elif taken:
        state = f"no message waits in {_names(taken)}: a worker has taken it"
    else:
        state = "its queue cannot be read now"
    message = (f"published to the team's queue at {_iso(step.started_at)}, waiting for its worker to answer: "
               f"{state}; it times out at {_iso(until)}")
    return _with(base, Cause.TASK_PUBLISHED, message, until,
                 {"task": call.get("name"), "timeout_s": timeout_s,
                  "queues": [{"queue": queue, "broker": broker, "messages_waiting": messages}
                             for queue, broker, messages in found]})


def _messages_waiting(queue: str, broker: str) -> bool | None:
    """Whether messages wait in the queue that no worker has taken (None: the broker cannot tell)."""
    depth = queue_depth(queue, broker)
    return None if depth is None else depth > 0


def _names(queues: list[str]) -> str:
    return ("queue " if len(queues) == 1 else "queues ") + ", ".join(f"'{queue}'" for queue in queues)


def _of_queued(step: StepRun, hold: ItemHold | None) -> Waiting:
    """A queued step, from what the fair queue holds of its item."""
    base = _base(step)
    if hold is None:
        return _with(base, Cause.LOST, "its queue item is missing (Redis lost it?); the coordinator's reconciler "
                                       "enqueues it again")
    return _held(base, hold, pool_name=((step.routing or {}).get("pool") or {}).get("name", ""))


def _held(base: Waiting, hold: ItemHold, *, pool_name: str = "") -> Waiting:
    """The first thing that holds an item, in the dequeue's order (see the module docs)."""
    if hold.state != "waiting":
        return _with(base, Cause.DISPATCHING, "admitted and dispatched: a worker is starting it")
    if hold.due_ms > hold.now_ms:
        return _with(base, Cause.NOT_DUE, f"not due until {_iso(_at(hold.due_ms))}", _at(hold.due_ms))
    ahead = hold.ahead + (1 if hold.partition_holder else 0)
    if ahead:
        return _with(base, Cause.PARTITION, f"behind {ahead} item{'s' if ahead > 1 else ''} of its partition "
                     f"{hold.partition!r} (one runs at a time)",
                     details={"partition": hold.partition, "ahead": ahead,
                              "in_flight": hold.partition_holder or None})
    if hold.suspended or not current_tenant().is_active:
        return _with(base, Cause.SUSPENDED, "the tenant is suspended: nothing of it is dispatched")
    if hold.rate_wait_ms > 0:
        until = _at(hold.now_ms + hold.rate_wait_ms)
        return _with(base, Cause.RATE_LIMITED, f"the tenant's step rate admits its next start at {_iso(until)}",
                     until, {"scope": "tenant"})
    if hold.tenant_limit is not None and hold.tenant_in_flight >= hold.tenant_limit:
        return _with(base, Cause.TENANT_CONCURRENCY, f"tenant concurrency {hold.tenant_in_flight} of "
                     f"{hold.tenant_limit}", details={"in_flight": hold.tenant_in_flight, "limit": hold.tenant_limit})
    if hold.admission is not None and not hold.admission.admitted:
        return _pool_hold(base, hold.admission, pool_name)
    # How many tenants have due work in the tier, or whether any has in a tier above it, is not told:
    # that counts other tenants' work. That tiers are strict is told: a lower tier waits for them all.
    above = _customer_tiers_above(hold.tier)
    after = f", after any due work of the tiers above it ({', '.join(above)})" if above else ""
    return _with(base, Cause.IN_LINE, "due and admissible: it waits for its turn among the tenants with due "
                 f"work in tier {hold.tier!r}{after}", details={"tier": hold.tier})


def _customer_tiers_above(tier: str) -> list[str]:
    """The tiers of customers' work that the dequeue serves before ``tier`` (strict priorities)."""
    tiers = [each for each in fair_queue.TIERS if each != fair_queue.SYSTEM_TIER]
    return tiers[:tiers.index(tier)] if tier in tiers else []


def _pool_hold(base: Waiting, view: AdmissionView, pool_name: str) -> Waiting:
    pool = f"pool {pool_name!r}" if pool_name else "its pool"
    until = _at(view.retry_at_ms) if view.retry_at_ms is not None else None
    if view.pool_limit is not None and view.pool_in_flight >= view.pool_limit:
        return _with(base, Cause.POOL_FULL, f"{pool} is full: {view.pool_in_flight} of {view.pool_limit} slots",
                     details={"in_flight": view.pool_in_flight, "limit": view.pool_limit})
    if not view.members:  # the pool itself waits for its rate
        return _with(base, Cause.RATE_LIMITED, f"{pool}'s rate admits its next start at {_iso(until)}", until,
                     {"scope": "pool"})
    if len(view.members) == 1 and view.members[0].connection_id.startswith(QUEUE_SCOPE_PREFIX):
        return _queue_hold(base, view.members[0].connection_id.removeprefix(QUEUE_SCOPE_PREFIX))
    names = routing_table()
    members = [{"connection_id": m.connection_id, "name": names.connection_name(m.connection_id),
                "breaker": m.breaker, "in_flight": m.in_flight, "limit": m.limit, "why": m.why} for m in view.members]
    blocked = [m for m in view.members if not m.eligible]
    if blocked and all(m.breaker == "open" for m in blocked):
        opens = [m.open_until_ms for m in blocked if m.open_until_ms is not None]
        until = _at(min(opens)) if opens else until
        return _with(base, Cause.BREAKER_OPEN, f"every connection of {pool} has its breaker open, the first "
                     f"until {_iso(until)}", until, {"connections": members})
    if any((m.limit is not None and m.in_flight >= m.limit) or m.why.startswith("its queue") for m in blocked):
        reasons = "; ".join(f"{names.connection_name(m.connection_id) or m.connection_id} {m.why}" for m in blocked)
        return _with(base, Cause.CONNECTION_FULL, f"every usable connection of {pool} is full: {reasons}",
                     details={"connections": members})
    return _with(base, Cause.RATE_LIMITED, f"the connections of {pool} admit their next start at {_iso(until)}",
                 until, {"scope": "connection", "connections": members})


def _queue_hold(base: Waiting, share: str) -> Waiting:
    """A task step with no pool, held by its catalog queue's slots that every tenant shares (the scope
    ``admission.queue_scope`` makes of the queue: no pool and no connection of the tenant's). How many of
    them other tenants hold is not told."""
    broker, _, queue = share.partition("/")
    limit = queue_slots().get(share)
    slots = "slot" if limit == 1 else "slots"
    return _with(base, Cause.QUEUE_FULL, f"queue {queue!r} is at its {limit} {slots}, which every tenant's task "
                 "steps share (DUCTOR_TASK_QUEUE_SLOTS): it takes the next one freed, in the fair order",
                 details={"queue": queue, "broker": broker, "limit": limit})


def _quota_holds(run: WorkflowRun, latest: dict[str, StepRun]) -> list[Waiting]:
    """Nodes that would start a run (sub-workflow, continue-as-new) and have not started, while the
    tenant's monthly run quota is used up: they cannot start it until the quota resets."""
    pending = [node for node in spec_of(run).get("nodes", [])
               if node.get("type") in RUN_STARTING_NODES and node["id"] not in latest]
    if not pending:
        return []
    quota = effective_entitlements(current_tenant()).monthly_run_quota
    used = runs_this_month()
    if used < quota:
        return []
    reset = next_reset()
    return [Waiting(node["id"], 0, "", NOT_STARTED, Cause.QUOTA_EXHAUSTED,
                    f"the monthly run quota is used up ({used} of {quota}): it cannot start its run until "
                    f"{_iso(reset)}", reset, {"used": used, "quota": quota}) for node in pending]


def _with(base: Waiting, cause: Cause, message: str, until: datetime | None = None,
          details: dict[str, Any] | None = None) -> Waiting:
    return Waiting(base.node_id, base.attempt, base.step_id, base.status, cause,
                   f"{base.message}: {message}" if base.message else message, until, details or {})


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _iso(moment: datetime | None) -> str:
    return moment.isoformat(timespec="milliseconds") if moment is not None else "an unknown time"
