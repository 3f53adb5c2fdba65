"""Fields of the SDK's models that hold one of a fixed set of values, checked by ``mypy --strict`` in
``tests/sdk/test_typing.py`` (a line marked ``# E: <code>`` must be reported with that code)."""

from __future__ import annotations

from typing import assert_type

from ductor_sdk import Client, Workflow
from ductor_sdk.models import Applied, ApplyOutcome, TaskArguments, TaskEntry


def outcome_of(client: Client, wf: Workflow) -> ApplyOutcome:
    applied = client.workflows.apply(wf)
    assert_type(applied, Applied)
    assert_type(applied.outcome, ApplyOutcome)
    if applied.outcome == "described":
        return "described"
    if applied.outcome == "create":  # E: comparison-overlap
        return "created"
    return applied.outcome


def arguments_of(entry: TaskEntry) -> TaskArguments:
    assert_type(entry.arguments, TaskArguments)
    if entry.arguments == "args":  # E: comparison-overlap
        return "single"
    return entry.arguments


unknown: ApplyOutcome = "deleted"  # E: assignment


def started_and_scheduled(client: Client) -> None:
    client.runs.start("report", tier="batch")
    client.runs.start("report", tier="bulk")  # E: arg-type
    client.schedules.create("nightly", "report", cron="0 2 * * *", overlap="buffer_one")
    client.schedules.create("nightly", "report", cron="0 2 * * *", overlap="queue")  # E: arg-type


def routed_keyed_and_hooked(client: Client) -> None:
    client.connections.create("crm", "http")
    client.connections.create("crm", "htpp")  # E: arg-type
    client.pools.create("main", strategy="weighted")
    client.pools.create("main", strategy="random")  # E: arg-type
    client.api_keys.create("ci", scopes=["read"])
    client.api_keys.create("ci", scopes=["admin"])  # E: list-item
    client.webhooks.create("https://hooks.example.com", ["run.failed"])
    client.webhooks.create("https://hooks.example.com", ["run.failure"])  # E: list-item
