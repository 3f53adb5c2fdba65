"""What the API answers when a backing service cannot be reached: 503 with ``Retry-After``, a cause to
retry; a statement that failed stays a 500, a bug to look at."""

from __future__ import annotations

import psycopg
import pytest
from django.db import InterfaceError, OperationalError
from django.test import Client

from ductor_project.core.errors import exception_handler
from tenants import middleware
from tests.tenants.helpers import make_user


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


@pytest.mark.django_db
def test_postgresql_out_of_reach_before_any_view_is_a_503_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The admin's tenant is read by a middleware, before the view: an error there is answered by
    Django's ``handler500``, which tells an unreachable server from a bug as the views do."""
    user = make_user("operator", is_staff=True)
    client = Client(raise_request_exception=False)
    client.force_login(user)

    def unreachable(user: object) -> None:
        raise _wrapped(psycopg.OperationalError("connection failed: Connection refused"))

    monkeypatch.setattr(middleware, "admin_tenant_for", unreachable)
    response = client.get("/admin/")
    assert (response.status_code, response.json()["error"]["code"], response["Retry-After"]) == (
        503, "service_unavailable", "5")

    def broken(user: object) -> None:
        raise _wrapped(psycopg.errors.DeadlockDetected("deadlock detected"))

    monkeypatch.setattr(middleware, "admin_tenant_for", broken)
    response = client.get("/admin/")
    assert (response.status_code, response.json()["error"]["code"]) == (500, "internal_error")
