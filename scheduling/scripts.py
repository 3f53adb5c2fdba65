"""Loading the Lua scripts of ``scheduling/lua``: one ``EVALSHA`` per call.

A script may be prefixed by shared libraries (``capacity_lib.lua`` …) so that
one atomic script can use the functions of several modules.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

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


def run(name: str, keys: list[str], args: list[Any], *, libraries: tuple[str, ...] = (), client: Any = None) -> Any:
    """Run a script in one round trip (redis-py reloads it if the server lost it).

    ``client`` may be a pipeline: the call is then queued, and its result is the pipeline's.
    """
    return script(name, *libraries)(keys=keys, args=args, client=client if client is not None else get_redis())
