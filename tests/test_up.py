"""``manage.py up`` end to end: the whole stack comes up on fresh embedded services, serves the
API, and Ctrl-C stops every process it started, the embedded PostgreSQL and Redis included."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from ductor_project.celery import RESULTS_WORKER_ARGS, STEP_WORKER_ARGS
from ductor_project.stack import free_port
from tests.conftest import ROOT
from tests.test_embedded import _processes_under, alive, new_data_dir


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children in sessions of their own included)."""
    table = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True, check=True).stdout
    parents: dict[int, int] = {}
    for row in table.splitlines():
        if row.strip():
            child, parent = map(int, row.split())
            parents[child] = parent
    found: list[int] = []
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found += frontier
    return found


def command_line(pid: int) -> list[str]:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_text().rstrip("\0").split("\0")
    except OSError:  # gone meanwhile
        return []


def test_up_serves_the_api_and_ctrl_c_stops_every_process_it_started() -> None:
    data_dir = new_data_dir()
    port = free_port()
    env = {**os.environ, "DUCTOR_DATA_DIR": str(data_dir), "DJANGO_SETTINGS_MODULE": "ductor_project.settings"}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen([sys.executable, "manage.py", "up", "--port", str(port), "--concurrency", "1"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        lines = []
        while "Press Ctrl-C to stop." not in lines and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
        assert "Ductor is up." in lines, lines
        # What it waits for is said before the wait, not only once it is over.
        up = lines.index("Ductor is up.")
        assert lines[0] == "Applying the migrations...", lines
        assert [line for line in lines[1:up] if line.startswith("Starting the web server, the workers, ")
                and line.endswith("; waiting for the web server...")], lines
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/schema/", timeout=10) as response:
            assert response.status == 200
        services = json.loads((data_dir / "services.json").read_text())
        [broker] = [line for line in lines if line.startswith("Broker")]  # once, its password (none here) masked
        assert broker.startswith(f"Broker    redis://127.0.0.1:{services['redis_port']}/")
        children = descendants(proc.pid)
        assert len(children) > 4  # web server, workers, dispatcher, coordinator (and their own children)
        # A worker of steps that leaves the outcomes of task nodes to a results worker (solo pool).
        commands = [" ".join(command_line(pid)) for pid in children]
        workers = [command for command in commands if " -A ductor_project worker " in command]
        assert any(command.endswith(" ".join(STEP_WORKER_ARGS)) for command in workers), workers
        assert any(command.endswith(" ".join(RESULTS_WORKER_ARGS)) for command in workers), workers

        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the terminal's foreground group
        proc.wait(timeout=60)

        rest = proc.stdout.read()
        assert "Stopped, with the embedded PostgreSQL and Redis it started." in rest
        assert proc.returncode == 0
        assert not [pid for pid in children if alive(pid)]
        assert not alive(services["postgres_pid"])
        assert not alive(services["redis_pid"])
    finally:
        if proc.poll() is None:  # a failed assertion: leave nothing behind either
            leftovers = descendants(proc.pid)
            os.killpg(proc.pid, signal.SIGKILL)
            for pid in leftovers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        from ductor_project import embedded

        embedded.stop(Path(data_dir))
        shutil.rmtree(data_dir, ignore_errors=True)


def test_a_second_up_of_the_same_data_dir_is_refused_before_anything_starts(settings, tmp_path: Path) -> None:
    """Two ups of one data dir: the second emptied the metrics directory the first's children write in,
    and its Ctrl-C or the first's stopped the servers under the other."""
    import fcntl

    from django.core.management import call_command
    from django.core.management.base import CommandError

    from ductor_project.management.commands import up

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the stack was started")

    settings.DUCTOR_DATA_DIR = tmp_path
    with open(tmp_path / up.UP_LOCK, "w") as first, pytest.MonkeyPatch.context() as patch:
        fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the up that runs holds it
        patch.setattr(up, "_start_children", started)
        patch.setattr(up, "call_command", started)  # the migrations, the first thing the command does
        with pytest.raises(CommandError, match=rf"Another manage.py up runs on this data dir \({tmp_path}\)"):
            call_command("up")


def test_an_up_refused_before_its_stack_starts_stops_the_servers_it_started() -> None:
    """A port given that is taken is refused after the migrations: the embedded PostgreSQL and Redis this
    up started for them stopped too, or they ran on unseen, and each later up took them for servers that
    were running before it, and left them running at its own end."""
    data_dir = new_data_dir()
    env = {**os.environ, "DUCTOR_DATA_DIR": str(data_dir), "DJANGO_SETTINGS_MODULE": "ductor_project.settings"}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            busy = taken.getsockname()[1]
            done = subprocess.run([sys.executable, "manage.py", "up", "--port", str(busy)], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 1
        assert f"Port {busy} is in use by another process" in done.stderr
        assert "Stopped, with the embedded PostgreSQL and Redis it started." in done.stdout
        assert not (data_dir / "services.json").exists()
        assert _processes_under(data_dir) == []
    finally:
        from ductor_project import embedded

        embedded.stop(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def test_the_default_port_taken_moves_the_web_server_to_a_free_one_and_says_so(monkeypatch) -> None:
    from ductor_project.management.commands import up

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(up, "DEFAULT_PORT", busy)
        port, note = up.pick_port(None)
    assert port != busy
    assert f"Port {busy} is in use" in note
    assert f"listens on {port} instead" in note
    assert 'ARGS="--port' in note


def test_the_tenant_command_up_prints_runs_with_the_interpreter_that_runs_up(monkeypatch, tmp_path: Path) -> None:
    """The command is for another terminal, whose ``python`` need not be the virtualenv's (one without
    Django): it names ``up``'s own interpreter, from the directory ``up`` runs in when it is below it."""
    import io

    from ductor_project.management.commands import up

    monkeypatch.chdir(tmp_path)
    for executable, shown in [(tmp_path / ".venv" / "bin" / "python", ".venv/bin/python"),
                              (Path("/usr/local/bin/python3"), "/usr/local/bin/python3")]:
        monkeypatch.setattr(sys, "executable", str(executable))
        out = io.StringIO()
        up.Command(stdout=out)._print_urls("http://127.0.0.1:8000", "secret")
        assert f"  Create a tenant: {shown} manage.py create_tenant acme --json" in out.getvalue().splitlines()


def test_the_children_use_the_data_dir_up_resolved_when_it_was_given_relative(monkeypatch, tmp_path: Path) -> None:
    """The children start in the project's directory: a relative DUCTOR_DATA_DIR, given to an up
    started elsewhere, named another data dir there, whose servers each child started anew."""
    from django.conf import settings

    from ductor_project.management.commands import up

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setenv("DUCTOR_DATA_DIR", "data")
    monkeypatch.setattr(settings, "DUCTOR_DATA_DIR", tmp_path / "data")  # "data" from up's own directory
    env = up.children_env()
    assert env["DUCTOR_DATA_DIR"] == str(tmp_path / "data")
    assert env["PROMETHEUS_MULTIPROC_DIR"] == str(tmp_path / "data" / "metrics")


def test_a_port_an_earlier_server_left_in_time_wait_is_free() -> None:
    """A restart keeps its port: the connections of the server before it linger in TIME_WAIT."""
    from ductor_project.management.commands.up import pick_port

    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server closes first: its side of the connection waits in TIME_WAIT
        client.close()
    assert pick_port(port) == (port, "")


def test_a_port_given_that_is_taken_is_refused_and_a_free_one_kept() -> None:
    from django.core.management.base import CommandError

    from ductor_project.management.commands.up import pick_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"Port {busy} is in use by another process: free it"):
            pick_port(busy)
    free = free_port()
    assert pick_port(free) == (free, "")


@pytest.mark.parametrize(("option", "value", "words"), [
    ("--workers", "0", "at least 1"),
    ("--workers", "-1", "at least 1"),
    ("--concurrency", "0", "at least 1"),
    ("--dispatchers", "0", "at least 1"),
    ("--results-workers", "-1", "at least 0"),
    ("--port", "0", "from 1 to 65535"),
    ("--port", "70000", "from 1 to 65535"),
])
def test_an_option_out_of_its_range_is_refused_before_anything_starts(option: str, value: str, words: str) -> None:
    """Without a worker of steps or a dispatcher the stack said it was up and ran no step; a port past
    65535 failed with an OverflowError's traceback."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from ductor_project.management.commands import up

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the stack was started")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(up, "_start_children", started)
        patch.setattr(up, "call_command", started)  # the migrations, the first thing the command does
        with pytest.raises(CommandError, match=rf"argument {option}: must be a whole number {words}, not '{value}'"):
            call_command("up", option, value)


@pytest.mark.parametrize("logged", [
    "[ERROR] Connection in use: ('127.0.0.1', 8000)\n[ERROR] Can't connect to ('127.0.0.1', 8000)",  # gunicorn
    "Error: That port is already in use.",  # runserver
])
def test_a_web_server_that_lost_its_port_is_told_as_such(logged: str, tmp_path: Path) -> None:
    from ductor_project.management.commands.up import port_taken

    dead = SimpleNamespace(alive=lambda: False, output=lambda: logged, log_path=tmp_path / "web.log")
    error = port_taken(dead, 8000)
    assert error is not None
    assert "Port 8000 is in use by another process" in str(error)
    assert 'make up ARGS="--port 8123"' in str(error)
    other = SimpleNamespace(alive=lambda: False, output=lambda: "ImportError: no module", log_path=dead.log_path)
    assert port_taken(other, 8000) is None


def test_an_up_whose_redis_is_out_of_reach_says_so_in_one_line_naming_the_setting_and_starts_nothing() -> None:
    """With ``REDIS_URL`` naming a port where nothing listens, up printed "Ductor is up." while
    ``/readyz`` answered 503 and every child that reads Redis failed over and over."""
    refused_up({"REDIS_URL": "redis://127.0.0.1:{nowhere}/0"}, named="REDIS_URL ")


def test_an_up_whose_celery_broker_alone_is_out_of_reach_says_so_naming_its_setting() -> None:
    """Ductor's own Redis answers (the embedded one), the broker the workers and dispatchers use does
    not: up said "Ductor is up." and no step ever ran."""
    refused_up({"CELERY_BROKER_URL": "redis://127.0.0.1:{nowhere}/0"}, named="CELERY_BROKER_URL,")


def refused_up(settings: dict[str, str], *, named: str) -> None:
    """``manage.py up`` with ``settings`` (``{nowhere}``: a port where nothing listens) refuses in one
    line naming the setting, with status 1, and stops what it started."""
    data_dir = new_data_dir()
    nowhere = free_port()  # nothing listens there
    env = {**os.environ, "DUCTOR_DATA_DIR": str(data_dir), "DJANGO_SETTINGS_MODULE": "ductor_project.settings"}
    env.pop("DATABASE_URL", None)
    for name in ("REDIS_URL", "DUCTOR_QUEUE_REDIS_URL", "CACHE_REDIS_URL", "CELERY_BROKER_URL",
                 "CELERY_RESULT_BACKEND"):
        env.pop(name, None)
    env.update({name: value.format(nowhere=nowhere) for name, value in settings.items()})
    proc = subprocess.Popen([sys.executable, "manage.py", "up", "--port", str(free_port())], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # it came up: Ctrl-C stops what it started
            os.killpg(proc.pid, signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=45)
        assert "Ductor is up." not in stdout
        assert "Starting the web server" not in stdout
        assert proc.returncode == 1
        last = stderr.splitlines()[-1]
        assert last.startswith(f"CommandError: Redis is out of reach at {named}"), stderr
        assert f"127.0.0.1:{nowhere}" in last
        assert "Traceback" not in stderr
        assert "Stopped, with the embedded PostgreSQL and Redis it started." in stdout
        assert _processes_under(data_dir) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        from ductor_project import embedded

        embedded.stop(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
