"""Workflow runs end to end: real web server, Celery worker, dispatcher and coordinator.

On the embedded services of ``DUCTOR_DATA_DIR`` (it FLUSHES that Redis and ends the
runs left unfinished there: ``flush_state``), with one
``celery -A ductor_project worker`` (concurrency ``CONCURRENCY``), one
``manage.py run_dispatcher``, one ``manage.py run_coordinator`` and gunicorn, all children of
``ductor_project.stack.Stack``, for one enterprise-plan tenant:

1. **Start latency** on an idle system: ``LATENCY_RUNS`` runs of a one-node (noop)
   workflow, one at a time and spaced out, each started with a real
   ``POST /api/v1/runs`` (a kept-alive HTTP connection). The latency is the first
   step's ``started_at`` (set by the worker right before the action is called) minus
   the moment the request was sent; p50 and p99. The p50 of each hop is reported
   too, from the rows' own timestamps: request → run row written (``api``), run
   row → its first step's row (``tick``: the run's first tick, in the transaction that
   starts it), step row → step started (``step_hop``: the commit, enqueue, dispatcher,
   Celery, worker, routing and admission).
2. **Runs per second**: ``RUNS_1NODE`` one-node runs and ``RUNS_10NODE`` runs of a
   10-node chain (noop), started through ``workflows.services.run_start`` by ``STARTERS``
   threads, with a fixed number unfinished at a time (new runs start as runs end); runs completed
   per second from the first start until every run is terminal. A phase stops after
   ``PHASE_BUDGET_S`` on a slow or shared host: the runs completed by then count, the
   rest are cancelled. What each phase cost the system per step (``bench/_costs.py``):
   PostgreSQL round trips and statements, Redis commands, and CPU milliseconds by process kind.
3. **The step path's round trips**, in this process before the stack starts (so that no worker
   takes the items): ``PATH_RUNS`` runs of the 10-node chain, each step's item dequeued, its
   handler run and the item acked as a worker does, counting the PostgreSQL round trips and
   statements of a step and of a run's start off the wire (``core.database.wire``: libpq's
   protocol trace), and Redis's (requests it read).
4. **Baseline**: plain Celery no-op tasks per second on the same worker
   (``bench.noop`` of ``bench/_worker_tasks.py``, passed with ``--include``):
   ``BASELINE_TASKS`` published, timed until the queue is empty and nothing unacked. The ratios
   are over this one. Ductor's worker runs them through Ductor's broker transport, which makes
   plain Celery itself faster (no emulated acks, one Redis client per channel: about 1.6 times
   on this benchmark's host). For comparison, ``stock_celery`` gives the same figure for a worker
   of Celery's defaults on kombu's own transport (``bench/_plain_celery.py``), with the
   ratios over it: what the engine does against Celery as a team runs it without Ductor.

Needs its own data dir: ``DUCTOR_DATA_DIR=.ductor/bench-w .venv/bin/python
bench/workflows.py``. Progress on stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import json
import math
import os
import queue
import statistics
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    bench_stack,
    bench_worker,
    coordinator_passed,
    flush_state,
    log,
    plain_celery_noops,
    setup_django,
    wait_until,
)
from bench._costs import Costs, redis_requests
from ductor_project.stack import Child, Stack, free_port

CONCURRENCY = 2
LATENCY_RUNS = 30
LATENCY_WARMUP = 5
LATENCY_GAP_S = 0.15
# Long enough for a steady state (a few seconds each; 40 chains and 200 runs were over in about a
# second, most of it the ramp and the tail), and, for one-node runs, enough unfinished that the
# bench's own lazy polling does not bound them: with 20, a run that ended waited up to POLL_S for
# its successor, so the phase measured about 20 / POLL_S, not the engine.
RUNS_1NODE, OUTSTANDING_1NODE = 1000, 100
RUNS_10NODE, OUTSTANDING_10NODE = 200, 10
PHASE_BUDGET_S = 20.0
STARTERS = 2  # threads starting runs (``Starters``)
BASELINE_TASKS = 3000  # a few seconds too, as the phases it is compared with
DONE_TIMEOUT_S = 60.0
PATH_RUNS = 20
POLL_S = 0.05  # the bench's own polling shares the 2 CPUs with what it measures: keep it lazy
GOAL_P50_MS = 15.0  # idle system
GOAL_P99_MS = 40.0
GOAL_STEP_RATIO = 0.5  # 10-node chain steps/s over plain Celery no-op tasks/s
GOAL_RUN_RATIO = 0.3  # 1-node runs/s over plain Celery no-op tasks/s



def ms(later: datetime, earlier: datetime | float) -> float:
    base = earlier if isinstance(earlier, float) else earlier.timestamp()
    return (later.timestamp() - base) * 1000


def make_tenant() -> tuple[Any, str]:
    from ductor_project.core.context import tenant_context
    from tenants import services
    from workflows.services import workflow_put

    tenant = services.tenant_create(slug=f"bench-wf-{uuid.uuid4().hex[:8]}", plan="enterprise")
    with tenant_context(tenant):
        _, key = services.api_key_create(name="bench", scopes=["read", "write"])
        workflow_put(name="one", spec={"nodes": [{"id": "a", "type": "action", "action": "noop"}]})
        chain = [{"id": f"n{i}", "type": "action", "action": "noop", "depends_on": [f"n{i - 1}"] if i else []}
                 for i in range(10)]
        workflow_put(name="ten", spec={"nodes": chain})
    return tenant, key


def start_latency(tenant: Any, key: str, base_url: str) -> dict[str, Any]:
    """One run at a time on an idle system: POST → first step started, and its hops."""
    import httpx

    from ductor_project.core.context import tenant_context
    from workflows.models import StepRun, WorkflowRun

    totals: list[float] = []
    hops: dict[str, list[float]] = {"api": [], "tick": [], "step_hop": []}
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=10) as client:
        for n in range(LATENCY_WARMUP + LATENCY_RUNS):
            time.sleep(LATENCY_GAP_S)  # idle: the dispatcher and the worker are waiting
            sent = time.time()
            response = client.post("/api/v1/runs", json={"workflow": "one"})
            response.raise_for_status()
            run_id = response.json()["id"]
            with tenant_context(tenant):
                # The figures come from the rows' timestamps, so a lazy poll loses no precision
                # and leaves the CPU to the processes being measured.
                wait_until(WorkflowRun.objects.filter(pk=run_id, status="succeeded").exists, what="the run",
                           every=POLL_S)
                step = StepRun.objects.get(run_id=run_id)
                run = WorkflowRun.objects.get(pk=run_id)
            if n < LATENCY_WARMUP:
                continue
            totals.append(ms(step.started_at, sent))
            hops["api"].append(ms(run.created_at, sent))
            hops["tick"].append(ms(step.created_at, run.created_at))
            hops["step_hop"].append(ms(step.started_at, step.created_at))
    ordered = sorted(totals)
    return {
        "start_latency_ms_p50": round(statistics.median(ordered), 1),
        "start_latency_ms_p99": round(ordered[math.ceil(len(ordered) * 0.99) - 1], 1),  # nearest rank
        "start_latency_ms_min": round(ordered[0], 1),
        "start_latency_hops_ms_p50": {name: round(statistics.median(v), 1) for name, v in hops.items()},
    }


class Starters:
    """``STARTERS`` threads that start runs of ``workflow`` for ``tenant`` through ``run_start``, in
    parallel as several API processes would: one thread of starts, each waiting on its round trips,
    was what bounded the one-node phase (the workers were idle half of the time). Each thread has
    its own database connection, closed when it stops."""

    def __init__(self, tenant: Any, workflow: str) -> None:
        self.tenant, self.workflow = tenant, workflow
        self._wanted: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._started: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._serve, daemon=True, name=f"starter-{n}")
                         for n in range(STARTERS)]
        for thread in self._threads:
            thread.start()

    def start(self, count: int) -> list[Any]:
        """Start ``count`` runs; their ids (each, or the exception its start raised)."""
        for _ in range(count):
            self._wanted.put(1)
        return [self._started.get() for _ in range(count)]

    def stop(self) -> None:
        for _ in self._threads:
            self._wanted.put(None)
        for thread in self._threads:
            thread.join()

    def _serve(self) -> None:
        from django.db import connection

        from ductor_project.core.context import tenant_context
        from workflows.services import run_start

        try:
            with tenant_context(self.tenant):
                while self._wanted.get() is not None:
                    try:
                        self._started.put(run_start(workflow=self.workflow)[0].pk)
                    except Exception as exc:
                        self._started.put(exc)
        finally:
            connection.close()


def runs_per_s(tenant: Any, workflow: str, count: int, outstanding: int, steps_per_run: int = 1
               ) -> dict[str, Any]:
    """Runs completed per second: ``count`` runs started through the service (by ``Starters``), at
    most ``outstanding`` unfinished at a time (new ones start as runs end), timed from the first
    start until all are terminal. Steady-state throughput, whatever the speed of the host: on
    a slow one the phase stops after ``PHASE_BUDGET_S``, the runs done by then count, and the
    rest are cancelled so that they do not load the next phase. With what the phase cost per
    step (``Costs``; the bench's own polling left out), ``steps_per_run`` steps to a run."""
    from ductor_project.core.context import tenant_context
    from workflows.models import WorkflowRun
    from workflows.services import run_cancel

    active: set[Any] = set()
    started_ids: list[Any] = []
    done = 0
    starters = Starters(tenant, workflow)
    try:
        with tenant_context(tenant):
            costs = Costs.start()
            started = time.perf_counter()
            deadline = started + PHASE_BUDGET_S
            while done < count and time.perf_counter() < deadline:
                for run_id in starters.start(min(outstanding - len(active), count - len(started_ids))):
                    if isinstance(run_id, Exception):
                        raise run_id
                    active.add(run_id)
                    started_ids.append(run_id)
                with costs.exclude():
                    ended = set(WorkflowRun.objects.filter(pk__in=active, status__in=WorkflowRun.TERMINAL)
                                .values_list("pk", flat=True))
                active -= ended
                done += len(ended)
                time.sleep(POLL_S)
            elapsed = time.perf_counter() - started
            cost = costs.per(done * steps_per_run)
    finally:
        starters.stop()
    with tenant_context(tenant):
        runs = WorkflowRun.objects.filter(pk__in=started_ids)
        failed = runs.filter(status__in=WorkflowRun.TERMINAL).exclude(status="succeeded").count()
        for run in runs.exclude(status__in=WorkflowRun.TERMINAL):
            run_cancel(run=run)
        wait_until(lambda: not runs.exclude(status__in=WorkflowRun.TERMINAL).exists(), what="the cancellations")
    if failed:
        raise RuntimeError(f"{failed} '{workflow}' runs did not succeed")
    return {"runs_per_s": round(done / elapsed, 2), "completed": done, "wanted": count,
            "outstanding": outstanding, "seconds": round(elapsed, 2),
            "steps_per_s": round(done * steps_per_run / elapsed, 1), "costs": cost}


def step_path(tenant: Any) -> dict[str, Any]:
    """The round trips of one step, and of a run's start, driven in this process (see the module
    docs); no worker may be running."""
    from ductor_project.core.context import no_tenant, tenant_context
    from ductor_project.core.database.wire import Wire, wire
    from ductor_project.core.keys import shard_of
    from scheduling import fair_queue
    from scheduling.dispatch.delivery import Delivery
    from scheduling.dispatch.handlers import handler_for
    from workflows.services import run_start

    steps, starts = Wire(), Wire()
    count = redis_steps = 0

    def dequeued() -> Any:
        with no_tenant():  # the dispatcher's side of the queue
            return fair_queue.dequeue(shard=shard_of(str(tenant.pk)), lease_ms=60_000)

    with tenant_context(tenant):
        for _ in range(PATH_RUNS):
            with wire(starts):
                run_start(workflow="ten")
            while item := dequeued():
                delivery = Delivery.of(item)
                before = redis_requests()[0]
                with wire(steps):
                    handler_for(delivery.kind)(delivery.context(tenant), delivery.body)  # type: ignore[misc]
                redis_steps += redis_requests()[0] - before - 1  # less the INFO that read it
                fair_queue.ack(item.item_id, delivery=item.delivery, tenant=tenant)
                count += 1
    return {"pg_roundtrips_per_step": round(steps.round_trips / max(count, 1), 2),
            "pg_statements_per_step": round(steps.executed / max(count, 1), 2),
            "pg_roundtrips_per_start": round(starts.round_trips / PATH_RUNS, 2),
            # A worker's handoff that acks the item and takes the next is one more.
            "redis_roundtrips_per_step": round(redis_steps / max(count, 1), 2),
            "items": count, "runs": PATH_RUNS}


def baseline_celery(count: int, *, stock: bool = False) -> float:
    """Plain Celery no-op tasks per second on the same worker (with ``stock``, on the running worker of
    ``bench/_plain_celery.py``)."""
    return count / plain_celery_noops(count, lambda done: wait_until(done, what="the no-op tasks"), stock=stock)


def stock_baseline(stack: Stack, count: int) -> float:
    """``baseline_celery`` on a worker of Celery's defaults (kombu's own transport), of the same
    concurrency, started for it and warmed up first."""
    from django.conf import settings

    os.environ["REDIS_URL"] = settings.REDIS_URL  # the broker of bench/_plain_celery.py
    worker = bench_worker(stack, "stock-worker", "bench._plain_celery", concurrency=CONCURRENCY, tasks=False)
    stack.wait_ready(worker)
    baseline_celery(count // 10, stock=True)  # its pool processes' first tasks
    return baseline_celery(count, stock=True)


def start_children(stack: Stack, *, port: int) -> tuple[Child, Child, Child]:
    """The web server, then ``start_pipeline``; returns the web server, the worker and the dispatcher.
    Not waited for: ``wait_ready``."""
    web = stack.web(port=port)
    return web, *start_pipeline(stack)


def start_pipeline(stack: Stack) -> tuple[Child, Child]:
    """One worker (with ``bench._worker_tasks``), one dispatcher and the coordinator; returns the worker
    and the dispatcher. Not waited for: ``wait_pipeline``."""
    worker = bench_worker(stack, "worker-0", concurrency=CONCURRENCY)
    dispatcher = stack.dispatcher("dispatcher-0")
    stack.coordinator("coordinator-0")
    return worker, dispatcher


def wait_pipeline(stack: Stack, worker: Child, dispatcher: Child) -> None:
    """Until the dispatcher runs and the worker's slots are registered."""
    from ductor_project.celery import WORK_QUEUE
    from scheduling.dispatch import credits as broker

    stack.wait_ready(dispatcher, worker)
    wait_until(lambda: broker.worker_slots(WORK_QUEUE) >= CONCURRENCY, what="the worker's slots")
    coordinator_passed()


def wait_ready(stack: Stack, web: Child, worker: Child, dispatcher: Child) -> None:
    """Until ``wait_pipeline`` is through and the web server answers."""
    wait_pipeline(stack, worker, dispatcher)
    stack.wait_ready(web)  # the schema it polls is slow to build on a busy host


def main() -> int:
    setup_django("bench/workflows.py")
    from ductor_project.core import capacity
    from ductor_project.core.context import tenant_context

    began = time.monotonic()
    flush_state()
    tenant, key = make_tenant()
    path = step_path(tenant)
    log(f"the step path: {json.dumps(path)}")
    stack = bench_stack("workflows")
    try:
        web, worker, dispatcher = start_children(stack, port=free_port())
        wait_ready(stack, web, worker, dispatcher)
        log(f"up in {time.monotonic() - began:.1f}s; measuring start latency ({LATENCY_RUNS} runs)")
        latency = start_latency(tenant, key, str(web.url))
        log(f"start latency: {json.dumps(latency)}")
        one = runs_per_s(tenant, "one", RUNS_1NODE, OUTSTANDING_1NODE)
        log(f"1-node: {json.dumps(one)}")
        ten = runs_per_s(tenant, "ten", RUNS_10NODE, OUTSTANDING_10NODE, steps_per_run=10)
        log(f"10-node chain: {json.dumps(ten)}")
        baseline = baseline_celery(BASELINE_TASKS)
        log(f"plain Celery: {baseline:.0f} no-op tasks/s; now on kombu's own transport")
        stock = stock_baseline(stack, BASELINE_TASKS)
        log(f"plain Celery, stock: {stock:.0f} no-op tasks/s")
        with tenant_context(tenant):
            wait_until(lambda: capacity.tenant_in_flight() == 0, what="the tenant's slots to come back")
    finally:
        stack.stop_all()
    load = os.getloadavg()
    log(f"done in {time.monotonic() - began:.0f}s (load average {load[0]:.1f})")
    print(json.dumps({
        "steps_per_s_10node": ten["steps_per_s"],
        "runs_per_s_1node": one["runs_per_s"],
        "runs_per_s_10node": ten["runs_per_s"],
        "baseline_celery_tasks_per_s": round(baseline, 1),
        "step_ratio": round(ten["steps_per_s"] / baseline, 3),
        "run_ratio": round(one["runs_per_s"] / baseline, 3),
        **latency,
        # The step path's round trips, counted in this process; what the 10-node chain cost the
        # whole system per step (the 1-node phase's costs are under "phases").
        "pg_roundtrips_per_step": path["pg_roundtrips_per_step"],
        "redis_roundtrips_per_step": path["redis_roundtrips_per_step"],
        "step_path": path,
        "pg_statements_per_step": ten["costs"].get("pg_statements_per_step"),
        "cpu_ms_per_step": ten["costs"]["cpu_ms_per_step"],
        "goals": {"step_ratio": GOAL_STEP_RATIO, "run_ratio": GOAL_RUN_RATIO,
                  "start_latency_ms_p50": GOAL_P50_MS, "start_latency_ms_p99": GOAL_P99_MS},
        "stock_celery": {"tasks_per_s": round(stock, 1), "step_ratio": round(ten["steps_per_s"] / stock, 3),
                         "run_ratio": round(one["runs_per_s"] / stock, 3)},
        "phases": {"1node": one, "10node": ten},
        "config": {"concurrency": CONCURRENCY, "latency_runs": LATENCY_RUNS, "ten_node_shape": "chain",
                   "phase_budget_s": PHASE_BUDGET_S, "baseline_tasks": BASELINE_TASKS,
                   "load_average_1m": round(load[0], 2), "cpus": os.cpu_count()},
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
