"""Tracing: one run's spans share one trace, from its API request through every tick and step, across
the processes that run it; with tracing off, nothing is added to what the queue carries.

The test process traces into an in-memory exporter (the request, the run's start, its first tick).
The worker and dispatcher processes it starts are configured by the standard ``OTEL_*`` environment
alone, as in production, and export OTLP/HTTP to a receiver in this process (``tests.span_receiver``).
The run's two middle steps meet (``test.rendezvous``): neither returns before the other has started,
and each of the two workers runs one attempt at a time, so they run in two processes.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ductor_project.core import tracing
from ductor_project.core.context import tenant_context
from ductor_project.stack import Child, Stack
from scheduling import fair_queue as fq
from tenants.models import Tenant
from tests import tracing_actions  # noqa: F401 - registers test.rendezvous here, for the spec's validation
from tests.conftest import api_client, service_env, service_stack
from tests.span_receiver import Span, SpanReceiver
from tests.workflows.test_engine_e2e import finished, put, steps
from tests.workflows.test_task_nodes_e2e import team_env
from workflows import services
from workflows.engine import items
from workflows.models import TaskCatalogEntry, WorkflowRun

LEASE_MS = 30_000
ONE_NODE = {"nodes": [{"id": "only", "type": "action", "action": "noop"}]}


def fan_out(barrier: str) -> dict[str, Any]:
    """``start``, then ``left`` and ``right`` at the same time (they meet), then ``join``."""
    meet = {"type": "action", "action": "test.rendezvous", "depends_on": ["start"],
            "input": {"name": barrier, "parties": 2}}
    return {"nodes": [
        {"id": "start", "type": "action", "action": "noop"},
        {"id": "left", **meet},
        {"id": "right", **meet},
        {"id": "join", "type": "action", "action": "noop", "depends_on": ["left", "right"]},
    ]}


@pytest.fixture
def traced() -> Iterator[InMemorySpanExporter]:
    """This process traces into an in-memory exporter for the test (instrumentations included)."""
    assert not tracing.enabled
    exporter = InMemorySpanExporter()
    assert tracing.configure(exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown()


def local_spans(exporter: InMemorySpanExporter) -> list[Span]:
    return [Span.of(span) for span in exporter.get_finished_spans()]


def queued_payloads() -> dict[str, dict[str, Any]]:
    """The payload of every item due now, by item id (each leased by the dequeue)."""
    return {item.item_id: item.payload for item in fq.dequeue_many(lease_ms=LEASE_MS, limit=100)}


def carried(payload: dict[str, Any]) -> tuple[str, str, bool]:
    """The trace id, parent span id and sampled flag of the W3C ``traceparent`` an item carries."""
    assert list(payload[tracing.TRACE_KEY]) == ["traceparent"]
    version, trace_id, parent_id, flags = payload[tracing.TRACE_KEY]["traceparent"].split("-")
    assert version == "00"
    return trace_id, parent_id, bool(int(flags, 16) & 1)


def start_run(tenant: Tenant, workflow: str, django_capture_on_commit_callbacks: Any) -> WorkflowRun:
    """Start a run as a request does, and enqueue a tick of it too; the items are enqueued once the
    transaction commits, after the request's span has ended."""
    with tenant_context(tenant), django_capture_on_commit_callbacks(execute=True), tracing.span("request"):
        run, _ = services.run_start(workflow=workflow)
        items.enqueue_tick(run)
    return run


# -- with tracing off, and what an item carries ----------------------------------------------------


@pytest.mark.django_db
def test_with_tracing_off_no_item_carries_a_trace(make_tenant, redis_client, django_capture_on_commit_callbacks):
    assert not tracing.enabled  # the default: no OTEL_TRACES_EXPORTER in the test environment
    tenant, _ = make_tenant("untraced")
    put(tenant, "one", ONE_NODE)

    run = start_run(tenant, "one", django_capture_on_commit_callbacks)

    payloads = queued_payloads()
    assert {payload["kind"] for payload in payloads.values()} == {"step", "tick"}
    assert all(tracing.TRACE_KEY not in payload for payload in payloads.values())
    assert payloads[items.tick_item_id(run.pk)] == {"kind": "tick", "run_id": str(run.pk)}
    with tracing.span("nothing") as span, tracing.item_span("nothing", {"kind": "x"}) as item:
        assert span is item  # the one shared no-op: no span object at all
        assert tracing.headers() == {}


@pytest.mark.django_db
def test_an_item_carries_the_trace_of_the_tick_that_enqueued_it(
    make_tenant, redis_client, django_capture_on_commit_callbacks, traced
):
    tenant, _ = make_tenant("traced-items")
    put(tenant, "one", ONE_NODE)

    run = start_run(tenant, "one", django_capture_on_commit_callbacks)

    spans = {span.name: span for span in local_spans(traced)}
    request, start, tick = spans["request"], spans["ductor.run.start"], spans["ductor.tick"]
    assert start.attributes == {"run_id": str(run.pk), "tenant_id": str(tenant.pk), "workflow": "one"}
    assert (start.parent_id, tick.parent_id) == (request.span_id, start.span_id)
    assert tick.attributes == {"run_id": str(run.pk), "tenant_id": str(tenant.pk)}
    payloads = queued_payloads()
    step = next(payload for payload in payloads.values() if payload["kind"] == "step")
    assert carried(step) == (request.trace_id, tick.span_id, True)  # its parent: the tick that started it
    # Taken when it was enqueued, in the request's span: not when the transaction committed, after it.
    assert carried(payloads[items.tick_item_id(run.pk)]) == (request.trace_id, request.span_id, True)


def test_an_items_span_continues_the_trace_it_carries_not_the_one_running_it(traced):
    with tracing.span("ductor.tick", run_id="r") as tick:
        payload = tracing.inject({"kind": "step", "run_id": "r", "node_id": "n", "attempt": 2, "step_id": "s"})
    with tracing.span("previous item"):  # a handoff runs the next item inside the task of the first
        with tracing.item_span("ductor.item.step", payload, item_id="step:s"):
            pass
        with tracing.item_span("ductor.item.tick", {"kind": "tick", "run_id": "lost"}, item_id="tick:lost"):
            pass

    spans = {span.name: span for span in local_spans(traced)}
    previous, continued, lost = spans["previous item"], spans["ductor.item.step"], spans["ductor.item.tick"]
    tick_context = tick.get_span_context()
    assert (continued.trace_id, continued.parent_id) == (f"{tick_context.trace_id:032x}",
                                                         f"{tick_context.span_id:016x}")
    assert continued.attributes == {"kind": "step", "run_id": "r", "node_id": "n", "attempt": 2, "step_id": "s",
                                    "item_id": "step:s"}
    # No context carried (re-enqueued from PostgreSQL): a trace of its own, not the running task's.
    assert lost.parent_id is None
    assert lost.trace_id not in (previous.trace_id, continued.trace_id)


# -- one run, through the API, on two worker processes ---------------------------------------------


def traced_processes(stack: Stack, receiver: SpanReceiver, *, team: bool) -> list[Child]:
    """Two workers of one process each and a dispatcher, tracing to ``receiver``, and with ``team``
    the team's own worker (which does not trace), ready."""
    env = {**service_env(), **receiver.env(), "DUCTOR_ACTION_MODULES": "workflows.actions,tests.tracing_actions"}
    children = []
    for number in range(2):
        name = f"traced-worker-{number}-{os.getpid()}"
        children.append(stack.worker(name, concurrency=1, hostname=f"{name}@localhost", env=env,
                                     extra=["--pool", "prefork", "--without-heartbeat"]))
    children.append(stack.dispatcher(env=env))
    if team:
        name = f"team-{os.getpid()}"
        children.append(stack.worker(name, app="tests.teamapp", concurrency=1, hostname=f"{name}@localhost",
                                     env=team_env(), extra=["-Q", "team", "--include", "tests.tracing_team_tasks",
                                                            "--pool", "prefork", "--without-heartbeat"]))
    stack.wait_ready(*children, timeout_s=90)
    return children


def run_through_the_api(tenant: Tenant, key: str, receiver: SpanReceiver, workflow: str, *,
                        team: bool = False) -> WorkflowRun:
    """Start a run of ``workflow`` with ``POST /api/v1/runs`` and wait until it ends. Every process is
    stopped (and has exported its spans) when this returns."""
    stack = service_stack()
    try:
        traced_processes(stack, receiver, team=team)
        response = api_client(key).post("/api/v1/runs", {"workflow": workflow}, format="json")
        assert response.status_code == 201, response.content
        return finished(tenant, response.json()["id"], timeout=90)
    finally:
        stack.stop_all(grace_s=20)


def children_of(spans: list[Span], parent: Span) -> list[Span]:
    return [span for span in spans if span.parent_id == parent.span_id and span.trace_id == parent.trace_id]


@pytest.mark.worker
@pytest.mark.timeout(300)
@pytest.mark.django_db(transaction=True)
def test_one_runs_spans_share_one_trace_from_its_request_through_each_step_on_two_workers(
    make_tenant, redis_client, traced
):
    tenant, key = make_tenant("traced-run")
    put(tenant, "fan", fan_out(barrier=uuid.uuid4().hex))

    with SpanReceiver() as receiver:
        run = run_through_the_api(tenant, key, receiver, "fan")
        spans = local_spans(traced) + receiver.spans()

    assert run.status == WorkflowRun.Status.SUCCEEDED, [(s.node_id, s.status, s.error) for s in steps(tenant, run)]
    run_id = str(run.pk)
    start = next(span for span in spans if span.name == "ductor.run.start" and span.attributes["run_id"] == run_id)
    request = next(span for span in spans if span.span_id == start.parent_id)
    assert (request.kind, request.parent_id, request.pid) == ("server", None, os.getpid())
    assert request.attributes.get("http.method", request.attributes.get("http.request.method")) == "POST"

    # Every span that names the run is in the request's trace, whichever process made it.
    of_run = [span for span in spans if span.attributes.get("run_id") == run_id]
    assert {span.trace_id for span in of_run} == {request.trace_id}
    assert all(span.attributes["tenant_id"] == str(tenant.pk) for span in of_run)

    # Each step attempt ran in a span of its own, a child of the tick that started it.
    ticks = {span.span_id: span for span in of_run if span.name == "ductor.tick"}
    step_spans = {span.attributes["node_id"]: span for span in of_run if span.name == "ductor.item.step"}
    attempts = steps(tenant, run)
    assert sorted(step_spans) == sorted(step.node_id for step in attempts) == ["join", "left", "right", "start"]
    for step in attempts:
        span = step_spans[step.node_id]
        assert (span.attributes["step_id"], span.attributes["attempt"]) == (str(step.id), step.attempt)
        assert span.attributes["item_id"] == items.step_item_id(step.id)
        assert span.parent_id in ticks
    # The first tick ran in the request; every step's outcome ticked the run inside the step's span,
    # the last one to the run's outcome.
    assert any(tick.parent_id == start.span_id for tick in ticks.values())
    for span in step_spans.values():
        assert [child.name for child in children_of(spans, span)].count("ductor.tick") == 1
    assert ticks[step_spans["join"].parent_id] in [
        tick for node in ("left", "right") for tick in children_of(spans, step_spans[node])]

    # On two worker processes, neither of them this one.
    pids = {node: span.pid for node, span in step_spans.items()}
    assert pids["left"] != pids["right"]
    assert os.getpid() not in pids.values()

    # The first step came by a Celery message: dispatched in the run's trace, whose context the
    # message's headers carried to the worker's task span.
    dispatch = next(span for span in of_run if span.name == "ductor.dispatch"
                    and span.attributes["step_id"] == str(next(s.id for s in attempts if s.node_id == "start")))
    published = [span for span in children_of(spans, dispatch) if span.kind == "producer"]
    assert len(published) == 1
    consumed = [span for span in children_of(spans, published[0]) if span.kind == "consumer"]
    assert len(consumed) == 1
    assert consumed[0].pid in pids.values()


@pytest.mark.worker
@pytest.mark.timeout(300)
@pytest.mark.django_db(transaction=True)
def test_a_task_nodes_message_and_outcome_stay_in_the_runs_trace_through_a_team_worker_that_does_not_trace(
    make_tenant, redis_client, traced
):
    TaskCatalogEntry.objects.create(name="team.traceparent", queue="team")
    tenant, key = make_tenant("traced-task")
    put(tenant, "call", {"nodes": [
        {"id": "call", "type": "task", "task": "team.traceparent", "input": {}},
        {"id": "after", "type": "action", "action": "noop", "depends_on": ["call"]},
    ]})

    with SpanReceiver() as receiver:
        run = run_through_the_api(tenant, key, receiver, "call", team=True)
        spans = local_spans(traced) + receiver.spans()

    assert run.status == WorkflowRun.Status.SUCCEEDED, [(s.node_id, s.status, s.error) for s in steps(tenant, run)]
    run_id = str(run.pk)
    of_run = [span for span in spans if span.attributes.get("run_id") == run_id]
    trace_id = next(span.trace_id for span in of_run if span.name == "ductor.run.start")
    assert {span.trace_id for span in of_run} == {trace_id}
    # The dispatcher published the team's task in the run's trace, and the message carried it on.
    publish = next(span for span in of_run if span.name == "ductor.task.publish")
    assert (publish.attributes["node_id"], publish.attributes["attempt"]) == ("call", 1)
    published = [span for span in children_of(spans, publish) if span.kind == "producer"]
    assert len(published) == 1
    call = next(step for step in steps(tenant, run) if step.node_id == "call")
    assert call.output["traceparent"].split("-")[1:3] == [trace_id, published[0].span_id]
    # Its outcome came back (Celery's link) in the run's trace, and ticked the run on to the next step.
    outcome = [span for span in children_of(spans, publish) if span.kind == "consumer"]
    assert len(outcome) == 1
    tick = next(span for span in children_of(spans, outcome[0]) if span.name == "ductor.tick")
    after = next(span for span in of_run if span.name == "ductor.item.step")
    assert (after.attributes["node_id"], after.parent_id) == ("after", tick.span_id)
