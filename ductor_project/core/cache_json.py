"""The Django cache's serializer: JSON, never pickle.

django-redis unpickles what it reads unless told otherwise, so whoever can write to the cache's
Redis could run code in every Ductor process that reads an entry; Celery's broker shares that
Redis unless ``CACHE_REDIS_URL`` names another, and a team's workers hold the broker's address. The
cache holds JSON values only: an object is cached as its JSON form and rebuilt by the module that
owns it (``Entitlements.from_dict``, ``RoutingTable.from_json``). A value that is not JSON (an entry
another version wrote with pickle) reads as missing, to be computed again.
"""

from __future__ import annotations

from typing import Any

from django_redis.serializers.json import JSONSerializer


class JSONCacheSerializer(JSONSerializer):
    """django-redis's JSON serializer; what does not decode as JSON reads as None (missing)."""

    def loads(self, value: bytes) -> Any:
        try:
            return super().loads(value)
        except ValueError:  # not UTF-8, or not JSON
            return None
