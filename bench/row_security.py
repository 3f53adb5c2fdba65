"""What the second wall (PostgreSQL row-level security) costs the workflow runs.

The goal: the workflow benchmark with row-level security on keeps at least 0.9x of its throughput
without it. On the embedded services of ``DUCTOR_DATA_DIR`` (it FLUSHES that Redis), the runs per
second of ``bench/workflows.py`` (``runs_per_s``: the 10-node chain, the most database work per run,
and the one-node workflow) are measured in two modes:

- **with**: as in production. The worker (concurrency ``CONCURRENCY``), the dispatcher and the
  coordinator connect as the app role (``DATABASE_URL``) with ``DUCTOR_ROW_SECURITY=1``: the policies
  bind them, and their connections set ``role`` and ``ductor.tenant_id`` whenever the scope changes.
  This process keeps its own connection, as the app role too.
- **without**: the children connect as the tables' owner (``DATABASE_OWNER_URL``; embedded, a
  superuser, which row-level security does not bind) with ``DUCTOR_ROW_SECURITY=0``: no scope
  statements. This process switches its own connection to the owner too, and turns the setting off.

Each phase has a fresh stack (no web server: the runs start through ``workflows.services.run_start``
in this process), a fresh Redis and a tenant of its own, and starts with ``WARMUP_RUNS`` uncounted
one-node runs. The phases go ``ORDER`` (without, with, with, without): a drift that is linear in time
(a growing database, a warming host) loads both modes alike. Each figure is the median of a mode's
phases; ``ratio`` is with / without for the 10-node chain, ``ratio_1node`` for the one-node workflow.
On a host shared with other load the runs per second are noisy, so each measurement also records
the CPU time that every process of the runs (this one, the children, PostgreSQL's backends, Redis)
used per step that succeeded: ``cpu_ratio`` (with / without, 10-node) is the wall's cost in work.
Each phase also records which database roles its children's connections used (``pg_stat_activity``),
so a mode that did not take effect shows.

Needs its own data dir: ``DUCTOR_DATA_DIR=.ductor/bench-rls .venv/bin/python bench/row_security.py``.
Progress on stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_stack, log, redis_client, setup_django
from bench.workflows import (
    CONCURRENCY,
    PHASE_BUDGET_S,
    make_tenant,
    runs_per_s,
    start_pipeline,
    wait_pipeline,
    wait_until,
)
from ductor_project.stack import Stack

RUNS_1NODE, OUTSTANDING_1NODE = 200, 20
RUNS_10NODE, OUTSTANDING_10NODE = 60, 10
WARMUP_RUNS = 20
GOAL_RATIO = 0.9
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Mode:
    """How a phase reaches the database: through the wall (``row_security``) or around it."""

    name: str
    row_security: bool

    def child_env(self) -> dict[str, str]:
        """The children's login and setting: the app role with the wall, the tables' owner without."""
        from django.conf import settings

        url = settings.DATABASE_URL if self.row_security else settings.DATABASE_OWNER_URL
        return {"DATABASE_URL": url, "DUCTOR_ROW_SECURITY": "1" if self.row_security else "0"}


WITH, WITHOUT = Mode("with", row_security=True), Mode("without", row_security=False)
ORDER = (WITHOUT, WITH, WITH, WITHOUT)


@contextmanager
def this_process_in(mode: Mode) -> Iterator[None]:
    """This process's default connection as ``mode`` has it inside the block; as before, after it.
    Without the wall: the owner's login and ``DUCTOR_ROW_SECURITY`` off."""
    from django.conf import settings
    from django.db import connection

    from ductor_project.core.database.security import owner_credentials, use_credentials

    if mode.row_security:
        yield
        return
    owner = owner_credentials()
    if owner is None:
        raise RuntimeError("no DATABASE_OWNER_URL: the app role owns the tables, so nothing bypasses the wall")
    previous, row_security = use_credentials(connection, owner), settings.DUCTOR_ROW_SECURITY
    settings.DUCTOR_ROW_SECURITY = False
    try:
        yield
    finally:
        settings.DUCTOR_ROW_SECURITY = row_security
        use_credentials(connection, previous)


def database_logins() -> dict[str, Any]:
    """Whom this process is logged in as (and whether the wall binds it), and how many of the
    database's sessions each role holds."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user, rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")
        user, bypasses = cursor.fetchone() or ("?", None)
        cursor.execute("SELECT usename, count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND usename IS NOT NULL GROUP BY usename ORDER BY usename")
        sessions = dict(cursor.fetchall())
    return {"bench_user": user, "bench_bypasses_rls": bypasses, "sessions_by_role": sessions}


def cpu_ticks(stack: Stack) -> dict[int, int]:
    """CPU time (user + system, clock ticks) used so far by each process a run goes through: the
    stack's children and what they forked (their process groups), the embedded PostgreSQL server
    with its backends, the embedded Redis, and this process."""
    from django.conf import settings

    from ductor_project import embedded

    state = embedded.read_state(Path(settings.DUCTOR_DATA_DIR))
    servers = {state.postgres_pid, state.redis_pid} - {0} if state else set()
    groups = {child.proc.pid for child in stack.children if child.proc is not None}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # from the 3rd field (state) on: the name may hold spaces
        pid, ppid, group = int(entry.name), int(fields[1]), int(fields[2])
        if group in groups or pid in servers or ppid in servers or pid == os.getpid():
            ticks[pid] = int(fields[11]) + int(fields[12])
    return ticks


def measured(stack: Stack, tenant: Any, workflow: str, count: int, outstanding: int) -> dict[str, Any]:
    """``runs_per_s``, and the CPU time the processes of the runs used per step that succeeded: wall
    time depends on whatever else the host runs, CPU time per step much less."""
    from ductor_project.core.context import tenant_context
    from workflows.models import StepRun

    def steps() -> int:
        with tenant_context(tenant):
            return StepRun.objects.filter(status=StepRun.Status.SUCCEEDED).count()

    steps_before, before = steps(), cpu_ticks(stack)
    figure = runs_per_s(tenant, workflow, count, outstanding)
    after, done = cpu_ticks(stack), steps() - steps_before
    used_s = sum(ticks - before.get(pid, 0) for pid, ticks in after.items()) / CLOCK_TICKS
    return {**figure, "steps": done, "cpu_ms_per_step": round(used_s * 1000 / max(done, 1), 2)}


def phase(mode: Mode, index: int) -> dict[str, Any]:
    """One mode's runs per second on a fresh stack, Redis and tenant."""
    from ductor_project.core import capacity
    from ductor_project.core.context import tenant_context

    began = time.monotonic()
    name = f"phase {index + 1}/{len(ORDER)} ({mode.name})"
    redis_client().flushdb()
    with this_process_in(mode):
        stack = bench_stack(f"row_security/{index}-{mode.name}", **mode.child_env())
        try:
            worker, dispatcher = start_pipeline(stack)
            tenant, _ = make_tenant()
            stack.wait_ready()  # the coordinator too
            wait_pipeline(stack, worker, dispatcher)
            log(f"{name}: up in {time.monotonic() - began:.1f}s")
            runs_per_s(tenant, "one", WARMUP_RUNS, OUTSTANDING_1NODE)
            ten = measured(stack, tenant, "ten", RUNS_10NODE, OUTSTANDING_10NODE)
            one = measured(stack, tenant, "one", RUNS_1NODE, OUTSTANDING_1NODE)
            logins = database_logins()
            with tenant_context(tenant):
                wait_until(lambda: capacity.tenant_in_flight() == 0, what="the tenant's slots to come back")
        finally:
            stack.stop_all()
    log(f"{name}: 10-node {ten['runs_per_s']} runs/s ({ten['cpu_ms_per_step']} CPU ms a step), 1-node "
        f"{one['runs_per_s']} runs/s ({one['cpu_ms_per_step']} CPU ms a step), {time.monotonic() - began:.0f}s in "
        f"all; {json.dumps(logins)}")
    return {"mode": mode.name, "10node": ten, "1node": one, **logins}


def median_of(phases: list[dict[str, Any]], mode: Mode, workflow: str, figure: str = "runs_per_s") -> float:
    """The median of ``figure`` over the phases of ``mode``."""
    return round(statistics.median(p[workflow][figure] for p in phases if p["mode"] == mode.name), 2)


def main() -> int:
    setup_django("bench/row_security.py")
    logging.getLogger("workflows").setLevel(logging.WARNING)  # four lines a run of this process: keep the progress
    began = time.monotonic()
    phases = [phase(mode, index) for index, mode in enumerate(ORDER)]
    redis_client().flushdb()
    with_10, without_10 = median_of(phases, WITH, "10node"), median_of(phases, WITHOUT, "10node")
    with_1, without_1 = median_of(phases, WITH, "1node"), median_of(phases, WITHOUT, "1node")
    cpu = {f"{workflow}_{mode.name}": median_of(phases, mode, workflow, "cpu_ms_per_step")
           for workflow in ("10node", "1node") for mode in (WITH, WITHOUT)}
    load = os.getloadavg()
    log(f"done in {time.monotonic() - began:.0f}s (load average {load[0]:.1f}): with / without, 10-node "
        f"{with_10} / {without_10} runs/s, 1-node {with_1} / {without_1} runs/s; CPU ms a step {json.dumps(cpu)}")
    print(json.dumps({
        "runs_per_s_with": with_10,
        "runs_per_s_without": without_10,
        "ratio": round(with_10 / without_10, 3),
        "runs_per_s_1node_with": with_1,
        "runs_per_s_1node_without": without_1,
        "ratio_1node": round(with_1 / without_1, 3),
        "goal_ratio": GOAL_RATIO,
        # CPU time of every process of the runs per step: less at the mercy of the host's other load.
        "cpu_ms_per_step": cpu,
        "cpu_ratio": round(cpu["10node_with"] / cpu["10node_without"], 3),
        "cpu_ratio_1node": round(cpu["1node_with"] / cpu["1node_without"], 3),
        "phases": phases,
        "config": {"order": [mode.name for mode in ORDER], "concurrency": CONCURRENCY, "ten_node_shape": "chain",
                   "runs_10node": RUNS_10NODE, "outstanding_10node": OUTSTANDING_10NODE,
                   "runs_1node": RUNS_1NODE, "outstanding_1node": OUTSTANDING_1NODE, "warmup_runs": WARMUP_RUNS,
                   "phase_budget_s": PHASE_BUDGET_S, "aggregate": "median per mode",
                   "load_average_1m": round(load[0], 2), "cpus": os.cpu_count()},
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
