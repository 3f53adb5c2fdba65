"""The step path's statements, written out: each one round trip, each scoped to the tenant.

Every step runs these, so they are plain SQL rather than querysets (a queryset costs more to
build than the statement costs PostgreSQL to run; ``docs/performance.md``). Each names the
tenant in context (``current_tenant()``, which raises without one, so they fail closed as the
scoped managers do) and row-level security holds them to it as it holds every query.

- ``lock_run``: one ``UPDATE ... RETURNING`` takes the run's row lock (as ``SELECT ... FOR
  UPDATE`` would), marks it as moving (``updated_at``, which the reconciler reads, and
  ``lock_version``) and reads it.
- ``start_attempt``: a queued attempt whose run is still going becomes running, and is read
  with its run's version. Its commit does not wait for the disk (``unflushed``).
- ``attempts_of``: the latest attempt of each node of a run.
- ``lock_and_finish``: what an outcome needs, sent together (``pipelined``): its run locked,
  the running attempt ended with it (nothing happens to one that moved on: cancelled, timed
  out), and the run's attempts.
- ``save_state``: what a tick changed of the run's state (status, times, output, error).
- ``together``: writes that need no answer, as one statement (a tick's, ``journal``).
- ``start_tasks``: the dispatcher's start of a group of task attempts before it publishes them
  (``unflushed`` too).
- ``version_to_start``: the workflow version a run starts on, with its definition (a run's start).
- ``chain_end``: the last run of the ContinueAsNew chain a run starts, in one round trip however
  long the chain (a sub-workflow node waits for it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.utils import timezone

from ductor_project.core.context import current_tenant
from ductor_project.core.database.pipeline import pipelined
from tenants.scoping import instance_with, instances_of, row_columns
from workflows.models import StepRun, WorkflowDefinition, WorkflowRun, WorkflowVersion

STATE = ("status", "started_at", "finished_at", "output", "error")
RUNS, STEPS = WorkflowRun._meta.db_table, StepRun._meta.db_table
VERSIONS, DEFINITIONS = WorkflowVersion._meta.db_table, WorkflowDefinition._meta.db_table
SPEC = ("spec",)
TRACE = ("routing",)


def _listed(values: list[str]) -> str:
    """An SQL list of the code's own status values, for a statement's text: a list parameter costs
    the driver a look at each element and an array's dumping on every execution. Each value is
    checked to be a plain word, so nothing but the model's constants can reach the text."""
    for value in values:
        if not value.replace("_", "").isalpha():
            raise ValueError(f"not a status: {value!r}")
    return "(" + ", ".join(f"'{value}'" for value in values) + ")"


# The statuses of a step that a worker may (still) run, and of a run that ended.
ON_WORKER = [StepRun.Status.QUEUED.value, StepRun.Status.RUNNING.value]
ENDED = [str(status) for status in WorkflowRun.TERMINAL]
ON_WORKER_SQL, ENDED_SQL = _listed(ON_WORKER), _listed(ENDED)


@dataclass(frozen=True)
class Started:
    """An attempt a worker started: what it needs to call the action and record the outcome."""

    id: Any
    run_id: Any
    node_id: str
    attempt: int
    input: Any
    version_id: Any


def _json(value: Any) -> str | None:
    """A JSON column's parameter: SQL NULL for None (as a ``JSONField`` stores it)."""
    return None if value is None else json.dumps(value)


def _loaded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _routing_update(added: dict[str, Any] | None, alias: str = "") -> tuple[str, list[Any]]:
    """The ``SET`` clause part that adds ``added`` to an attempt's routing trace, if any."""
    if not added:
        return "", []
    column = f"{alias}.routing" if alias else "routing"
    return f", routing = COALESCE({column}, '{{}}'::jsonb) || %s::jsonb", [json.dumps(added)]


Statement = tuple[str, list[Any]]


def _lock_run(run_id: Any) -> Statement:
    return (f"UPDATE {RUNS} SET updated_at = %s, lock_version = lock_version + 1 "  # noqa: S608 - no value in the text
            f"WHERE tenant_id = %s AND id = %s RETURNING {row_columns(WorkflowRun)}",
            [timezone.now(), current_tenant().pk, run_id])


def _finish_running(step_id: Any, run_id: Any, fields: dict[str, Any], added: dict[str, Any] | None) -> Statement:
    # Only while its run goes on: an outcome that comes once the run was asked to cancel is the
    # result of a step the cancel ends, which is dropped, not kept beside a cancelled run.
    routing, routing_params = _routing_update(added)
    return (f"UPDATE {STEPS} SET status = %s, output = %s::jsonb, error = %s::jsonb, "  # noqa: S608
            f"finished_at = %s{routing} "
            f"WHERE tenant_id = %s AND id = %s AND run_id = %s AND status IN {ON_WORKER_SQL} "
            f"AND EXISTS (SELECT 1 FROM {RUNS} r WHERE r.tenant_id = %s AND r.id = %s "
            f"AND r.status NOT IN {ENDED_SQL} AND NOT r.cancel_requested) RETURNING node_id, attempt",
            [fields["status"], _json(fields["output"]), _json(fields["error"]), fields["finished_at"],
             *routing_params, current_tenant().pk, step_id, run_id, current_tenant().pk, run_id])


def _attempts_of(run_id: Any) -> Statement:
    # The latest attempt of each node only: what a tick reads (``attempts.latest_of``), however
    # many times its nodes were retried (``steprun_unique_attempt`` finds the run's attempts;
    # they are few, and sorted in memory).
    return (f"SELECT DISTINCT ON (node_id) {row_columns(StepRun, defer=TRACE)} FROM {STEPS} "  # noqa: S608
            "WHERE tenant_id = %s AND run_id = %s ORDER BY node_id, attempt DESC",
            [current_tenant().pk, run_id])


def _runs(rows: list[Any]) -> WorkflowRun | None:
    found = instances_of(WorkflowRun, rows)
    return found[0] if found else None


def _finished(row: Any) -> tuple[str, int] | None:
    return (row[0], row[1]) if row is not None else None


def unflushed(*, join: str) -> tuple[str, str]:
    """The ``WITH`` clause and the ``FROM`` item (``join`` before it: ``", "`` or ``" FROM "``)
    that make a statement which is its own transaction commit asynchronously: without waiting
    for its WAL to reach the disk, about 0.1 ms here, on the step path's critical path. For the
    start of an attempt only: should the server crash before the WAL writer flushes it (within
    three times ``wal_writer_delay``), the attempt is found queued again and its item, still leased, is
    delivered again after its lease, as for a worker that died with it, and at least once holds.
    The outcome's commit, which the item's ack follows, flushes it first (WAL is written in
    order), and stays synchronous, as does every other commit. Inside a transaction, nothing:
    the setting would hold for the transaction's own commit."""
    if connection.in_atomic_block:
        return "", ""
    return "WITH unflushed AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)) ", f"{join}unflushed"


def _one(statement: Statement) -> list[Any]:
    with connection.cursor() as cursor:
        cursor.execute(*statement)
        return list(cursor.fetchall())


def start_tasks(step_ids: list[str], added: Mapping[str, dict[str, Any]] | None = None) -> dict[str, StepRun]:
    """Mark the queued ones of these attempts running (now), with ``added[step_id]`` (the
    connection their admission chose) on their routing traces, and read the ones running, with
    what their messages need (``heartbeat_details``: the progress to resume from,
    ``LAST_HEARTBEAT_DETAILS``): one ``UPDATE ... RETURNING`` for the group; none of a run that
    ended or was asked to cancel (as ``start_attempt``: its message is not sent). An attempt running
    already (its item delivered again) keeps its start time and its trace, which name where its
    first message went: a timeout is that one's."""
    if not step_ids:
        return {}
    queued, running = StepRun.Status.QUEUED.value, StepRun.Status.RUNNING.value
    prefix, from_ = unflushed(join=", ")
    traces = {step_id: trace for step_id, trace in (added or {}).items() if trace}
    routing, routing_params = ("", []) if not traces else (
        ", routing = CASE WHEN s.status = %s THEN COALESCE(s.routing, '{}'::jsonb) "
        "|| COALESCE(%s::jsonb -> s.id::text, '{}'::jsonb) ELSE s.routing END", [queued, json.dumps(traces)])
    with connection.cursor() as cursor:
        cursor.execute(
            f"{prefix}UPDATE {STEPS} s SET status = %s, "  # noqa: S608 - no value in the text
            f"started_at = CASE WHEN s.status = %s THEN %s ELSE s.started_at END{routing} FROM {RUNS} r{from_} "
            f"WHERE s.tenant_id = %s AND s.id = ANY(%s::uuid[]) AND s.status IN {ON_WORKER_SQL} "
            f"AND r.tenant_id = s.tenant_id AND r.id = s.run_id AND r.status NOT IN {ENDED_SQL} "
            "AND NOT r.cancel_requested "
            f"RETURNING s.id, s.run_id, s.node_id, s.attempt, s.input, s.started_at, {LAST_HEARTBEAT_DETAILS}",
            [running, queued, timezone.now(), *routing_params, current_tenant().pk, step_ids])
        rows = cursor.fetchall()
    return {str(row[0]): StepRun(id=row[0], run_id=row[1], node_id=row[2], attempt=row[3], input=_loaded(row[4]),
                                 started_at=row[5], status=running, heartbeat_details=_loaded(row[6]))
            for row in rows}


# What the attempt ``s`` resumes from: the progress its own last heartbeat reported (its message sent
# again), else its node's latest earlier attempt's in the run (its retry). Read for an attempt after
# the first only, through the attempts' unique index on (run, node, attempt).
LAST_HEARTBEAT_DETAILS = (
    f"COALESCE(s.heartbeat_details, CASE WHEN s.attempt > 1 THEN (SELECT p.heartbeat_details FROM {STEPS} p "  # noqa: S608
    "WHERE p.tenant_id = s.tenant_id AND p.run_id = s.run_id AND p.node_id = s.node_id AND p.attempt < s.attempt "
    "AND p.heartbeat_details IS NOT NULL ORDER BY p.attempt DESC LIMIT 1) END)")


def chain_end(run_id: Any) -> WorkflowRun | None:
    """The run ``run_id`` of the tenant in context, or the last run of the ContinueAsNew chain it
    started (the run it continued as, and so on), read in one statement; None when there is no
    such run. Each successor is found by its unique ``continued_from``."""
    tenant = current_tenant().pk
    sql = (f"WITH RECURSIVE chain (id, depth) AS (SELECT id, 0 FROM {RUNS} WHERE tenant_id = %s AND id = %s "  # noqa: S608
           f"UNION ALL SELECT r.id, c.depth + 1 FROM {RUNS} r JOIN chain c ON r.continued_from_id = c.id "
           f"WHERE r.tenant_id = %s) "
           f"SELECT {row_columns(WorkflowRun)} FROM {RUNS} WHERE tenant_id = %s "
           "AND id = (SELECT id FROM chain ORDER BY depth DESC LIMIT 1)")
    return _runs(_one((sql, [tenant, run_id, tenant, tenant])))


def lock_run(run_id: Any) -> WorkflowRun | None:
    """The run ``run_id`` of the tenant in context, its row locked until the transaction ends
    and touched; None when there is no such run."""
    return _runs(_one(_lock_run(run_id)))


def start_attempt(step_id: Any, added: dict[str, Any] | None) -> Started | None:
    """Mark the attempt ``step_id`` running (with ``added`` on its routing trace) and read it,
    if a worker may run it: it is queued (or running: a delivery again after a lost lease) and
    its run has neither ended nor been asked to cancel. None otherwise."""
    routing, routing_params = _routing_update(added, "s")
    prefix, from_ = unflushed(join=", ")
    rows = _one((
        f"{prefix}UPDATE {STEPS} s SET status = %s, started_at = %s{routing} FROM {RUNS} r{from_} "  # noqa: S608
        f"WHERE s.tenant_id = %s AND s.id = %s AND s.status IN {ON_WORKER_SQL} "
        f"AND r.tenant_id = s.tenant_id AND r.id = s.run_id AND r.status NOT IN {ENDED_SQL} AND NOT r.cancel_requested "
        "RETURNING s.id, s.run_id, s.node_id, s.attempt, s.input, r.workflow_id",
        [StepRun.Status.RUNNING.value, timezone.now(), *routing_params, current_tenant().pk, step_id],
    ))
    if not rows:
        return None
    row = rows[0]
    return Started(row[0], row[1], row[2], row[3], _loaded(row[4]), row[5])


def attempts_of(run_id: Any) -> list[StepRun]:
    """The latest attempt of each node of the run ``run_id``, by node; their routing traces,
    which a tick does not read, only if asked for."""
    return instances_of(StepRun, _one(_attempts_of(run_id)), defer=TRACE)


def lock_and_finish(run_id: Any, step_id: Any, fields: dict[str, Any], added: dict[str, Any] | None,
                    ) -> tuple[WorkflowRun | None, tuple[str, int] | None, list[StepRun]]:
    """``lock_run``, then the end of the attempt ``step_id`` of run ``run_id`` with ``fields``
    (``attempts.outcome_fields``) and ``added`` on its trace if a worker may still run it, then
    ``attempts_of`` (which sees it ended): in that order, in one round trip. The run (None if
    there is none), the ended attempt's node and number (None when it moved on: cancelled,
    timed out; or when its run ended or was asked to cancel), and the attempts."""
    with connection.cursor() as run, connection.cursor() as step, connection.cursor() as every:
        with pipelined():  # the results are read once the batch is answered, in one round trip
            run.execute(*_lock_run(run_id))
            step.execute(*_finish_running(step_id, run_id, fields, added))
            every.execute(*_attempts_of(run_id))
        locked, finished, attempts = run.fetchall(), step.fetchone(), every.fetchall()
    return _runs(locked), _finished(finished), instances_of(StepRun, attempts, defer=TRACE)


def state_of(run: WorkflowRun) -> tuple[Any, ...]:
    return tuple(getattr(run, name) for name in STATE)


def state_update(run: WorkflowRun) -> Statement:
    """The ``UPDATE`` of the run's state (status, times, output, error) as it is in memory."""
    return (f"UPDATE {RUNS} SET status = %s, started_at = %s, finished_at = %s, "  # noqa: S608
            "output = %s::jsonb, error = %s::jsonb WHERE tenant_id = %s AND id = %s",
            [run.status, run.started_at, run.finished_at, _json(run.output), _json(run.error),
             current_tenant().pk, run.pk])


def save_state(run: WorkflowRun) -> None:
    """Write the run's state (status, times, output, error) as it is in memory."""
    with connection.cursor() as cursor:
        cursor.execute(*state_update(run))


def together(statements: list[Statement]) -> Statement:
    """Writes whose results nobody reads, as one statement (one ``execute``, where each costs the
    client about as much as a round trip): every one but the last a data-modifying ``WITH`` of the
    last. All see the snapshot from before the statement (none sees another's rows), and all
    happen or none does. Each must be an ``INSERT``, ``UPDATE`` or ``DELETE``; no two may change
    one row."""
    if len(statements) == 1:
        return statements[0]
    *before, last = statements
    parts = ", ".join(f"w{n} AS ({sql})" for n, (sql, _) in enumerate(before))
    return f"WITH {parts} {last[0]}", [param for _, params in statements for param in params]


def lock_definitions(*names: str | None) -> None:
    """Lock the tenant's workflows named ``names`` (those that exist), in one order, as their deletion
    locks its own: what refers to a workflow (a trigger, a schedule) and is written in this
    transaction is either committed before the deletion removes what refers to it, or waits for
    the deletion and then finds the workflow gone."""
    wanted = sorted({name for name in names if isinstance(name, str)})
    if wanted:
        list(WorkflowDefinition.objects.select_for_update().filter(name__in=wanted).order_by("name")
             .values_list("pk", flat=True))


def version_to_start(workflow: str, number: int | None = None) -> WorkflowVersion | None:
    """The tenant's version ``number`` of the workflow named ``workflow`` (its latest when None),
    with its definition; its spec is left unread (``attempts.version_spec`` reads it once per
    process: versions never change). None when there is none. One statement."""
    tenant = current_tenant().pk
    only, params = ("AND v.number = %s ", [number]) if number is not None else ("", [])
    rows = _one((f"SELECT {row_columns(WorkflowVersion, 'v', defer=SPEC)}, {row_columns(WorkflowDefinition, 'd')} "  # noqa: S608
                 f"FROM {VERSIONS} v JOIN {DEFINITIONS} d ON d.id = v.definition_id "
                 f"WHERE d.tenant_id = %s AND v.tenant_id = %s AND d.name = %s {only}"
                 "ORDER BY v.number DESC LIMIT 1", [tenant, tenant, workflow, *params]))
    return instance_with(WorkflowVersion, "definition", rows[0], defer=SPEC) if rows else None
