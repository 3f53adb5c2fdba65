"""The whole Ductor stack as child processes: web server, Celery workers, dispatchers, coordinator.

``Stack`` starts each child in its own process group, restarts a child that
dies (and says so), and stops every child on ``stop()`` — SIGTERM first, then
SIGKILL after a grace period. ``manage.py up`` and the demo use it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def stop_group(proc: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
    """Stop a child started in a process group of its own: SIGTERM to the group (a Celery
    worker shuts down warm), then SIGKILL to whatever of the group is left after ``grace_s``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    _log: object = field(default=None, repr=False)

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(  # noqa: S603 - our own commands
            self.argv, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
            self._log = None


class Stack:
    """Supervises the children of one Ductor stack."""

    def __init__(self, *, data_dir: Path, port: int, workers: int = 1, worker_concurrency: int = 2,
                 dispatchers: int = 1, web_workers: int = 2, dev: bool = False,
                 extra_env: dict[str, str] | None = None, say: Callable[[str], None] = print) -> None:
        self.say = say
        logs = data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, **(extra_env or {}))
        python = sys.executable
        web = (
            [python, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]
            if dev
            else [python, "-m", "gunicorn", "ductor_project.wsgi:application", "--bind", f"127.0.0.1:{port}",
                  "--workers", str(web_workers), "--threads", "4", "--timeout", "60"]
        )
        self.children = [Child("web", web, logs / "web.log", env)]
        for i in range(workers):
            self.children.append(Child(
                f"worker-{i + 1}",
                [python, "-m", "celery", "-A", "ductor_project", "worker", "--concurrency", str(worker_concurrency),
                 "--hostname", f"worker-{i + 1}-{os.getpid()}@%h", "--without-gossip", "--without-mingle",
                 "--loglevel", "INFO"],
                logs / f"worker-{i + 1}.log", env,
            ))
        for i in range(dispatchers):
            self.children.append(Child(f"dispatcher-{i + 1}", [python, "manage.py", "run_dispatcher"],
                                       logs / f"dispatcher-{i + 1}.log", env))
        self.children.append(Child("coordinator", [python, "manage.py", "run_coordinator"],
                                   logs / "coordinator.log", env))

    def start(self) -> None:
        for child in self.children:
            child.start()

    def check(self) -> None:
        """Restart every child that died, and report it."""
        for child in self.children:
            if child.proc is not None and not child.alive():
                code = child.proc.returncode
                child.close()
                child.restarts += 1
                self.say(f"{child.name} exited with {code}; restarting (restart #{child.restarts}, log: "
                         f"{child.log_path})")
                child.start()

    def stop(self, grace_s: float = 15.0) -> None:
        # SIGTERM to each child's main process only: a Celery worker then shuts down warm,
        # letting its pool finish the tasks in hand. What is left of a group is killed below.
        for child in self.children:
            if child.alive() and child.proc is not None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"{child.name} did not stop in time; killing it")
            child.signal(signal.SIGKILL)  # whatever is left of its process group
            child.proc.wait(5)
            child.close()
