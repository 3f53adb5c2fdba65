"""The processes an end-to-end test module shares: one Ductor worker, a dispatcher and coordinators,
children of one ``Stack``, started on a flushed Redis and stopped when the module ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import pytest

from ductor_project.stack import Child
from tests.conftest import celery_worker_child, flush_redis, service_env, service_stack


class Processes:
    """One worker (concurrency 2), a dispatcher and ``coordinators`` coordinators."""

    def __init__(self, *, coordinators: int = 1) -> None:
        self.stack = service_stack()
        self.count = coordinators

    def start(self) -> None:
        self.worker = self.start_worker()
        self.dispatcher = self.stack.dispatcher(env=service_env())
        self.coordinators = [self.stack.coordinator(f"coordinator-{n}", env=service_env())
                             for n in range(self.count)]
        self.stack.wait_ready(self.dispatcher, *self.coordinators, timeout_s=60)

    @property
    def coordinator(self) -> Child:
        return self.coordinators[0]

    def start_worker(self) -> Child:
        return celery_worker_child(self.stack, concurrency=2)

    def restart(self, child: Child, start: Callable[[], Child]) -> Child:
        """SIGKILL ``child`` (no shutdown of any kind) and start it again."""
        child.kill()
        self.stack.stop(child)
        again = start()
        self.stack.wait_ready(again, timeout_s=60)
        return again


@contextmanager
def running_processes(*, coordinators: int = 1, env: Mapping[str, str] | None = None) -> Iterator[Processes]:
    """``Processes`` started on a flushed Redis, with ``env`` in their environment (``service_env``
    copies ``os.environ``), stopped at the end."""
    flush_redis()
    with pytest.MonkeyPatch.context() as mp:
        for name, value in (env or {}).items():
            mp.setenv(name, value)
        running = Processes(coordinators=coordinators)
        try:
            running.start()
            yield running
        finally:
            running.stack.stop_all(grace_s=20)
