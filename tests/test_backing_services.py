"""What the API answers when a backing service cannot be reached: 503 with ``Retry-After``, a cause to
retry; a statement that failed stays a 500, a bug to look at."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from django.db import InterfaceError, OperationalError, connection
from django.test import Client

from ductor_project.core.errors import exception_handler
from ductor_project.embedded import free_port
from tenants import middleware
from tests.conftest import ROOT
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


def _manage(tmp_path: Path, *args: str, database_url: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DUCTOR_DATA_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "ductor_project.settings",
           "DATABASE_URL": database_url, "REDIS_URL": redis_url}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.django_db
def test_a_command_whose_backing_service_is_out_of_reach_says_which_in_one_line(tmp_path: Path) -> None:
    """An operator's command (create_tenant, queue_reshard, migrate …) against a PostgreSQL or a Redis
    that does not answer: one line naming it, status 1, not the driver's traceback."""
    nowhere = free_port()  # nothing listens there
    db = connection.settings_dict
    where = db["OPTIONS"]  # the embedded server's socket, or the host of TEST_DATABASE_URL
    reachable_db = (f"postgresql://{db['USER']}:{quote(db['PASSWORD'] or '', safe='')}@/{db['NAME']}"
                    f"?host={where.get('host') or db['HOST']}&port={where.get('port') or db['PORT'] or 5432}")

    done = _manage(tmp_path, "create_tenant", "acme", database_url=f"postgresql://ductor_app@127.0.0.1:{nowhere}/d",
                   redis_url=f"redis://127.0.0.1:{nowhere}/0")
    assert done.returncode == 1
    assert done.stderr.startswith("manage.py: PostgreSQL is out of reach: connection failed: ")
    assert done.stderr.count("\n") == 1, done.stderr

    done = _manage(tmp_path, "queue_reshard", "--shards", "2", "--dry-run", database_url=reachable_db,
                   redis_url=f"redis://127.0.0.1:{nowhere}/0")
    assert done.returncode == 1
    lines = done.stderr.splitlines()  # the command's own log lines (JSON) come first
    assert lines[-1].startswith("manage.py: Redis is out of reach: Error ")
    assert lines[-1].endswith(f"connecting to 127.0.0.1:{nowhere}. Connection refused.")
    assert not any(line.startswith("Traceback") for line in lines)

    done = _manage(tmp_path, "create_tenant", "acme", "--traceback",
                   database_url=f"postgresql://ductor_app@127.0.0.1:{nowhere}/d", redis_url=f"redis://127.0.0.1:{nowhere}/0")
    assert done.returncode == 1
    assert "Traceback" in done.stderr  # asked for


def test_a_command_interrupted_says_so_in_one_line(tmp_path: Path) -> None:
    """Ctrl-C in a long command (migrate, queue_reshard) is the operator's own stop, not a failure to
    show a traceback for; the status stays a SIGINT's, 130."""
    interrupt = "import os, signal; os.kill(os.getpid(), signal.SIGINT)"  # Ctrl-C, mid-command
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")}
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", interrupt], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stderr) == (130, "manage.py: interrupted\n")
