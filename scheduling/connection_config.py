"""What a connection's ``config`` may hold, per kind, and its defaults.

- ``http``: ``base_url`` (an http or https URL, required), ``headers`` (a dict
  of header name to string value), ``timeout_s`` (0 < x <= 300, default 10)
  and ``max_response_bytes`` (1 .. 50 MiB, default 1 MiB).
- ``python``: a free-form object of at most 64 KiB as JSON.
- ``celery``: ``queue`` (required: the Celery queue the team's workers consume;
  never a ``ductor.`` one, nor the name of a key the broker's Redis keeps for
  something else: ``RESERVED_QUEUE``) and ``broker`` (the name of a broker of
  ``DUCTOR_TASK_BROKERS``, default ``"default"``: Ductor's own). A tenant names
  brokers the platform configured; it never gives a URL.

The API, the admin and the ``http.request`` action read the same rules from
here. ``validate_config`` returns a normalized copy with the defaults filled in.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

HTTP_DEFAULT_TIMEOUT_S = 10.0
HTTP_MAX_TIMEOUT_S = 300.0
HTTP_DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024
HTTP_MAX_RESPONSE_BYTES = 50 * 1024 * 1024
HTTP_MAX_HEADERS = 50
PYTHON_MAX_CONFIG_BYTES = 64 * 1024
HTTP_KEYS = ("base_url", "headers", "timeout_s", "max_response_bytes")
CELERY_KEYS = ("queue", "broker")
DEFAULT_BROKER = "default"
# A Celery queue name as AMQP and Redis both take it; ``ductor.`` names are Ductor's own queues.
QUEUE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,199}$")
INTERNAL_QUEUE_PREFIX = "ductor."
# On Redis a queue is the list under its name, in the database where the broker also keeps kombu's
# own keys (the messages every worker that emulates acks holds, as a team's worker does by default,
# and the exchanges' bindings), Celery's results, and Ductor's cache (``<version>:t:…``,
# ``<version>:g:…``, after the cache's prefix). A message pushed onto one of them made it a list:
# every worker on the broker died at its next message (``WRONGTYPE`` on ``unacked``), or the cache
# entry every tenant reads failed their requests. Such a name is no queue.
# Headers that steps and connections may not set: they belong to the transport
# (and ``Host`` must stay the checked host).
RESERVED_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer",
    "upgrade", "proxy-authorization", "proxy-connection",
})
RESERVED_QUEUE_NAMES = frozenset({"unacked", "unacked_index", "unacked_mutex"})
RESERVED_QUEUE = re.compile(r"_kombu\.|celery-task-meta-|celery-taskset-meta-|chord-unlock-|(?:.*:)?[0-9]+:[tg]:")

# RFC 9110 field-name token; values may not carry CR/LF (no header injection).
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,100}$")
# What no header value may hold: a line break or another control character (a tab aside).
_HEADER_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_url = URLValidator(schemes=["http", "https"])


class ConfigError(ValueError):
    """An invalid connection config. ``field`` is dotted from the request root (``config.base_url``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def unsendable_header_value(value: str) -> bool:
    """Whether ``value`` cannot be sent as a header value: it holds a line break or another control
    character (a tab aside), or a character that is not ASCII (httpx encodes header values as ASCII)."""
    return not value.isascii() or _HEADER_CONTROL.search(value) is not None


def validate_secret(kind: str, secret: str) -> None:
    """Raises ``ConfigError`` (field ``secret``, the secret never quoted) when ``kind`` is ``http``
    and ``secret`` cannot go in a header (``unsendable_header_value``): a secret pasted with its
    line end, say. A ``python`` connection's secret is handed to its action as it is (a PEM key
    has line breaks)."""
    if kind == "http" and secret and unsendable_header_value(secret):
        raise ConfigError("secret", "holds a line break, another control character or a character that is not "
                                    "ASCII, which no HTTP header can carry")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _http(config: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(config) - set(HTTP_KEYS))
    if unknown:
        raise ConfigError(f"config.{unknown[0]}", f"unknown field; use {', '.join(HTTP_KEYS)}")
    base_url = config.get("base_url")
    if not isinstance(base_url, str) or not base_url:
        wanted = "is required" if base_url is None else "must be"
        raise ConfigError("config.base_url", f"{wanted}: an http or https URL")
    try:
        _url(base_url)
    except ValidationError as exc:
        raise ConfigError("config.base_url", "must be an http or https URL") from exc
    try:
        host = httpx.URL(base_url).host  # decodes an IDNA host: one that names nothing ("xn--a") fails only here
    except (httpx.InvalidURL, UnicodeError) as exc:
        raise ConfigError("config.base_url", "its host is no host name") from exc
    if not host:
        raise ConfigError("config.base_url", "must name a host")
    if "@" in urlsplit(base_url).netloc:
        raise ConfigError("config.base_url", "must not carry credentials; use the connection secret")
    try:
        port = urlsplit(base_url).port
    except ValueError:
        port = 0
    if port == 0:
        raise ConfigError("config.base_url", "its port must be from 1 to 65535")
    headers = config.get("headers", {})
    if not isinstance(headers, Mapping) or len(headers) > HTTP_MAX_HEADERS:
        raise ConfigError("config.headers", f"must be an object of at most {HTTP_MAX_HEADERS} headers")
    for name, value in headers.items():
        if not _HEADER_NAME.fullmatch(name):
            raise ConfigError("config.headers", "header names must be HTTP tokens")
        if name.lower() in RESERVED_HEADERS:
            raise ConfigError(f"config.headers.{name}", "is set by the platform and cannot be given")
        if not isinstance(value, str) or len(value) > 8192 or unsendable_header_value(value):
            raise ConfigError(f"config.headers.{name}", "must be a string of ASCII characters without line "
                                                        "breaks or other control characters")
    timeout = config.get("timeout_s", HTTP_DEFAULT_TIMEOUT_S)
    if not _is_number(timeout) or not 0 < timeout <= HTTP_MAX_TIMEOUT_S:
        raise ConfigError("config.timeout_s", f"must be a number above 0 and at most {HTTP_MAX_TIMEOUT_S:g}")
    limit = config.get("max_response_bytes", HTTP_DEFAULT_MAX_RESPONSE_BYTES)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= HTTP_MAX_RESPONSE_BYTES:
        message = f"must be an integer from 1 to {HTTP_MAX_RESPONSE_BYTES}"
        raise ConfigError("config.max_response_bytes", message)
    return {
        "base_url": base_url,
        "headers": dict(headers),
        "timeout_s": float(timeout),
        "max_response_bytes": limit,
    }


def _python(config: Mapping[str, Any]) -> dict[str, Any]:
    size = len(json.dumps(config, separators=(",", ":")).encode())
    if size > PYTHON_MAX_CONFIG_BYTES:
        raise ConfigError("config", f"must be at most {PYTHON_MAX_CONFIG_BYTES} bytes as JSON ({size} given)")
    return dict(config)


def queue_name_error(queue: Any) -> str | None:
    """Why ``queue`` cannot be a team queue, or None when it can."""
    if not isinstance(queue, str) or not QUEUE_NAME.fullmatch(queue):
        return "must be a Celery queue name: letters, digits and _ . : - (at most 200)"
    if queue.startswith(INTERNAL_QUEUE_PREFIX):
        return "names one of Ductor's own queues (ductor.*), which no task may be sent to"
    if queue in RESERVED_QUEUE_NAMES or RESERVED_QUEUE.match(queue):
        return ("names a key the broker keeps for itself or for Ductor (unacked*, _kombu.*, Celery's results, "
                "Ductor's cache), which no task may be sent to")
    return None


def _celery(config: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(config) - set(CELERY_KEYS))
    if unknown:
        raise ConfigError(f"config.{unknown[0]}", f"unknown field; use {', '.join(CELERY_KEYS)}")
    problem = queue_name_error(config.get("queue"))
    if problem:
        raise ConfigError("config.queue", problem)
    broker = config.get("broker", DEFAULT_BROKER)
    known = [DEFAULT_BROKER, *settings.DUCTOR_TASK_BROKERS]
    if broker not in known:
        raise ConfigError("config.broker", f"unknown broker; use one of {', '.join(map(str, known))}")
    return {"queue": config["queue"], "broker": broker}


def validate_config(kind: str, config: Any) -> dict[str, Any]:
    """A normalized copy of ``config`` for a connection of ``kind``.

    Raises ``ConfigError`` naming the offending field. No I/O (reads the settings only).
    """
    if not isinstance(config, Mapping):
        raise ConfigError("config", "must be an object")
    if kind == "http":
        return _http(config)
    if kind == "python":
        return _python(config)
    if kind == "celery":
        return _celery(config)
    raise ConfigError("kind", "must be http, python or celery")
