"""The two ways an action can fail, as the workflow engine's retry policy sees them.

An action raises ``RetryableActionError`` when trying again later may succeed
(a timeout, a refused connection, HTTP 429 or 5xx) and ``PermanentActionError``
when it cannot (bad parameters, a refused address, HTTP 4xx, a response over
the size limit). The engine retries only a retryable error, and only as far as
the step's retry policy allows. Each error carries a stable ``code`` from
``StepErrorCode``, stored on the attempt.

``StepErrorCode`` (``ductor_project.core.errors``, beside the API's own
``ErrorCode``) holds every code a step's stored error can have: these, and the
engine's own (a denied route, a crashed action, a child that failed...).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from ductor_project.core.errors import StepErrorCode

# The longest wait a server's hint asks for that a retry keeps (366 days, the longest sleep): a
# hint past it (``Retry-After: 1e400``, which reads as infinity) waits that long.
MAX_RETRY_AFTER_S = 366 * 86_400.0


def retry_hint(seconds: float | None) -> float | None:
    """A server's hint of how long to wait (``retry_after_s``) as a retry keeps it: from 0 to
    ``MAX_RETRY_AFTER_S``; None when there is none or it is not a number (NaN), which no stored
    error (JSON) could hold, nor a timer wait for."""
    if seconds is None or math.isnan(seconds):
        return None
    return min(max(0.0, float(seconds)), MAX_RETRY_AFTER_S)


class ActionError(Exception):
    """An action failed. ``retryable`` says whether the engine may try again."""

    retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        code: StepErrorCode,
        status: int | None = None,
        retry_after_s: float | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.retry_after_s = retry_hint(retry_after_s)
        self.details = details or {}

    def describe(self) -> dict[str, Any]:
        """The error as stored on a step attempt (no secrets: messages never quote headers)."""
        return {
            "code": str(self.code), "message": self.message, "retryable": self.retryable,
            "status": self.status, "retry_after_s": self.retry_after_s, "details": self.details,
        }


class RetryableActionError(ActionError):
    """Trying again later may succeed; ``retry_after_s`` is the server's hint, if it gave one."""

    retryable = True


class PermanentActionError(ActionError):
    """Trying again with the same parameters will fail the same way."""

    retryable = False
