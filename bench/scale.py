"""The fair broker with its queue state on a real Redis Cluster, against the same on one Redis.

In one run, on the same workers configuration (``WORKERS`` x ``CONCURRENCY``), ``DISPATCHERS``
dispatchers and ``SHARDS`` queue shards, in blocks that alternate (single, cluster, single,
cluster …: ``BENCH_SCALE_PAIRS`` pairs, 5 by default) so that a drift of the host's load
favours neither:

- **single**: the queue state on the embedded Redis, which also carries the Celery broker and
  the Django cache (the default deployment);
- **cluster**: the queue state on a fresh three-master Redis Cluster that this benchmark starts
  (``ductor_project.redis_cluster``, under ``<data dir>/scale-cluster``) and stops at the end,
  also on failure; the broker and the cache stay on the embedded Redis.

Each block starts its own workers and dispatchers on the mode's queue state, warms up, then runs
``ROUNDS`` rounds of ``TASKS`` no-op items (``bench/dispatch.py``'s round, spread evenly over
tenants chosen so that every shard has ``TENANTS_PER_SHARD`` of them), each timed from the first
enqueue until every item is acked. A mode's tasks/s is the median of its blocks'.

The Redis cost of an item comes from each server's own counters (``bench._costs.ServerSample``),
read around the measured rounds: ``redis_cpu_us_per_item`` is the microseconds that the servers
holding the queue state spent running commands (``INFO commandstats``), summed over the masters,
per item; ``redis_process_cpu_us_per_item`` the same from the servers' CPU time (``INFO cpu``),
which also counts their network work. The benchmark's own polling for the end of a round is
taken back out: its cost per poll is measured on the idle queue after each block. On the
cluster, the embedded Redis's cost per item (``broker_redis_*``) is that of the Celery broker
alone; on one Redis the two roles share one server.

``crossslot_errors`` counts the ``CROSSSLOT`` errors (``INFO errorstats``) of every master over
the whole run (goal 0); ``failed_calls`` and ``rejected_calls`` every failed command there.

Needs its own data dir (it FLUSHES Redis): ``DUCTOR_DATA_DIR=.ductor/bench-x python
bench/scale.py``. Progress on stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_stack, fair_broker, log, setup_django
from bench._costs import ServerSample, cpu_seconds
from bench.dispatch import CONCURRENCY, TASKS, WARMUP_TASKS, WORKERS, ductor_round, make_tenant, queue_idle

SHARDS = 6
MASTERS = 3
DISPATCHERS = 2
TENANTS_PER_SHARD = 2
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
PAIRS = int(os.environ.get("BENCH_SCALE_PAIRS", "5"))
IDLE_POLLS = 200  # polls of the idle queue that price the benchmark's own polling


@dataclass
class Mode:
    """Where the queue state lives: its URL, and a client of each server that holds it."""

    name: str
    url: str
    servers: dict[str, Any]
    # The processes whose CPU counts (with their descendants): this one, which starts the workers
    # and dispatchers, and the PostgreSQL and Redis servers that the benchmark runs on.
    processes: list[int]


@dataclass
class Block:
    """What one block of a mode measured."""

    mode: str
    seconds: list[float]
    # Per server of the queue state: its counters over the rounds, less the benchmark's polling.
    queue: dict[str, ServerSample] = field(default_factory=dict)
    broker: ServerSample = field(default_factory=ServerSample)
    # CPU seconds of this stack's processes over the rounds, by kind (worker, dispatcher, redis …).
    cpu_by_kind: dict[str, float] = field(default_factory=dict)

    @property
    def items(self) -> int:
        return TASKS * len(self.seconds)

    @property
    def tasks_per_s(self) -> float:
        return self.items / sum(self.seconds)


def samples(servers: dict[str, Any]) -> dict[str, ServerSample]:
    return {name: ServerSample.of(server) for name, server in servers.items()}


def shard_covering_tenants() -> list[Any]:
    """``TENANTS_PER_SHARD`` tenants on every shard (made as needed), so that each shard gets the
    same share of the items."""
    from ductor_project.core.keys import shard_of

    chosen: dict[int, list[Any]] = {shard: [] for shard in range(SHARDS)}
    n = 0
    while any(len(tenants) < TENANTS_PER_SHARD for tenants in chosen.values()):
        if n > 50 * SHARDS * TENANTS_PER_SHARD:
            raise RuntimeError("could not find tenants for every shard")
        tenant = make_tenant(f"scale-{n}")
        n += 1
        bucket = chosen[shard_of(str(tenant.pk))]
        if len(bucket) < TENANTS_PER_SHARD:
            bucket.append(tenant)
    return [tenant for tenants in chosen.values() for tenant in tenants]


def run_block(mode: Mode, broker: Any, tenants: list[Any], number: int) -> Block:
    """One block of ``mode`` on workers and dispatchers started for it, stopped afterwards."""
    from django.conf import settings

    settings.DUCTOR_QUEUE_REDIS_URL = mode.url
    for server in {id(s): s for s in [broker, *mode.servers.values()]}.values():
        server.flushdb()
    stack = bench_stack(f"scale-{number}-{mode.name}", DUCTOR_QUEUE_REDIS_URL=mode.url)
    polls = 0

    def idle() -> bool:
        nonlocal polls
        polls += 1
        return queue_idle()

    try:
        fair_broker(stack, "", workers=WORKERS, concurrency=CONCURRENCY, dispatchers=DISPATCHERS)
        ductor_round(tenants, WARMUP_TASKS, f"warm{number}")
        before, broker_before, cpu_before = samples(mode.servers), ServerSample.of(broker), cpu_seconds(mode.processes)
        seconds = [ductor_round(tenants, TASKS, f"b{number}r{r}", idle) for r in range(ROUNDS)]
        after, broker_after, cpu_after = samples(mode.servers), ServerSample.of(broker), cpu_seconds(mode.processes)
    finally:
        stack.stop_all()
    polling = polling_cost(mode)
    block = Block(mode.name, seconds, broker=broker_after - broker_before)
    for (kind, pid), used in cpu_after.items():
        block.cpu_by_kind[kind] = block.cpu_by_kind.get(kind, 0.0) + used - cpu_before.get((kind, pid), 0.0)
    for name in mode.servers:
        used = after[name] - before[name]
        # The polls were all read-only EVALSHAs: take their time back out, not their errors.
        block.queue[name] = ServerSample(
            usec=round(used.usec - polls * polling[name][0]), calls=round(used.calls - polls * polling[name][1]),
            failed_calls=used.failed_calls, rejected_calls=used.rejected_calls, errors=used.errors,
            failures=used.failures, cpu_s=max(0.0, used.cpu_s - polls * polling[name][2]),
            round_trips=round(used.round_trips - polls * polling[name][3]), connections=used.connections)
    log(f"block {number} {mode.name}: " + ", ".join(f"{TASKS / s:.0f}" for s in seconds)
        + f" tasks/s; {polls} polls")
    return block


def polling_cost(mode: Mode) -> dict[str, tuple[float, float, float, float]]:
    """Per server: (usec, calls, CPU seconds, round trips) of one poll for the end of a round, on
    the idle queue with nothing else running."""
    before = samples(mode.servers)
    for _ in range(IDLE_POLLS):
        queue_idle()
    after = samples(mode.servers)
    costs = {}
    for name in mode.servers:
        used = after[name] - before[name]
        costs[name] = (used.usec / IDLE_POLLS, used.calls / IDLE_POLLS, used.cpu_s / IDLE_POLLS,
                       used.round_trips / IDLE_POLLS)
    return costs


def shards_by_master(cluster_client: Any) -> dict[str, list[int]]:
    """Which shards each master holds: a shard's keys share the hash slot of its tag."""
    from ductor_project.core.keys import shard_tag

    held: dict[str, list[int]] = {}
    for shard in range(SHARDS):
        node = cluster_client.get_node_from_key(shard_tag(shard))
        held.setdefault(f"{node.host}:{node.port}", []).append(shard)
    return held


def per_item(sample: ServerSample, items: int) -> dict[str, float]:
    """A server's (or a sum of servers') costs per item: command CPU, process CPU, commands."""
    return {"us_per_item": round(sample.usec / items, 2),
            "process_cpu_us_per_item": round(sample.cpu_s * 1e6 / items, 2),
            "calls_per_item": round(sample.calls / items, 2),
            "round_trips_per_item": round(sample.round_trips / items, 2),
            "connections": sample.connections}


def cpu_per_item(blocks: list[Block]) -> dict[str, float]:
    """The whole system's CPU milliseconds per item over ``blocks``, by process kind, and in all."""
    items = sum(block.items for block in blocks)
    by_kind: dict[str, float] = {}
    for block in blocks:
        for kind, seconds in block.cpu_by_kind.items():
            by_kind[kind] = by_kind.get(kind, 0.0) + seconds
    return {**{kind: round(s * 1000 / items, 3) for kind, s in sorted(by_kind.items())},
            "total": round(sum(by_kind.values()) * 1000 / items, 3)}


def summary(blocks: list[Block], cluster_sample_over_run: ServerSample, held: dict[str, list[int]],
            masters: list[str]) -> dict[str, Any]:
    single = [b for b in blocks if b.mode == "single"]
    cluster = [b for b in blocks if b.mode == "cluster"]
    single_rate = statistics.median(b.tasks_per_s for b in single)
    # Each cluster block over the single block just before it: the drift of the host cancels best here.
    pair_ratios = [c.tasks_per_s / s.tasks_per_s for s, c in zip(single, cluster, strict=True)]
    cluster_rate = statistics.median(b.tasks_per_s for b in cluster)

    def total(chosen: list[Block], pick: Any) -> tuple[ServerSample, int]:
        summed = ServerSample()
        for block in chosen:
            summed = summed + pick(block)
        return summed, sum(block.items for block in chosen)

    single_queue, single_items = total(single, lambda b: sum(b.queue.values(), ServerSample()))
    cluster_queue, cluster_items = total(cluster, lambda b: sum(b.queue.values(), ServerSample()))
    cluster_broker, _ = total(cluster, lambda b: b.broker)
    by_role = {"cluster": per_item(cluster_queue, cluster_items), "single": per_item(single_queue, single_items),
               "cluster_broker_server": per_item(cluster_broker, cluster_items)}
    per_master = {}
    for master in masters:
        used, _ = total(cluster, lambda b, m=master: b.queue[m])
        per_master[master] = {"shards": held.get(master, []), "usec": used.usec, "calls": used.calls,
                              **per_item(used, cluster_items)}
    return {
        "cluster_tasks_per_s": round(cluster_rate, 1),
        "single_tasks_per_s": round(single_rate, 1),
        "cluster_vs_single_ratio": round(cluster_rate / single_rate, 3),
        "pair_ratios": [round(ratio, 3) for ratio in pair_ratios],
        "pair_ratio_median": round(statistics.median(pair_ratios), 3),
        "redis_cpu_us_per_item": {name: costs["us_per_item"] for name, costs in by_role.items()},
        "redis_process_cpu_us_per_item": {name: costs["process_cpu_us_per_item"] for name, costs in by_role.items()},
        "redis_calls_per_item": {name: costs["calls_per_item"] for name, costs in by_role.items()},
        "redis_round_trips_per_item": {name: costs["round_trips_per_item"] for name, costs in by_role.items()},
        "redis_connections": {name: costs["connections"] for name, costs in by_role.items()},
        "per_master": per_master,
        "crossslot_errors": cluster_sample_over_run.errors.get("CROSSSLOT", 0),
        "failed_calls": cluster_sample_over_run.failed_calls,
        "rejected_calls": cluster_sample_over_run.rejected_calls,
        "errors_by_kind": {kind: n for kind, n in cluster_sample_over_run.errors.items() if n},
        "failures_by_command": cluster_sample_over_run.failures,
        "cpu_ms_per_item_by_process": {"single": cpu_per_item(single), "cluster": cpu_per_item(cluster)},
        "blocks": [{"mode": b.mode, "tasks_per_s": round(b.tasks_per_s, 1)} for b in blocks],
    }


def stop_on_sigterm() -> None:
    """A SIGTERM (a run stopped from outside) unwinds like Ctrl-C does, so that the ``finally``
    blocks stop the workers, the dispatchers and the cluster."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def main() -> int:
    stop_on_sigterm()
    # Before Django reads its settings: the shards of both modes, and the queue state on the
    # embedded Redis unless a block says otherwise.
    os.environ["DUCTOR_QUEUE_SHARDS"] = str(SHARDS)
    os.environ.pop("DUCTOR_QUEUE_REDIS_URL", None)
    setup_django("bench/scale.py")
    import redis
    from django.conf import settings

    from ductor_project import embedded, redis_cluster
    from ductor_project.core.redis import get_redis

    started = time.monotonic()
    load_before = os.getloadavg()
    broker = redis.Redis.from_url(settings.REDIS_URL)
    services = embedded.read_state(Path(settings.DUCTOR_DATA_DIR))
    ours = [os.getpid(), *((services.postgres_pid, services.redis_pid) if services else ())]
    single = Mode("single", settings.REDIS_URL, {"single": broker}, ours)
    directory = Path(settings.DUCTOR_DATA_DIR) / "scale-cluster"
    log(f"starting a {MASTERS}-master Redis Cluster under {directory}")
    state = redis_cluster.start(directory, masters=MASTERS)
    try:
        masters = {f"127.0.0.1:{port}": redis.Redis(port=port) for port in state.ports}
        cluster = Mode("cluster", state.url(), masters, [*ours, *state.pids])
        over_run_start = sum(samples(masters).values(), ServerSample())
        settings.DUCTOR_QUEUE_REDIS_URL = cluster.url
        held = shards_by_master(get_redis())
        log(f"shards by master: {held}")
        settings.DUCTOR_QUEUE_REDIS_URL = single.url
        tenants = shard_covering_tenants()
        blocks: list[Block] = []
        for _ in range(PAIRS):
            for mode in (single, cluster):
                blocks.append(run_block(mode, broker, tenants, len(blocks)))
        over_run = sum(samples(masters).values(), ServerSample()) - over_run_start
        result = summary(blocks, over_run, held, list(masters))
    finally:
        redis_cluster.stop(directory)
        broker.flushdb()
    result.update({
        "items": TASKS * ROUNDS * PAIRS,
        "items_per_block": TASKS * ROUNDS,
        "blocks_per_mode": PAIRS,
        "shards": SHARDS,
        "masters": MASTERS,
        "dispatchers": DISPATCHERS,
        "workers": {"processes": WORKERS, "concurrency": CONCURRENCY},
        "tenants": len(tenants),
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]},
        "cores": os.cpu_count(),
    })
    log(f"done in {time.monotonic() - started:.0f}s")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
