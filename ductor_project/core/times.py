"""The one rule for a time the API is sent: RFC 3339's ``date-time``, the schema's format.

RFC 3339 (section 5.6) lets its ``T`` and ``Z`` be lower case. ``datetime.fromisoformat`` and
Django's ``parse_datetime`` take a lower-case ``t``, but not a lower-case ``z``: ``rfc3339``
gives them the time with its UTC letter upper case. Pure.
"""


def rfc3339(text: str) -> str:
    """``text`` with a final lower-case ``z`` (UTC) as ``Z``; any other text as it is."""
    return f"{text[:-1]}Z" if text.endswith("z") else text
