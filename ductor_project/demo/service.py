"""The demo's own HTTP service: what its tenants' connections point at.

A ``ThreadingHTTPServer`` on 127.0.0.1 (a free port) in a daemon thread. Every
path starts with a prefix, one per connection (``/eu``, ``/us``, ``/pay``,
``/reports``), so the service can tell which connection a call came through.
Every call must carry the connection's secret (``Authorization: Bearer …``), and
answers after a small delay, like a remote API:

- ``GET order/<id>`` → ``{"order", "sku", "qty"}``;
- ``GET price?sku=`` → ``{"sku", "unit_price"}``; ``GET stock?sku=`` → ``{"sku", "in_stock"}``;
- ``POST quote`` with ``{"unit_price", "qty", "in_stock"}`` → ``{"total", "available"}``;
- ``GET countdown?n=`` → ``{"n": n - 1}`` (drives the ContinueAsNew loop);
- ``GET flaky?key=`` → 503 for the first ``FLAKY_FAILURES`` calls of each key, then 200;
- ``GET slow?ms=`` → sleeps, and records how many ``slow`` calls ran at once.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

FLAKY_FAILURES = 2
PREFIXES = ("eu", "us", "pay", "reports")


def unit_price(sku: str) -> float:
    """The price the service quotes for ``sku`` (the demo checks the diamond's total against it)."""
    return round(5 + zlib.crc32(sku.encode()) % 2000 / 100, 2)


def order_line(order: str) -> dict[str, Any]:
    number = zlib.crc32(order.encode())
    return {"order": order, "sku": f"SKU-{number % 90 + 10}", "qty": number % 3 + 1}


class DemoService:
    """The local HTTP service; ``start()`` then ``stop()``. Thread-safe counters in ``stats()``."""

    def __init__(self, *, token: str, delay_s: float = 0.02) -> None:
        self.token = token
        self.delay_s = delay_s
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()  # "<prefix> <endpoint>" -> calls
        self.flaky: Counter[str] = Counter()  # key -> calls
        self.refused = 0
        self.slow_now = 0
        self.slow_max = 0
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, name="demo-http", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket. Idempotent; fine before ``start()``."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"calls": dict(self.calls), "flaky": dict(self.flaky), "refused": self.refused,
                    "slow_max_concurrent": self.slow_max}

    # -- request handling (runs on the server's threads) --------------------------------------

    def handle(self, method: str, path: str, query: dict[str, str], body: Any,
               authorization: str) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p]
        if len(parts) < 2 or parts[0] not in PREFIXES:
            return 404, {"error": "unknown path"}
        if authorization != f"Bearer {self.token}":
            with self._lock:
                self.refused += 1
            return 401, {"error": "missing or wrong token"}
        prefix, endpoint, rest = parts[0], parts[1], parts[2:]
        with self._lock:
            self.calls[f"{prefix} {endpoint}"] += 1
        if endpoint == "slow":
            return self._slow(query)
        time.sleep(self.delay_s)
        if endpoint == "order" and rest and method == "GET":
            return 200, order_line(rest[0])
        if endpoint == "price" and method == "GET":
            sku = query.get("sku", "")
            return 200, {"sku": sku, "unit_price": unit_price(sku)}
        if endpoint == "stock" and method == "GET":
            sku = query.get("sku", "")
            return 200, {"sku": sku, "in_stock": zlib.crc32(sku.encode()) % 7}
        if endpoint == "quote" and method == "POST" and isinstance(body, dict):
            total = round(float(body.get("unit_price", 0)) * int(body.get("qty", 0)), 2)
            return 200, {"total": total, "available": int(body.get("in_stock", 0)) >= int(body.get("qty", 0))}
        if endpoint == "countdown" and method == "GET":
            return 200, {"n": max(int(query.get("n", "0")) - 1, 0)}
        if endpoint == "flaky" and method == "GET":
            key = query.get("key", "")
            with self._lock:
                self.flaky[key] += 1
                calls = self.flaky[key]
            if calls <= FLAKY_FAILURES:
                return 503, {"error": "temporarily unavailable", "call": calls}
            return 200, {"ok": True, "attempts": calls}
        return 404, {"error": "unknown endpoint"}

    def _slow(self, query: dict[str, str]) -> tuple[int, Any]:
        ms = min(max(int(query.get("ms", "100")), 0), 5000)
        with self._lock:
            self.slow_now += 1
            self.slow_max = max(self.slow_max, self.slow_now)
        try:
            time.sleep(ms / 1000)
        finally:
            with self._lock:
                self.slow_now -= 1
        return 200, {"slept_ms": ms}


class _Server(ThreadingHTTPServer):
    """The service's server. A client that goes away mid-request (a worker process killed or
    restarted, a kept-alive connection reset) is not the service's error: it is not reported, where
    ``socketserver`` prints a traceback on stderr, across the live view. Any other error is."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def _handler(service: DemoService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self, method: str) -> None:
            split = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(split.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            try:
                status, payload = service.handle(method, split.path, query, body,
                                                 self.headers.get("Authorization", ""))
            except (TypeError, ValueError):
                status, payload = 400, {"error": "bad parameters"}
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the live view owns the terminal."""

    return Handler
