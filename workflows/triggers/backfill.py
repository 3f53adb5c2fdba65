"""Fires asked for by hand: a schedule's past fire times backfilled, or a fire now.

- ``schedule_backfill`` starts the run of each fire time of a schedule from
  ``start`` to ``end``, both included (at most ``MAX_BACKFILL_FIRES``; none after
  now: those are the schedule's own), each under its fire's key
  (``timing.fire_key``). A fire that has its run already (it fired, or an
  earlier backfill started it) starts nothing more, so a backfill may be sent
  again, or over a span that overlaps what fired. It asks for every fire of the
  span, whatever the overlap policy, the catch-up window or a pause. A fire
  refused (the month's run quota) is listed with its error and refuses no other.
- ``schedule_trigger`` starts a run now, as a fire of this second would: under
  that fire's key, so a second trigger within the same second answers the same
  run (started with the input the schedule had then, if it changed since),
  whatever the overlap policy.

Neither changes the schedule's own fires or its counters; the runs carry its
tag (``schedule:<name>``) as its fires' do. Both act for the tenant in context.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import datetime, timedelta

import structlog
from django.db import transaction
from django.utils import timezone

from ductor_project.core.errors import ApiError, ErrorCode
from workflows.models import Schedule, WorkflowRun
from workflows.services import run_start
from workflows.triggers.arming import timing_of
from workflows.triggers.firing import Outcome, fire_request, start_fires
from workflows.triggers.timing import Timing

log = structlog.get_logger(__name__)

MAX_BACKFILL_FIRES = 1000


def schedule_backfill(*, schedule: Schedule, start: datetime, end: datetime) -> list[tuple[datetime, Outcome]]:
    """Start the runs of ``schedule``'s fire times from ``start`` to ``end`` (see the module docs):
    each fire time with how its start went, in order. ``400 invalid`` naming ``start`` or ``end``
    when the span is backwards, reaches past now, holds more than ``MAX_BACKFILL_FIRES`` fires, or
    starts where no fire time can be computed (the calendar's first days)."""
    now = timezone.now()
    if start > end:
        raise ApiError("start is after end.", code=ErrorCode.INVALID, details={"start": ["Must not be after end."]})
    if end > now:
        raise ApiError("end is in the future.", code=ErrorCode.INVALID,
                       details={"end": ["Must not be in the future: the schedule starts its own fires."]})
    try:
        fires = list(itertools.islice(_fires_between(timing_of(schedule), start, end), MAX_BACKFILL_FIRES + 1))
    except OverflowError:  # a start in the calendar's first days: before it, or its time zone's, there is none
        raise ApiError("start is too far in the past.", code=ErrorCode.INVALID,
                       details={"start": ["Too far in the past: no fire time can be computed from it."]}) from None
    if len(fires) > MAX_BACKFILL_FIRES:
        raise ApiError(f"More than {MAX_BACKFILL_FIRES} fire times from start to end.", code=ErrorCode.INVALID,
                       details={"end": [f"The span holds more than {MAX_BACKFILL_FIRES} fire times: backfill it "
                                        f"in shorter spans."]})
    with transaction.atomic():
        outcomes = start_fires([(schedule, fire) for fire in fires])
    log.info("schedule_backfilled", schedule_id=str(schedule.pk), fires=len(fires),
             started=sum(outcome.created for outcome in outcomes),
             refused=sum(outcome.error is not None for outcome in outcomes))
    return list(zip(fires, outcomes, strict=True))


def schedule_trigger(*, schedule: Schedule) -> tuple[WorkflowRun, bool]:
    """Start a run of ``schedule`` now, as a fire of this second (see the module docs): ``(run,
    created)``. A refused start raises its ``ApiError``, as ``POST /runs`` would (the month's run
    quota: ``429 quota_exceeded``; the workflow archived: ``409 conflict``)."""
    request = fire_request(schedule, timezone.now().replace(microsecond=0))
    try:
        run, created = run_start(**request)
    except ApiError as exc:
        # The fire of this second started its run already, with the input or name the schedule had then:
        # the key is the fire's, and that run answers, as it does for a fire that finds its key used.
        if exc.error_code != ErrorCode.IDEMPOTENCY_KEY_REUSED:
            raise
        run, created = WorkflowRun.objects.get(idempotency_key=request["idempotency_key"]), False
    log.info("schedule_triggered", schedule_id=str(schedule.pk), run_id=str(run.pk), created=created)
    return run, created


def _fires_between(timing: Timing, start: datetime, end: datetime) -> Iterator[datetime]:
    """The fire times of ``timing`` from ``start`` to ``end``, both included, in order."""
    for fire in timing.after(start - timedelta(microseconds=1)):
        if fire > end:
            return
        yield fire
