"""The one raw Redis client of the process.

It shares django-redis's connection pool. Raw clients ignore Django's cache key
function, so every key passed to them must come from ``ductor_project.core.keys``.
"""

from __future__ import annotations

from typing import Any

from django_redis import get_redis_connection


def get_redis() -> Any:
    """The process-wide ``redis.Redis`` client (thread-safe, pooled)."""
    return get_redis_connection("default")
