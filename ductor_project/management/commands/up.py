"""``python manage.py up``: the whole stack on this machine, until Ctrl-C.

Starts (or attaches to) PostgreSQL and Redis, refuses to go on when Redis does not
answer (one line naming its setting: ``redis_out_of_reach``), migrates, then runs the web
server (gunicorn; ``--dev`` for runserver), Celery workers (of steps, and of the
outcomes of task nodes: ``--results-workers``), dispatchers and the coordinator
as children of ``ductor_project.stack.Stack``. A child that dies is
reported and restarted, and so is a coordinator or dispatcher that lives but
has not beaten for ``DUCTOR_HEARTBEAT_STALE_S`` (its loop is stuck, or cannot
reach PostgreSQL). Ctrl-C stops every child cleanly, then the embedded
PostgreSQL and Redis if this command started them (``--keep-services`` keeps
them; servers that were already running are left alone, ``make down`` stops
those).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import os
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django_redis import get_redis_connection

from ductor_project import embedded
from ductor_project.celery import RESULTS_WORKER_ARGS, STEP_WORKER_ARGS
from ductor_project.core import heartbeats, redis, redis_urls
from ductor_project.core.errors import service_out_of_reach
from ductor_project.stack import Child, ChildError, Stack, free_port

READY_TIMEOUT_S = 60.0
DEFAULT_PORT = 8000
# What the web server logs when its port is taken: gunicorn, runserver, a plain socket error.
PORT_TAKEN = ("Connection in use", "That port is already in use", "Address already in use")


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An option's type: a whole number from ``low`` (to ``high``). A stack with no worker of steps or no
    dispatcher runs no step, and a port out of range failed with a traceback: each is refused as the
    command is read, before anything starts."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be a whole number {bounds}, not {text!r}")
        return value
    return parse


class Command(BaseCommand):
    help = "Run the whole Ductor stack (web, workers, dispatchers, coordinator) until Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=whole_number(1, 65535), default=None,
                            help=f"the web server's port (default: {DEFAULT_PORT}, or a free one when it is taken)")
        parser.add_argument("--workers", type=whole_number(1), default=1,
                            help="Celery workers of steps (default: 1)")
        parser.add_argument("--concurrency", type=whole_number(1), default=2,
                            help="pool processes of each worker of steps (default: 2)")
        parser.add_argument("--results-workers", type=whole_number(0), default=1,
                            help="workers of the outcomes of task nodes alone (solo pool); 0: the other workers "
                                 "record them")
        parser.add_argument("--dispatchers", type=whole_number(1), default=1,
                            help="dispatchers, which move admitted items to the workers (default: 1)")
        parser.add_argument("--dev", action="store_true", help="runserver instead of gunicorn")
        parser.add_argument("--keep-services", action="store_true",
                            help="leave the embedded PostgreSQL and Redis running after Ctrl-C")

    def handle(self, *args: Any, **options: Any) -> None:
        # A refusal before the stack starts (the migrations, a port given that is taken) stops the
        # embedded servers this command started too, as Ctrl-C does: left running, every later up
        # took them for servers that were running before it.
        with only_up(settings.DUCTOR_DATA_DIR):
            try:
                self._run(options)
            finally:
                self._stop_services(keep=options["keep_services"])

    def _run(self, options: dict[str, Any]) -> None:
        problem = redis_out_of_reach()
        if problem is not None:
            raise CommandError(problem)
        # Each step may take a while (seconds for the migrations, up to READY_TIMEOUT_S for the web
        # server): say what is being waited for, not nothing until "Ductor is up.".
        self.stdout.write("Applying the migrations...")
        call_command("migrate", interactive=False, verbosity=0)
        password = _admin_password()
        port, note = pick_port(options["port"])  # raises CommandError when the port given is taken
        if note:
            self.stdout.write(self.style.WARNING(note))
        stack = Stack(settings.DUCTOR_DATA_DIR / "logs", env=children_env(), say=self.stdout.write)
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            web, loops = _start_children(stack, port=port, options=options)
            self.stdout.write(f"Starting the web server, the workers, the dispatchers and the coordinator "
                              f"(logs: {stack.log_dir}); waiting for the web server...")
            try:
                stack.wait_ready(web, timeout_s=READY_TIMEOUT_S)
            except ChildError as exc:
                taken = port_taken(web, port)
                if taken is None:
                    raise
                raise taken from exc
            self._print_urls(str(web.url), password)
            watch = HeartbeatWatch(stack, loops)
            while not stop.wait(1.0):
                stack.check()
                watch.check()
        finally:
            self.stdout.write("Stopping every child...")
            stack.stop_all()

    def _print_urls(self, base: str, password: str) -> None:
        self.stdout.write(self.style.SUCCESS("Ductor is up."))
        self.stdout.write(f"  API       {base}/api/v1/")
        self.stdout.write(f"  API docs  {base}/api/docs/")
        self.stdout.write(f"  Admin     {base}/admin/   (login: admin / {password})")
        self.stdout.write(f"  Logs      {settings.DUCTOR_DATA_DIR / 'logs'}")
        broker = redis_urls.shown(settings.CELERY_BROKER_URL)  # a password masked
        self.stdout.write(f"  Broker    {broker}   (your Celery workers' broker, for task nodes)")
        self.stdout.write(f"  Create a tenant: {interpreter()} manage.py create_tenant acme --json")
        self.stdout.write("Press Ctrl-C to stop.")

    def _stop_services(self, *, keep: bool) -> None:
        """Stop the embedded PostgreSQL and Redis if this command started them and ``keep`` is False."""
        if embedded.started_here and not keep:
            embedded.stop(settings.DUCTOR_DATA_DIR)
            self.stdout.write("Stopped, with the embedded PostgreSQL and Redis it started.")
        elif embedded.started_here:
            self.stdout.write("Stopped. The embedded PostgreSQL and Redis keep running; `make down` stops them.")
        else:
            self.stdout.write("Stopped. PostgreSQL and Redis were running before and keep running.")


def redis_out_of_reach() -> str | None:
    """Why Ductor's Redis cannot be used, in one line naming the setting of the server that does not
    answer (its own state's, ``DUCTOR_QUEUE_REDIS_URL``, each primary of a cluster; the cache's,
    ``CACHE_REDIS_URL``; Celery's broker and result backend, ``CELERY_BROKER_URL`` and
    ``CELERY_RESULT_BACKEND``; all ``REDIS_URL`` by default); None when each answers ``PING``. Out of
    reach, the stack came up all the same, said "Ductor is up." while ``/readyz`` answered 503, and
    each child that reads Redis failed again and again."""
    servers: list[tuple[str, str, Callable[[], Any]]] = [
        ("DUCTOR_QUEUE_REDIS_URL", settings.DUCTOR_QUEUE_REDIS_URL, redis.ping),
        ("CACHE_REDIS_URL", settings.CACHE_REDIS_URL, lambda: get_redis_connection("default").ping())]
    checked = {settings.DUCTOR_QUEUE_REDIS_URL, settings.CACHE_REDIS_URL}
    for name in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):  # the workers' and dispatchers' own
        url = os.environ.get(name) or settings.REDIS_URL
        if url not in checked:
            checked.add(url)
            servers.append((name, url, functools.partial(_ping, url, name)))
    for name, url, ping in servers:
        try:
            ping()
        except Exception as exc:
            if service_out_of_reach(exc) is None:
                raise
            return (f"Redis is out of reach at {redis_urls.setting_name(name)}, {redis_urls.shown(url)}: "
                    f"{' '.join(str(exc).split())} Start it, or point the setting at one that runs.")
    return None


def _ping(url: str, name: str) -> None:
    """``PING`` the Redis server of ``url`` (the setting ``name``'s), on a client of its own."""
    client = redis_urls.parse(url, setting=redis_urls.setting_name(name)).client()
    try:
        client.ping()
    finally:
        client.close()


# Held by the up of a data dir while it runs (not by its children: the file is not inherited).
UP_LOCK = "up.lock"


@contextlib.contextmanager
def only_up(data_dir: Path) -> Iterator[None]:
    """While it runs, this is the only up of ``data_dir``; a ``CommandError`` when another runs. A
    second up emptied the metrics directory the first's children write in, and the Ctrl-C of the one
    that had started the embedded servers stopped them under the other."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / UP_LOCK, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CommandError(f"Another manage.py up runs on this data dir ({data_dir}): stop it (Ctrl-C) "
                               "first, or give this one a DUCTOR_DATA_DIR of its own.") from None
        yield


def _start_children(stack: Stack, *, port: int, options: dict[str, Any]) -> tuple[Child, list[tuple[Child, str]]]:
    """Start the web server, the workers, the dispatchers and the coordinator; returns the web server,
    and the children that beat with their heartbeat kinds."""
    web = stack.web(port=port, dev=options["dev"])
    start_workers(stack, workers=options["workers"], concurrency=options["concurrency"],
                  results_workers=options["results_workers"])
    loops = [(stack.dispatcher(f"dispatcher-{i + 1}"), heartbeats.DISPATCHER) for i in range(options["dispatchers"])]
    loops.append((stack.coordinator(), heartbeats.COORDINATOR))
    return web, loops


def start_workers(stack: Stack, *, workers: int, concurrency: int, results_workers: int) -> list[Child]:
    """``workers`` Celery workers of ``concurrency`` processes (``worker-N``) and ``results_workers``
    workers of the outcomes of task nodes alone (``results-N``); with any of the latter, the former
    take only steps and engine-internal work. Not waited for."""
    queues = list(STEP_WORKER_ARGS) if results_workers else []
    started = [stack.worker(f"worker-{i + 1}", concurrency=concurrency, extra=queues) for i in range(workers)]
    started += [stack.worker(f"results-{i + 1}", concurrency=1, extra=RESULTS_WORKER_ARGS)
                for i in range(results_workers)]
    return started


# How long a loop that stopped beating is given to stop after its SIGTERM: it is stuck (or stopped),
# not busy with a pass, which takes far less than DUCTOR_HEARTBEAT_STALE_S; and while it has it, the
# supervisor restarts no other child.
STALE_GRACE_S = 5.0


class HeartbeatWatch:
    """Restarts a looping child (coordinator, dispatcher) that lives but has not beaten for
    ``DUCTOR_HEARTBEAT_STALE_S``. A child is judged from its last (re)start, and a beat missing
    for a moment (Redis lost its data) is not a stale one: only the time since it was last seen
    beating counts. While Redis cannot be read, nobody is judged, and once it can again each child
    is judged from then: no loop could beat while Redis was away."""

    def __init__(self, stack: Stack, loops: list[tuple[Child, str]]) -> None:
        self.stack = stack
        self.loops = loops
        self._seen: dict[str, float] = {}  # child name -> time.monotonic() of its last seen beat
        self._blind = False  # the last check could not read Redis

    def check(self) -> None:
        stale_s = settings.DUCTOR_HEARTBEAT_STALE_S
        try:
            ages = {kind: heartbeats.ages(kind) for kind in {kind for _, kind in self.loops}}
        except Exception:
            self._blind = True
            return
        now = time.monotonic()
        if self._blind:
            self._blind = False
            self._seen = {child.name: now for child, _ in self.loops}
        stale: dict[Child, str] = {}
        for child, kind in self.loops:
            age = ages[kind].get(self.stack.process_name(child.name))
            seen = max(self._seen.get(child.name, 0.0), child.started_at)
            if age is not None:
                seen = max(seen, now - age)
            self._seen[child.name] = seen
            if child.alive() and now - seen > stale_s:
                stale[child] = f"has not beaten for {now - seen:.1f} s"
        if stale:  # together: one grace period for them all, however many are stuck
            self.stack.restart(stale, grace_s=STALE_GRACE_S)


def interpreter() -> str:
    """The interpreter that runs ``up``, as a command for another terminal: relative to the directory
    ``up`` runs in when below it (``.venv/bin/python``), else its whole path. Never a bare ``python``,
    which another terminal's PATH may find without Django."""
    executable = Path(sys.executable)
    return str(executable.relative_to(Path.cwd()) if executable.is_relative_to(Path.cwd()) else executable)


def children_env() -> dict[str, str]:
    """The children's environment: this process's data dir, whole (they start in the project's
    directory, where a relative ``DUCTOR_DATA_DIR`` named another, whose servers each started anew);
    and with ``PROMETHEUS_MULTIPROC_DIR`` (unless it is set already), a fresh directory in the data dir,
    where every child process writes its metrics for ``/metrics`` to merge."""
    env = {**os.environ, "DUCTOR_DATA_DIR": str(settings.DUCTOR_DATA_DIR)}
    if not env.get("PROMETHEUS_MULTIPROC_DIR"):
        directory = settings.DUCTOR_DATA_DIR / "metrics"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    return env


def pick_port(asked: int | None) -> tuple[int, str]:
    """The web server's port: ``asked`` (``--port``), which must be free on 127.0.0.1 (a
    ``CommandError`` says it is not: whoever named it expects the server there); or, none asked,
    ``DEFAULT_PORT`` when it is free, else a free one, with a note saying so (the URLs ``up`` prints
    then name that port)."""
    port = DEFAULT_PORT if asked is None else asked
    if _port_free(port):
        return port, ""
    if asked is not None:
        raise CommandError(f"Port {asked} is in use by another process: free it, or choose another port with "
                           f"--port, or leave --port out for a free one.")
    free = free_port()
    return free, (f"Port {DEFAULT_PORT} is in use by another process: the web server listens on {free} instead "
                  f'(choose one with --port, as in make up ARGS="--port 8123").')


def port_taken(web: Child, port: int) -> CommandError | None:
    """A clear error when the web server exited because ``port`` was taken (by another process, after
    ``pick_port`` found it free), None for any other failure."""
    if web.alive() or not any(text in web.output() for text in PORT_TAKEN):
        return None
    return CommandError(f"Port {port} is in use by another process, so the web server could not listen on it "
                        f'(log: {web.log_path}). Free it, or choose another port: make up ARGS="--port 8123" '
                        "(manage.py up --port 8123).")


def _port_free(port: int) -> bool:
    """Whether the web server may listen on ``port``: nothing listens there. A connection of an
    earlier server left in TIME_WAIT does not count (the bind reuses the address, as gunicorn's and
    runserver's do), so a restart keeps its port."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _admin_password() -> str:
    """The local admin's password: created once and kept in the data dir (mode 0600)."""
    path = settings.DUCTOR_DATA_DIR / "admin_password"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(12))
        path.chmod(0o600)
    password = path.read_text().strip()
    user_model = get_user_model()
    user = user_model.objects.filter(username="admin").first()
    if user is None:
        user_model.objects.create_superuser("admin", "admin@localhost", password)
    return password
