"""Loading Lua scripts: one ``EVALSHA`` per call.

Each module keeps its Lua beside it (``lua/<name>.lua``) and names a script by
its path. A script may be prefixed by shared libraries (the capacity counters'
``capacity_lib.lua`` …) so that one atomic script can use the functions of
several modules.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import hiredis
from redis.exceptions import DataError, NoScriptError, ResponseError

from ductor_project.core import tenant_moves
from ductor_project.core.redis import REDIRECTED, get_redis, per_node


@cache
def source(path: Path) -> str:
    """The text of the Lua file at ``path``."""
    return path.read_text()


@cache
def script(path: Path, *libraries: Path) -> Any:
    """A registered script: the libraries' text, then the script's. Cached per process."""
    body = "\n".join([*(source(lib) for lib in libraries), source(path)])
    return get_redis().register_script(body)


def run(path: Path, keys: list[str], args: list[Any], *, libraries: tuple[Path, ...] = (),
        batch: Batch | None = None, again: Callable[[], Any] | None = None) -> Any:
    """Run a script in one round trip (reloaded first if the server lost it); its error raised.

    With ``batch``, the call is only queued on it; its reply comes from ``batch.execute()``, or
    from ``again()`` should a tenant's fence have answered it (see ``Batch``).
    """
    if batch is not None:
        batch.add(script(path, *libraries), keys, args, again=again)
        return None
    alone = Batch()  # a batch of one: its round trip costs the client less than redis-py's call
    alone.add(script(path, *libraries), keys, args)
    (reply,) = alone.execute()
    if isinstance(reply, Exception):
        raise reply
    return reply


class Batch:
    """Script calls sent together in one round trip, in order; each is atomic, the batch is not.

    Unlike redis-py's pipelined scripts, it does not ask ``SCRIPT EXISTS`` before
    every batch (a round trip more): a script is loaded once per process, before
    its first batch, so that the calls run in their order. Should the server have
    lost a script since (a restart), the calls that failed for it are sent again
    after the others, once it is loaded again, and later batches load theirs
    first again.

    On a Redis Cluster (whose scripts are loaded on every primary) the calls are
    grouped by the node that holds their first key: one round trip per node, each
    node's calls in their order. A call a node redirected (its slot moved, a
    failover) is sent again alone through the cluster client, which follows it.

    A call of one tenant that its fence answered (the tenant moves to another shard:
    ``tenant_moves``) changed nothing; when it was added with ``again``, its reply is what
    ``again()`` returns (the same call, made where the tenant is now), after the others.
    """

    _loaded: set[str] = set()  # the SHAs this process has loaded (class-wide)

    def __init__(self) -> None:
        self._calls: list[tuple[Any, list[str], list[Any]]] = []
        self._again: list[Callable[[], Any] | None] = []

    def add(self, registered: Any, keys: list[str], args: list[Any], *,
            again: Callable[[], Any] | None = None) -> None:
        self._calls.append((registered, keys, args))
        self._again.append(again)

    def __len__(self) -> int:
        return len(self._calls)

    def execute(self) -> list[Any]:
        """The replies, in order; a call that failed has its exception in its place."""
        for registered in {id(call[0]): call[0] for call in self._calls}.values():
            if registered.sha not in Batch._loaded:
                registered.sha = get_redis().script_load(registered.script)
                Batch._loaded.add(registered.sha)
        replies = self._send(self._calls)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            Batch._loaded.clear()  # the server lost its scripts: the next batches load theirs first
            for registered in {id(self._calls[i][0]): self._calls[i][0] for i in missing}.values():
                registered.sha = get_redis().script_load(registered.script)
            for i, reply in zip(missing, self._send([self._calls[i] for i in missing]), strict=True):
                replies[i] = reply
        again, self._calls, self._again = self._again, [], []
        for i, (reply, call) in enumerate(zip(replies, again, strict=True)):
            if call is not None and tenant_moves.redirect_of(reply) is not None:
                replies[i] = _again(call)
        return replies

    @staticmethod
    def _send(calls: list[tuple[Any, list[str], list[Any]]]) -> list[Any]:
        replies: list[Any] = [None] * len(calls)

        def send(server: Any, positions: list[int]) -> None:
            commands = []
            for i in positions:
                registered, keys, args = calls[i]
                commands.append(("EVALSHA", registered.sha, len(keys), *keys, *args))
            for i, reply in zip(positions, _round_trip(server, commands), strict=True):
                replies[i] = reply

        per_node([keys[0] for _, keys, _ in calls], send)
        for i, reply in enumerate(replies):
            if isinstance(reply, REDIRECTED):
                registered, keys, args = calls[i]
                try:
                    replies[i] = get_redis().evalsha(registered.sha, len(keys), *keys, *args)
                except Exception as exc:  # the call's reply is its error, as in the pipeline
                    replies[i] = exc
        return replies


def _round_trip(server: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """The replies of ``commands`` sent to ``server`` (a ``redis.Redis``) in one round trip, in
    order, a command's error in its place: what its pipeline does without raising, for a third of
    the client's CPU. The arguments go to hiredis as they are (``str``, ``bytes``, ``int``,
    ``float``, as redis-py accepts), not through redis-py's encoder one by one; a batch is sent
    again on a new connection after a dropped one, as the client's retry policy says (and as its
    pipeline did)."""
    try:
        packed = b"".join([hiredis.pack_command(command) for command in commands])  # one write
    except TypeError as exc:  # None, a bool …: what redis-py's encoder refuses too
        raise DataError(f"a script argument redis cannot send: {exc}") from exc
    pool = server.connection_pool
    connection = pool.get_connection()
    try:
        return connection.retry.call_with_retry(
            lambda: _exchange(connection, packed, len(commands)), lambda error: connection.disconnect())
    finally:
        pool.release(connection)


def _exchange(connection: Any, packed: bytes, count: int) -> list[Any]:
    connection.send_packed_command([packed])
    replies: list[Any] = []
    try:
        for _ in range(count):
            try:
                replies.append(connection.read_response())
            except ResponseError as exc:  # the reply is an error: read in full, the next follows
                replies.append(exc)
    except BaseException:
        connection.disconnect()  # replies may be left on the socket: it must not go back to the pool
        raise
    return replies


def _again(call: Callable[[], Any]) -> Any:
    """A fenced call's reply made again: its reply, or its error in its place."""
    try:
        return call()
    except Exception as exc:  # the call's reply is its error, as in the pipeline
        return exc
