"""The one rule for reading an id the API is sent: a UUID in its canonical text form.

``8-4-4-4-12`` hexadecimal digits with their hyphens, in either case
(``0f8c…-…``), as the API writes every id. Python's ``uuid.UUID`` also reads
``{…}``, ``urn:uuid:…``, the 32 digits without hyphens and hyphens anywhere:
forms the API never writes, so that one row had many paths and a filter many
spellings. A path id of another form names nothing (``404``); a body's or a
query's is ``400 invalid`` naming the field.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

# ASCII hexadecimal digits only (a character class of ranges, not \d or \w).
_CANONICAL = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
# What the OpenAPI schema says of such an id (with ``format: uuid``).
UUID_PATTERN = f"^{_CANONICAL.pattern}$"


def canonical_uuid(value: Any) -> uuid.UUID | None:
    """``value`` as a UUID if it is one in the canonical text form (a ``UUID`` itself too), else None."""
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str) and _CANONICAL.fullmatch(value):
        return uuid.UUID(value)
    return None
