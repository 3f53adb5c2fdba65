"""Loading the Lua scripts of ``scheduling/lua``: one ``EVALSHA`` per call.

A script may be prefixed by shared libraries (``capacity_lib.lua`` …) so that
one atomic script can use the functions of several modules.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

from ductor_project.redis import get_redis

LUA_DIR = Path(__file__).resolve().parent / "lua"


@cache
def source(name: str) -> str:
    """The text of ``scheduling/lua/<name>.lua``."""
    return (LUA_DIR / f"{name}.lua").read_text()


@cache
def script(name: str, *libraries: str) -> Any:
    """A registered script: the libraries' text, then the script's. Cached per process."""
    body = "\n".join([*(source(lib) for lib in libraries), source(name)])
    return get_redis().register_script(body)


def run(name: str, keys: list[str], args: list[Any], *, libraries: tuple[str, ...] = (),
        batch: Batch | None = None) -> Any:
    """Run a script in one round trip (redis-py reloads it if the server lost it).

    With ``batch``, the call is only queued on it; its reply comes from ``batch.execute()``.
    """
    if batch is not None:
        batch.add(script(name, *libraries), keys, args)
        return None
    return script(name, *libraries)(keys=keys, args=args, client=get_redis())


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
