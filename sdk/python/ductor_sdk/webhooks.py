"""Checking that a webhook delivery comes from Ductor: ``verify(body, signature_header, secret)``.

Each delivery is a POST whose ``Ductor-Signature`` header is ``t=<unix seconds>,v1=<hex>``: the
HMAC-SHA256, keyed with the endpoint's secret (``whsec_…``, the whole text as UTF-8), of the
timestamp, a ``.`` and the raw body bytes. During a rotation's grace the header carries one ``v1``
per secret, and either one checks. Verify the body exactly as it came, before parsing it::

    from ductor_sdk.webhooks import WebhookSignatureError, verify

    try:
        verify(request.body, request.headers["Ductor-Signature"], secret)
    except WebhookSignatureError:
        return 400

Needs the standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "Ductor-Signature"
DEFAULT_TOLERANCE_S = 300
# Most digits a timestamp may have: Unix seconds for the next 30,000 years, and an int() that never refuses.
MAX_TIMESTAMP_DIGITS = 12


class WebhookSignatureError(ValueError):
    """The delivery's signature is missing, malformed, wrong, or too old (or too far ahead) to trust."""


def sign(body: bytes, secret: str, timestamp: int) -> str:
    """The hex signature Ductor sends of ``body`` at ``timestamp`` (a ``v1`` of the header)."""
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def _parse(header: str) -> tuple[int, list[str]]:
    """The timestamp and the ``v1`` signatures of a ``Ductor-Signature`` header."""
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
        if key == "t" and value.isascii() and value.isdigit() and len(value) <= MAX_TIMESTAMP_DIGITS:
            timestamp = int(value)
        elif key == "v1" and value:
            signatures.append(value)
    if timestamp is None or not signatures:
        raise WebhookSignatureError(f"not a {SIGNATURE_HEADER} header: it needs t=<timestamp> and v1=<signature>")
    return timestamp, signatures


def verify(body: bytes, signature_header: str, secret: str, *, tolerance_s: int = DEFAULT_TOLERANCE_S,
           now: float | None = None) -> None:
    """Return if ``body`` was signed with ``secret`` by one of the header's ``v1`` signatures (each
    compared in constant time), at a timestamp within ``tolerance_s`` seconds of ``now`` (default:
    the clock's): a delivery replayed later is refused. Raises ``WebhookSignatureError`` otherwise."""
    if not isinstance(signature_header, str) or not signature_header:
        raise WebhookSignatureError(f"no {SIGNATURE_HEADER} header")
    timestamp, signatures = _parse(signature_header)
    expected = sign(body, secret, timestamp)
    if not any(hmac.compare_digest(expected.encode(), given.encode()) for given in signatures):
        raise WebhookSignatureError("no signature of the header matches the body and the secret")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise WebhookSignatureError(f"the signature's timestamp is more than {tolerance_s} s from now")
