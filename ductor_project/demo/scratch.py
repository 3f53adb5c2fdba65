"""A scratch PostgreSQL database and Redis database for one demo, dropped when it ends.

The demo's noisy tenant queues thousands of runs and the demo ends long before
they are all done: that is the point, fair sharing is what happens while a
tenant is backlogged. Run in the project's own database, that backlog would
stay behind, and the next ``make up`` (or demo) would spend minutes working it
off. So the demo runs in ``<database>_demo`` and in the next Redis database
number, on the same servers, and drops both at the end, also after Ctrl-C or a
failure. When the project database holds nothing but its migrations and seeded
rows (a fresh checkout: ``make demo`` has just migrated it) and nothing else is
connected to it, the scratch database is a copy of it (``CREATE DATABASE …
TEMPLATE``, fast); otherwise it is created empty and the demo migrates it, so
that none of your tenants or runs ends up in the demo.

The demo's own process switches its default database to the scratch one the
way Django's test runner switches to its test database (``use``); its
children (web, workers, dispatcher, coordinator) get both URLs in their
environment. The demo's process never uses Redis itself.

The example shop (``examples/shop``), a Django project of its own, gets a
database of its own beside it, ``<database>_demo_shop``, created empty (the
shop's own ``manage.py migrate`` fills it: ``ductor_project.demo.shop``) and
dropped with the other. The shop connects as the role that created it (the
tables' owner): on a server of its own, a team's project would have its own role.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import psycopg
import redis
from django.conf import settings
from django.db import connections
from psycopg import errors, sql

SUFFIX = "_demo"
SHOP_SUFFIX = "_shop"
REDIS_DATABASES = 16


@dataclass(frozen=True)
class Scratch:
    database_url: str
    redis_url: str
    migrated: bool  # copied from the (migrated) project database
    admin_url: str  # the tables' owner, who creates and drops it
    shop_database_url: str  # the example shop's own database, as its owner (``admin_url``'s role)


def _with_path(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=path))


def _database_name(url: str) -> str:
    name = urlsplit(url).path.lstrip("/")
    if not name:
        raise ValueError(f"no database name in {url!r}")
    return name


def _admin(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """An autocommit connection to the server's ``postgres`` database."""
    return psycopg.connect(_with_path(url, "/postgres"), autocommit=True)


def _scratch_redis_url(url: str) -> str:
    parts = urlsplit(url)
    current = int(parts.path.lstrip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(current + 1) % REDIS_DATABASES}"))


def create(database_url: str, redis_url: str, *, copy: bool, admin_url: str) -> Scratch:
    """Create (or re-create) the scratch databases, as ``admin_url``'s role (the tables' owner);
    ``copy``: from the project database, if it can (with its row-level security and grants). The
    shop's database is created empty.

    Any earlier scratch database is dropped first.
    """
    source = _database_name(database_url)
    target = source + SUFFIX
    shop = target + SHOP_SUFFIX
    migrated = False
    with _admin(admin_url) as conn:
        for name in (target, shop):
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(shop)))
        if copy:
            try:
                conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(target), sql.Identifier(source)))
                migrated = True
            except errors.ObjectInUse:  # someone is connected to the project database
                pass
        if not migrated:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(target)))
    scratch_redis = _scratch_redis_url(redis_url)
    redis.Redis.from_url(scratch_redis).flushdb()
    return Scratch(_with_path(database_url, f"/{target}"), scratch_redis, migrated, admin_url,
                   _with_path(admin_url, f"/{shop}"))


def use(scratch: Scratch) -> None:
    """Point this process's default database connection at the scratch database (closed first)."""
    connections.close_all()
    name = _database_name(scratch.database_url)
    settings.DATABASES["default"]["NAME"] = name
    connections["default"].settings_dict["NAME"] = name


def drop(scratch: Scratch) -> None:
    """Drop the scratch databases, the shop's too (closing every connection to them), and empty the scratch
    Redis database."""
    with contextlib.suppress(redis.RedisError):
        redis.Redis.from_url(scratch.redis_url).flushdb()
    with _admin(scratch.admin_url) as conn:
        for url in (scratch.database_url, scratch.shop_database_url):
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(_database_name(url))))
