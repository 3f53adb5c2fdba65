"""The two ways an action can fail, as the workflow engine's retry policy sees them.

An action raises ``RetryableActionError`` when trying again later may succeed
(a timeout, a refused connection, HTTP 429 or 5xx) and ``PermanentActionError``
when it cannot (bad parameters, a refused address, HTTP 4xx, a response over
the size limit). The engine retries only a retryable error, and only as far as
the step's retry policy allows. Each error carries a stable ``code`` from
``ActionErrorCode``, which a retry policy may also filter on.

These are the codes of a step's failure, stored on its attempt; the API's own
error codes are ``ductor_project.core.errors.ErrorCode``.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar


class ActionErrorCode(enum.StrEnum):
    INVALID_PARAMS = "invalid_params"
    NO_CONNECTION = "no_connection"
    INVALID_CONNECTION = "invalid_connection"
    ADDRESS_REFUSED = "address_refused"
    DNS_ERROR = "dns_error"
    CONNECT_ERROR = "connect_error"
    TIMEOUT = "timeout"
    TRANSPORT_ERROR = "transport_error"
    RATE_LIMITED = "rate_limited"
    SERVER_ERROR = "server_error"
    CLIENT_ERROR = "client_error"
    RESPONSE_TOO_LARGE = "response_too_large"
    ACTION_FAILED = "action_failed"


class ActionError(Exception):
    """An action failed. ``retryable`` says whether the engine may try again."""

    retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        code: ActionErrorCode,
        status: int | None = None,
        retry_after_s: float | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.retry_after_s = retry_after_s
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
