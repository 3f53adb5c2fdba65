"""The data migrations of the scheduling app, run forward and back on the real PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from ductor_project.core.context import tenant_context
from ductor_project.core.database.security import as_owner
from tenants.row_security import secure_tenant_tables
from tests.conftest import let_the_app_role_truncate

BEFORE = [("scheduling", "0001_initial")]
AFTER = [("scheduling", "0002_one_template_language")]


def migrate(targets: list[tuple[str, str]]) -> Any:
    """Migrate to ``targets`` as ``manage.py migrate`` does: as the tables' owner, whom row-level
    security does not bind (a data migration sees every tenant's rows)."""
    with as_owner(connection):
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(targets)
        return executor.loader.project_state(targets).apps


def latest() -> list[tuple[str, str]]:
    """The scheduling app's last migration: where the rest of the suite expects its tables."""
    return MigrationExecutor(connection).loader.graph.leaf_nodes("scheduling")


@pytest.mark.django_db(transaction=True)
def test_stored_rules_move_to_the_one_template_language_and_back(tenant_a: Any) -> None:
    tenant = tenant_a[0]
    try:
        check_rules_move_and_back(tenant)
    finally:  # back to every table of today (going to 0001 dropped the later migrations' too)
        migrate(latest())
        with as_owner(connection):  # as manage.py migrate ends: the roles' grants and the wall
            secure_tenant_tables()
            let_the_app_role_truncate()


def check_rules_move_and_back(tenant: Any) -> None:
    old = migrate(BEFORE)
    with tenant_context(tenant):  # the app's own reads and writes: row-level security binds them
        rule = old.get_model("scheduling", "Rule").objects.create(
            tenant_id=tenant.pk, name="r", priority=1,
            match={"conditions": [{"path": "customer.tier", "op": "eq", "value": "gold"}]},
            action={"partition_key": "c-{input.customer.id}-{workflow}"},
        )
    new_model = migrate(AFTER).get_model("scheduling", "Rule")
    with tenant_context(tenant):
        new = new_model.objects.get(pk=rule.pk)
    assert new.match == {"conditions": [{"path": "input.customer.tier", "op": "eq", "value": "gold"}]}
    assert new.action == {"partition_key": "c-{{ $input.customer.id }}-{{ $workflow }}"}
    back_model = migrate(BEFORE).get_model("scheduling", "Rule")
    with tenant_context(tenant):
        back = back_model.objects.get(pk=rule.pk)
    assert (back.match, back.action) == (rule.match, rule.action)
