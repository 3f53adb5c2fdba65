"""How a team's task says that trying it again is no use: its step then fails for good.

Raise ``NonRetryable`` (or a subclass of it), or any exception whose
``ductor_retryable`` attribute is False, and the step fails with ``task_failed``
marked not retryable: the node's retry policy is not applied. Any other
exception fails it as retryable. It takes ``install``'s errback to tell Ductor
(``error_of``); without it, every failure is retryable.
"""

from __future__ import annotations


class NonRetryable(Exception):
    """A failure that trying again cannot mend (a declined card, an order that does not exist)."""

    ductor_retryable = False


def is_retryable(exc: BaseException) -> bool:
    """Whether the step of a task that raised ``exc`` may be tried again."""
    return getattr(exc, "ductor_retryable", True) is not False
