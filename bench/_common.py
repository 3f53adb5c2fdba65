"""What the benchmarks share: Django in this process on a data dir of its own, the timing loop, the
environment of their children (which ``ductor_project.stack.Stack`` supervises), the fair broker's
processes, percentiles, and the plain-Celery no-op baseline.

Not a benchmark itself (``run_all.py`` skips files starting with ``_``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ductor_project.stack import Child, Stack

N = TypeVar("N", int, float)

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


def bench_stack(name: str, **env: str) -> Stack:
    """A ``Stack`` for the benchmark ``name``: fresh logs under ``<data dir>/bench-logs/<name>``, children on
    this process's services (``child_env(**env)``); failures and kills reported on stderr."""
    from django.conf import settings

    return Stack(Path(settings.DUCTOR_DATA_DIR) / "bench-logs" / name, env=child_env(**env), say=log,
                 fresh_logs=True)


def bench_worker(stack: Stack, name: str, app: str = "ductor_project", *, concurrency: int,
                 tasks: bool = True, env: dict[str, str] | None = None) -> Child:
    """A prefork Celery worker without heartbeats, named ``<name>@bench``; with ``tasks``, it also has the
    benchmarks' own tasks (``bench._worker_tasks``); ``env`` on top of the stack's. Not waited for:
    ``stack.wait_ready``."""
    extra = ["--pool", "prefork", "--without-heartbeat"] + (["--include", "bench._worker_tasks"] if tasks else [])
    return stack.worker(name, app=app, concurrency=concurrency, hostname=f"{name}@bench", extra=extra,
                        env=None if env is None else {**stack.env, **env})


def fair_broker(stack: Stack, prefix: str, *, workers: int, concurrency: int, dispatchers: int,
                env: dict[str, str] | None = None) -> list[Child]:
    """Start ``workers`` Celery workers (with ``bench._worker_tasks``) and ``dispatchers`` dispatchers,
    ``env`` on top of the stack's; once every worker slot is registered and every dispatcher runs, return
    them all, dispatchers first (the order to stop them in)."""
    from ductor_project.celery import WORK_QUEUE
    from scheduling.dispatch import credits as broker

    started = [bench_worker(stack, f"{prefix}worker-{i}", concurrency=concurrency, env=env) for i in range(workers)]
    stack.wait_ready(*started)
    while broker.worker_slots(WORK_QUEUE) < workers * concurrency:
        time.sleep(0.1)
    running = [stack.dispatcher(f"{prefix}dispatcher-{i}", env=None if env is None else {**stack.env, **env})
               for i in range(dispatchers)]
    stack.wait_ready(*running)
    return running + started


def wait_until(done: Callable[[], Any], what: str, timeout: float = 120.0, every: float = 0.05) -> Any:
    """Poll ``done`` every ``every`` s until it gives something true, and return that; a
    ``RuntimeError`` naming ``what`` after ``timeout`` s. Lazy: the benchmarks' own polling shares
    the CPUs with what they measure."""
    deadline = time.monotonic() + timeout
    while not (value := done()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every)
    return value


def coordinator_passed() -> None:
    """Until a coordinator has made its first pass (it beats after each pass that worked). On a
    benchmark's flushed Redis that pass finds every shard's epoch gone and repairs every unfinished
    run at once, as after a loss of Redis's data (docs/operations.md): a run started before it
    would have its step enqueued once more, a second delivery the measurement would count."""
    from ductor_project.core import heartbeats

    wait_until(lambda: heartbeats.ages(heartbeats.COORDINATOR), what="the coordinator's first pass")


def percentile(values: Sequence[N], q: float) -> N:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def redis_client() -> Any:
    from ductor_project.core.redis import get_redis

    return get_redis()


def flush_state() -> None:
    """Flush the benchmark's Redis, and end the runs of earlier runs of it that the flush leaves
    without their queue state (otherwise the coordinator's reconciler would put them back, and
    their steps would run during the measurement)."""
    from django.utils import timezone

    from workflows.models import WorkflowRun

    redis_client().flushdb()
    WorkflowRun.all_tenants.exclude(status__in=WorkflowRun.TERMINAL).update(
        status=WorkflowRun.Status.CANCELLED, cancel_requested=True, finished_at=timezone.now())


def plain_celery_noops(count: int, wait: Callable[[Callable[[], bool]], object], *, stock: bool = False) -> float:
    """Seconds that ``count`` plain Celery no-op tasks (results ignored) take on the running workers:
    from the first publish until their queue is empty and no message is unacked, which ``wait``
    polls for. The same-run baseline of the throughput benchmarks: ``bench.noop`` on Ductor's work
    queue, run by Ductor's workers through Ductor's broker transport (which keeps no ``unacked``
    hash: the last messages, at most one per worker process, may still be running then, well under
    a millisecond); with ``stock``, ``bench.plain_noop`` on the queue of ``bench/_plain_celery.py``,
    Celery's defaults on kombu's own transport, for workers of that app."""
    if stock:
        from bench._plain_celery import QUEUE as queue
        from bench._plain_celery import app
        from bench._plain_celery import plain_noop as task
    else:
        from bench._worker_tasks import noop as task
        from ductor_project.celery import WORK_QUEUE as queue
        from ductor_project.celery import app

    redis = redis_client()
    started = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for _ in range(count):
            task.apply_async(queue=queue, producer=producer)
    wait(lambda: redis.llen(queue) == 0 and redis.hlen("unacked") == 0)
    return time.perf_counter() - started
