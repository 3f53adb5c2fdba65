"""The one process supervisor: Ductor's children (web server, Celery workers, dispatchers, coordinator, or
any other command) for ``manage.py up``, the demo and the benchmarks.

A ``Stack`` starts each child by name, from the repository root, in a process group of its own, with its
output in ``<log dir>/<name>.log``. It guarantees:

- **nothing outlives ``stop``**: a stopped child's main process gets SIGTERM, and whatever is left of its
  process group (everything it forked) gets SIGKILL after the grace period. SIGTERM goes to the main process
  only: a Celery worker then shuts down warm and its pool finishes the tasks in hand, where a SIGTERM to the
  pool processes themselves would kill them, and the tasks with them;
- **a dead child is restarted** by ``check`` (and reported through ``say``), which is what ``up`` needs;
- **readiness is explicit**: a child is ready once a text appears in what this start of it logged (a Celery
  worker's `` ready.``) or once a URL answers (the web server); ``wait_ready`` raises ``ChildError`` with the
  log's tail when a child exits or misses its deadline instead.

It imports no app (an import contract checks it), and importing it starts nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.2
PROBE_TIMEOUT_S = 2.0
REAP_S = 5.0  # after SIGKILL, how long to wait for the main process to be reaped
LOG_TAIL = 3000


class ChildError(RuntimeError):
    """A child exited, or did not get ready in time; the message ends with the tail of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that the OS found free a moment ago (another process may take it meanwhile)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(url: str) -> bool:
    """Whether ``url`` answers with a status below 500 within ``PROBE_TIMEOUT_S``. A 401 is an answer: the
    server is up. Never raises for a connection error or a timeout."""
    try:
        return httpx.get(url, timeout=PROBE_TIMEOUT_S).status_code < 500
    except httpx.HTTPError:
        return False


def _signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _reaped(proc: subprocess.Popen[Any], timeout_s: float) -> bool:
    try:
        proc.wait(max(0.0, timeout_s))
    except subprocess.TimeoutExpired:
        return False
    return True


def stop_group(proc: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
    """Stop a process started in a process group of its own, and everything in that group, quickly:
    SIGTERM to the whole group, then SIGKILL to whatever of it is left after ``grace_s``. Not a warm
    shutdown: a Celery worker's pool processes die of the SIGTERM with the tasks in hand (``Child.stop``
    shuts a worker down warm). Returns once the process is reaped, or ``REAP_S`` after the SIGKILL."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        _reaped(proc, grace_s)
    _signal_group(proc, signal.SIGKILL)
    _reaped(proc, REAP_S)


@dataclass(eq=False)  # a child is itself: compared by identity
class Child:
    """One supervised command: its argv, environment and log file, and what says that it is ready."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    ready_text: str | None = None  # ready once this text is in what this start logged
    ready_url: str | None = None  # ready once this URL answers (``answers``)
    url: str | None = None  # where a server child serves
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0  # time.monotonic() of its last start
    _log: IO[bytes] | None = field(default=None, repr=False)
    _log_from: int = field(default=0, repr=False)

    def start(self, *, fresh_log: bool = False) -> None:
        """Start the command in a new session (so a process group of its own) with stdin closed, its output
        appended to ``log_path`` (or replacing it with ``fresh_log``). ``output`` then reads only what this
        start writes."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb" if fresh_log else "ab")  # noqa: SIM115 - closed in close()
        self._log_from = self.log_path.stat().st_size
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(  # noqa: S603 - our own commands
            self.argv, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )

    def alive(self) -> bool:
        """Whether it was started and its main process has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        """What this start of the child has logged so far."""
        with contextlib.suppress(FileNotFoundError), self.log_path.open("rb") as handle:
            handle.seek(self._log_from)
            return handle.read().decode(errors="replace")
        return ""

    def is_ready(self) -> bool:
        """Whether its ``ready_text`` was logged and its ``ready_url`` answers (True when it has neither)."""
        if self.ready_text is not None and self.ready_text not in self.output():
            return False
        return self.ready_url is None or answers(self.ready_url)

    def failure(self, what: str) -> ChildError:
        """A ``ChildError`` that says ``what`` happened to this child, with the tail of its log."""
        return ChildError(f"{self.name} {what} (log: {self.log_path}):\n{self.output()[-LOG_TAIL:]}")

    def wait_for_output(self, text: str, timeout_s: float = 90.0) -> None:
        """Return once ``text`` is in what this start logged; raise ``ChildError`` if the child exits first
        or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while text not in self.output():
            if not self.alive():
                raise self.failure(f"exited ({self.exit_code()}) before logging {text!r}")
            if time.monotonic() > deadline:
                raise self.failure(f"logged no {text!r} in {timeout_s:g} s")
            time.sleep(POLL_S)

    def terminate(self) -> None:
        """SIGTERM to its main process only (a Celery worker shuts down warm); no-op once it exited."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)

    def stop(self, grace_s: float = 15.0) -> bool:
        """Stop it alone, as ``Stack.stop`` does: SIGTERM to its main process, then SIGKILL to whatever
        is left of its process group after ``grace_s``. Returns whether it had stopped by then."""
        self.terminate()
        stopped = self.proc is None or _reaped(self.proc, grace_s)
        self.kill()
        return stopped

    def kill(self) -> None:
        """SIGKILL to whatever is left of its process group, wait for the main process, close the log."""
        if self.proc is not None:
            _signal_group(self.proc, signal.SIGKILL)
            _reaped(self.proc, REAP_S)
        self.close()

    def close(self) -> None:
        """Close its log file (idempotent)."""
        if self._log is not None:
            self._log.close()
            self._log = None

    def exit_code(self) -> int | None:
        """Its main process's exit status; None while it runs (or before it started)."""
        return None if self.proc is None else self.proc.poll()


class Stack:
    """The children of one ``up``, demo or benchmark. ``stop_all`` (in a ``finally``) leaves none of them,
    nor anything they forked, running."""

    def __init__(self, log_dir: Path, *, env: Mapping[str, str] | None = None,
                 say: Callable[[str], None] = print, fresh_logs: bool = False) -> None:
        """Children log to ``log_dir``; they get ``env`` (by default this process's environment) unless
        started with one of their own. ``say`` reports restarts and kills. With ``fresh_logs`` each start
        replaces a child's log, instead of appending to it (a restart always appends)."""
        self.log_dir = log_dir
        self.env = dict(os.environ if env is None else env)
        self.say = say
        self.fresh_logs = fresh_logs
        self.children: list[Child] = []

    # -- any child -----------------------------------------------------------------------------

    def start(self, name: str, argv: list[str], *, env: Mapping[str, str] | None = None,
              ready_text: str | None = None, ready_url: str | None = None, url: str | None = None) -> Child:
        """Start ``argv`` now as the child ``name`` (logging to ``<log dir>/<name>.log``) and supervise it.
        Raises ``ValueError`` if a child of that name is already supervised."""
        if any(child.name == name for child in self.children):
            raise ValueError(f"a child named {name!r} is already running")
        child = Child(name, argv, dict(self.env if env is None else env), self.log_dir / f"{name}.log",
                      ready_text=ready_text, ready_url=ready_url, url=url)
        self.children.append(child)
        child.start(fresh_log=self.fresh_logs)
        return child

    def check(self) -> None:
        """Restart every supervised child that died, and report it through ``say``."""
        for child in self.children:
            if child.proc is not None and not child.alive():
                code = child.proc.returncode
                child.close()
                child.restarts += 1
                self.say(f"{child.name} exited with {code}; restarting (restart #{child.restarts}, log: "
                         f"{child.log_path})")
                child.start()

    def restart(self, why: Mapping[Child, str], *, grace_s: float = 15.0) -> None:
        """Stop the supervised children that are alive but not working (``why[child]`` says how), all
        within one grace period, as ``stop`` does, and start them again; reported through ``say``. One
        period for them all: a stuck child (one stopped, or wedged, ignores its SIGTERM) holds the
        supervisor, and the children that die meanwhile, that long only once."""
        for child, reason in why.items():
            child.restarts += 1
            self.say(f"{child.name} {reason}; restarting it (restart #{child.restarts}, log: {child.log_path})")
        self._stop_within(list(why), grace_s)
        for child in why:
            child.start()

    def wait_ready(self, *children: Child, timeout_s: float = 90.0, restart: bool = False) -> None:
        """Return once every one of ``children`` (by default all) is ready. Raises ``ChildError`` when
        ``timeout_s`` passes first, or when one exits, unless ``restart``: then ``check`` restarts it and
        the wait goes on."""
        waiting = list(children or self.children)
        deadline = time.monotonic() + timeout_s
        while True:
            if restart:
                self.check()
            for child in waiting:
                if not restart and not child.alive():
                    raise child.failure(f"exited ({child.exit_code()}) before it was ready")
            waiting = [child for child in waiting if not child.is_ready()]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise waiting[0].failure(f"was not ready within {timeout_s:g} s")
            time.sleep(POLL_S)

    def stop(self, *children: Child, grace_s: float = 15.0) -> None:
        """Stop ``children``, all within one grace period: SIGTERM to each one's main process, then, after
        ``grace_s`` in total, SIGKILL to whatever is left of each one's process group (a child that had not
        exited yet is reported through ``say``). They are no longer supervised; idempotent."""
        stopping = [child for child in children if child in self.children]
        self._stop_within(stopping, grace_s)
        for child in stopping:
            self.children.remove(child)

    def _stop_within(self, children: list[Child], grace_s: float) -> None:
        """SIGTERM to each of ``children``'s main process, then, after ``grace_s`` in total, SIGKILL to
        whatever is left of each one's process group (one that had not exited is reported)."""
        for child in children:
            child.terminate()
        deadline = time.monotonic() + grace_s
        for child in children:
            if child.proc is not None and not _reaped(child.proc, deadline - time.monotonic()):
                self.say(f"{child.name} did not stop in time; killing it")
            child.kill()

    def stop_all(self, grace_s: float = 15.0) -> None:
        """``stop`` every supervised child, the newest first; idempotent."""
        self.stop(*reversed(self.children), grace_s=grace_s)

    # -- Ductor's children ---------------------------------------------------------------------

    def web(self, name: str = "web", *, port: int, workers: int = 2, dev: bool = False,
            ready_path: str = "/api/schema/", env: Mapping[str, str] | None = None) -> Child:
        """gunicorn serving ``ductor_project.wsgi`` on 127.0.0.1:``port`` with ``workers`` processes x 4
        threads (``dev``: ``runserver --noreload``). Ready once ``ready_path`` answers (below 500)."""
        url = f"http://127.0.0.1:{port}"
        argv = (
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]
            if dev
            else [sys.executable, "-m", "gunicorn", "ductor_project.wsgi:application", "--bind", f"127.0.0.1:{port}",
                  "--workers", str(workers), "--threads", "4", "--timeout", "60"]
        )
        return self.start(name, argv, env=env, ready_url=url + ready_path, url=url)

    def worker(self, name: str, *, app: str = "ductor_project", concurrency: int = 2, hostname: str | None = None,
               extra: Iterable[str] = (), env: Mapping[str, str] | None = None) -> Child:
        """``celery -A <app> worker`` at INFO with ``concurrency`` processes, without gossip or mingle, plus
        ``extra`` arguments (``--include bench._worker_tasks``). Its hostname is ``hostname``, by default
        ``<name>-<this pid>@%h``. Ready once it logs `` ready.``."""
        argv = [sys.executable, "-m", "celery", "-A", app, "worker", "--concurrency", str(concurrency),
                "--hostname", hostname or f"{name}-{os.getpid()}@%h", "--without-gossip", "--without-mingle",
                "--loglevel", "INFO", *extra]
        return self.start(name, argv, env=env, ready_text=" ready.")

    def dispatcher(self, name: str = "dispatcher", *, env: Mapping[str, str] | None = None) -> Child:
        """``manage.py run_dispatcher``. Ready once it logs ``dispatcher_started`` (at INFO). Its
        heartbeats carry ``process_name(name)``."""
        return self.start(name, [sys.executable, "manage.py", "run_dispatcher"], env=self._named(name, env),
                          ready_text="dispatcher_started")

    def coordinator(self, name: str = "coordinator", *, extra: Iterable[str] = (),
                    env: Mapping[str, str] | None = None) -> Child:
        """``manage.py run_coordinator`` plus ``extra`` arguments (``--reconcile-every 1``). Ready once it
        logs ``coordinator_started`` (at INFO). Its heartbeats carry ``process_name(name)``."""
        return self.start(name, [sys.executable, "manage.py", "run_coordinator", *extra], env=self._named(name, env),
                          ready_text="coordinator_started")

    def process_name(self, name: str) -> str:
        """The ``DUCTOR_PROCESS_NAME`` of this stack's child ``name``: unique across the stacks of
        one deployment, as a Celery worker's hostname is."""
        return f"{name}-{os.getpid()}@{socket.gethostname()}"

    def _named(self, name: str, env: Mapping[str, str] | None) -> dict[str, str]:
        return {**(self.env if env is None else env), "DUCTOR_PROCESS_NAME": self.process_name(name)}
