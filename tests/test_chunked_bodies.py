"""A request body sent in chunks, through Django's own WSGI application wrapped as ``wsgi.py`` wraps it.

Django reads a body by its ``Content-Length`` and one without as empty, so a chunked ``PATCH`` was a
``200`` that changed nothing. Where the server decodes the chunks (gunicorn says so with
``wsgi.input_terminated``) the body is read; where it does not, the request is a ``411``.
"""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import pytest
from django.core.handlers.wsgi import WSGIHandler
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
