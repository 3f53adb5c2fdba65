"""The data migrations of the scheduling app, run forward and back on the real PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("scheduling", "0001_initial")]
AFTER = [("scheduling", "0002_one_template_language")]


def migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_stored_rules_move_to_the_one_template_language_and_back(tenant_a: Any) -> None:
    old = migrate(BEFORE)
    rule = old.get_model("scheduling", "Rule").objects.create(
        tenant_id=tenant_a[0].pk, name="r", priority=1,
        match={"conditions": [{"path": "customer.tier", "op": "eq", "value": "gold"}]},
        action={"partition_key": "c-{input.customer.id}-{workflow}"},
    )
    new = migrate(AFTER).get_model("scheduling", "Rule").objects.get(pk=rule.pk)
    assert new.match == {"conditions": [{"path": "input.customer.tier", "op": "eq", "value": "gold"}]}
    assert new.action == {"partition_key": "c-{{ $input.customer.id }}-{{ $workflow }}"}
    back = migrate(BEFORE).get_model("scheduling", "Rule").objects.get(pk=rule.pk)
    assert (back.match, back.action) == (rule.match, rule.action)
    migrate(AFTER)
