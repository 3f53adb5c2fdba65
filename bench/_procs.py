"""Helpers of the end-to-end benchmarks: Django in this process, and child processes (Celery
workers, dispatchers) on the same embedded services, each in its own process group so that
``Processes.stop_all`` can end it and everything it forked.

Not a benchmark itself (``run_all.py`` skips files starting with ``_``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ductor_project.stack import stop_group

ROOT = Path(__file__).resolve().parent.parent


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure(step: Callable[[int], object], seconds: float) -> tuple[int, float]:
    """Run ``step`` back to back for ``seconds``; returns (operations, elapsed seconds)."""
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        step(count)
        count += 1
    return count, time.perf_counter() - start


def setup_django(name: str) -> None:
    """Refuse to run without a data dir of its own (the benchmark flushes Redis); migrate; set up Django."""
    if "DUCTOR_DATA_DIR" not in os.environ:
        log(f"{name} flushes its Redis: set DUCTOR_DATA_DIR (e.g. .ductor/bench)")
        raise SystemExit(2)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ductor_project.settings")
    import django

    from ductor_project import embedded

    embedded.boot()

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child on this process's services (no second embedded start)."""
    from django.conf import settings

    env = dict(os.environ)
    env.update(
        DATABASE_URL=settings.DATABASE_URL,
        REDIS_URL=settings.REDIS_URL,
        DUCTOR_DATA_DIR=str(settings.DUCTOR_DATA_DIR),
        DJANGO_SETTINGS_MODULE=os.environ["DJANGO_SETTINGS_MODULE"],
        SECRET_KEY=settings.SECRET_KEY,
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    )
    env.update(extra)
    return env


class Child:
    """One child process in its own session; its output goes to a log file."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._out, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited early ({self.proc.returncode}):\n{self.output()[-3000:]}")
            if text in self.output():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: no {text!r} after {timeout}s:\n{self.output()[-3000:]}")

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM the process group (warm shutdown), SIGKILL what is left of it."""
        stop_group(self.proc, grace_s=timeout)
        self._out.close()


class Processes:
    """The children of a benchmark; ``stop_all`` (in a ``finally``) ends every one, newest first."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> Child:
        child = Child(name, cmd, env, self.log_dir)
        self.children.append(child)
        return child

    def stop(self, child: Child) -> None:
        child.stop()
        self.children.remove(child)

    def stop_all(self) -> None:
        while self.children:
            self.stop(self.children[-1])

    def celery_worker(self, name: str, app: str, *, concurrency: int, env: dict[str, str],
                      extra: tuple[str, ...] = ()) -> Child:
        cmd = [
            sys.executable, "-m", "celery", "-A", app, "worker", "--loglevel", "INFO",
            "--concurrency", str(concurrency), "--pool", "prefork", "--without-gossip", "--without-mingle",
            "--without-heartbeat", "--hostname", f"{name}@bench", *extra,
        ]
        return self.start(name, cmd, env)

    def dispatcher(self, name: str, env: dict[str, str]) -> Child:
        return self.start(name, [sys.executable, "manage.py", "run_dispatcher"], env)

    def fair_broker(self, prefix: str, *, workers: int, concurrency: int, dispatchers: int,
                    env: dict[str, str]) -> list[Child]:
        """Start ``workers`` Celery workers (with ``bench._worker_tasks``) and ``dispatchers``
        dispatchers; once every worker slot is registered and every dispatcher runs, return
        them all, dispatchers first (the order to stop them in)."""
        from ductor_project.celery import WORK_QUEUE
        from scheduling.dispatch import credits as broker

        started = [
            self.celery_worker(f"{prefix}worker-{i}", "ductor_project", concurrency=concurrency, env=env,
                               extra=("--include", "bench._worker_tasks"))
            for i in range(workers)
        ]
        wait_ready(*started)
        while broker.worker_slots(WORK_QUEUE) < workers * concurrency:
            time.sleep(0.1)
        running = [self.dispatcher(f"{prefix}dispatcher-{i}", env) for i in range(dispatchers)]
        for dispatcher in running:
            dispatcher.wait_for_output("dispatcher_started")
        return running + started


def wait_ready(*workers: Child, timeout: float = 90) -> None:
    for worker in workers:
        worker.wait_for_output(" ready.", timeout)


def percentile(values: list[int], q: float) -> int:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def redis_client() -> Any:
    from ductor_project.core.redis import get_redis

    return get_redis()


def plain_celery_noops(count: int, wait: Callable[[Callable[[], bool]], object]) -> float:
    """Seconds that ``count`` plain Celery no-op tasks (``bench.noop``, results ignored) take on
    the running workers: from the first publish until the work queue is empty and no message is
    unacked, which ``wait`` polls for. The same-run baseline of the throughput benchmarks."""
    from bench._worker_tasks import noop
    from ductor_project.celery import WORK_QUEUE, app

    redis = redis_client()
    started = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for _ in range(count):
            noop.apply_async(queue=WORK_QUEUE, producer=producer)
    wait(lambda: redis.llen(WORK_QUEUE) == 0 and redis.hlen("unacked") == 0)
    return time.perf_counter() - started
