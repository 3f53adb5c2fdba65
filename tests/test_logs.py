"""Structured logs: one JSON object (or key=value line) per event, carrying the tenant in context."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from django.conf import settings

from ductor_project.core.context import tenant_context
from ductor_project.logs import configure_logging
from tenants.models import Tenant


class Captured:
    """Lines written through the project's own structured formatter."""

    def __init__(self) -> None:
        self.stream = io.StringIO()

    def lines(self) -> list[str]:
        return [line for line in self.stream.getvalue().splitlines() if line]

    def json(self, logger: str = "ductor.test") -> list[dict[str, Any]]:
        """The events of ``logger`` (fixtures log events of their own)."""
        events = [json.loads(line) for line in self.lines()]
        return [event for event in events if event.get("logger") == logger]


def attach(captured: Captured) -> logging.Handler:
    """A handler on the root logger with the formatter ``configure_logging`` installed."""
    formatter = next(
        handler.formatter
        for handler in logging.getLogger().handlers
        if isinstance(handler.formatter, structlog.stdlib.ProcessorFormatter)
    )
    handler = logging.StreamHandler(captured.stream)
    handler.setFormatter(formatter)
    logging.getLogger().addHandler(handler)
    return handler


@pytest.fixture
def logs() -> Iterator[Captured]:
    configure_logging(fmt="json", level="INFO")
    captured = Captured()
    handler = attach(captured)
    try:
        yield captured
    finally:
        logging.getLogger().removeHandler(handler)
        configure_logging(fmt=settings.DUCTOR_LOG_FORMAT, level=settings.DUCTOR_LOG_LEVEL)


@pytest.fixture
def tenant(tenant_a: tuple[Tenant, str]) -> Tenant:
    return tenant_a[0]


def test_structlog_event_inside_a_tenant_is_json_with_tenant_id(logs: Captured, tenant: Tenant) -> None:
    with tenant_context(tenant):
        structlog.get_logger("ductor.test").info("hello", answer=42)
    (event,) = logs.json()
    assert event["event"] == "hello"
    assert event["answer"] == 42
    assert event["tenant_id"] == str(tenant.pk)
    assert event["tenant"] == tenant.slug
    assert event["level"] == "info"
    assert event["logger"] == "ductor.test"
    assert event["timestamp"].endswith("Z")


def test_event_outside_any_tenant_carries_no_tenant(logs: Captured, tenant: Tenant) -> None:
    structlog.get_logger("ductor.test").warning("no tenant here")
    (event,) = logs.json()
    assert event["event"] == "no tenant here"
    assert "tenant_id" not in event
    assert "tenant" not in event


def test_standard_library_logs_are_json_with_tenant_id(logs: Captured, tenant: Tenant) -> None:
    with tenant_context(tenant):
        logging.getLogger("django.request").warning("Not Found: %s", "/x")
    (event,) = logs.json("django.request")
    assert event["event"] == "Not Found: /x"
    assert event["tenant_id"] == str(tenant.pk)
    assert event["logger"] == "django.request"


def test_each_event_reports_the_tenant_of_its_own_context(
    logs: Captured, tenant: Tenant, tenant_b: tuple[Tenant, str]
) -> None:
    log = structlog.get_logger("ductor.test")
    with tenant_context(tenant):
        log.info("first")
        with tenant_context(tenant_b[0]):
            log.info("nested")
        log.info("back")
    log.info("after")
    assert [(event["event"], event.get("tenant_id")) for event in logs.json()] == [
        ("first", str(tenant.pk)),
        ("nested", str(tenant_b[0].pk)),
        ("back", str(tenant.pk)),
        ("after", None),
    ]


def test_bound_context_variables_are_carried(logs: Captured, tenant: Tenant) -> None:
    with tenant_context(tenant), structlog.contextvars.bound_contextvars(task_id="t-1", run_id="r-9"):
        structlog.get_logger("ductor.test").info("tick")
    (event,) = logs.json()
    assert (event["task_id"], event["run_id"], event["tenant_id"]) == ("t-1", "r-9", str(tenant.pk))


def test_an_explicit_tenant_id_is_not_overwritten_by_the_context(logs: Captured, tenant: Tenant) -> None:
    with tenant_context(tenant):
        structlog.get_logger("ductor.test").info("for another", tenant_id="explicit")
    (event,) = logs.json()
    assert event["tenant_id"] == "explicit"


def test_exceptions_are_rendered_inside_the_json_line(logs: Captured, tenant: Tenant) -> None:
    with tenant_context(tenant):
        try:
            raise ValueError("boom")
        except ValueError:
            structlog.get_logger("ductor.test").exception("failed")
    (event,) = logs.json()
    assert event["event"] == "failed"
    assert "ValueError: boom" in event["exception"]
    assert event["tenant_id"] == str(tenant.pk)


def test_key_value_format_carries_tenant_id(logs: Captured, tenant: Tenant) -> None:
    configure_logging(fmt="kv", level="INFO")
    captured = Captured()
    handler = attach(captured)
    try:
        with tenant_context(tenant):
            structlog.get_logger("ductor.test").info("hello")
    finally:
        logging.getLogger().removeHandler(handler)
    (line,) = [line for line in captured.lines() if "logger='ductor.test'" in line]
    assert line.startswith("timestamp=")
    assert "event='hello'" in line
    assert f"tenant_id='{tenant.pk}'" in line
