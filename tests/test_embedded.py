"""Embedded PostgreSQL and Redis: started from pip wheels under a data dir, shared, stoppable, durable.

The tests share one data dir under /tmp (PostgreSQL's unix socket path must stay
under ~100 characters; ``initdb`` runs once) and each begins with
``ensure_running``, so none depends on another having run. The servers are
always stopped at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from ductor_project import embedded
from tests.conftest import ROOT

ATTACH = (
    "import json, sys; from dataclasses import asdict; from pathlib import Path; "
    "from ductor_project import embedded; "
    "print(json.dumps(asdict(embedded.ensure_running(Path(sys.argv[1])))))"
)


def new_data_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="de-", dir="/tmp"))
    path.chmod(0o755)  # as root, PostgreSQL runs as its own user and must reach its socket dir
    return path


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    path = new_data_dir()
    try:
        yield path
    finally:
        embedded.stop(path)
        shutil.rmtree(path, ignore_errors=True)


def alive(pid: int) -> bool:
    """The process runs (a zombie, exited but not reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state != "Z"


def cli(data_dir: Path, command: str) -> str:
    env = {**os.environ, "DUCTOR_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT)}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "ductor_project.embedded", command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout


def test_racing_processes_start_one_pair_of_servers_and_attach_to_it(data_dir: Path) -> None:
    children = [
        subprocess.Popen([sys.executable, "-c", ATTACH, str(data_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    states = [json.loads(child.communicate(timeout=120)[0]) for child in children]
    assert [child.returncode for child in children] == [0, 0]
    assert states[0] == states[1]
    here = embedded.ensure_running(data_dir)
    assert (here.postgres_pid, here.redis_pid) == (states[0]["postgres_pid"], states[0]["redis_pid"])
    assert embedded.ensure_running(data_dir) == here


def test_ensure_running_starts_real_servers_and_records_them(data_dir: Path) -> None:
    state = embedded.ensure_running(data_dir)
    recorded = json.loads((data_dir / embedded.STATE_FILE).read_text())
    assert (recorded["postgres_pid"], recorded["redis_pid"]) == (state.postgres_pid, state.redis_pid)
    assert alive(state.postgres_pid)
    assert alive(state.redis_pid)
    with psycopg.connect(state.database_url) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("ductor",)
        # The app's role: bound by row-level security, a member of the maintenance role that does
        # not inherit it (it must switch to it).
        assert conn.execute(
            "SELECT current_user, rolsuper, rolbypassrls, pg_has_role(current_user, %s, 'MEMBER'), "
            "pg_has_role(current_user, %s, 'USAGE') FROM pg_roles WHERE rolname = current_user",
            (embedded.MAINTENANCE_ROLE, embedded.MAINTENANCE_ROLE),
        ).fetchone() == (embedded.APP_ROLE, False, False, True, False)
    with psycopg.connect(state.owner_url) as conn:  # the migrations' role owns the tables
        assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (True,)
    client = redis.Redis.from_url(state.redis_url)
    assert client.ping()
    assert client.info("server")["redis_version"]
    assert (data_dir / "pg" / "PG_VERSION").exists()


def test_stop_stops_both_servers_and_data_survives_a_start(data_dir: Path) -> None:
    first = embedded.ensure_running(data_dir)
    with psycopg.connect(first.owner_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS durable")
        conn.execute("CREATE TABLE durable (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO durable VALUES (1, 'kept')")
    redis.Redis.from_url(first.redis_url).set("durable", "kept")

    assert embedded.stop(data_dir) is True
    assert not alive(first.postgres_pid)
    assert not alive(first.redis_pid)
    assert not (data_dir / embedded.STATE_FILE).exists()
    assert embedded.stop(data_dir) is False

    # The same process starts them again: the data is still there.
    second = embedded.ensure_running(data_dir)
    assert second.is_alive()
    assert second.postgres_pid != first.postgres_pid
    with psycopg.connect(second.owner_url) as conn:
        assert conn.execute("SELECT note FROM durable WHERE id = 1").fetchone() == ("kept",)
    assert redis.Redis.from_url(second.redis_url).get("durable") == b"kept"


def test_stale_state_file_is_replaced_by_live_servers(data_dir: Path) -> None:
    first = embedded.ensure_running(data_dir)
    stale = (data_dir / embedded.STATE_FILE).read_text()
    embedded.stop(data_dir)
    (data_dir / embedded.STATE_FILE).write_text(stale)
    recorded = embedded.read_state(data_dir)
    assert recorded is not None
    assert not recorded.is_alive()

    fresh = embedded.ensure_running(data_dir)
    assert fresh.is_alive()
    assert fresh.postgres_pid != first.postgres_pid
    with psycopg.connect(fresh.database_url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert redis.Redis.from_url(fresh.redis_url).ping()


def test_command_line_reports_status_starts_and_stops(data_dir: Path) -> None:
    started = json.loads(cli(data_dir, "start"))
    status = json.loads(cli(data_dir, "status"))
    assert status["running"] is True
    assert status["postgres_pid"] == started["postgres_pid"]
    assert cli(data_dir, "stop").strip() == "stopped"
    assert json.loads(cli(data_dir, "status"))["running"] is False
    assert cli(data_dir, "stop").strip() == "nothing running"


def test_status_and_stop_of_an_unused_data_dir_start_nothing() -> None:
    path = new_data_dir()
    try:
        assert json.loads(cli(path, "status"))["running"] is False
        assert cli(path, "stop").strip() == "nothing running"
        assert not (path / "pg").exists()
        assert not (path / embedded.STATE_FILE).exists()
    finally:
        embedded.stop(path)
        shutil.rmtree(path, ignore_errors=True)


def test_stop_of_a_data_dir_that_does_not_exist_leaves_it_so(tmp_path: Path) -> None:
    """A misspelt DUCTOR_DATA_DIR given to make down is not created (with its lock file) where none was."""
    missing = tmp_path / "not-a-data-dir"
    assert cli(missing, "stop").strip() == "nothing running"
    assert embedded.stop(missing) is False
    assert not missing.exists()


def _processes_under(path: Path) -> list[str]:
    """The command lines of the running processes that name ``path`` (an embedded server would)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in cmdline:
            found.append(cmdline)
    return found


@pytest.mark.parametrize("command", [["--help"], ["help"], ["up", "--help"], ["check"],
                                     ["makemigrations", "--check", "--dry-run"]])
def test_commands_that_need_no_server_start_none_on_a_fresh_data_dir(command: list[str]) -> None:
    data_dir = new_data_dir()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DUCTOR_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="ductor_project.settings")
    try:
        done = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert not (data_dir / embedded.STATE_FILE).exists()  # nothing was started, nor recorded
        assert _processes_under(data_dir) == []
    finally:
        embedded.stop(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def test_redis_comes_back_on_its_port_after_a_crash_left_connections_on_it(tmp_path: Path) -> None:
    """A crashed server's closed connections linger on its port (the client has not closed its end):
    a plain bind refuses it, Redis binds it; so must the check, or running processes lose Redis."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as redis-server's
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server's end closes first: FIN_WAIT2 on the port
    listener.close()
    try:
        (tmp_path / "port").write_text(str(port))
        assert embedded._redis_port(tmp_path) == port
        taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        try:
            assert embedded._redis_port(tmp_path) != port  # a live server there: another port
        finally:
            taken.close()
    finally:
        client.close()


@pytest.mark.parametrize("flag", ["--help", "-h", "help"])
def test_the_command_line_tells_how_to_use_it_and_starts_nothing(flag: str) -> None:
    path = new_data_dir()
    try:
        done = subprocess.run([sys.executable, "-m", "ductor_project.embedded", flag], cwd=ROOT, capture_output=True,
                              text=True, timeout=60, check=False,
                              env={**os.environ, "DUCTOR_DATA_DIR": str(path)})
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("usage: python -m ductor_project.embedded [start|stop|status]\n")
        assert "DUCTOR_DATA_DIR" in done.stdout
        assert not (path / embedded.STATE_FILE).exists()
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_the_command_line_refuses_an_unknown_command_on_stderr() -> None:
    done = subprocess.run([sys.executable, "-m", "ductor_project.embedded", "restart"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("usage: python -m ductor_project.embedded")
    assert done.stderr.rstrip().endswith("not a command: 'restart'")


CHECK, BOOT, START, STOP = (["manage.py", "check"], ["manage.py", "create_tenant", "acme"],
                             ["-m", "ductor_project.embedded", "start"], ["-m", "ductor_project.embedded", "stop"])


@pytest.mark.parametrize(("where", "command", "said"), [
    *[(where, CHECK, "manage.py: the configuration is wrong: ") for where in ("file", "file/data")],
    *[(where, BOOT, "manage.py: the embedded PostgreSQL and Redis did not start: ") for where in ("file", "file/data")],
    *[(where, START, "python -m ductor_project.embedded: ") for where in ("file", "file/data")],
    ("file", STOP, "python -m ductor_project.embedded: "),  # under a file, nothing runs: stop says so
])
def test_a_data_dir_that_cannot_be_a_directory_is_named_in_one_line(tmp_path: Path, where: str, command: list[str],
                                                                    said: str) -> None:
    (tmp_path / "file").write_text("not a directory")
    data_dir = tmp_path / where
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DUCTOR_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="ductor_project.settings")
    done = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 1
    assert done.stderr == (f"{said}DUCTOR_DATA_DIR is a directory this process can create and write in, "
                           f"not '{data_dir}': it or a directory above it is a file\n")
    assert done.stdout == ""


def test_a_recorded_pid_another_process_took_is_neither_counted_on_nor_signalled(tmp_path: Path) -> None:
    """After a reboot the pids in services.json can be any process's: starting or stopping the data
    dir's servers must leave that process alone, and not take it for a server."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        stale = embedded.ServiceState(database_url="postgresql://ductor_app@/ductor?host=/nowhere&port=5432",
                                      owner_url="postgresql://postgres@/ductor?host=/nowhere&port=5432",
                                      postgres_pid=other.pid, redis_url="redis://127.0.0.1:1/0", redis_pid=other.pid,
                                      redis_port=embedded.free_port())
        embedded._write_state(tmp_path, stale)
        assert not stale.postgres_alive()
        assert embedded.stop(tmp_path)
        assert other.poll() is None

        embedded._write_state(tmp_path, stale)
        fresh = embedded.ensure_running(tmp_path, postgres=False)
        assert fresh.redis_pid != other.pid
        assert fresh.redis_alive()
        assert other.poll() is None
    finally:
        embedded.stop(tmp_path)
        other.kill()
        other.wait()


def test_a_recorded_cluster_node_pid_another_process_took_is_neither_counted_on_nor_signalled(tmp_path: Path) -> None:
    """The Redis Cluster of the tests and benchmarks records its nodes' pids too: a stop after they
    were reused (a reboot, a cluster that died) must leave the process that has one now alone."""
    from ductor_project import redis_cluster

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        port = embedded.free_port()
        stale = redis_cluster.ClusterState(ports=(port,), pids=(other.pid,), announced=(port,))
        redis_cluster._write_state(tmp_path, stale)
        assert not stale.alive()
        assert redis_cluster.stop(tmp_path)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_redis_of_the_data_dir_that_the_state_file_lost_is_attached_to_not_doubled(tmp_path: Path) -> None:
    """Two servers on one data dir's files (its append-only log) would each write their own: a state
    file removed or unreadable while the servers run must not start a second one."""
    first = embedded.ensure_running(tmp_path, postgres=False)
    try:
        (tmp_path / embedded.STATE_FILE).write_text("{not json")
        again = embedded.ensure_running(tmp_path, postgres=False)
        assert (again.redis_pid, again.redis_port) == (first.redis_pid, first.redis_port)
        assert again.redis_alive()
        assert json.loads((tmp_path / embedded.STATE_FILE).read_text())["redis_pid"] == first.redis_pid
    finally:
        embedded.stop(tmp_path)
        embedded.wait_gone(first.redis_pid, signal.SIGTERM, timeout=2)
