"""Changing the number of fair-queue shards while the system runs: moving tenants between shards.

A tenant's shard is its pin in the shard map, else the jump hash of its id over the count in force
(``ductor_project.core.keys``). ``manage.py queue_reshard --shards N`` changes the count:

1. ``start``: in one write of the map, the count in force becomes ``N`` and every tenant whose
   shard that changes is pinned where it is, so no process, with the old map or the new one,
   looks for it anywhere else; the shards served become ``0 .. max(old, new) - 1``.
2. ``move_tenant`` for each of them, to its shard under ``N``; then its pin goes.
3. ``finish``: once no tenant is left on the shards ``N`` and above, only ``0 .. N - 1`` are served.

A move of one tenant from shard ``a`` to ``b`` runs these steps, each recorded in the map
(``move:<tenant>``) before the next starts and each safe to run again, so that a move that was
killed half-way is finished by running the command again (``resume``):

- ``fence`` (reshard_out.lua, atomic in ``a``'s slot): the tenant's fence in ``a`` says ``MOVING``
  (every tenant-side script there now answers that, and its caller waits: ``tenant_moves``), and
  the tenant leaves ``a``'s indexes (ready, timers, parked, in flight, queue shares, backlog), what
  they held of it kept in its own key ``fq:moved-out``. The dispatchers of ``a`` no longer see it.
- ``copy``: its keys in ``a`` (a SCAN of its prefix on the node that holds ``a``'s slot) are copied
  under ``b``'s names by ``DUMP``/``RESTORE REPLACE`` with their TTLs (the values name no key but
  the lease records', which the next step renames); any key of it left in ``b`` is dropped first.
- ``index`` (reshard_in.lua, atomic in ``b``'s slot): it enters ``b``'s indexes, its tags placed
  relative to ``b``'s virtual time, its leases with their ends (the reaper and acks work there).
- ``map``: its pin says ``b`` (or goes, when ``b`` is its hash under the count in force).
- ``moved``: its fence in ``a`` says ``MOVED b``: a process whose map is older goes to ``b`` at once.
- ``clean``: its keys in ``a`` go, but the fence; the move's record goes.

The tenant's operations wait from ``fence`` to ``map`` (``MoveReport.paused_s``). The fence stays in
``a`` (one small key) for processes that read the map before the move; a move of the tenant back
into ``a`` drops it.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from redis.exceptions import ResponseError

from ductor_project.core.keys import (
    MOVE,
    PIN,
    ShardMap,
    fence_key,
    hashed_shard,
    queue_shards,
    read_shard_map,
    redis_key,
    shard_map_key,
    shard_tag,
    tenant_shard_prefix,
)
from ductor_project.core.redis import get_redis, on_node
from ductor_project.core.tenant_moves import redirect_of
from scheduling import fair_queue
from scheduling.coordinator.epoch import epoch_key
from tenants.models import Tenant

# The steps of a move, in order (module docstring); a move's record names the next one to run.
STEPS = ("fence", "copy", "index", "map", "moved", "clean")
# Keys read or written per round trip while copying or deleting a tenant's keys.
KEYS_PER_CALL = 500
# The most shards a count may name: a Redis Cluster has 16384 slots, and a shard is one. The
# settings refuse a DUCTOR_QUEUE_SHARDS above it too.
MAX_SHARDS = 16384


class ReshardError(RuntimeError):
    """A reshard or a move cannot go on as asked (its message says why); nothing was left half-done
    that running it again would not finish."""


@dataclass(frozen=True)
class Move:
    """A tenant's move from shard ``source`` to ``target``; ``step`` is the next one to run."""

    tenant_id: str
    source: int
    target: int
    step: str

    def record(self) -> str:
        return f"{self.source}>{self.target}:{self.step}"

    @classmethod
    def parse(cls, tenant_id: str, record: str) -> Move:
        shards, step = record.split(":")
        source, target = shards.split(">")
        return cls(tenant_id, int(source), int(target), step)


@dataclass(frozen=True)
class MoveReport:
    """A finished move: ``paused_s`` is how long the tenant's operations waited (fence to map),
    ``seconds`` the whole move; ``keys`` its keys copied, ``items`` its items (waiting or in flight)."""

    tenant_id: str
    source: int
    target: int
    keys: int
    items: int
    paused_s: float
    seconds: float


@dataclass(frozen=True)
class Plan:
    """What ``start`` would do for ``count``: the count before, and the tenants whose shard changes
    (tenant id, its shard now, its shard under ``count``)."""

    before: int
    count: int
    moves: tuple[tuple[str, int, int], ...]


def _probe(tenant_id: str) -> Tenant:
    """A tenant of that id for the key builders, which read only its id (no row is read)."""
    return Tenant(id=tenant_id)


def _record(move: Move) -> Move:
    get_redis().hset(shard_map_key(), MOVE + move.tenant_id, move.record())
    return move


def _next(move: Move) -> Move:
    """The move with its next step recorded (the step just run is done)."""
    step = STEPS[STEPS.index(move.step) + 1] if move.step != STEPS[-1] else ""
    if not step:
        get_redis().hdel(shard_map_key(), MOVE + move.tenant_id)
        return Move(move.tenant_id, move.source, move.target, "")
    return _record(Move(move.tenant_id, move.source, move.target, step))


def begin_move(tenant_id: str, target: int) -> Move | None:
    """The tenant's move to ``target``, recorded; or the move of it already recorded (a command that
    was killed: it is finished first, whatever its target); None when it is in ``target`` already."""
    _check_count("target shard", target + 1)
    current = read_shard_map()
    if tenant_id in current.moves:
        return Move.parse(tenant_id, current.moves[tenant_id])
    source = current.shard_of(tenant_id)
    if source == target:
        return None
    return _record(Move(tenant_id, source, target, STEPS[0]))


def fence_out(move: Move) -> Move:
    """Step ``fence``: the tenant is fenced in its source shard and out of its indexes (atomic).

    A fence there that says the tenant moved already is a finished move's whose map was lost since
    (the master of shard 0 alone came back empty, on a Redis Cluster): its queue state is where the
    fence sends it. Moved to the target, only the map is left to write; moved elsewhere, the move
    goes on from there."""
    try:
        fair_queue.shard_script("reshard_out", move.source, [fence_key(move.tenant_id, move.source)],
                                [move.tenant_id])
    except ResponseError as exc:
        redirect = redirect_of(exc)
        if redirect is None or redirect.shard is None:
            raise
        if redirect.shard == move.target:
            return _record(Move(move.tenant_id, move.source, move.target, "map"))
        return _record(Move(move.tenant_id, redirect.shard, move.target, "fence"))
    return _next(move)


def copy_keys(move: Move) -> tuple[Move, int]:
    """Step ``copy``: the tenant's keys of the source shard, under the target's names (any of its keys
    left in the target first dropped, but its fence there). Returns the move and the keys copied."""
    tenant_id, source, target = move.tenant_id, move.source, move.target
    delete_tenant_keys(tenant_id, target)
    names = tenant_keys(tenant_id, source)
    old, new = tenant_shard_prefix(tenant_id, source), tenant_shard_prefix(tenant_id, target)
    copied = 0
    for chunk in _chunks(names):
        dumped = on_node(fence_key(tenant_id, source), partial(_dump, names=chunk))
        renamed = [(new + name[len(old):], ttl, value) for name, ttl, value in dumped]
        copied += on_node(fence_key(tenant_id, target), partial(_restore, dumped=renamed))
    return _next(move), copied


def index_in(move: Move) -> Move:
    """Step ``index``: the tenant enters the target shard's indexes (atomic); its operations work there."""
    moved_out = redis_key("fq", "moved-out", tenant=_probe(move.tenant_id), shard=move.target)
    fair_queue.shard_script("reshard_in", move.target, [moved_out],
                            [move.tenant_id, shard_tag(move.source), shard_tag(move.target)])
    return _next(move)


def publish(move: Move) -> Move:
    """Step ``map``: the map says the tenant is in the target shard (a pin, unless its hash says so)."""
    redis = get_redis()
    if hashed_shard(move.tenant_id, read_shard_map().in_force()) == move.target:
        redis.hdel(shard_map_key(), PIN + move.tenant_id)
    else:
        redis.hset(shard_map_key(), PIN + move.tenant_id, move.target)
    move = _next(move)
    read_shard_map()  # this process's own copy knows it at once
    return move


def fence_moved(move: Move) -> Move:
    """Step ``moved``: the source's fence sends callers with an older map to the target at once."""
    get_redis().set(fence_key(move.tenant_id, move.source), f"MOVED {move.target}")
    return _next(move)


def clean_out(move: Move) -> Move:
    """Step ``clean``: the tenant's keys in the source shard go, but its fence; the move is done."""
    delete_tenant_keys(move.tenant_id, move.source)
    return _next(move)


def resume(move: Move) -> MoveReport:
    """Run the move's steps from its recorded one to the end. Idempotent."""
    started = time.monotonic()
    paused_s, keys_copied = 0.0, 0
    while move.step:
        step = move.step
        if step == "copy":
            move, keys_copied = copy_keys(move)
        else:
            move = _STEPS[step](move)
        if step == "map":  # from the fence (or the step this run resumed at) to the map
            paused_s = time.monotonic() - started
    items = int(get_redis().hlen(redis_key("fq", "items", tenant=_probe(move.tenant_id), shard=move.target)))
    return MoveReport(move.tenant_id, move.source, move.target, keys_copied, items, paused_s,
                      time.monotonic() - started)


_STEPS: dict[str, Callable[[Move], Move]] = {
    "fence": fence_out, "index": index_in, "map": publish, "moved": fence_moved, "clean": clean_out,
}


def move_tenant(tenant_id: str, target: int) -> MoveReport | None:
    """Move the tenant's queue state (backlog, leases, limiters, breakers, counters) to shard ``target``
    while the system runs: nothing lost, nothing twice; its operations wait meanwhile. Finishes a move
    of it that was killed first. None when it is there already."""
    move = begin_move(tenant_id, target)
    if move is None:
        return None
    report = resume(move)
    if report.target != target:  # that was a killed move's: now the one asked for
        return move_tenant(tenant_id, target)
    return report


def _chunks(names: list[str]) -> Iterator[list[str]]:
    for i in range(0, len(names), KEYS_PER_CALL):
        yield names[i : i + KEYS_PER_CALL]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def tenant_keys(tenant_id: str, shard: int) -> list[str]:
    """The tenant's keys in ``shard`` but its fence: a SCAN of its prefix on the server that holds
    the shard's slot."""
    prefix = tenant_shard_prefix(tenant_id, shard)
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + "*"
    fence = fence_key(tenant_id, shard)

    def scan(server: Any) -> list[str]:
        return sorted({_text(name) for name in server.scan_iter(match=pattern, count=1000)} - {fence})

    return on_node(fence, scan)


def _dump(server: Any, names: list[str]) -> list[tuple[str, int, bytes]]:
    """Each key's TTL (ms, 0 for none) and serialized value; keys gone meanwhile are left out."""
    with server.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.pttl(name)
            pipe.dump(name)
        replies = pipe.execute()
    out = []
    for name, ttl, value in zip(names, replies[0::2], replies[1::2], strict=True):
        if value is not None and ttl != -2:
            out.append((name, max(0, int(ttl)), value))
    return out


def _restore(server: Any, dumped: list[tuple[str, int, bytes]]) -> int:
    with server.pipeline(transaction=False) as pipe:
        for name, ttl, value in dumped:
            pipe.restore(name, ttl, value, replace=True)
        pipe.execute()
    return len(dumped)


def _unlink(server: Any, names: list[str]) -> int:
    return int(server.delete(*names))


def delete_tenant_keys(tenant_id: str, shard: int) -> int:
    """Delete the tenant's keys in ``shard`` but its fence; returns how many."""
    names = tenant_keys(tenant_id, shard)
    for chunk in _chunks(names):
        on_node(fence_key(tenant_id, shard), partial(_unlink, names=chunk))
    return len(names)


def _check_count(what: str, count: int) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SHARDS:
        raise ReshardError(f"{what} must be between 1 and {MAX_SHARDS}, not {count!r}")
    return count


def tenant_ids() -> list[str]:
    """Every tenant that may hold queue state: PostgreSQL's tenants, and any other tenant id the served
    shards' backlog indexes name (a bulk loader's, without a row)."""
    ids = {str(pk) for pk in Tenant.objects.values_list("id", flat=True)}
    redis = get_redis()
    for shard in queue_shards():
        ids.update(_text(tid) for tid in redis.zrange(fair_queue.global_key("backlog", shard=shard), 0, -1))
    return sorted(ids)


def plan(count: int, *, tenants: Iterable[str] | None = None) -> Plan:
    """Which tenants (of ``tenants``, default ``tenant_ids()``) a reshard to ``count`` moves, and from
    where to where. Reads only."""
    _check_count("the shard count", count)
    current = read_shard_map()
    moves = []
    for tenant_id in tenants if tenants is not None else tenant_ids():
        now, then = current.shard_of(tenant_id), hashed_shard(tenant_id, count)
        if now != then or tenant_id in current.moves:
            moves.append((tenant_id, now, then))
    return Plan(current.in_force(), count, tuple(moves))


def start(reshard: Plan) -> ShardMap:
    """Put ``reshard.count`` in force, in one write of the map, with every tenant of the plan pinned
    where it is (no process looks for it elsewhere before its move); the shards served now reach
    ``max(before, count)``, and each new shard gets its epoch first (the coordinator must not take a
    new, empty shard for lost data). Idempotent."""
    current = read_shard_map()
    served = max(current.shards(), reshard.count)
    redis = get_redis()
    for shard in range(current.shards(), served):
        redis.set(epoch_key(shard), uuid.uuid4().hex, nx=True)
    fields: dict[str, Any] = {"count": reshard.count, "serve": served}
    fields.update({PIN + tenant_id: shard for tenant_id, shard, _ in reshard.moves
                   if current.pins.get(tenant_id) != shard and tenant_id not in current.moves})
    redis.hset(shard_map_key(), mapping=fields)
    return read_shard_map()


def _fields() -> set[str]:
    return {_text(name) for name in get_redis().hkeys(shard_map_key())}


def left_on(shards: Iterable[int]) -> list[str]:
    """The tenants with items on any of ``shards`` (their backlog indexes), or pinned there."""
    shards = set(shards)
    redis = get_redis()
    found = {tenant_id for tenant_id, shard in read_shard_map().pins.items() if shard in shards}
    for shard in shards:
        found.update(_text(tid) for tid in redis.zrange(fair_queue.global_key("backlog", shard=shard), 0, -1))
    return sorted(found)


def finish() -> ShardMap:
    """Stop serving the shards at and above the count in force once none holds a tenant (and no move
    is recorded); otherwise change nothing. Returns the map."""
    current = read_shard_map()
    dropped = range(current.in_force(), current.shards())
    if "serve" in _fields() and not current.moves and not left_on(dropped):
        get_redis().hdel(shard_map_key(), "serve")
    return read_shard_map()
