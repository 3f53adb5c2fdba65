"""The web server as the stack runs it (gunicorn, ``Stack.web``) keeps a client's connection usable
after an answer given before the request's body was read: a ``413`` for a body over the limit, a
``401`` for a bad key. gunicorn drains only a few kilobytes of an unread body, then closes the
connection its answer said to keep, and the client's next request on it failed
(``parsers.UnreadBodyMiddleware`` reads the body first)."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest

from tests.conftest import service_env, service_stack

pytestmark = pytest.mark.django_db(transaction=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_after_an_answer_to_an_unread_body_the_next_request_on_the_connection_is_answered(make_tenant: Any) -> None:
    _, key = make_tenant("keepalive")
    stack = service_stack()
    port = free_port()
    try:
        web = stack.web(port=port, workers=1, env=service_env())
        stack.wait_ready(web, timeout_s=60)
        answers = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"},
                          timeout=30) as client:
            for _ in range(8):
                too_large = client.post("/api/v1/runs", json={"workflow": "w", "input": {"s": "x" * 1_100_000}})
                unknown_key = client.post("/api/v1/runs", json={"workflow": "w", "input": {"s": "x" * 300_000}},
                                          headers={"Authorization": "Bearer not-a-key"})
                after = client.get("/api/v1/tenant")  # on the same kept connection: it raised, server gone
                answers.append((too_large.status_code, unknown_key.status_code, after.status_code))
    finally:
        stack.stop_all()

    assert answers == [(413, 401, 200)] * 8
