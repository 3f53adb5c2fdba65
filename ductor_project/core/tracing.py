"""Tracing: OpenTelemetry spans of one run, from its API request through every tick, dispatch and step.

**Off by default.** It is on in a process whose ``OTEL_TRACES_EXPORTER`` names
an exporter (``otlp``, ``otlp_proto_http``, ``console``; not ``none``), unless
``OTEL_SDK_DISABLED`` is true. Everything else is the standard ``OTEL_*``
variables, read by the SDK itself: the service name and resource
(``OTEL_SERVICE_NAME``, default ``ductor``; ``OTEL_RESOURCE_ATTRIBUTES``), the
sampler (``OTEL_TRACES_SAMPLER`` / ``_ARG``), the exporter's endpoint, headers
and timeout (``OTEL_EXPORTER_OTLP_*``), the batching (``OTEL_BSP_*``) and the
propagators (``OTEL_PROPAGATORS``). Ductor ships the OTLP/HTTP exporter, so
``otlp`` means ``http/protobuf`` unless ``OTEL_EXPORTER_OTLP_PROTOCOL`` says
otherwise. While off, every helper here is one check of ``enabled``: no span
object, no context copied into a payload; this module imports no OpenTelemetry
package (redis-py imports the SDK for metrics of its own, off unless turned on).

**Once per process, where it starts serving** (``configure``): the WSGI module
of each web worker, each Celery pool process after its fork (a span processor's
thread does not survive a fork, and the process id is the resource's), the
dispatcher's and the coordinator's commands. Importing this module starts
nothing. ``configure`` instruments Django (a span per request), Celery (its
headers carry the context of whatever publishes), psycopg and Redis (a span
per query and command, inside whatever span is current; one outside any, such
as a dispatcher's polling or the renewal thread's, is not traced: each would be
a one-span trace, many times a second).

**Across the fair queue.** An item is not a Celery message: a worker takes the
next one itself by handoff, with no message. So the context travels in the
item's payload: ``inject`` adds the current span's W3C ``traceparent`` (and
``tracestate``) under ``trace`` when the item is enqueued, and ``item_span``,
wherever and however the item runs, starts from that context alone, never from
what is current there (the previous item's task, on a handoff).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from ductor_project.core.context import peek_tenant

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

log = structlog.get_logger(__name__)

# The payload key of the context an item carries.
TRACE_KEY = "trace"
# The payload keys that say what an item is about: its spans carry them as attributes.
ITEM_KEYS = ("kind", "run_id", "step_id", "node_id", "attempt")
DEFAULT_SERVICE_NAME = "ductor"
# The requests of monitoring, traced by nobody unless OTEL_PYTHON_DJANGO_EXCLUDED_URLS says otherwise.
UNTRACED_URLS = "/healthz,/readyz,/metrics"

# Whether this process traces. Read it before doing any work for a span.
enabled = False
_tracer: Any = None
_provider: TracerProvider | None = None
_instrumentors: list[Any] = []


class SpanLike(Protocol):
    def set_attribute(self, key: str, value: Any) -> None: ...


class _Off:
    """What ``span`` and ``item_span`` return while tracing is off: enters nothing, records nothing."""

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_attribute(self, key: str, value: Any) -> None:
        return None


_OFF = _Off()


# -- set-up -------------------------------------------------------------------------------------


def requested() -> bool:
    """Whether the environment asks this process to trace (see the module docs)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() not in ("", "none")


def configure(*, exporter: SpanExporter | None = None) -> bool:
    """Set up tracing in this process if the environment asks for it (or ``exporter`` is given: it
    then gets every span as it ends, beside the environment's exporters). Idempotent; returns
    whether the process traces. A configuration the SDK refuses (an unknown exporter) is logged,
    and the process runs untraced rather than not at all."""
    global enabled, _tracer, _provider
    if enabled:
        return True
    if exporter is None and not requested():
        return False
    try:
        provider = _provider_for(exporter)
        _instrument(provider)
    except Exception:
        log.exception("tracing_not_configured")
        _uninstrument()
        return False
    _provider, _tracer = provider, provider.get_tracer("ductor")
    _set_global(provider)
    enabled = True
    log.info("tracing_configured", pid=os.getpid())
    return True


def shutdown() -> None:
    """Stop tracing in this process: the instrumentations removed, the spans still buffered
    exported (from a process that is about to exit without running its ``atexit`` hooks: a
    Celery pool process). ``configure`` may set it up again. Idempotent."""
    global enabled, _tracer, _provider
    if not enabled:
        return
    enabled = False
    _uninstrument()
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def _provider_for(exporter: SpanExporter | None) -> TracerProvider:
    """A tracer provider with the environment's exporters (batched), and ``exporter`` (each span
    as it ends). The SDK reads the sampler, the resource and the exporters' settings itself."""
    from opentelemetry.sdk._configuration import _get_exporter_names, _import_exporters
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider, sampling
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    _default_otlp_protocol()
    resource = Resource.create({"process.pid": os.getpid()})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource, sampler=_calls_inside_operations(sampling._get_from_env_or_default()))
    span_exporters, _, _ = _import_exporters(_get_exporter_names("traces"), [], [])
    for exporter_class in span_exporters.values():
        provider.add_span_processor(BatchSpanProcessor(exporter_class()))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _default_otlp_protocol() -> None:
    """``otlp`` with no protocol named is, for the SDK, gRPC, whose exporter Ductor does not ship:
    make it OTLP/HTTP (the OpenTelemetry specification's default), for this process and its children."""
    names = [name.strip().lower() for name in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    if "otlp" in names and not (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")):
        os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"


def _calls_inside_operations(sampler: Any) -> Any:
    """``sampler``, except that a client call (a query, a Redis command) with no span around it is
    not traced: polling loops and background threads would each make a trace per call."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

    class CallsInsideOperations(Sampler):
        def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                          attributes: Any = None, links: Any = None, trace_state: Any = None) -> SamplingResult:
            if kind == trace.SpanKind.CLIENT and not trace.get_current_span(parent_context).get_span_context().is_valid:
                return SamplingResult(Decision.DROP)
            return sampler.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

        def get_description(self) -> str:
            return f"CallsInsideOperations{{{sampler.get_description()}}}"

    return CallsInsideOperations()


def _instrument(provider: TracerProvider) -> None:
    """Instrument Django, Celery, psycopg and Redis with ``provider``'s tracers."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    urls_named = os.environ.get("OTEL_PYTHON_DJANGO_EXCLUDED_URLS") or os.environ.get("OTEL_PYTHON_EXCLUDED_URLS")
    django_options: dict[str, Any] = {} if urls_named else {"excluded_urls": UNTRACED_URLS}
    instrumentors: list[tuple[Any, dict[str, Any]]] = [
        (DjangoInstrumentor(), django_options), (CeleryInstrumentor(), {}), (PsycopgInstrumentor(), {}),
        (RedisInstrumentor(), {})]
    for instrumentor, options in instrumentors:
        instrumentor.instrument(tracer_provider=provider, **options)
        _instrumentors.append(instrumentor)


def _uninstrument() -> None:
    while _instrumentors:
        _instrumentors.pop().uninstrument()


def _set_global(provider: TracerProvider) -> None:
    """Make ``provider`` the process's global one (for code that asks OpenTelemetry for a tracer
    itself), unless one was set already: the SDK allows it once per process."""
    from opentelemetry import trace

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)


# -- spans and context --------------------------------------------------------------------------


def span(name: str, **attributes: Any) -> AbstractContextManager[SpanLike]:
    """A span ``name`` around the block, a child of the current span, with ``attributes`` (those
    that are None left out) and the id of the tenant in context as ``tenant_id`` unless given. An
    exception that leaves the block is recorded on it. A shared no-op while tracing is off."""
    if not enabled:
        return _OFF
    return _start(name, None, attributes)


def item_span(name: str, payload: Any, **attributes: Any) -> AbstractContextManager[SpanLike]:
    """A span ``name`` for a fair-queue item whose payload is ``payload``: a child of the context the
    payload carries (``inject``), whatever span is current, or the root of a trace of its own when it
    carries none. It has ``attributes`` and those of ``ITEM_KEYS`` the payload has. A shared no-op
    while tracing is off."""
    if not enabled:
        return _OFF
    from opentelemetry import propagate
    from opentelemetry.context import Context

    body = payload if isinstance(payload, Mapping) else {}
    carried = body.get(TRACE_KEY)
    parent = propagate.extract(carried, context=Context()) if isinstance(carried, Mapping) else Context()
    for key in ITEM_KEYS:
        attributes.setdefault(key, body.get(key))
    return _start(name, parent, attributes)


def _start(name: str, parent: Any, attributes: dict[str, Any]) -> AbstractContextManager[SpanLike]:
    if attributes.get("tenant_id") is None:
        tenant = peek_tenant()
        attributes["tenant_id"] = str(tenant.pk) if tenant is not None else None
    clean = {key: value if isinstance(value, str | bool | int | float) else str(value)
             for key, value in attributes.items() if value is not None}
    return _tracer.start_as_current_span(name, context=parent, attributes=clean)


def inject(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload``, with the current span's context under ``trace`` for the item's span to continue
    the trace wherever it runs. Unchanged while tracing is off, or outside any span."""
    if enabled:
        carrier = headers()
        if carrier:
            payload[TRACE_KEY] = carrier
    return payload


def headers() -> dict[str, str]:
    """The current span's context as message headers (W3C ``traceparent``, ``tracestate``), for a
    message that something else sends later (a Celery callback). Empty while tracing is off, or
    outside any span."""
    carrier: dict[str, str] = {}
    if enabled:
        from opentelemetry import propagate

        propagate.inject(carrier)
    return carrier


def bound(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn``, to run later (``transaction.on_commit``) in the trace context current now, not in
    whatever is current when it runs. ``fn`` itself while tracing is off."""
    if not enabled:
        return fn
    from opentelemetry import context

    captured = context.get_current()

    def run() -> None:
        token = context.attach(captured)
        try:
            fn()
        finally:
            context.detach(token)

    return run
