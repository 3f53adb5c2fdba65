"""What a phase of a benchmark cost the whole system: PostgreSQL statements and round trips, Redis
commands, and CPU time by process kind, read before and after it.

- **PostgreSQL**, from ``pg_stat_statements`` (the embedded server loads it; a server given by
  ``DATABASE_URL`` must too, else these figures are absent): every call of every statement of
  Ductor's database, by every role. ``statements`` counts them all (a pipelined batch sends
  several in one round trip: ``core.database.wire`` counts those, in this process); ``queries`` leaves
  out transaction control (``BEGIN``, ``COMMIT``, savepoints) and the session's tenant and role
  settings. The foreign-key checks PostgreSQL runs inside an ``INSERT`` (``SELECT 1 FROM ONLY
  ... FOR KEY SHARE``) are not sent by anyone: they are counted apart, as ``fk_checks``.
- **Redis**, from ``INFO stats``: ``roundtrips`` are the requests the server read from its
  clients (``total_reads_processed``: a pipeline or a script is one), ``commands`` the commands it
  ran (``total_commands_processed``, each command inside a script included).
- **One Redis server's own counters** (``ServerSample``), for a benchmark that watches each server
  of a cluster: from ``INFO commandstats`` the calls and the microseconds of CPU each command took
  inside the server, with its ``failed_calls`` and ``rejected_calls``; from ``INFO errorstats`` the
  errors by kind (``CROSSSLOT``, ``MOVED`` …); from ``INFO cpu`` the server process's CPU time,
  which also counts reading and writing the sockets (``commandstats`` counts only running the
  commands); from ``INFO stats`` the requests it read (round trips) and the connections it
  accepted. The ``INFO`` requests that read them are left out of the commands and round trips.
- **CPU**, from each process's user and system time (``psutil``), grouped by kind: Ductor's Celery
  worker (its pool processes included), a results worker (``results_worker``: the outcomes of task
  nodes alone), a team's own Celery worker (``team_worker``), the
  dispatcher, the coordinator, the web server, the PostgreSQL backends, Redis, and this benchmark
  process itself (which starts the runs and polls for their end).

The benchmark's own polling would count too: ``Costs.exclude()`` wraps it and takes its
statements (counted in this process) back out.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psutil

from ductor_project.celery import RESULTS_QUEUE

CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "SET ", "SELECT set_config(")


def _kind(process: psutil.Process) -> str | None:
    """Which part of the system ``process`` is, or None for none of it."""
    try:
        name, cmdline = process.name(), " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    if process.pid == os.getpid():
        return "bench"
    if name.startswith("postgres") or cmdline.startswith("postgres:"):
        return "postgres"
    if "redis-server" in name or "redis-server" in cmdline:
        return "redis"
    if "celery" in cmdline and "ductor_project" not in cmdline:
        return "team_worker"  # a team's own Celery app (bench/tasks.py), not Ductor's
    if "celery" in cmdline and RESULTS_QUEUE in cmdline.split():
        return "results_worker"  # a worker of the outcomes of task nodes alone
    for marker, kind in (("celery", "worker"), ("run_dispatcher", "dispatcher"),
                         ("run_coordinator", "coordinator"), ("gunicorn", "web")):
        if marker in cmdline:
            return kind
    return None


def _process_trees(roots: Iterable[int]) -> Iterator[psutil.Process]:
    """The processes ``roots`` and all their descendants that still run."""
    for pid in roots:
        try:
            root = psutil.Process(pid)
            yield root
            yield from root.children(recursive=True)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue


def cpu_seconds(roots: Iterable[int] | None = None) -> dict[tuple[str, int], float]:
    """The CPU seconds each process of the system has used so far, by (kind, pid). With ``roots``,
    only those processes and their descendants count: on a host that runs other copies of the
    system (another checkout's servers and workers), they would count too."""
    seen: dict[tuple[str, int], float] = {}
    for process in psutil.process_iter() if roots is None else _process_trees(roots):
        kind = _kind(process)
        if kind is None:
            continue
        try:
            times = process.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        seen[(kind, process.pid)] = times.user + times.system
    return seen


def _is_fk_check(query: str) -> bool:
    return "FROM ONLY" in query and "FOR KEY SHARE OF" in query


def pg_calls() -> tuple[int, int, int] | None:
    """(the statements clients sent, those of them that are not transaction control or session
    settings, the foreign-key checks inside them) so far in Ductor's database; None when
    ``pg_stat_statements`` is not there to ask."""
    import psycopg
    from django.conf import settings

    url = settings.DATABASE_OWNER_URL or settings.DATABASE_URL
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT query, calls FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
                "WHERE d.datname = current_database()"
            ).fetchall()
    except psycopg.Error:
        return None
    checks = sum(int(calls) for query, calls in rows if _is_fk_check(str(query)))
    every = sum(int(calls) for _, calls in rows) - checks
    control = sum(int(calls) for query, calls in rows if str(query).lstrip().upper().startswith(
        tuple(c.upper() for c in CONTROL)))
    return every, every - control, checks


def redis_requests() -> tuple[int, int]:
    """(the requests read from clients, the commands run) by the queue's Redis so far."""
    from ductor_project.core.redis import get_redis

    stats = get_redis().info("stats")
    return int(stats["total_reads_processed"]), int(stats["total_commands_processed"])


@dataclass(frozen=True)
class ServerSample:
    """One Redis server's counters at a moment (see the module's docstring); two samples subtract."""

    usec: int = 0
    calls: int = 0
    failed_calls: int = 0
    rejected_calls: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    # Failed and rejected calls by command: which command an error came from.
    failures: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0
    round_trips: int = 0
    connections: int = 0

    @classmethod
    def of(cls, server: Any) -> ServerSample:
        """The counters of ``server``, a client of that one server (not a cluster client)."""
        commands = {name.removeprefix("cmdstat_"): stats for name, stats in server.info("commandstats").items()}
        # The INFO requests are the sample's own.
        counted = [stats for name, stats in commands.items() if name != "info"]
        cpu = server.info("cpu")
        errors = server.info("errorstats")
        stats = server.info("stats")
        return cls(
            usec=sum(int(stats["usec"]) for stats in counted),
            calls=sum(int(stats["calls"]) for stats in counted),
            failed_calls=sum(int(stats.get("failed_calls", 0)) for stats in counted),
            rejected_calls=sum(int(stats.get("rejected_calls", 0)) for stats in counted),
            errors={name.removeprefix("errorstat_"): int(counts["count"]) for name, counts in errors.items()},
            failures={name: int(counts.get("failed_calls", 0)) + int(counts.get("rejected_calls", 0))
                      for name, counts in commands.items()
                      if int(counts.get("failed_calls", 0)) + int(counts.get("rejected_calls", 0))},
            cpu_s=float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            round_trips=int(stats["total_reads_processed"]) - 4,  # less this sample's four INFO requests
            connections=int(stats["total_connections_received"]),
        )

    def __sub__(self, earlier: ServerSample) -> ServerSample:
        return self._combined(earlier, -1)

    def __add__(self, other: ServerSample) -> ServerSample:
        return self._combined(other, 1)

    def _combined(self, other: ServerSample, sign: int) -> ServerSample:
        kinds = sorted(set(self.errors) | set(other.errors))
        commands = sorted(set(self.failures) | set(other.failures))
        return ServerSample(
            usec=self.usec + sign * other.usec,
            calls=self.calls + sign * other.calls,
            failed_calls=self.failed_calls + sign * other.failed_calls,
            rejected_calls=self.rejected_calls + sign * other.rejected_calls,
            errors={kind: self.errors.get(kind, 0) + sign * other.errors.get(kind, 0) for kind in kinds},
            failures={name: self.failures.get(name, 0) + sign * other.failures.get(name, 0) for name in commands},
            cpu_s=self.cpu_s + sign * other.cpu_s,
            round_trips=self.round_trips + sign * other.round_trips,
            connections=self.connections + sign * other.connections,
        )


@dataclass
class Costs:
    """The costs of the system between ``start()`` and ``per(units)``."""

    cpu: dict[tuple[str, int], float] = field(default_factory=dict)
    pg: tuple[int, int, int] | None = None
    redis: tuple[int, int] = (0, 0)
    excluded_statements: int = 0

    @classmethod
    def start(cls) -> Costs:
        return cls(cpu=cpu_seconds(), pg=pg_calls(), redis=redis_requests())

    @contextmanager
    def exclude(self) -> Iterator[None]:
        """Leave the statements this process runs inside the block out of the figures."""
        from django.db import connection

        def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            self.excluded_statements += 1
            return execute(sql, params, many, context)

        with connection.execute_wrapper(count):
            yield

    def per(self, units: int) -> dict[str, Any]:
        """The costs since ``start()`` per unit (a step), as the benchmark's JSON prints them."""
        units = max(units, 1)
        now_cpu, now_pg, now_redis = cpu_seconds(), pg_calls(), redis_requests()
        by_kind: dict[str, float] = {}
        for key, seconds in now_cpu.items():
            by_kind[key[0]] = by_kind.get(key[0], 0.0) + seconds - self.cpu.get(key, 0.0)
        figures: dict[str, Any] = {
            # Less the two INFO requests that read the figures.
            "redis_roundtrips_per_step": round((now_redis[0] - self.redis[0] - 2) / units, 2),
            "redis_commands_per_step": round((now_redis[1] - self.redis[1] - 2) / units, 2),
            "cpu_ms_per_step": {kind: round(s * 1000 / units, 2) for kind, s in sorted(by_kind.items())},
            "cpu_ms_per_step_total": round(sum(by_kind.values()) * 1000 / units, 2),
        }
        if self.pg is not None and now_pg is not None:
            # Less the benchmark's own: its polling, and the one query that read the figures at start.
            every = now_pg[0] - self.pg[0] - self.excluded_statements - 1
            statements = now_pg[1] - self.pg[1] - self.excluded_statements - 1
            figures["pg_statements_per_step"] = round(every / units, 2)
            figures["pg_queries_per_step"] = round(statements / units, 2)
            figures["pg_fk_checks_per_step"] = round((now_pg[2] - self.pg[2]) / units, 2)
        return figures
