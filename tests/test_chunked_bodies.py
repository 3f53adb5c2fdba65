"""A request body sent in chunks, through Django's own WSGI application wrapped as ``wsgi.py`` wraps it.

Django reads a body by its ``Content-Length`` and one without as empty, so a chunked ``PATCH`` was a
``200`` that changed nothing. Where the server decodes the chunks (gunicorn says so with
``wsgi.input_terminated``) the body is read; where it does not, the request is a ``411``.
"""

from __future__ import annotations

import io
import json
import socket
import sys
import threading
from typing import Any

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.core.servers.basehttp import WSGIRequestHandler, WSGIServer
from django.test import override_settings

from ductor_project.chunked import ChunkedBodies
from ductor_project.core.context import tenant_context
from workflows import services
from workflows.models import WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_client")]


def send(raw_key: str, body: bytes, *, decoded: bool = True) -> tuple[str, dict[str, Any]]:
    """POST ``body`` to ``/api/v1/runs`` in chunks (no length), as a WSGI server hands it over."""
    environ = {
        "REQUEST_METHOD": "POST", "PATH_INFO": "/api/v1/runs", "QUERY_STRING": "", "SCRIPT_NAME": "",
        "SERVER_NAME": "testserver", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr,
        "wsgi.multithread": False, "wsgi.multiprocess": False, "wsgi.run_once": False,
        "HTTP_TRANSFER_ENCODING": "chunked", "CONTENT_TYPE": "application/json",
        "HTTP_AUTHORIZATION": f"Bearer {raw_key}",
    }
    if decoded:
        environ["wsgi.input_terminated"] = True
    answered: list[str] = []
    chunks = ChunkedBodies(WSGIHandler())(environ, lambda status, headers, *_: answered.append(status))
    return answered[0], json.loads(b"".join(chunks))


def test_a_chunked_body_is_read_as_any_other_where_the_server_decodes_it(tenant_a):
    tenant, raw = tenant_a
    with tenant_context(tenant):
        services.workflow_put(name="w", spec={"nodes": [{"id": "a", "type": "action", "action": "noop"}]})

    status, body = send(raw, json.dumps({"workflow": "w", "tags": ["chunked"]}).encode())

    assert status.startswith("201"), body
    with tenant_context(tenant):
        assert list(WorkflowRun.objects.values_list("tags", flat=True)) == [["chunked"]]


def test_a_chunked_body_over_the_request_limit_is_refused_as_too_large(tenant_a):
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1024):
        status, body = send(tenant_a[1], json.dumps({"workflow": "w", "input": {"x": "y" * 4096}}).encode())
    assert (status[:3], body["error"]["code"]) == ("413", "payload_too_large")


def test_a_chunked_body_a_server_does_not_decode_is_a_411_in_the_error_shape(tenant_a):
    status, body = send(tenant_a[1], b'{"workflow": "w"}', decoded=False)
    assert (status[:3], body["error"]["code"]) == ("411", "length_required")
    with tenant_context(tenant_a[0]):
        assert not WorkflowRun.objects.exists()


def test_runserver_answers_a_chunked_body_411_in_the_error_shape_and_closes_the_connection(tenant_a):
    """Through the development server's own classes (``runserver``, ``make up --dev``), whose WSGI
    handler refuses an application's hop-by-hop header: the 411 was its own plain-text 500."""
    server = WSGIServer(("127.0.0.1", 0), WSGIRequestHandler)
    server.set_app(ChunkedBodies(WSGIHandler()))
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        with socket.create_connection(server.server_address[:2], timeout=30) as conn:
            conn.sendall(b"POST /api/v1/runs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                         b"Authorization: Bearer " + tenant_a[1].encode() + b"\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n11\r\n{\"workflow\": \"w\"}\r\n0\r\n\r\n")
            answer = b""
            while chunk := conn.recv(65536):  # until the server closes the connection
                answer += chunk
    finally:
        server.shutdown()
        server.server_close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 411 "), answer
    assert b"\r\nConnection: close" in head
    assert json.loads(body)["error"]["code"] == "length_required"
    with tenant_context(tenant_a[0]):
        assert not WorkflowRun.objects.exists()
