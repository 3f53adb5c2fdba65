"""What a chain step and a run's start cost the process that runs them: CPU, or instructions.

On the embedded services of ``DUCTOR_DATA_DIR`` (it FLUSHES that Redis and ends the runs left
unfinished there: ``flush_state``), with no worker running: this process starts ``RUNS`` runs of a
10-node chain of no-op actions (``bench/workflows.py``'s), timing the starts, then as many through
``POST /api/v1/runs`` (Django's request handling, the middleware, the API's authentication,
throttles and serializers, without an HTTP server), timing those, then runs their
steps as a worker's pool process runs handed-off items (``handoff.chain`` inside
``holding_enqueues``: each step's outcome, its tick, the handoff's ack and dequeue, the next
attempt's start), timing the steps. The heap is frozen first, as a worker's is
(``core/heap.py``).

Times on a shared host vary from run to run by a fifth or more. With ``--instructions`` the
measuring runs again under valgrind's callgrind, counting the instructions this process executes
in the two loops alone (the servers' are not counted): the same figure, within a few in ten
thousand, from run to run, whatever else the host is doing. That is the figure to compare two
versions of the code with; it needs ``valgrind`` on the PATH and takes a minute or two.

    DUCTOR_DATA_DIR=.ductor/bench-s .venv/bin/python bench/step_cost.py [--instructions] [--runs N]

Progress on stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import flush_state, log, setup_django

STEPS_PER_RUN = 10
WARMUP_RUNS = 5
COUNTING = "DUCTOR_BENCH_COUNTING"  # set in the process valgrind runs: toggle its counting


def _servers() -> list[psutil.Process]:
    """This process's PostgreSQL backend and the Redis server: the servers its loops keep busy."""
    from django.db import connection

    from ductor_project.core.redis import get_redis

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()
    return [psutil.Process(backend), psutil.Process(int(get_redis().info("server")["process_id"]))]


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


@contextmanager
def counted() -> Iterator[dict[str, float]]:
    """The block's CPU seconds (this process's, and its PostgreSQL backend's and Redis's: their
    work for it, on a host where nothing else uses them), and under valgrind its instructions
    (callgrind's counters, zeroed at its start and read at its end, every thread's)."""
    found: dict[str, float] = {}
    servers = _servers()
    if os.environ.get(COUNTING):
        _callgrind("--instr=on")
        _callgrind("--zero")
    began, began_servers = time.process_time(), [_cpu_s(server) for server in servers]
    yield found
    found["cpu_s"] = time.process_time() - began
    found["postgres_cpu_s"], found["redis_cpu_s"] = (
        _cpu_s(server) - before for server, before in zip(servers, began_servers, strict=True))
    if os.environ.get(COUNTING):
        report = _callgrind("-e", "Ir")
        found["instructions"] = sum(int(line.split()[-1].replace(",", "")) for line in report.splitlines()
                                    if line.strip().startswith("Th "))
        _callgrind("--instr=off")


def _callgrind(*args: str) -> str:
    return subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True,
                          text=True).stdout


def measure(runs: int) -> dict[str, Any]:
    setup_django("bench/step_cost.py")
    from django.test import Client

    from bench.workflows import make_tenant
    from ductor_project.celery import WORK_QUEUE
    from ductor_project.core.context import tenant_context
    from ductor_project.core.keys import shard_of
    from scheduling import fair_queue
    from scheduling.dispatch import handoff
    from workflows.models import WorkflowRun
    from workflows.services import run_start

    flush_state()
    tenant, key = make_tenant()
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")

    def starts(count: int) -> None:
        with tenant_context(tenant):
            for _ in range(count):
                run_start(workflow="ten")

    def api_starts(count: int) -> None:
        for _ in range(count):
            response = client.post("/api/v1/runs", {"workflow": "ten"}, content_type="application/json")
            if response.status_code != 201:
                raise SystemExit(f"POST /api/v1/runs answered {response.status_code}: {response.content!r}")

    def steps() -> None:
        with fair_queue.holding_enqueues():
            handoff.chain(None, queue=WORK_QUEUE, credit="bench", shard=shard_of(str(tenant.pk)),
                          until=time.monotonic() + 3600)

    starts(WARMUP_RUNS)  # every statement prepared, every cache filled
    api_starts(WARMUP_RUNS)
    steps()
    gc.collect()
    gc.freeze()
    with counted() as start_cost:
        starts(runs)
    with counted() as api_cost:
        api_starts(runs)
    with counted() as step_cost:
        steps()
    done = WorkflowRun.all_tenants.filter(tenant=tenant, status=WorkflowRun.Status.SUCCEEDED).count()
    if done != 2 * (runs + WARMUP_RUNS):
        raise SystemExit(f"{done} runs succeeded of {2 * (runs + WARMUP_RUNS)}: the loop did not run them all")
    found = {"cpu_ms_per_start": round(start_cost["cpu_s"] * 1000 / runs, 3),
             "cpu_ms_per_api_start": round(api_cost["cpu_s"] * 1000 / runs, 3),
             "cpu_ms_per_step": round(step_cost["cpu_s"] * 1000 / (2 * runs * STEPS_PER_RUN), 3),
             "postgres_cpu_ms_per_start": round(start_cost["postgres_cpu_s"] * 1000 / runs, 3),
             "postgres_cpu_ms_per_step": round(step_cost["postgres_cpu_s"] * 1000 / (2 * runs * STEPS_PER_RUN), 3),
             "redis_cpu_ms_per_start": round(start_cost["redis_cpu_s"] * 1000 / runs, 3),
             "redis_cpu_ms_per_step": round(step_cost["redis_cpu_s"] * 1000 / (2 * runs * STEPS_PER_RUN), 3),
             "runs": runs, "steps": 2 * runs * STEPS_PER_RUN}
    if os.environ.get(COUNTING):
        found["instructions_per_start"] = int(start_cost["instructions"]) // runs
        found["instructions_per_api_start"] = int(api_cost["instructions"]) // runs
        found["instructions_per_step"] = int(step_cost["instructions"]) // (2 * runs * STEPS_PER_RUN)
    return found


def instructions(runs: int) -> dict[str, Any]:
    """``measure`` again under callgrind (its times are then valgrind's, not the host's)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (with callgrind_control) on the PATH")
    with tempfile.TemporaryDirectory() as out:
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}/callgrind.%p",
                   sys.executable, __file__, "--runs", str(runs)]
        log(f"under callgrind ({runs} runs; a minute or two)")
        # Under callgrind the loops take minutes: a connection older than DATABASE_CONN_MAX_AGE would be
        # closed between two steps and opened again (its backend, whose CPU ``counted`` reads, gone).
        env = {**os.environ, COUNTING: "1", "DATABASE_CONN_MAX_AGE": "3600"}
        child = subprocess.run(command, env=env, capture_output=True, text=True,
                               check=False)
    if child.returncode != 0:
        raise SystemExit(f"the counted run failed:\n{child.stderr[-2000:]}")
    found: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="chains to start and run (10 steps each)")
    parser.add_argument("--instructions", action="store_true", help="count instructions under callgrind")
    args = parser.parse_args(argv)
    result = (instructions if args.instructions else measure)(args.runs)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
