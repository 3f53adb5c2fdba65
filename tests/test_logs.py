"""Structured logs: one JSON object (or key=value line) per event, carrying the tenant in context."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from ductor_project.core.context import tenant_context
from ductor_project.logs import MAX_EXCEPTION_CHARS, configure_logging
from scheduling import fair_queue as fq
from scheduling.dispatch.finisher import finisher
from scheduling.dispatch.handlers import ItemContext, register_handler
from scheduling.dispatch.handoff import log_dispatch
from scheduling.dispatch.worker import execute_item
from tenants.models import Tenant
from tests.conftest import LogLines
from tests.workflows.inline import run_items
from workflows.services import run_start, workflow_put


@pytest.fixture
def tenant(tenant_a: tuple[Tenant, str]) -> Tenant:
    return tenant_a[0]


def test_structlog_event_inside_a_tenant_is_json_with_tenant_id(logged: LogLines, tenant: Tenant) -> None:
    with tenant_context(tenant):
        structlog.get_logger("ductor.test").info("hello", answer=42)
    (event,) = logged.json("ductor.test")
    assert event["event"] == "hello"
    assert event["answer"] == 42
    assert event["tenant_id"] == str(tenant.pk)
    assert event["tenant"] == tenant.slug
    assert event["level"] == "info"
    assert event["logger"] == "ductor.test"
    assert event["timestamp"].endswith("Z")


def test_event_outside_any_tenant_carries_no_tenant(logged: LogLines, tenant: Tenant) -> None:
    structlog.get_logger("ductor.test").warning("no tenant here")
    (event,) = logged.json("ductor.test")
    assert event["event"] == "no tenant here"
    assert "tenant_id" not in event
    assert "tenant" not in event


def test_standard_library_logs_are_json_with_tenant_id(logged: LogLines, tenant: Tenant) -> None:
    with tenant_context(tenant):
        logging.getLogger("django.request").warning("Not Found: %s", "/x")
    (event,) = logged.json("django.request")
    assert event["event"] == "Not Found: /x"
    assert event["tenant_id"] == str(tenant.pk)
    assert event["logger"] == "django.request"


def test_djangos_line_of_a_refused_api_request_names_the_requests_tenant(
    logged: LogLines, tenant: Tenant, client_a: Any
) -> None:
    # Django writes it once the view, and its tenant context, ended.
    refused = client_a.get("/api/v1/runs/00000000-0000-4000-8000-000000000000")
    assert refused.status_code == 404
    (event,) = logged.json("django.request")
    assert event["event"].startswith("Not Found: /api/v1/runs/")
    assert (event["tenant_id"], event["tenant"]) == (str(tenant.pk), tenant.slug)


def test_djangos_line_of_a_suspended_tenants_refused_request_names_the_tenant(
    logged: LogLines, tenant: Tenant, client_a: Any
) -> None:
    tenant.status = Tenant.Status.SUSPENDED
    tenant.save(update_fields=["status"])
    refused = client_a.get("/api/v1/runs")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "tenant_suspended"
    (event,) = logged.json("django.request")
    assert event["event"].startswith("Forbidden: /api/v1/runs")
    assert (event["tenant_id"], event["tenant"]) == (str(tenant.pk), tenant.slug)


def test_each_event_reports_the_tenant_of_its_own_context(
    logged: LogLines, tenant: Tenant, tenant_b: tuple[Tenant, str]
) -> None:
    log = structlog.get_logger("ductor.test")
    with tenant_context(tenant):
        log.info("first")
        with tenant_context(tenant_b[0]):
            log.info("nested")
        log.info("back")
    log.info("after")
    assert [(event["event"], event.get("tenant_id")) for event in logged.json("ductor.test")] == [
        ("first", str(tenant.pk)),
        ("nested", str(tenant_b[0].pk)),
        ("back", str(tenant.pk)),
        ("after", None),
    ]


def test_bound_context_variables_are_carried(logged: LogLines, tenant: Tenant) -> None:
    with tenant_context(tenant), structlog.contextvars.bound_contextvars(task_id="t-1", run_id="r-9"):
        structlog.get_logger("ductor.test").info("tick")
    (event,) = logged.json("ductor.test")
    assert (event["task_id"], event["run_id"], event["tenant_id"]) == ("t-1", "r-9", str(tenant.pk))


def test_an_explicit_tenant_id_is_not_overwritten_by_the_context(logged: LogLines, tenant: Tenant) -> None:
    with tenant_context(tenant):
        structlog.get_logger("ductor.test").info("for another", tenant_id="explicit")
    (event,) = logged.json("ductor.test")
    assert event["tenant_id"] == "explicit"


def test_exceptions_are_rendered_inside_the_json_line(logged: LogLines, tenant: Tenant) -> None:
    with tenant_context(tenant):
        try:
            raise ValueError("boom")
        except ValueError:
            structlog.get_logger("ductor.test").exception("failed")
    (event,) = logged.json("ductor.test")
    assert event["event"] == "failed"
    assert "ValueError: boom" in event["exception"]
    assert event["tenant_id"] == str(tenant.pk)


def test_an_exception_with_a_huge_message_is_logged_in_a_line_of_bounded_length(
    logged: LogLines, tenant: Tenant
) -> None:
    """An action's exception is the tenant's to word: one raised with a megabyte of text made a
    megabyte log line, per attempt, that every log pipeline downstream carried."""
    with tenant_context(tenant):
        try:
            raise ValueError("x" * 1_000_000 + "the end")
        except ValueError:
            structlog.get_logger("ductor.test").exception("failed")
            logging.getLogger("ductor.test").exception("failed again")
    for event in logged.json("ductor.test"):
        assert len(event["exception"]) < 2 * MAX_EXCEPTION_CHARS
        assert "ValueError: xxx" in event["exception"]
        assert event["exception"].endswith("the end")
        assert "characters left out" in event["exception"]
    assert len(logged.json("ductor.test")) == 2


def test_key_value_format_carries_tenant_id(logged: LogLines, tenant: Tenant) -> None:
    configure_logging(fmt="kv", level="INFO", stream=logged.stream)
    with tenant_context(tenant):
        structlog.get_logger("ductor.test").info("hello")
    (line,) = [line for line in logged.lines() if "logger='ductor.test'" in line]
    assert line.startswith("timestamp=")
    assert "event='hello'" in line
    assert f"tenant_id='{tenant.pk}'" in line


@pytest.fixture
def quiet_test_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("ductor.test")
    logger.setLevel(logging.WARNING)
    try:
        yield logger
    finally:
        logger.setLevel(logging.NOTSET)


@pytest.mark.usefixtures("quiet_test_logger")
def test_a_structlog_event_follows_its_loggers_standard_library_level(logged: LogLines) -> None:
    log = structlog.get_logger("ductor.test")
    log.info("below its level")
    log.warning("at its level")
    structlog.get_logger("ductor.other").info("another logger's")
    assert [event["event"] for event in logged.json()] == ["at its level", "another logger's"]


def test_positional_arguments_are_formatted_into_the_event(logged: LogLines) -> None:
    structlog.get_logger("ductor.test").info("moved %d items to %s", 3, "shard 2")
    (event,) = logged.json("ductor.test")
    assert event["event"] == "moved 3 items to shard 2"


def test_a_logger_used_before_logging_is_configured_again_writes_where_it_now_goes(logged: LogLines) -> None:
    log = structlog.get_logger("ductor.test")
    log.info("first")  # the logger is made, and cached, now
    elsewhere = io.StringIO()
    configure_logging(fmt="kv", level="INFO", stream=elsewhere)
    log.info("second")
    assert [event["event"] for event in logged.json("ductor.test")] == ["first"]
    assert "event='second'" in elsewhere.getvalue()


def test_what_json_cannot_encode_is_logged_as_its_repr(logged: LogLines) -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    structlog.get_logger("ductor.test").info("odd values", value=Opaque(), ids={3}, ratio=float("nan"))
    (event,) = logged.json("ductor.test")
    assert (event["value"], event["ids"], event["ratio"]) == ("<opaque>", "{3}", None)


def test_an_integer_json_cannot_hold_in_64_bits_is_still_written(logged: LogLines) -> None:
    structlog.get_logger("ductor.test").info("big", value=2**70)
    (event,) = logged.json("ductor.test")
    assert event["value"] == 2**70


def test_a_line_that_cannot_be_made_or_written_never_fails_the_code_that_logs(
    logged: LogLines, capsys: pytest.CaptureFixture[str]
) -> None:
    class Unprintable:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    log = structlog.get_logger("ductor.test")
    log.info("cannot be rendered", value=Unprintable())
    assert "--- Logging error ---" in capsys.readouterr().err  # reported as logging reports it
    logged.stream.close()
    log.info("cannot be written")
    assert "--- Logging error ---" in capsys.readouterr().err


def _raises(ctx: ItemContext, body: dict[str, Any]) -> None:
    raise RuntimeError("the handler failed")


@pytest.mark.django_db
def test_the_failure_and_the_end_of_an_item_that_names_a_run_carry_its_run_id(
    logged: LogLines, tenant: Tenant, redis_client: Any
) -> None:
    """A tick's, a step's or a webhook's item names its run; its delivery's own lines, written
    after the handler's binding ended, name it too: ``item_handler_failed`` is the line to search."""
    register_handler("test.raises", _raises)
    run_id = "5d6f8a2e-0000-4000-8000-000000000001"
    fq.enqueue("raises-1", tier="standard", partition="p", payload={"kind": "test.raises", "run_id": run_id},
               tenant=tenant)
    item = fq.dequeue(lease_ms=30_000)
    assert item is not None
    execute_item.apply(kwargs={"tenant_id": item.tenant_id, "item_id": item.item_id, "delivery": item.delivery,
                               "kind": "test.raises", "body": item.payload, "tier": item.tier,
                               "partition": item.partition, "lease_until_ms": item.lease_until_ms}).get(propagate=False)
    finisher.flush()

    lines = {line["event"]: line for line in logged.json() if line.get("item_id") == "raises-1"}
    for event in ("item_handler_failed", "item_finished"):
        assert lines[event]["run_id"] == run_id, lines[event]
        assert lines[event]["tenant_id"] == str(tenant.pk)


@pytest.mark.django_db
def test_the_dispatch_of_an_item_that_names_a_run_carries_its_run_id(
    logged: LogLines, tenant: Tenant, redis_client: Any
) -> None:
    """The dispatcher's (or a handoff's) ``dispatched`` line of a run's item names the run, so a
    search by ``run_id`` finds when each of its items left the queue; an item of no run names none."""
    run_id = "5d6f8a2e-0000-4000-8000-000000000002"
    fq.enqueue("of-a-run", tier="standard", partition="p1", payload={"kind": "tick", "run_id": run_id}, tenant=tenant)
    fq.enqueue("of-no-run", tier="standard", partition="p2", payload={"kind": "other"}, tenant=tenant)
    for _ in range(2):
        item = fq.dequeue(lease_ms=30_000)
        assert item is not None
        log_dispatch(item)

    lines = {line["item_id"]: line for line in logged.json() if line.get("event") == "dispatched"}
    assert lines["of-a-run"]["run_id"] == run_id
    assert lines["of-a-run"]["tenant_id"] == str(tenant.pk)
    assert "run_id" not in lines["of-no-run"]


def test_celerys_own_lines_about_a_task_carry_its_tenant_and_run(logged: LogLines, tenant: Tenant) -> None:
    """Celery's ``received`` line (the worker's main process) and its ``succeeded`` line (after the
    task's tenant context ended) name the tenant and run the task's arguments name, as the
    dispatcher shows them for an item and as an outcome's callback carries them."""
    from celery.app import trace
    from celery.utils.saferepr import saferepr

    from scheduling.dispatch import task_events

    run_id = "5d6f8a2e-0000-4000-8000-000000000003"
    item = task_events.task_kwargs(str(tenant.pk), "item-1", 2, {"kind": "step", "run_id": run_id, "node_id": "a"})
    outcome = saferepr({"step_id": "s", "tenant_id": str(tenant.pk), "run_id": run_id, "delivery": 1})
    of_no_run = task_events.task_kwargs(str(tenant.pk), "item-2", 1, {"kind": "wakeup"})
    trace.info(trace.LOG_RECEIVED, {"id": "m1", "name": "ductor.step:w/a", "args": "()", "kwargs": item, "eta": None})
    trace.info(trace.LOG_SUCCESS, {"id": "m2", "name": "ductor.task_succeeded", "return_value": "None",
                                   "runtime": 0.01, "args": "(1,)", "kwargs": outcome})
    trace.info(trace.LOG_RECEIVED, {"id": "m3", "name": "ductor.wakeup", "args": "()", "kwargs": of_no_run,
                                    "eta": None})
    trace.info(trace.LOG_RECEIVED, {"id": "m4", "name": "celery.ping", "args": "()", "kwargs": "{}", "eta": None})

    lines = {line["event"].split("[")[1].split("]")[0]: line for line in logged.json("celery.app.trace")}
    for task_id in ("m1", "m2"):
        assert lines[task_id]["tenant_id"] == str(tenant.pk), lines[task_id]
        assert lines[task_id]["run_id"] == run_id
    assert lines["m3"]["tenant_id"] == str(tenant.pk)
    assert "run_id" not in lines["m3"]
    assert "tenant_id" not in lines["m4"]


@pytest.mark.django_db(transaction=True)
def test_a_failed_step_and_run_say_which_attempt_and_why_in_their_lines(
    logged: LogLines, tenant: Tenant, redis_client: Any
) -> None:
    """An operator reading the logs alone learns which attempt failed and its error's code (never its
    message or a payload, which the run's history keeps): ``run_step_failed`` and ``run_failed``."""
    with tenant_context(tenant):
        workflow_put(name="doomed", spec={"nodes": [{"id": "charge", "type": "action", "action": "fail",
                                                     "input": {"retryable": False, "message": "card 4242"}}]})
        run, _ = run_start(workflow="doomed")
    run_items(tenant)

    lines = {line["event"]: line for line in logged.json() if line.get("run_id") == str(run.pk)}
    assert (lines["run_step_failed"]["node_id"], lines["run_step_failed"]["attempt"],
            lines["run_step_failed"]["error"]) == ("charge", 1, "action_failed")
    assert (lines["run_failed"]["node_id"], lines["run_failed"]["error"]) == ("charge", "action_failed")
    assert "card 4242" not in logged.stream.getvalue()


def test_gunicorns_own_lines_are_json_and_its_access_line_names_the_requests_tenant(
    logged: LogLines, tenant: Tenant, client_a: Any, tmp_path: Any
) -> None:
    """A gunicorn worker loads Ductor after gunicorn set up its own loggers (their handlers, their
    plain-text formats): its lines, a worker's error and the access line of each request when an
    access log is asked for, are JSON lines too, still written where gunicorn was told to write
    them, and the access line of an API request names the tenant the request acted for (it is
    written once the request's context has ended). No header is written: no ``Authorization``."""
    import datetime
    import json
    from types import SimpleNamespace

    from gunicorn.config import Config
    from gunicorn.glogging import Logger

    config = Config()
    config.set("accesslog", str(tmp_path / "access.log"))
    config.set("errorlog", str(tmp_path / "error.log"))
    server_log = Logger(config)  # what the gunicorn master set up before the worker's fork
    try:
        configure_logging(fmt="json", level="INFO", stream=logged.stream)  # the worker loading Ductor

        answered = client_a.get("/api/v1/runs")
        assert answered.status_code == 200
        environ = {**answered.wsgi_request.META, "RAW_URI": "/api/v1/runs"}  # gunicorn's own environ key
        response = SimpleNamespace(status="200 OK", sent=2, headers=[("Content-Type", "application/json")])
        request = SimpleNamespace(headers=[("AUTHORIZATION", "Bearer dct_not_logged")])
        server_log.access(response, request, environ, datetime.timedelta(milliseconds=3))
        server_log.error("Error handling request %s", "/api/v1/runs")
    finally:
        for name in ("gunicorn.error", "gunicorn.access"):
            for handler in logging.getLogger(name).handlers[:]:
                handler.close()
                logging.getLogger(name).removeHandler(handler)

    (access,) = [json.loads(line) for line in (tmp_path / "access.log").read_text().splitlines()]
    assert '"GET /api/v1/runs' in access["event"]
    assert (access["logger"], access["tenant_id"]) == ("gunicorn.access", str(tenant.pk))
    errors = [json.loads(line) for line in (tmp_path / "error.log").read_text().splitlines()]
    assert errors[-1]["event"] == "Error handling request /api/v1/runs"
    assert "dct_not_logged" not in (tmp_path / "access.log").read_text()


def test_a_malformed_exporter_header_is_logged_by_its_name_never_its_value(logged: LogLines) -> None:
    """``OTEL_EXPORTER_OTLP_HEADERS`` holds the trace exporter's credential; an entry the SDK cannot
    parse (a ``;`` in it, or a comma that cuts a value in two) is warned of at each process's start,
    quoted: the line names it and keeps its value out."""
    from opentelemetry.util.re import parse_env_headers

    parse_env_headers("x-api-key=abc;s3cret-key,authorization=Basic dXNlcjpw,YXNzd29yZA", liberal=True)

    lines = logged.json("opentelemetry.util.re")
    assert len(lines) == 2
    assert lines[0]["event"].endswith(": x-api-key=<redacted>")
    assert lines[1]["event"].endswith(": <redacted>")
    assert "s3cret" not in logged.stream.getvalue()
    assert "YXNzd29yZA" not in logged.stream.getvalue()


@pytest.mark.django_db
def test_celerys_own_retry_line_of_a_task_carries_its_tenant_and_run(logged: LogLines, tenant: Tenant) -> None:
    """Celery's ``retry`` line names no argument of the task, unlike its other lines: it carries the
    tenant and run of the task it is about from that task's request, still current when it is
    written (an outcome's callback put off while PostgreSQL is away writes one)."""
    from tests.scoped.tasks import retry_once

    run_id = "5d6f8a2e-0000-4000-8000-000000000004"
    retry_once.apply(kwargs={"tenant_id": str(tenant.pk), "run_id": run_id})  # as a worker runs its message

    (line,) = [line for line in logged.json("celery.app.trace") if " retry: " in line["event"]]
    assert (line["tenant_id"], line["run_id"]) == (str(tenant.pk), run_id)
