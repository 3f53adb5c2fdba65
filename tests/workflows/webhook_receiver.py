"""A webhook receiver for the tests: a real HTTP server on 127.0.0.1, in a thread of the test process.

It records every request it gets (path, headers, the raw body) and answers ``status`` (with
``headers``), after ``delay_s``, and, while ``gate`` is set, once the gate opens (``answered``
counts the answers); with ``head_pause_s``, its head comes in pieces that far apart, and with
``trickle`` too, one header line at a time until ``trickle`` is set: a head that never ends.
``answer``, when set, is the body sent (as it is: with ``headers``, a compressed one).
``wait_for(n)`` waits on a condition, never on the clock alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    port: int = 0
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    head_pause_s: float = 0.0
    trickle: threading.Event | None = None
    answer: bytes | None = None
    gate: threading.Event | None = None
    answered: int = 0
    requests: list[Received] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def record(self, request: Received) -> None:
        with self.changed:
            self.requests.append(request)
            self.changed.notify_all()

    def wait_for(self, count: int, *, timeout: float = 30.0) -> list[Received]:
        """The first ``count`` requests, once there are that many; fails after ``timeout`` seconds."""
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.requests) >= count, timeout=timeout):
                raise AssertionError(f"the receiver got {len(self.requests)} requests, not {count}, in {timeout:g}s")
            return list(self.requests[:count])


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        receiver = self.server.receiver
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        receiver.record(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        if receiver.delay_s:
            time.sleep(receiver.delay_s)
        if receiver.gate is not None:
            receiver.gate.wait(timeout=120)
        answer = b'{"ok": true}' if 200 <= receiver.status < 300 else b"boom " * 200
        answer = answer if receiver.answer is None else receiver.answer
        try:
            self.send_response(receiver.status)
            self.trickle_head()
            self.pause_in_head()
            for name, value in receiver.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.pause_in_head()
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
        except (BrokenPipeError, ConnectionResetError):
            return  # the sender gave up waiting (its timeout, which a delay may test): no answer to give
        with receiver.changed:
            receiver.answered += 1

    def pause_in_head(self) -> None:
        """Send what the answer's head holds so far, then wait ``head_pause_s``: a head that comes in
        pieces, each in time, the whole late."""
        if self.server.receiver.head_pause_s:
            self.flush_headers()
            time.sleep(self.server.receiver.head_pause_s)


    def trickle_head(self) -> None:
        """Until ``trickle`` is set, send one more header line every ``head_pause_s``."""
        trickle = self.server.receiver.trickle
        while trickle is not None and not trickle.wait(self.server.receiver.head_pause_s):
            self.send_header("X-Trickle", "more")
            self.flush_headers()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, receiver: Receiver) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.receiver = receiver


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    """A receiver serving until the block ends."""
    receiver = Receiver()
    server = _Server(receiver)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        for event in (receiver.gate, receiver.trickle):
            if event is not None:
                event.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
