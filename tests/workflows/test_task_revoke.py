"""A task step that ends before its task started (its run cancelled, failed or timed out) has its
messages revoked on their broker: Celery's ``revoke`` broadcast, which the team's workers hear. End
to end with a team's worker: ``test_task_nodes_e2e``."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from ductor_project.core.context import tenant_context
from tests.conftest import broker_redis
from workflows import services
from workflows.engine.tick import tick
from workflows.models import StepRun, TaskCatalogEntry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_client")]


def broadcasts(pubsub: Any) -> list[dict[str, Any]]:
    """The control commands broadcast on Ductor's broker since ``pubsub`` subscribed (kombu's fanout
    on Redis publishes each message on its exchange's channel)."""
    found, ends = [], time.monotonic() + 2
    while time.monotonic() < ends:
        message = pubsub.get_message(timeout=0.2)
        if message and message["type"] == "pmessage":
            body = json.loads(message["data"])
            found.append(json.loads(base64.b64decode(body["body"])))
            break
    return found


def test_a_cancelled_task_step_s_messages_are_revoked_on_their_broker(tenant_a, tenant_b):
    TaskCatalogEntry.objects.create(name="team.add", queue="team")
    pubsub = broker_redis().pubsub()
    pubsub.psubscribe("*pidbox*")
    pubsub.get_message(timeout=1)  # the subscription's confirmation
    with tenant_context(tenant_a[0]):
        services.workflow_put(name="w", spec={"nodes": [{"id": "t", "type": "task", "task": "team.add"}]})
        run, _ = services.run_start(workflow="w")
        step = StepRun.objects.get(run=run)
        services.run_cancel(run=run)
    with tenant_context(tenant_a[0]):
        tick(run.pk)
        assert StepRun.objects.get(pk=step.pk).status == "cancelled"

    (command,) = broadcasts(pubsub)
    assert command["method"] == "revoke"
    assert command["arguments"]["task_id"] == str(step.pk)  # its message's task id
