"""Shared fixtures. Every test runs against the real embedded PostgreSQL and Redis
(or the servers named by DATABASE_URL / REDIS_URL): no SQLite, no fake Redis.

With ``DUCTOR_TEST_QUEUE_CLUSTER=1`` (``make test``'s second run, over the tests marked
``cluster``), each test process also starts a real three-master Redis Cluster of its own
(``ductor_project.redis_cluster``) and keeps Ductor's queue state there
(``DUCTOR_QUEUE_REDIS_URL``, for the processes its tests start too); the Celery broker and the
Django cache stay on the plain Redis. Tests marked ``cluster(only=True)`` need the cluster: the
first run leaves them out (deselected); the cluster run leaves out those marked
``cluster(also=False)`` in a module marked ``cluster``.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from pytest_django.plugin import blocking_manager_key
from rest_framework.test import APIClient

from ductor_project import redis_cluster
from ductor_project.core.context import tenant_context
from ductor_project.core.database.security import owner_credentials, use_credentials
from ductor_project.core.keys import shard_of
from ductor_project.logs import configure_logging
from ductor_project.stack import Child, Stack
from tenants import services
from tenants.models import ApiKey, Tenant

ROOT = Path(__file__).resolve().parent.parent
# The switch of the cluster run (the Makefile's second pytest).
QUEUE_CLUSTER = "DUCTOR_TEST_QUEUE_CLUSTER"


def on_queue_cluster() -> bool:
    return bool(os.environ.get(QUEUE_CLUSTER))


def queue_cluster_directory() -> Path:
    """Where this test process's cluster lives in the cluster run."""
    return Path(settings.DUCTOR_DATA_DIR) / f"cluster-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


@pytest.fixture(scope="session", autouse=True)
def queue_cluster() -> Iterator[redis_cluster.ClusterState | None]:
    """In the cluster run, this test process's own Redis Cluster, which holds Ductor's queue state
    for it and for the processes its tests start (they inherit the environment); None otherwise.
    Stopped when the session ends. A session fixture, not the settings, starts it: pytest-xdist's
    controller imports the settings too, and runs no test."""
    if not on_queue_cluster():
        yield None
        return
    directory = queue_cluster_directory()
    cluster = redis_cluster.start(directory)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(settings, "DUCTOR_QUEUE_REDIS_URL", cluster.url())
        mp.setenv("DUCTOR_QUEUE_REDIS_URL", cluster.url())
        try:
            yield cluster
        finally:
            redis_cluster.stop(directory)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> dict[str, Any] | None:
    """The test database is created, migrated (which puts row-level security on its tenant tables)
    and dropped by the tables' owner, as ``manage.py migrate`` is run: switch to it first. Returns
    the app role's credentials, which the tests then connect with."""
    owner = owner_credentials()
    return use_credentials(connections["default"], owner) if owner else None


@pytest.fixture(scope="session")
def django_db_setup(
    django_db_setup: None, django_db_modify_db_settings: dict[str, Any] | None, django_db_blocker: Any
) -> Iterator[None]:
    """Every test connects as the app role, as the product does, under row-level security. In
    this test database only, the owner lets that role truncate the tables too: a transactional
    test's flush does."""
    app = django_db_modify_db_settings
    if app is None:
        yield
        return
    with django_db_blocker.unblock():
        let_the_app_role_truncate()
    owner = use_credentials(connections["default"], app)
    yield
    use_credentials(connections["default"], owner)  # the owner drops the test database


def let_the_app_role_truncate() -> None:
    """As the tables' owner, in the test database only: the app role may truncate every table (a
    transactional test's flush does)."""
    with connection.cursor() as cursor:
        cursor.execute(f'GRANT TRUNCATE ON ALL TABLES IN SCHEMA public TO "{settings.DUCTOR_DB_APP_ROLE}"')


def seed_reference_data() -> None:
    """Put back what the tenants app's data migrations create (the system tenant, the plans and their
    later columns), by running their own forward functions in order. Idempotent, as they are."""
    from django.apps import apps
    from django.db.migrations import RunPython
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    with transaction.atomic():  # as a migration runs: the foreign keys are checked at its commit
        for key in sorted(key for key in loader.disk_migrations if key[0] == "tenants"):
            for operation in loader.disk_migrations[key].operations:
                if isinstance(operation, RunPython):
                    operation.code(apps, None)


def _flushes_database(item: pytest.Item) -> bool:
    marker = item.get_closest_marker("django_db")
    return bool(
        {"transactional_db", "live_server"} & set(getattr(item, "fixturenames", ()))
        or (marker is not None and marker.kwargs.get("transaction"))
    )


def _left_out(item: pytest.Item) -> bool:
    """Whether this run leaves the test out: the first run those that need the queue cluster
    (``cluster(only=True)``), the cluster run those marked ``cluster(also=False)``."""
    mark = item.get_closest_marker("cluster")
    if mark is None:
        return False
    if on_queue_cluster():
        return mark.kwargs.get("also", True) is False
    return bool(mark.kwargs.get("only", False))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The API fuzzing, by far the longest test, goes first (after pytest-django's own ordering):
    with several test processes, the others share the rest of the suite meanwhile. Without the
    queue cluster, the tests that need it are deselected; with it, those it should leave out."""
    left_out = [item for item in items if _left_out(item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]
    items.sort(key=lambda item: item.get_closest_marker("fuzz") is None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A transactional test flushes every table when its teardown ends: put the reference data back
    then, so that whatever runs next in this process (in any order, a test of any kind) finds it."""
    result = yield
    if _flushes_database(item) and nextitem is not None:  # after the last test the database is gone
        with item.config.stash[blocking_manager_key].unblock():
            seed_reference_data()
    return result


def flush_redis() -> Any:
    """Flush Ductor's own Redis state and, where that is apart (the cluster run), the plain Redis
    database of the broker and the cache too; returns Ductor's raw client."""
    from django_redis import get_redis_connection

    from ductor_project.core.keys import forget_shard_map
    from ductor_project.core.redis import get_redis

    client = get_redis()
    client.flushdb()
    forget_shard_map()  # the flush took the shard map with it
    plain = get_redis_connection("default")
    if plain is not client:
        plain.flushdb()
    return client


def broker_redis() -> Any:
    """A client of the Celery broker's Redis (its queues are lists named after them): the plain
    Redis, apart from the queue state's in the cluster run."""
    import redis

    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def log_lines(text: str) -> list[dict[str, Any]]:
    """The JSON log records of a process's output (other lines are skipped)."""
    records = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by a process being killed
    return records


def handed_off(text: str) -> bool:
    """Whether a worker's output shows an item taken by handoff (a process that finished one)."""
    return any(line.get("event") == "dispatched" and line.get("handoff") for line in log_lines(text))


class LogLines:
    """What the process logged while a ``logged`` test ran: its lines, as they were written."""

    def __init__(self) -> None:
        self.stream = io.StringIO()

    def lines(self) -> list[str]:
        return [line for line in self.stream.getvalue().splitlines() if line]

    def json(self, logger: str | None = None) -> list[dict[str, Any]]:
        """The events of ``logger`` (every event without one)."""
        events = [json.loads(line) for line in self.lines()]
        return [event for event in events if logger is None or event.get("logger") == logger]


@pytest.fixture
def logged() -> Iterator[LogLines]:
    """Every log line of the test (structlog's and the standard library's, at INFO and above, in
    JSON), read from the stream the process logs to; the settings' logging after it."""
    captured = LogLines()
    configure_logging(fmt="json", level="INFO", stream=captured.stream)
    try:
        yield captured
    finally:
        configure_logging(fmt=settings.DUCTOR_LOG_FORMAT, level=settings.DUCTOR_LOG_LEVEL)


@pytest.fixture
def redis_client() -> Any:
    """The raw Redis client, flushed before the test (the test data dir has its own Redis)."""
    return flush_redis()


@pytest.fixture
def tenants_on_shard(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """The tenants this test makes map to fair-queue shard 0, which the dispatcher side serves by
    default (``dequeue``, ``reap``, ``handoff(shard=0)`` …): with several shards (the cluster run)
    a new tenant would land on any of them. Called with another shard, it puts the tenants made
    next on that one. Each id is drawn at random until one maps there."""
    target = [0]

    def on_target_shard() -> uuid.UUID:
        while shard_of(str(candidate := uuid.uuid4())) != target[0]:
            pass
        return candidate

    def place(shard: int) -> None:
        target[0] = shard

    monkeypatch.setattr(Tenant._meta.get_field("id"), "_get_default", on_target_shard)
    return place


@pytest.fixture
def make_tenant(db: None) -> Callable[..., tuple[Tenant, str]]:
    """Create a tenant and a read+write key; returns ``(tenant, raw_key)``."""
    counter = iter(range(10_000))

    def make(
        slug: str | None = None, scopes: list[str] | None = None, plan: str = "enterprise"
    ) -> tuple[Tenant, str]:
        # Enterprise by default: its API rate keeps functional tests clear of the throttle.
        tenant = services.tenant_create(slug=slug or f"tenant-{next(counter)}", plan=plan)
        with tenant_context(tenant):
            _, raw = services.api_key_create(
                name="test", scopes=scopes or [ApiKey.Scope.READ, ApiKey.Scope.WRITE]
            )
        return tenant, raw

    return make


@pytest.fixture
def tenant_a(make_tenant: Callable[..., tuple[Tenant, str]]) -> tuple[Tenant, str]:
    return make_tenant("tenant-a")


@pytest.fixture
def tenant_b(make_tenant: Callable[..., tuple[Tenant, str]]) -> tuple[Tenant, str]:
    return make_tenant("tenant-b")


def api_client(raw_key: str | None = None) -> APIClient:
    client = APIClient()
    if raw_key:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


@pytest.fixture
def client_a(tenant_a: tuple[Tenant, str]) -> APIClient:
    return api_client(tenant_a[1])


@pytest.fixture
def client_b(tenant_b: tuple[Tenant, str]) -> APIClient:
    return api_client(tenant_b[1])


def service_env() -> dict[str, str]:
    """Environment for a child process that must use this test run's database and Redis."""
    # The same server as this run, but the test database pytest-django created.
    url = urlsplit(settings.DATABASE_URL)._replace(path="/" + connection.settings_dict["NAME"]).geturl()
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        REDIS_URL=settings.REDIS_URL,
        DJANGO_SETTINGS_MODULE="tests.settings",
        DUCTOR_DATA_DIR=str(settings.DUCTOR_DATA_DIR),
        SECRET_KEY=settings.SECRET_KEY,
        PYTHONPATH=str(ROOT),
    )
    return env


def service_stack() -> Stack:
    """A supervisor of child processes on this run's services (``service_env``), logging under the
    data dir."""
    logs = "test-logs-" + os.environ.get("PYTEST_XDIST_WORKER", "main")  # one directory per test process
    return Stack(Path(settings.DUCTOR_DATA_DIR) / logs, env=service_env(), say=lambda _: None, fresh_logs=True)


def celery_worker_child(stack: Stack, *extra: str, concurrency: int = 1) -> Child:
    """A real ``celery -A ductor_project worker`` (prefork, no heartbeats) under ``stack``, ready."""
    name = f"worker-{os.getpid()}-{time.monotonic_ns()}"
    worker = stack.worker(name, concurrency=concurrency, hostname=f"{name}@localhost", env=service_env(),
                          extra=["--pool", "prefork", "--without-heartbeat", *extra])
    stack.wait_ready(worker, timeout_s=60)
    return worker


@pytest.fixture
def celery_worker(transactional_db: None, redis_client: Any) -> Iterator[Callable[..., Child]]:
    """Start real worker processes against this run's services; all are stopped afterwards."""
    stack = service_stack()

    def start(*extra: str, concurrency: int = 1) -> Child:
        return celery_worker_child(stack, *extra, concurrency=concurrency)

    try:
        yield start
    finally:
        stack.stop_all(grace_s=20)


def error_code(response: Any) -> str:
    return str(json.loads(response.content)["error"]["code"])


def in_threads(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(i)`` in ``count`` threads released together; each closes its own database connections.

    Returns each thread's result, or the exception it raised.
    """
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def run(index: int) -> None:
        try:
            barrier.wait()
            results[index] = work(index)
        except Exception as exc:
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results
