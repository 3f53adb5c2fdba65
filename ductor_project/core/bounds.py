"""How long a short text of the API may be, and how many of them a list may hold: one place, so a
tag, a name or a reason is bounded alike wherever the API takes one.

A field past its bound is ``400 invalid`` naming it; nothing is cut silently.
"""

from __future__ import annotations

# A name: an API key's, a connection's, a pool's, a rule's, a workflow's.
MAX_NAME_CHARS = 100
# A tag of a run or a step, and how many one carries (or a rule or a dry run names).
MAX_TAG_CHARS = 100
MAX_TAGS = 50
# A key or a reference: an idempotency key, an event's name or key, a glob, a condition's path or a
# string it compares with.
MAX_KEY_CHARS = 200
# A run's tag that names what started it, ``schedule:<its name>`` or ``event:<its name>``, kept whole
# (a name of an event is a key): a run list's ``tag`` filter takes one this long.
MAX_SOURCE_TAG_CHARS = len("schedule:") + MAX_KEY_CHARS
# A reason or a description meant for people: a deny rule's reason, a step error's message.
MAX_REASON_CHARS = 500
