"""Tenant-carrying Celery tasks, on real ``celery -A ductor_project worker`` processes.

Workers run with concurrency 1 and prefetch 1, so the messages of one queue
are executed one after the other, in order, by the same child process: a task
sent after another one starts only once that one is done. That gives every
"was it refused?" check a deterministic end point, with no sleeps.

The data migrations' rows a worker needs (the system tenant, the plans) are
put back after every flush by ``tests/conftest.py``.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from ductor_project.celery import app as celery_app
from ductor_project.core.context import TenantScopeError, tenant_context
from ductor_project.stack import Child
from tenants.models import Tenant, system_context
from tenants.tasking import SYSTEM_QUEUE, TENANT_HEADER
from tenants.tasks import tenant_ping
from tests.scoped.models import Folder
from tests.scoped.tasks import create_folder, fail_in_tenant, peek_tenant_between_tasks

WORK_QUEUE = celery_app.conf.task_default_queue
RESULT_TIMEOUT = 60

StartWorker = Callable[..., Child]


def worker_events(worker: Child) -> list[dict[str, Any]]:
    """The worker's structured log lines."""
    events = []
    for line in worker.output().splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def queued_messages(redis_client: Any, queue: str) -> list[dict[str, Any]]:
    """The messages waiting in a Celery queue (kombu's Redis transport keeps them in a list)."""
    return [json.loads(raw) for raw in redis_client.lrange(queue, 0, -1)]


def message_kwargs(message: dict[str, Any]) -> dict[str, Any]:
    _args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    return dict(kwargs)


# --- sending ---------------------------------------------------------------------------------


def test_tenant_task_sent_outside_any_tenant_raises_at_send_time(db: None, redis_client: Any) -> None:
    with pytest.raises(TenantScopeError):
        tenant_ping.delay(token="x")
    with pytest.raises(TenantScopeError):
        tenant_ping.apply_async(kwargs={"token": "x"})
    assert redis_client.llen(WORK_QUEUE) == 0


def test_tenant_task_carries_the_tenant_as_argument_and_header(
    tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str], redis_client: Any
) -> None:
    with tenant_context(tenant_a[0]):
        tenant_ping.delay(token="from-context")
    tenant_ping.apply_async(kwargs={"token": "explicit", "tenant_id": tenant_b[0].pk})
    first, second = reversed(queued_messages(redis_client, WORK_QUEUE))  # LPUSH: newest first
    for message, tenant, token in ((first, tenant_a[0], "from-context"), (second, tenant_b[0], "explicit")):
        assert message["headers"][TENANT_HEADER] == str(tenant.pk)
        assert message_kwargs(message) == {"token": token, "tenant_id": str(tenant.pk)}


def test_tenant_task_checks_the_callers_arguments_at_send_time(tenant_a: tuple[Tenant, str], redis_client: Any) -> None:
    with tenant_context(tenant_a[0]), pytest.raises(TypeError):
        tenant_ping.delay(token="x", unexpected=1)
    assert redis_client.llen(WORK_QUEUE) == 0


def test_system_tenant_task_is_published_on_the_system_queue(tenant_a: tuple[Tenant, str], redis_client: Any) -> None:
    with system_context():
        tenant_ping.delay(token="in-context")
    tenant_ping.apply_async(kwargs={"token": "explicit", "tenant_id": Tenant.system().pk})
    with tenant_context(tenant_a[0]):
        tenant_ping.delay(token="customer")
    assert [message_kwargs(m)["token"] for m in queued_messages(redis_client, SYSTEM_QUEUE)] == [
        "explicit",
        "in-context",
    ]
    assert [message_kwargs(m)["token"] for m in queued_messages(redis_client, WORK_QUEUE)] == ["customer"]


# --- on a real worker ----------------------------------------------------------------------


@pytest.mark.worker
def test_consecutive_tasks_on_one_worker_process_never_share_a_tenant(
    celery_worker: StartWorker, make_tenant: Callable[..., tuple[Tenant, str]]
) -> None:
    a, _ = make_tenant("tenant-a")
    b, _ = make_tenant("tenant-b")
    worker = celery_worker()
    sent: list[tuple[str, Tenant | None, Any]] = []
    with tenant_context(a):
        sent.append(("ping", a, tenant_ping.delay(token="1")))
    with tenant_context(b):
        sent.append(("ping", b, tenant_ping.delay(token="2")))
    with tenant_context(a):
        sent.append(("fail", a, fail_in_tenant.delay()))
    sent.append(("peek", None, peek_tenant_between_tasks.delay()))
    with tenant_context(b):
        sent.append(("folder", b, create_folder.delay(name="written-by-b")))
    with tenant_context(a):
        sent.append(("ping", a, tenant_ping.delay(token="6")))
    sent.append(("peek", None, peek_tenant_between_tasks.delay()))

    pids = set()
    for kind, tenant, result in sent:
        if kind == "fail":
            with pytest.raises(RuntimeError, match="failing inside tenant tenant-a"):
                result.get(timeout=RESULT_TIMEOUT)
            continue
        answer = result.get(timeout=RESULT_TIMEOUT)
        pids.add(answer["pid"])
        expected = str(tenant.pk) if tenant is not None else None
        assert answer["tenant_id"] == expected, (kind, answer)
    assert [answer["token"] for kind, _, r in sent if kind == "ping" for answer in [r.get()]] == [
        "1",
        "2",
        "6",
    ]
    assert len(pids) == 1, "all tasks must have run in the same worker process"
    assert Folder.all_tenants.get(name="written-by-b").tenant_id == b.pk
    worker.stop()
    assert "task_refused" not in worker.output()


@pytest.mark.worker
def test_task_without_a_usable_tenant_is_refused_logged_and_never_runs(
    celery_worker: StartWorker, make_tenant: Callable[..., tuple[Tenant, str]], redis_client: Any
) -> None:
    a, _ = make_tenant("tenant-a")
    b, _ = make_tenant("tenant-b")
    worker = celery_worker()
    refused = {
        "no-tenant": celery_app.send_task("ductor.tenant_ping", kwargs={"token": "none"}),
        "header-only": celery_app.send_task(
            "ductor.tenant_ping", kwargs={"token": "header"}, headers={TENANT_HEADER: str(a.pk)}
        ),
        "mismatch": celery_app.send_task(
            "ductor.tenant_ping",
            kwargs={"token": "mismatch", "tenant_id": str(a.pk)},
            headers={TENANT_HEADER: str(b.pk)},
        ),
        "unknown-tenant": celery_app.send_task(
            "ductor.tenant_ping", kwargs={"token": "ghost", "tenant_id": str(uuid.uuid4())}
        ),
        "folder-without-tenant": celery_app.send_task("tests.scoped.create_folder", kwargs={"name": "orphan"}),
    }
    with tenant_context(a):
        after = tenant_ping.delay(token="after")
    # Same queue, one process, prefetch 1: once this one is done, every message before it was handled.
    assert after.get(timeout=RESULT_TIMEOUT)["token"] == "after"
    worker.stop()

    log = worker.output()
    events = worker_events(worker)
    refusals = {
        event["task_id"]: event["event"] for event in events if event.get("event", "").startswith("task_refused")
    }
    assert {name: refusals.get(result.id) for name, result in refused.items()} == {
        "no-tenant": "task_refused_without_tenant",
        "header-only": "task_refused_without_tenant",
        "mismatch": "task_refused_without_tenant",
        "unknown-tenant": "task_refused_unknown_tenant",
        "folder-without-tenant": "task_refused_without_tenant",
    }
    for name, result in refused.items():
        assert f"[{result.id}] succeeded" not in log, name
        assert result.state != "SUCCESS", name
    assert f"[{after.id}] succeeded" in log
    assert not Folder.all_tenants.filter(name="orphan").exists()
    assert redis_client.llen(WORK_QUEUE) == 0, "refused messages are dropped, not requeued"


@pytest.mark.worker
def test_system_tenant_task_is_routed_to_the_system_queue(
    celery_worker: StartWorker, make_tenant: Callable[..., tuple[Tenant, str]], redis_client: Any
) -> None:
    a, _ = make_tenant("tenant-a")
    with system_context() as system:
        in_context = tenant_ping.delay(token="system")
    explicit = tenant_ping.apply_async(kwargs={"token": "system-explicit", "tenant_id": system.pk})
    with tenant_context(a):
        customer = tenant_ping.delay(token="customer")
    worker = celery_worker("-Q", SYSTEM_QUEUE)
    assert in_context.get(timeout=RESULT_TIMEOUT)["slug"] == "system"
    assert explicit.get(timeout=RESULT_TIMEOUT)["slug"] == "system"
    # The worker only consumes ductor.system: the customer task is still waiting on its own queue.
    assert [message_kwargs(m)["token"] for m in queued_messages(redis_client, WORK_QUEUE)] == ["customer"]
    assert customer.state == "PENDING"
    worker.stop()
