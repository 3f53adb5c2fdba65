"""Request bodies sent in chunks (``Transfer-Encoding: chunked``, no ``Content-Length``).

Django reads a body by its ``Content-Length`` and reads one without as empty: a chunked ``PATCH``
was answered ``200`` having changed nothing. ``ChunkedBodies`` wraps the WSGI application: where
the server hands it the body already decoded and ended (``wsgi.input_terminated``, as gunicorn
does), it reads the body, at most one byte more than ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (so that a
larger one is refused as too large, as any is), and gives it its length. A server that does not
(``runserver``) leaves the body unread: the request is refused with ``411 length_required``, an
answer of no declared length, so that the server ends the connection after it (the chunks left
unread would be read as the next request). ``Connection: close`` is not the application's to send:
a WSGI server refuses a hop-by-hop header from it (``runserver`` answered ``500``).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.conf import settings

from ductor_project.core.errors import ErrorCode, error_body

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


def is_chunked(environ: Environ) -> bool:
    """Whether the request's body comes in chunks, with no length given."""
    return "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower() and not environ.get("CONTENT_LENGTH")


class ChunkedBodies:
    """The WSGI application ``app``, given each chunked request's body with its length."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if is_chunked(environ):
            if not environ.get("wsgi.input_terminated"):
                return _refused(start_response)
            body = environ["wsgi.input"].read(settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
            environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        return self.app(environ, start_response)


def _refused(start_response: StartResponse) -> Iterator[bytes]:
    """The 411 answer: its body as an iterator, whose length the server cannot tell, so that it closes
    the connection after it (as ``runserver`` does, saying ``Connection: close`` itself)."""
    body = json.dumps(error_body(ErrorCode.LENGTH_REQUIRED, "Send the request body with a Content-Length: this "
                                 "server does not read a chunked one.")).encode()
    start_response("411 Length Required", [("Content-Type", "application/json")])
    return iter([body])
