"""A tick's writes, gathered: the step attempts it creates and the events it appends reach
PostgreSQL in one multi-row ``INSERT`` each when the tick ends, in its transaction, with the
run's new state (``add_state``) and the rows of the runs it starts, all in one statement
rather than one per row.

Inside ``with journal():`` a new run (``add_run``) or attempt (``add_step``) is kept in memory
until the block ends: it can still be changed (``attempts.finish`` of an unsaved attempt sets
its fields only), and its id is known at once. An event (``add_event``) is numbered when it is written: its ``seq``
follows the run's last one in the same statement (the run's row lock orders the writers).
Outside a block each write goes at once. A nested block joins the outer one; ``mark()`` and
``rollback_to()`` drop what was gathered since a mark, as a savepoint rolled back drops what was
written since it. ``journal(with_commit=True)`` keeps it all for the transaction's ``COMMIT``,
sent with it in one round trip: a write that fails then fails the commit, and nothing of the
transaction is kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from ductor_project.core.context import current_tenant
from tenants.scoping import insert_rows, rows_insert, rows_inserted
from workflows.engine.statements import save_state, state_update, together
from workflows.models import RunEvent, StepRun, WorkflowRun


@dataclass(frozen=True)
class Event:
    """An event of a run's history not written yet (``events_insert`` numbers it)."""

    run_id: Any
    type: str
    node_id: str
    data: Any
    at: datetime


@dataclass
class Journal:
    """The attempts and events written inside one ``journal()`` block, not yet in PostgreSQL."""

    runs: list[WorkflowRun] = field(default_factory=list)  # new runs' rows
    steps: list[StepRun] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    states: list[WorkflowRun] = field(default_factory=list)
    with_commit: bool = False  # written with the transaction's COMMIT, not before

    def mark(self) -> tuple[int, int, int, int]:
        return len(self.runs), len(self.steps), len(self.events), len(self.states)

    def rollback_to(self, mark: tuple[int, int, int, int]) -> None:
        del self.runs[mark[0]:]
        del self.steps[mark[1]:]
        del self.events[mark[2]:]
        del self.states[mark[3]:]

    def flush(self) -> None:
        """Write what was gathered in one statement (``statements.together``): the new runs'
        ``INSERT``, the attempts', the events', the runs' new states. Should it fail, nothing is
        forgotten (``rollback_to`` then drops what must go)."""
        if not (self.runs or self.steps or self.events or self.states):
            return
        parts = [rows_insert(rows) for rows in (self.runs, self.steps) if rows]
        if self.events:
            parts.append(events_insert(self.events))
        # Each run's state once, as last seen; a new run's row is inserted with it (an UPDATE in the
        # same statement would not see that row).
        new = {run.pk for run in self.runs}
        parts += [state_update(run) for run in {run.pk: run for run in self.states}.values() if run.pk not in new]
        with connection.cursor() as cursor:
            cursor.execute(*together(parts))
        rows_inserted(self.runs)
        rows_inserted(self.steps)
        self.runs, self.steps, self.events, self.states = [], [], [], []


_current: ContextVar[Journal | None] = ContextVar("ductor_engine_journal", default=None)


@contextmanager
def journal(*, with_commit: bool = False) -> Iterator[Journal]:
    """Gather the writes of the block and make them when it ends without an error (see the
    module docs), or with ``with_commit`` when the transaction that the block ends in commits.
    Inside a transaction: what it writes commits or rolls back with it."""
    outer = _current.get()
    if outer is not None:
        yield outer
        return
    gathered = Journal(with_commit=with_commit)
    token = _current.set(gathered)
    try:
        yield gathered
        if with_commit:
            connection.send_with_commit(gathered.flush)  # type: ignore[attr-defined]
        else:
            gathered.flush()
    finally:
        _current.reset(token)


def current_journal() -> Journal:
    """The journal of the block in progress; raises outside one."""
    gathered = _current.get()
    if gathered is None:
        raise RuntimeError("no journal in progress")
    return gathered


def add_run(run: WorkflowRun) -> None:
    """Create the run ``run`` (an unsaved row, its id set) of the tenant in context: at the end of
    the journal, else at once. Until then its row is not in the database: only its transaction may
    need it (a foreign key to it is checked at the commit; a row that links to it is checked
    against this instance, stamped with its tenant now)."""
    gathered = _current.get()
    if gathered is None:
        insert_rows([run])
    else:
        run.bind_tenant(current_tenant())
        gathered.runs.append(run)


def add_step(step: StepRun) -> StepRun:
    """Create the attempt ``step`` (an unsaved row): at the end of the journal, else at once."""
    gathered = _current.get()
    if gathered is None:
        step.save(force_insert=True)
    else:
        gathered.steps.append(step)
    return step


def add_state(run: WorkflowRun) -> None:
    """Write the run's state (``statements.save_state``): at the end of the journal, else at once."""
    gathered = _current.get()
    if gathered is None:
        save_state(run)
    else:
        gathered.states.append(run)


def add_event(run: WorkflowRun, type_: str, node_id: str, data: Any) -> None:
    """Append an event to ``run``'s history: at the end of the journal, else at once. ``data``
    is stored as JSON carries it (dates and other objects as text)."""
    event = Event(run.pk, type_, node_id, data, timezone.now())
    gathered = _current.get()
    if gathered is None:
        _insert_events([event])
    else:
        gathered.events.append(event)


def _insert_events(events: list[Event]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(*events_insert(events))


def events_insert(events: list[Event]) -> tuple[str, list[Any]]:
    """One ``INSERT`` of ``events``: each run's numbered on from its last ``seq``, read in the
    same statement (which does not see its own rows, hence the offsets ``n``). The rows go as
    one JSON parameter, so that the statement's text is the same for any number of events (the
    driver converts it once per process, and PostgreSQL plans it once per connection)."""
    tenant_id = current_tenant().pk
    offsets: dict[Any, int] = {}
    rows = []
    for event in events:
        offsets[event.run_id] = n = offsets.get(event.run_id, 0) + 1
        rows.append({"run_id": event.run_id, "n": n, "type": event.type, "node_id": event.node_id,
                     "data": event.data, "created_at": event.at})
    table = RunEvent._meta.db_table
    # The table is the model's, and every value a placeholder.
    sql = (
        f"INSERT INTO {table} (tenant_id, run_id, seq, type, node_id, data, created_at) "  # noqa: S608
        f"SELECT %s::uuid, v.run_id, COALESCE((SELECT max(e.seq) FROM {table} e "
        "WHERE e.tenant_id = %s::uuid AND e.run_id = v.run_id), 0) + v.n, v.type, v.node_id, v.data, v.created_at "
        "FROM jsonb_to_recordset(%s::jsonb) "
        "AS v (run_id uuid, n integer, type text, node_id text, data jsonb, created_at timestamptz)"
    )
    return sql, [tenant_id, tenant_id, json.dumps(rows, default=str)]
