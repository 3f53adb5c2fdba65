"""A task step that ends once its message was sent, before its outcome (its run cancelled, failed or
timed out), has its message revoked on its broker: Celery's ``revoke`` of its task id, the step's
id. Here the revoke the broker's app sends is recorded; end to end, a team's worker that holds the
message discards it (``test_task_nodes_e2e``)."""

from __future__ import annotations

from typing import Any

import pytest

from ductor_project.core.context import tenant_context
from workflows import services
from workflows.engine import brokers
from workflows.engine.statements import start_tasks
from workflows.engine.tick import tick
from workflows.models import StepRun, TaskCatalogEntry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_client")]


@pytest.fixture
def revoked(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The task ids Ductor's broker app revokes (its broadcast is not sent)."""
    sent: list[Any] = []
    monkeypatch.setattr(brokers.broker_app("default").control, "revoke", lambda task_id, **_: sent.append(task_id))
    return sent


def cancelled_task_step(tenant: Any, *, sent: bool) -> StepRun:
    """A one-task run of ``tenant`` cancelled, its step's message sent first or not."""
    TaskCatalogEntry.objects.get_or_create(name="team.add", defaults={"queue": "team"})
    with tenant_context(tenant):
        services.workflow_put(name="w", spec={"nodes": [{"id": "t", "type": "task", "task": "team.add"}]})
        run, _ = services.run_start(workflow="w")
        step = StepRun.objects.get(run=run)
        if sent:
            start_tasks([str(step.pk)])  # as its publisher marks it
        services.run_cancel(run=run)
        tick(run.pk)
        assert StepRun.objects.get(pk=step.pk).status == "cancelled"
    return step


def test_a_cancelled_task_step_s_message_is_revoked_by_its_task_id(tenant_a, revoked):
    step = cancelled_task_step(tenant_a[0], sent=True)
    assert revoked == [str(step.pk)]


def test_a_task_step_cancelled_before_it_was_sent_revokes_nothing(tenant_a, revoked):
    cancelled_task_step(tenant_a[0], sent=False)
    assert revoked == []


def test_a_broker_away_leaves_the_cancel_whole(tenant_a, monkeypatch):
    def away(task_id: Any, **_: Any) -> None:
        raise ConnectionError("broker away")

    monkeypatch.setattr(brokers.broker_app("default").control, "revoke", away)
    cancelled_task_step(tenant_a[0], sent=True)
