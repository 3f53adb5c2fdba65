"""A task node's outcome that reaches its results worker while PostgreSQL is out of that worker's
reach is kept once PostgreSQL is back: the step does not wait for its timeout, and the team's task
does not run again.

The results worker connects to PostgreSQL through a directory of its own whose socket is a link to
the server's: removing the link (and ending the worker's connections) puts PostgreSQL out of its
reach alone; the other processes carry on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest
from django.conf import settings
from django.db import connection

from ductor_project.celery import RESULTS_WORKER_ARGS, STEP_WORKER_ARGS
from ductor_project.stack import Child
from tests.conftest import service_env, service_stack
from tests.workflows.test_engine_e2e import by_node, finished, put, start, wait_for
from tests.workflows.test_task_nodes_e2e import TEAM_SLOTS, task, team_env
from workflows.models import TaskCatalogEntry

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

TIMEOUT_S = 600  # the step's: far beyond the test's waits, so a lost outcome shows as a run that never ends


class Cut:
    """The socket of PostgreSQL under ``directory``, as a link that can be removed and put back."""

    def __init__(self, directory: Path) -> None:
        query = dict(parse_qsl(urlsplit(settings.DATABASE_URL).query))
        self.server = Path(query["host"]) / f".s.PGSQL.{query.get('port', '5432')}"
        self.link = directory / self.server.name
        self.directory = directory
        self.restore()

    def url(self) -> str:
        """``service_env``'s database URL, through the link."""
        parts = urlsplit(service_env()["DATABASE_URL"])
        query = {**dict(parse_qsl(parts.query)), "host": str(self.directory)}
        return parts._replace(query=urlencode(query)).geturl()

    def cut(self) -> None:
        """No new connection through the link, and every connection to the database but this test's
        ended (the processes connected through the server's own socket connect again)."""
        self.link.unlink()
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")

    def restore(self) -> None:
        os.symlink(self.server, self.link)


class Layout:
    """A worker of steps, a results worker connected through ``cut``, a dispatcher, the coordinator
    and the team's worker."""

    def __init__(self, cut: Cut) -> None:
        self.stack = service_stack()
        self.steps = self.stack.worker("worker", concurrency=1, extra=list(STEP_WORKER_ARGS))
        self.results: Child = self.stack.worker("results", concurrency=1, extra=list(RESULTS_WORKER_ARGS),
                                                env={**service_env(), "DATABASE_URL": cut.url()})
        self.team: Child = self.stack.worker("team-outage", app="tests.teamapp", concurrency=1, env=team_env(),
                                             hostname="team-outage@localhost",
                                             extra=["-Q", "team", "--pool", "prefork", "--without-heartbeat"])
        dispatcher = self.stack.dispatcher(env=service_env())
        coordinator = self.stack.coordinator(env=service_env())
        self.stack.wait_ready(self.steps, self.results, self.team, dispatcher, coordinator, timeout_s=60)


@pytest.fixture
def cut(tmp_path: Path) -> Cut:
    return Cut(tmp_path)


@pytest.fixture
def layout(cut: Cut, settings: Any) -> Iterator[Layout]:
    from ductor_project.core.redis import get_redis

    get_redis().flushdb()
    settings.DUCTOR_TASK_QUEUE_SLOTS = dict([TEAM_SLOTS.split("=")])  # this process enqueues too
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {"DUCTOR_TASK_QUEUE_SLOTS": TEAM_SLOTS, "DUCTOR_FAILED_ITEM_DELAY_MS": "100",
                            "DUCTOR_FAILED_ITEM_MAX_DELAY_MS": "500"}.items():
            mp.setenv(name, value)  # service_env() copies os.environ into every process started
        running = Layout(cut)
        try:
            yield running
        finally:
            running.stack.stop_all(grace_s=20)


def test_an_outcome_that_came_while_postgresql_was_out_of_reach_is_kept_once_it_is_back(
        layout: Layout, cut: Cut, make_tenant: Any) -> None:
    TaskCatalogEntry.objects.create(name="team.add", queue="team")
    tenant = make_tenant()[0]
    put(tenant, "sum", {"nodes": [task("add", "team.add", {"a": 1, "b": 2}, timeout_s=TIMEOUT_S)],
                        "output": "$nodes.add.output.sum"})
    cut.cut()
    run = start(tenant, "sum")
    wait_for(lambda: "task_outcome_deferred" in layout.results.output(), timeout=60,
             what="the results worker to put the outcome off, PostgreSQL being out of its reach")
    cut.restore()

    done = finished(tenant, run.pk, timeout=60)
    assert (done.status, done.output) == ("succeeded", 3), done.error
    assert by_node(tenant, done)["add"].attempt == 1
    assert layout.team.output().count("Task team.add[") == 2  # received, and succeeded: once
