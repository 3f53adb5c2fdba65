"""The step path's hand-written statements and the tick's journal, against the real PostgreSQL.

Each statement is scoped like a scoped manager: it sees only the rows of the tenant in context
(another tenant's run or attempt is not there for it, and is left as it was) and refuses to run
without a tenant. The journal writes a tick's attempts and events in one ``INSERT`` each, in
order, and forgets what a rolled-back savepoint wrote.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from ductor_project.core.context import TenantScopeError, tenant_context
from tenants.models import Tenant
from tenants.scoping import insert_rows
from workflows import services
from workflows.engine import journal as journal_module
from workflows.engine import statements
from workflows.engine.attempts import outcome_fields, spec_of
from workflows.engine.events import record_event
from workflows.engine.journal import add_state, add_step, journal
from workflows.models import RunEvent, StepRun, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

ONE = {"nodes": [{"id": "a", "type": "action", "action": "echo", "input": {"n": 1}}]}


def started_run(tenant: Tenant) -> tuple[WorkflowRun, StepRun]:
    """A run of ``tenant`` whose one step is queued (its first tick ran in ``run_start``)."""
    with tenant_context(tenant):
        services.workflow_put(name="one", spec=ONE)
        run = services.run_start(workflow="one")[0]
        return WorkflowRun.objects.get(pk=run.pk), StepRun.objects.get(run=run)


@pytest.fixture
def two(redis_client: Any, tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str],
        ) -> tuple[Tenant, Tenant, WorkflowRun, StepRun]:
    """Tenants a and b, and b's run with its queued step."""
    run, step = started_run(tenant_b[0])
    return tenant_a[0], tenant_b[0], run, step


def stored(step: StepRun) -> tuple[Any, ...]:
    return tuple(StepRun.all_tenants.filter(pk=step.pk).values_list("status", "output", "routing").get())


def test_a_started_attempt_is_read_with_its_runs_version_and_its_admission_on_its_trace(two: Any) -> None:
    _, b, run, step = two
    with tenant_context(b):
        started = statements.start_attempt(step.pk, {"admitted": "pool p"})
        assert started is not None
        assert (started.id, started.run_id, started.node_id, started.attempt, started.input, started.version_id) == (
            step.pk, run.pk, "a", 1, {"n": 1}, run.workflow_id)
        again = StepRun.objects.get(pk=step.pk)
    assert again.status == "running"
    assert again.started_at is not None
    assert again.routing == {**(step.routing or {}), "admitted": "pool p"}


def test_no_attempt_starts_once_its_run_is_asked_to_cancel(two: Any) -> None:
    _, b, run, step = two
    WorkflowRun.all_tenants.filter(pk=run.pk).update(cancel_requested=True)
    with tenant_context(b):
        assert statements.start_attempt(step.pk, None) is None
    assert stored(step)[0] == "queued"


def test_no_task_attempt_starts_once_its_run_is_asked_to_cancel(two: Any) -> None:
    _, b, run, step = two
    WorkflowRun.all_tenants.filter(pk=run.pk).update(cancel_requested=True)
    with tenant_context(b):
        assert statements.start_tasks([str(step.pk)]) == {}
    assert stored(step)[0] == "queued"


def test_the_statements_do_not_reach_another_tenants_rows(two: Any) -> None:
    a, _, run, step = two
    before_run = WorkflowRun.all_tenants.filter(pk=run.pk).values_list("lock_version", "updated_at").get()
    before_step = stored(step)
    with tenant_context(a):
        assert statements.lock_run(run.pk) is None
        assert statements.start_attempt(step.pk, {"admitted": "stolen"}) is None
        assert statements.lock_and_finish(run.pk, step.pk, outcome_fields("succeeded"), None) == (None, None, [])
        assert statements.attempts_of(run.pk) == []
        assert statements.start_tasks([str(step.pk)]) == {}
        assert statements.version_to_start("one") is None  # b's workflow of that name
        services.workflow_put(name="one", spec=ONE)
        mine = statements.version_to_start("one")
        assert mine is not None
        assert (mine.pk != run.workflow_id, mine.tenant_id) == (True, a.pk)
    assert WorkflowRun.all_tenants.filter(pk=run.pk).values_list("lock_version", "updated_at").get() == before_run
    assert stored(step) == before_step


def test_the_statements_refuse_to_run_without_a_tenant(two: Any) -> None:
    _, _, run, step = two
    for call in (lambda: statements.lock_run(run.pk), lambda: statements.start_attempt(step.pk, None),
                 lambda: statements.lock_and_finish(run.pk, step.pk, outcome_fields("succeeded"), None),
                 lambda: statements.attempts_of(run.pk), lambda: statements.start_tasks([str(step.pk)]),
                 lambda: statements.version_to_start("one")):
        with pytest.raises(TenantScopeError):
            call()


def test_a_run_starts_on_the_latest_version_or_the_one_asked_for_its_spec_read_once_per_process(
        two: Any, django_assert_num_queries: Any) -> None:
    _, b, run, _ = two
    later = {"nodes": [{"id": "z", "type": "action", "action": "echo", "input": {"n": 2}}]}
    with tenant_context(b):
        services.workflow_put(name="one", spec=later)
        latest, first = statements.version_to_start("one"), statements.version_to_start("one", 1)
        assert statements.version_to_start("one", 3) is None
        assert statements.version_to_start("other") is None
        assert latest is not None
        assert first is not None
        assert (latest.number, latest.definition.name, first.number, first.pk) == (2, "one", 1, run.workflow_id)
        assert "spec" in latest.get_deferred_fields()
        started, _ = services.run_start(workflow="one")
        with django_assert_num_queries(0):  # the spec the start read, kept: the tick reads it again
            assert spec_of(started)["nodes"][0]["id"] == "z"
        assert StepRun.objects.get(run=started).node_id == "z"
        assert services.run_start(workflow="one", version=1)[0].workflow_id == run.workflow_id


def test_task_attempts_start_once_and_a_redelivered_one_keeps_its_start(two: Any) -> None:
    _, b, run, step = two
    with tenant_context(b):
        first = statements.start_tasks([str(step.pk)])
        again = statements.start_tasks([str(step.pk)])  # its item delivered again: running already
        StepRun.objects.filter(pk=step.pk).update(status="succeeded")
        ended = statements.start_tasks([str(step.pk)])
    started = first[str(step.pk)]
    assert (started.run_id, started.node_id, started.attempt, started.input, started.status) == (
        run.pk, "a", 1, {"n": 1}, "running")
    assert started.started_at is not None
    assert again[str(step.pk)].started_at == started.started_at
    assert ended == {}
    assert StepRun.all_tenants.get(pk=step.pk).started_at == started.started_at


def wal_flushes_of_this_backend() -> int:
    """How often this connection's backend itself flushed WAL to disk (PostgreSQL's statistics of
    the backend's own I/O): a synchronous commit of a write does, an asynchronous one leaves it to
    the WAL writer."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_get_backend_io(pg_backend_pid()) "
                       "WHERE object = 'wal'")
        return int(cursor.fetchone()[0])


def synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


def test_an_attempt_starts_without_waiting_for_the_disk_and_nothing_else_changes_its_commits(two: Any) -> None:
    _, b, _, step = two
    with tenant_context(b):
        before = wal_flushes_of_this_backend()
        assert statements.start_attempt(step.pk, None) is not None
        assert statements.start_tasks([str(step.pk)])  # a task attempt's start, as the dispatcher's
        assert wal_flushes_of_this_backend() == before
        assert synchronous_commit() == "on"  # for the session's next commits
        with transaction.atomic():  # in a transaction, the transaction's commit stays synchronous
            StepRun.objects.filter(pk=step.pk).update(status="queued")
            assert statements.start_attempt(step.pk, None) is not None
            assert statements.start_tasks([str(step.pk)])
            assert synchronous_commit() == "on"
    assert stored(step)[0] == "running"


def test_a_running_attempt_finishes_once_and_one_that_moved_on_is_left_alone(two: Any) -> None:
    _, b, run, step = two
    with tenant_context(b):
        assert statements.start_attempt(step.pk, None) is not None
        done = outcome_fields("succeeded") | {"output": {"x": [1, None]}}
        assert statements.lock_and_finish(run.pk, step.pk, done, {"admitted": "ok"})[1] == ("a", 1)
        assert statements.lock_and_finish(run.pk, step.pk, outcome_fields("failed"), None)[1] is None
        missing_run = "00000000-0000-0000-0000-000000000000"
        assert statements.lock_and_finish(missing_run, step.pk, done, None)[:2] == (None, None)
        (attempt,) = statements.attempts_of(run.pk)
        assert attempt.routing["admitted"] == "ok"  # not read with the attempt, read when asked for
    assert (attempt.status, attempt.output, attempt.error) == ("succeeded", {"x": [1, None]}, None)
    assert attempt.stored_tenant_id() == b.pk


def test_a_tick_reads_each_nodes_latest_attempt_only_however_often_it_was_retried(two: Any) -> None:
    _, b, run, step = two
    with tenant_context(b):
        insert_rows([StepRun(run=run, node_id="a", node_type="action", status="failed", attempt=n) for n in (2, 3)]
                    + [StepRun(run=run, node_id="b", node_type="action", status="queued", attempt=1)])
        insert_rows([StepRun(run=run, node_id="a", node_type="action", status="queued", attempt=4)])
        latest = statements.attempts_of(run.pk)
        _, _, finished_with = statements.lock_and_finish(run.pk, step.pk, outcome_fields("failed"), None)
    assert [(s.node_id, s.attempt, s.status) for s in latest] == [("a", 4, "queued"), ("b", 1, "queued")]
    assert [(s.node_id, s.attempt) for s in finished_with] == [("a", 4), ("b", 1)]


def test_a_locked_run_is_touched_and_read_as_a_query_would_read_it(two: Any) -> None:
    _, b, run, _ = two
    with tenant_context(b), transaction.atomic():
        locked = statements.lock_run(run.pk)
        assert locked is not None
        assert locked.lock_version == run.lock_version + 1
        assert locked.updated_at > run.updated_at
        fresh = WorkflowRun.objects.get(pk=run.pk)
        assert {f.attname: getattr(locked, f.attname) for f in WorkflowRun._meta.concrete_fields} == {
            f.attname: getattr(fresh, f.attname) for f in WorkflowRun._meta.concrete_fields}


def test_a_journal_numbers_each_runs_events_after_its_last_in_one_insert(two: Any, django_assert_num_queries: Any,
                                                                         ) -> None:
    _, b, run, _ = two
    other, _ = started_run(b)
    with tenant_context(b):
        last = {r.pk: RunEvent.objects.filter(run=r).order_by("-seq").values_list("seq", flat=True)[0]
                for r in (run, other)}
        with transaction.atomic(), django_assert_num_queries(1), journal():
            record_event(run, "one", "a", n=1)
            record_event(other, "two", "a")
            record_event(run, "three", "a", when=run.created_at)
        got = {r.pk: list(RunEvent.objects.filter(run=r, seq__gt=last[r.pk]).order_by("seq")
                          .values_list("seq", "type", "data")) for r in (run, other)}
    assert got[run.pk] == [(last[run.pk] + 1, "one", {"n": 1}),
                           (last[run.pk] + 2, "three", {"when": str(run.created_at)})]
    assert got[other.pk] == [(last[other.pk] + 1, "two", {})]


def test_events_go_as_one_parameter_the_statement_the_same_whatever_their_number(two: Any, monkeypatch: Any,
                                                                                ) -> None:
    _, b, run, _ = two
    at = datetime(2026, 12, 4, 7, 0, 0, 123456, tzinfo=UTC)
    monkeypatch.setattr(journal_module.timezone, "now", lambda: at)
    with tenant_context(b):
        sent = []
        for count in (1, 3):
            with transaction.atomic(), CaptureQueriesContext(connection) as seen, journal():
                for n in range(count):
                    record_event(run, "noted", "a" if n else "", text="é\u2028\"", nested={"list": [n, None]})
            sent.append([q["sql"] for q in seen.captured_queries if "workflows_runevent" in q["sql"]])
        rows = list(RunEvent.objects.filter(run=run, type="noted").order_by("seq")
                    .values_list("node_id", "data", "created_at"))
    # Its text is the same, so the driver converts it and the server plans it once (the values differ).
    assert len(sent[0]) == len(sent[1]) == 1
    assert sent[0][0].split("FROM jsonb_to_recordset")[0] == sent[1][0].split("FROM jsonb_to_recordset")[0]
    assert [(node, data) for node, data, _ in rows] == [
        ("", {"text": "é\u2028\"", "nested": {"list": [0, None]}}),
        ("", {"text": "é\u2028\"", "nested": {"list": [0, None]}}),
        ("a", {"text": "é\u2028\"", "nested": {"list": [1, None]}}),
        ("a", {"text": "é\u2028\"", "nested": {"list": [2, None]}}),
    ]
    assert {created for _, _, created in rows} == {at}  # to the microsecond


def test_a_journal_forgets_what_was_gathered_after_a_mark_it_rolls_back_to(two: Any) -> None:
    _, b, run, _ = two
    with tenant_context(b):
        before = RunEvent.objects.filter(run=run).count()
        with transaction.atomic(), journal() as gathered:
            record_event(run, "kept")
            mark = gathered.mark()
            record_event(run, "dropped")
            gathered.rollback_to(mark)
        assert list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))[before:] == [
            "kept"]


def test_insert_rows_writes_new_attempts_as_the_tenant_in_context_and_refuses_a_link_to_another(two: Any) -> None:
    a, b, run, _ = two
    with tenant_context(b):
        new = [StepRun(run=run, node_id=f"x{i}", node_type="action", status="queued", input={"i": i})
               for i in range(3)]
        insert_rows(new)
        assert all(not s._state.adding and s.tenant_id == b.pk for s in new)
        stored_rows = {s.node_id: (s.input, s.created_at is not None)
                       for s in StepRun.objects.filter(pk__in=[s.pk for s in new])}
    assert stored_rows == {f"x{i}": ({"i": i}, True) for i in range(3)}
    with tenant_context(a), pytest.raises(TenantScopeError):
        insert_rows([StepRun(run=run, node_id="stolen", node_type="action", status="queued")])
    with pytest.raises(TenantScopeError):
        insert_rows([StepRun(run=run, node_id="nobody", node_type="action", status="queued")])
    assert not StepRun.all_tenants.filter(node_id__in=["stolen", "nobody"]).exists()


def test_a_journal_s_attempts_events_and_state_go_in_one_statement_all_or_none(two: Any) -> None:
    """``together``: the tick's writes as one statement; should one part fail, none is written."""
    _, b, run, _ = two
    with tenant_context(b):
        before = RunEvent.objects.filter(run=run).count()
        with transaction.atomic(), CaptureQueriesContext(connection) as seen, journal():
            locked = statements.lock_run(run.pk)
            assert locked is not None
            add_step(StepRun(run=locked, node_id="b", node_type="action", status="queued"))
            record_event(locked, "one")
            record_event(locked, "two")
            locked.status = WorkflowRun.Status.FAILED
            add_state(locked)
        assert [q["sql"][:4] for q in seen.captured_queries] == ["UPDA", "WITH"]  # the lock, then the writes
        assert StepRun.objects.filter(run=run, node_id="b").exists()
        assert list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type"))[before:] == [
            (before + 1, "one"), (before + 2, "two")]
        assert WorkflowRun.objects.get(pk=run.pk).status == WorkflowRun.Status.FAILED

        with pytest.raises(IntegrityError):
            write_again(run)
        assert RunEvent.objects.filter(run=run).count() == before + 2
        assert WorkflowRun.objects.get(pk=run.pk).status == WorkflowRun.Status.FAILED


def write_again(run: WorkflowRun) -> None:
    """A journal whose attempt is one the run has already: its whole statement fails."""
    with transaction.atomic(), journal():
        locked = statements.lock_run(run.pk)
        assert locked is not None
        add_step(StepRun(run=run, node_id="b", node_type="action", status="queued"))
        record_event(locked, "three")
        locked.status = WorkflowRun.Status.SUCCEEDED
        add_state(locked)


def test_attempts_read_by_hand_are_the_instances_a_queryset_makes(two: Any) -> None:
    _, b, run, step = two
    with tenant_context(b):
        StepRun.objects.filter(pk=step.pk).update(output={"n": [1, "x"]}, routing={"pool": "p"})
        read, = statements.attempts_of(run.pk)
        queried = StepRun.objects.get(pk=step.pk)

        fields = [f.attname for f in StepRun._meta.concrete_fields]
        assert {name: getattr(read, name) for name in fields} == {name: getattr(queried, name) for name in fields}
        assert (read._state.adding, read._state.db) == (False, "default")
        assert read.stored_tenant_id() == b.pk
        assert read.run == run  # a link is loaded when first used, as a queryset's is
        read.status = StepRun.Status.FAILED
        read.save(update_fields=["status"])  # an instance that saves as one read by a queryset
    assert stored(step)[0] == "failed"


def test_rows_become_instances_through_init_when_a_receiver_listens(two: Any) -> None:
    from django.db.models.signals import post_init

    _, b, run, step = two
    seen: list[Any] = []

    def receiver(sender: Any, instance: Any, **kwargs: Any) -> None:
        seen.append(instance.pk)

    post_init.connect(receiver, sender=StepRun)
    try:
        with tenant_context(b):
            read, = statements.attempts_of(run.pk)
    finally:
        post_init.disconnect(receiver, sender=StepRun)
    assert seen == [step.pk]
    assert read.stored_tenant_id() == b.pk
