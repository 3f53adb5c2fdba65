"""The tick: advance one run, idempotently, under its tenant's context with its row locked.

Apply what happened since the last tick (finished child runs, waits that an
event, a signal or a timeout resumed, failed attempts that their retry policy
tries again), start every node whose dependencies are done (``nodes.start``; a
false ``when`` or a skipped dependency skips it, and the skip propagates), and
finish the run when nothing is left: failed with its first failed step, or
succeeded with its rendered output, waking its parent. An output over the
plan's payload limit fails the run with ``payload_too_large``. Each tick, queued
or inline, is a ``ductor.tick`` span of the run's trace.

A run whose spec has ``timeout_s`` arms a coordinator wake-up at its first tick
(and again when it is retried, ``arm_run_timeout``): a run still going then
fails with ``run_timed_out``, its active steps and child runs cancelled
(``run_timeout``).

A queued tick that raises is delivered again after ``DUCTOR_FAILED_ITEM_DELAY_MS``
(doubled with each failure in a row, up to ``DUCTOR_FAILED_ITEM_MAX_DELAY_MS``), until
it succeeds (once the data or code it tripped on is fixed, or the run is
cancelled): a run is never failed for an error of the engine's own. Its first,
second, fourth, eighth … failure is in the run's history (``tick_failed``, with
the exception), so that the run says why it does not move on.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import structlog
from django.db import transaction
from django.utils import timezone

from ductor_project.core import tracing
from ductor_project.core.errors import StepErrorCode
from scheduling import templates
from scheduling.action_errors import retry_hint
from scheduling.dispatch.handlers import ItemContext
from workflows.engine import nodes, waits
from workflows.engine.attempts import (
    Outcome,
    abort_active,
    finish,
    latest_attempts,
    new_step,
    node_of,
    nodes_of,
    rendered_payload,
    spec_of,
)
from workflows.engine.events import jsonable, record_event
from workflows.engine.items import enqueue_tick, wakeup_on_commit
from workflows.engine.journal import add_state, current_journal, journal
from workflows.engine.statements import chain_end, lock_run, state_of
from workflows.models import RunEvent, StepRun, WorkflowRun
from workflows.spec import Retry, backoff_delay, seconds_text

log = structlog.get_logger(__name__)

Status = WorkflowRun.Status
SStatus = StepRun.Status


def tick(run_id: Any) -> None:
    """Advance one run. Idempotent; runs in the run's tenant context with the run row locked."""
    with (structlog.contextvars.bound_contextvars(run_id=str(run_id)), tracing.span("ductor.tick", run_id=str(run_id)),
          transaction.atomic(), journal()):
        run = lock_run(run_id)
        if run is not None:
            advance(run)


def advance(run: WorkflowRun, *, latest: dict[str, StepRun] | None = None) -> None:
    """The tick's work on ``run``, whose row ``lock_run`` locked, inside a journal; ``latest``,
    each node's latest attempt, when the caller read them in this transaction (else read here)."""
    if run.is_terminal:
        return
    if run.cancel_requested:
        _cancel(run)
        return
    before, now = state_of(run), timezone.now()
    if run.status == Status.PENDING:
        run.status, run.started_at = Status.RUNNING, now
        record_event(run, "started")
    latest = latest_attempts(run) if latest is None else latest
    if not latest:  # its first tick: no node has started
        arm_run_timeout(run)
    _apply_children(run, latest)
    waits.apply(run, latest, lambda node_id: node_of(run, node_id), lambda: context_of(run, latest))
    _retry_failed(run, latest, now)
    if _start_ready(run, latest, now):
        return  # continued as new
    _finish_if_done(run, latest)
    if state_of(run) != before:
        add_state(run)


def execute_tick(ctx: ItemContext, body: dict[str, Any]) -> None:
    """The ``tick`` item handler."""
    try:
        tick(body["run_id"])
    except Exception as exc:
        if ctx.delivery & (ctx.delivery - 1) == 0:  # 1, 2, 4, 8 …: a history that stays short
            _record_failure(body["run_id"], ctx.delivery, exc)
        raise


def _record_failure(run_id: Any, delivery: int, exc: Exception) -> None:
    """A ``tick_failed`` event, in a transaction of its own (the tick's rolled back); nothing when
    that fails too (the database is away, say): the tick's own failure is what is raised."""
    try:
        with transaction.atomic(), journal():
            run = lock_run(run_id)
            if run is not None and not run.is_terminal:
                record_event(run, "tick_failed", failures=delivery,
                             error={"type": type(exc).__name__, "message": str(exc)[:500]})
    except Exception:
        log.exception("tick_failure_unrecorded", run_id=str(run_id))


def advance_locked(run: WorkflowRun, *, latest: dict[str, StepRun] | None = None, queued_again: bool = True) -> None:
    """Advance ``run`` at once, in this process, instead of through the queue (a hop saved):
    inside the transaction that locked it and its journal, where a step records its outcome or
    a run is started (its ``latest`` attempts: none). The tick runs in a savepoint, and its
    writes commit with the rest; should it fail, its writes are rolled back alone (the
    outcome's, or the new run, are kept) and the tick is enqueued. Without ``queued_again``
    (a retry of a failed run, whose ``latest`` leaves out the attempts it starts again: a tick
    through the queue would read them and fail the run again), its failure is raised instead."""
    gathered = current_journal()
    mark = gathered.mark()
    try:
        with tracing.span("ductor.tick", run_id=str(run.pk)), transaction.atomic():
            advance(run, latest=latest)
            if not gathered.with_commit:  # else they are written with the commit: see record_outcome
                gathered.flush()
    except Exception:
        if not queued_again:
            raise
        log.exception("inline_tick_failed", run_id=str(run.pk))
        gathered.rollback_to(mark)
        enqueue_tick(run)


def context_of(run: WorkflowRun, latest: dict[str, StepRun]) -> dict[str, Any]:
    """What the run's templates and ``when`` conditions read: its input, nodes and ids."""
    return {
        "input": run.input,
        "nodes": {nid: {"output": s.output, "status": s.status} for nid, s in latest.items()},
        "run": {"id": str(run.id), "root_id": str(run.root_run_id)},
    }


def _retry_policy(node: dict[str, Any]) -> dict[str, Any]:
    retry = dict(node.get("retry") or {})
    retry.setdefault("max_attempts", 1)
    retry.setdefault("backoff_s", 1.0)
    retry.setdefault("max_backoff_s", 300.0)
    retry.setdefault("jitter", True)
    return retry


def _retry_failed(run: WorkflowRun, latest: dict[str, StepRun], now: datetime) -> None:
    """Schedule the next attempt of each failed step its retry policy tries again."""
    by_id = {n["id"]: n for n in nodes_of(run)}
    for node_id, step in list(latest.items()):
        if step.status != SStatus.FAILED:
            continue
        node, policy = by_id[node_id], _retry_policy(by_id[node_id])
        if not Retry(non_retryable=tuple(policy.get("non_retryable") or ())).retries(step.error):
            continue
        if step.attempt >= int(policy["max_attempts"]):
            continue
        delay = backoff_delay(policy, step.attempt)
        retry_after = (step.error or {}).get("retry_after_s")
        if isinstance(retry_after, int | float) and not isinstance(retry_after, bool):
            delay = max(delay, retry_hint(float(retry_after)) or 0.0)
        routing = nodes.attempt_routing(run, node, step.input)[1] if node["type"] in nodes.ROUTED else None
        nxt = new_step(run, node_id, step.node_type, SStatus.SCHEDULED, attempt=step.attempt + 1, input=step.input,
                       scheduled_for=now + timedelta(seconds=delay), routing=routing)
        latest[node_id] = nxt
        record_event(run, "step_retry_scheduled", node_id, attempt=nxt.attempt, delay_s=round(delay, 3))
        wakeup_on_commit(str(nxt.id), kind="step_retry", delay_s=delay)


def _apply_children(run: WorkflowRun, latest: dict[str, StepRun]) -> None:
    """Finish each step waiting for a child run that ended (through its ContinueAsNew successors)."""
    for node_id, step in latest.items():
        if step.status != SStatus.WAITING or step.child_run_id is None:
            continue
        final = chain_end(step.child_run_id)
        if final is None or not final.is_terminal:
            continue
        if final.status == Status.SUCCEEDED:
            finish(step, Outcome.succeeded(final.output))
        else:
            code = StepErrorCode.CHILD_CANCELLED if final.status == Status.CANCELLED else StepErrorCode.CHILD_FAILED
            finish(step, Outcome.failed(code, f"child run {final.id} {final.status}", child_error=final.error))
        record_event(run, f"step_{step.status}", node_id, attempt=step.attempt,
                     error=(step.error or {}).get("code"), child_run=str(final.id))


def _start_ready(run: WorkflowRun, latest: dict[str, StepRun], now: datetime) -> bool:
    """Start every node whose dependencies are done. Returns True if the run continued as new.

    Nothing starts once a step has failed for good (``_retry_failed`` has rescheduled the others),
    even on another branch: the run fails in this tick (``_finish_if_done``). A node refused as it
    starts fails for good too, so it stops the nodes after it: a ``continue_as_new`` among them
    would end the run as ``continued`` with that failure dropped. A sub-workflow node is checked
    in its place (``nodes.child_of``), but the children of the nodes ready together are charged
    and created last, all or none (``nodes.start_children``), once no other node was refused and
    none continued the run: whatever their place in the spec, no child is created and charged
    only to be cancelled with the run."""
    if any(step.status == SStatus.FAILED for step in latest.values()):
        return False  # the run fails
    progressed = True
    while progressed:  # skips, and children that do not wait, can make more nodes ready within one tick
        progressed, children = False, []
        for node in nodes_of(run):
            if node["id"] in latest:
                continue
            deps = [latest.get(d) for d in node.get("depends_on", [])]
            if any(d is None or d.status not in StepRun.TERMINAL for d in deps):
                continue
            context = context_of(run, latest)
            skip = any(d.status in (SStatus.SKIPPED, SStatus.CANCELLED) for d in deps if d is not None)
            if not skip and node.get("when") is not None and not templates.evaluate_when(node["when"], context):
                skip = True
            if skip:
                latest[node["id"]] = nodes.finish_skipped(run, node, now)
            elif node["type"] == nodes.CHILD:
                checked = nodes.child_of(run, node, context)
                if isinstance(checked, StepRun):
                    latest[node["id"]] = checked
                    return False  # refused: the run fails
                children.append(checked)
                continue
            elif nodes.start(run, node, latest, context, now):
                return True
            elif latest[node["id"]].status == SStatus.FAILED:
                return False  # refused as it started: the run fails
            progressed = True
        if children and not nodes.start_children(run, children, latest):
            return False  # refused by the quota: the run fails
        progressed = progressed or bool(children)
    return False


def _finish_if_done(run: WorkflowRun, latest: dict[str, StepRun]) -> None:
    failed = [s for s in latest.values() if s.status == SStatus.FAILED]
    if failed:
        first = failed[0]
        _fail(run, latest, {"node": first.node_id, "attempt": first.attempt, "error": first.error})
        return
    if len(latest) < len(nodes_of(run)) or any(s.status not in StepRun.TERMINAL for s in latest.values()):
        return
    output, refusal = rendered_payload(spec_of(run).get("output"), context_of(run, latest), "output")
    if refusal is not None:
        _fail(run, latest, {"node": None, "attempt": None, "error": refusal.error})
        return
    run.output = jsonable(output)
    run.status, run.finished_at = Status.SUCCEEDED, timezone.now()
    record_event(run, "succeeded")
    _notify_parent(run)


def _fail(run: WorkflowRun, latest: dict[str, StepRun], error: dict[str, Any]) -> None:
    abort_active(latest, SStatus.CANCELLED)
    run.status, run.finished_at, run.error = Status.FAILED, timezone.now(), error
    failure = error.get("error") or {}
    record_event(run, "failed", error["node"] or "", attempt=error["attempt"], error=failure.get("code"))
    _notify_parent(run)


def _cancel(run: WorkflowRun) -> None:
    abort_active(latest_attempts(run), SStatus.CANCELLED)
    run.status, run.finished_at = Status.CANCELLED, timezone.now()
    record_event(run, "cancelled")
    add_state(run)
    _notify_parent(run)


def run_cancel(ref: str, data: dict[str, Any]) -> None:
    """The run ``ref`` was asked to cancel (``items.cancel_on_commit``): end it as its tick would,
    without waiting for one of its tenant's slots. A run that ended, or that was not asked to
    cancel, changes nothing."""
    with transaction.atomic(), journal():
        run = lock_run(ref)
        if run is not None and not run.is_terminal and run.cancel_requested:
            _cancel(run)


# The wake-up of a run whose spec's ``timeout_s`` is due (``run_timeout``).
RUN_TIMEOUT = "run_timeout"


def arm_run_timeout(run: WorkflowRun) -> None:
    """Wake ``run_timeout`` when ``run``'s spec's ``timeout_s`` (if any) ends, counted from now (its
    start, or its retry), once the surrounding transaction commits."""
    timeout_s = spec_of(run).get("timeout_s")
    if timeout_s:
        wakeup_on_commit(str(run.pk), kind=RUN_TIMEOUT, delay_s=float(timeout_s))


def run_timeout(ref: str, data: dict[str, Any]) -> None:
    """The run ``ref``'s ``timeout_s`` may be over: a run still going fails with ``run_timed_out`` (its
    active steps and child runs cancelled, its parent woken; what ended before and no tick took yet,
    a child or a wait, kept first); one that was retried since waits for
    the rest of the timeout counted from the retry. A run that ended changes nothing; one asked to
    cancel is cancelled."""
    with transaction.atomic(), journal():
        run = lock_run(ref)
        if run is None or run.is_terminal:
            return
        if run.cancel_requested:  # asked first: it ends as asked, with no cancel left pending on it
            _cancel(run)
            return
        timeout_s = float(spec_of(run).get("timeout_s") or 0)
        if not timeout_s:
            return
        since = max(moment for moment in (run.started_at, run.created_at, _last_retried(run)) if moment is not None)
        left = (since + timedelta(seconds=timeout_s) - timezone.now()).total_seconds()
        if left > RUN_TIMEOUT_SLACK_S:
            wakeup_on_commit(ref, kind=RUN_TIMEOUT, delay_s=left)
            return
        error = {"code": StepErrorCode.RUN_TIMED_OUT.value, "retryable": False,
                 "message": f"the run went on past its timeout_s of {seconds_text(timeout_s)} s"}
        latest = latest_attempts(run)
        # What ended before the deadline, and that no tick has taken yet, is kept as its tick would
        # keep it (a child's success, a wait's event or signal), not cancelled: a retry of the run
        # keeps it too, rather than running the child again or waiting for a signal taken already.
        _apply_children(run, latest)
        waits.apply(run, latest, lambda node_id: node_of(run, node_id), lambda: context_of(run, latest))
        _fail(run, latest, {"node": None, "attempt": None, "error": error})
        add_state(run)


# A run's timeout woken this close to its end is over (timers fire a few ms early or late).
RUN_TIMEOUT_SLACK_S = 0.05


def _last_retried(run: WorkflowRun) -> datetime | None:
    """When ``run`` was last retried (its latest ``retried`` event), or None."""
    return (RunEvent.objects.filter(run_id=run.pk, type="retried").order_by("-seq")
            .values_list("created_at", flat=True).first())


def _notify_parent(run: WorkflowRun) -> None:
    if run.parent_run_id is not None:
        parent = WorkflowRun.objects.filter(pk=run.parent_run_id).first()
        if parent is not None and not parent.is_terminal:
            enqueue_tick(parent)
