"""What the API answers when a backing service cannot be reached: 503 with ``Retry-After``, a cause to
retry; a statement that failed stays a 500, a bug to look at."""

from __future__ import annotations

import psycopg
import pytest
from django.db import InterfaceError, OperationalError

from ductor_project.core.errors import exception_handler


def _wrapped(cause: BaseException) -> OperationalError:
    """As Django raises a driver's error: its own class, the driver's as the cause."""
    error = OperationalError(str(cause))
    error.__cause__ = cause
    return error


@pytest.mark.parametrize("exc", [
    _wrapped(psycopg.OperationalError("connection failed: Connection refused")),  # down: no SQLSTATE
    _wrapped(psycopg.errors.AdminShutdown("terminating connection due to administrator command")),
    _wrapped(psycopg.errors.CannotConnectNow("the database system is starting up")),
    _wrapped(psycopg.errors.ConnectionFailure("connection failure")),
    InterfaceError("connection already closed"),
], ids=lambda exc: type(exc.__cause__ or exc).__name__)
def test_postgresql_out_of_reach_is_a_503_to_retry(exc: Exception) -> None:
    response = exception_handler(exc, {})
    assert (response.status_code, response.data["error"]["code"], response["Retry-After"]) == (
        503, "service_unavailable", "5")


@pytest.mark.parametrize("cause", [
    psycopg.errors.DeadlockDetected("deadlock detected"),
    psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
], ids=lambda exc: type(exc).__name__)
def test_a_statement_that_failed_is_still_a_500(cause: Exception) -> None:
    response = exception_handler(_wrapped(cause), {})
    assert (response.status_code, response.data["error"]["code"]) == (500, "internal_error")
