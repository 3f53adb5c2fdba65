"""An OTLP/HTTP receiver of spans in the test process: what the processes a test starts export to.

A process configured by the environment it gets (``env()``: ``OTEL_TRACES_EXPORTER=otlp`` and this
receiver's endpoint) exports its spans as production does, protobuf-encoded in ``POST /v1/traces``.
The receiver decodes each into a ``Span``: the record the tests compare, whichever process made it.
``Span.of`` makes the same record of a span this process finished (the in-memory exporter's).
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.sdk.trace import ReadableSpan

# OTLP's span kinds, and the SDK's (``SpanKind.name``), by one name.
_OTLP_KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: str
    pid: int | None
    attributes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, span: ReadableSpan) -> Span:
        """The record of a span finished in this process."""
        context, parent = span.get_span_context(), span.parent
        pid = span.resource.attributes.get("process.pid")
        return cls(f"{context.trace_id:032x}", f"{context.span_id:016x}",
                   f"{parent.span_id:016x}" if parent is not None else None, span.name, span.kind.name.lower(),
                   int(pid) if isinstance(pid, int) else None, dict(span.attributes or {}))


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, which) if which else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


def decode(body: bytes) -> list[Span]:
    """The spans of one OTLP/HTTP protobuf export request."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        pid = _attributes(resource_spans.resource.attributes).get("process.pid")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(Span(span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex() or None,
                                  span.name, _OTLP_KINDS.get(span.kind, "unspecified"),
                                  int(pid) if pid is not None else None, _attributes(span.attributes)))
    return spans


class SpanReceiver:
    """Receives spans on 127.0.0.1 while entered (``with SpanReceiver() as receiver``)."""

    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._add(decode(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="span-receiver")

    def __enter__(self) -> SpanReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _add(self, spans: list[Span]) -> None:
        with self._lock:
            self._spans.extend(spans)

    def spans(self) -> list[Span]:
        """Every span received so far."""
        with self._lock:
            return list(self._spans)

    def env(self) -> dict[str, str]:
        """What a process needs to trace to this receiver: the standard variables only. Its spans are
        batched for a minute, so they come when it stops: what a stopping process must not lose."""
        host, port = self._server.server_address[:2]
        return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{host}:{port}",
                "OTEL_SERVICE_NAME": "ductor-test", "OTEL_BSP_SCHEDULE_DELAY": "60000"}
