"""Routing, the tiered fair queue, dispatch into Celery and the coordinator (see README.md)."""

from pathlib import Path

# The Lua scripts of this app, one file per operation (``scheduling/lua/<name>.lua``).
LUA_DIR = Path(__file__).resolve().parent / "lua"
