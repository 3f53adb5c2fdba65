"""Loading Lua scripts: one ``EVALSHA`` per call.

Each module keeps its Lua beside it (``lua/<name>.lua``) and names a script by
its path. A script may be prefixed by shared libraries (the capacity counters'
``capacity_lib.lua`` …) so that one atomic script can use the functions of
several modules.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

from ductor_project.core.redis import get_redis


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
        batch: Batch | None = None) -> Any:
    """Run a script in one round trip (redis-py reloads it if the server lost it).

    With ``batch``, the call is only queued on it; its reply comes from ``batch.execute()``.
    """
    if batch is not None:
        batch.add(script(path, *libraries), keys, args)
        return None
    return script(path, *libraries)(keys=keys, args=args, client=get_redis())


class Batch:
    """Script calls sent together in one round trip, in order; each is atomic, the batch is not.

    Unlike redis-py's pipelined scripts, it does not ask ``SCRIPT EXISTS`` before
    every batch (a round trip more): a script is loaded once per process, before
    its first batch, so that the calls run in their order. Should the server have
    lost a script since (a restart), the calls that failed for it are sent again
    after the others, once it is loaded again, and later batches load theirs
    first again.
    """

    _loaded: set[str] = set()  # the SHAs this process has loaded (class-wide)

    def __init__(self) -> None:
        self._calls: list[tuple[Any, list[str], list[Any]]] = []

    def add(self, registered: Any, keys: list[str], args: list[Any]) -> None:
        self._calls.append((registered, keys, args))

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
        self._calls = []
        return replies

    @staticmethod
    def _send(calls: list[tuple[Any, list[str], list[Any]]]) -> list[Any]:
        with get_redis().pipeline(transaction=False) as pipe:
            for registered, keys, args in calls:
                pipe.evalsha(registered.sha, len(keys), *keys, *args)
            return list(pipe.execute(raise_on_error=False))
