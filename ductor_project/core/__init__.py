"""The low layer: what every app stands on, importing none of them.

The tenant context and the keys built from it, the one Redis client, the error
codes and the API error shape, Lua script loading, and the capacity counters
(leased slots and GCRA limiters) with their renewal thread. ``tenants``,
``scheduling`` and ``workflows`` import from here, never the other way round
(the import contracts in ``pyproject.toml`` check it).
"""
