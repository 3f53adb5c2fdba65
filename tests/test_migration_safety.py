"""Migrations a deployment applies while the previous release still runs (docs/operations.md,
Upgrading): none holds a lock on a large table for longer than a change of the catalog, and
none takes away what the previous release reads.

The operations that reach the database (a ``SeparateDatabaseAndState``'s database operations,
not its state's) are read from the migration graph, as ``migrate`` applies them. One on a table
of ``LARGE`` that the same migration does not create is refused when it

- builds an index holding the lock that blocks the table's writes for the whole build
  (``AddIndex``, ``AddConstraint``, a field with an index, a unique or a foreign key, whose
  check reads every row; SQL that creates an index without ``CONCURRENTLY``), or drops one so;
- adds a column whose database default is an expression: PostgreSQL writes every row again when
  it is volatile (``gen_random_uuid()``, ``clock_timestamp()``), under the lock that blocks reads;
- alters a column (a new type writes every row again, a new index is built), or the table in
  SQL (``ALTER TABLE``);

and one on any table is refused when it removes or renames a field or a model (the previous
release's processes still read it: expand, then contract in a later release), adds a column
that may not be null and has no default in the database (``db_default``: Django drops the one
``default`` gives once the column is filled, so the previous release's inserts, which leave the
column out, fail), or runs Python over the data (``migrate`` holds its locks until it ends: it
must work in batches).

A migration named in ``REVIEWED`` was read for what it does to a live deployment; the reason
says why it stays as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations.base import Operation

# Tables that grow with the work: millions of rows on a busy deployment.
LARGE = frozenset({("workflows", "workflowrun"), ("workflows", "steprun"), ("workflows", "runevent"),
                   ("workflows", "event"), ("workflows", "eventwait"), ("workflows", "runsignal"),
                   ("workflows", "webhookdelivery")})

_BEFORE_HISTORY = ("applied, as every migration is, once by each deployment; a deployment that "
                   "started after it has run it on empty tables")
_PLAN_LIMIT = ("updates the three seeded plans; the limit has no default in the database: a plan the "
               "previous release's platform API created failed from the migration until it was replaced")
REVIEWED = {
    ("workflows", "0003_run_rerun_of"): (
        "the runs' rerun_of: its foreign key is checked and its index built while the runs table "
        f"takes no writes; {_BEFORE_HISTORY}"),
    ("workflows", "0006_waits_signals_webhooks"): (
        "event_tenant_age and run_tenant_root_finished are built while the events and runs tables "
        f"take no writes; {_BEFORE_HISTORY}"),
    ("workflows", "0007_run_fairness_key"): (
        "fairness_key has no default in the database: the previous release's run starts failed from "
        "the migration until its processes were replaced"),
    ("workflows", "0013_event_refused_triggers"): (
        "refused has no default in the database: the previous release's events failed from the "
        "migration until its processes were replaced"),
    ("scheduling", "0002_one_template_language"): "rewrites every stored rule: a few per tenant",
    ("tenants", "0002_system_tenant"): "creates one row",
    ("tenants", "0003_plans"): "seeds the three plans; a tenant's plan has no default in the database",
    ("tenants", "0004_plan_max_schedules"): _PLAN_LIMIT,
    ("tenants", "0005_plan_event_retention"): _PLAN_LIMIT,
    ("tenants", "0006_plan_history_retention"): _PLAN_LIMIT,
    ("tenants", "0007_plan_max_fairness_keys"): _PLAN_LIMIT,
}

_INDEX_SQL = re.compile(r"\bCREATE\s+(UNIQUE\s+)?INDEX\s+(?!CONCURRENTLY\b)", re.IGNORECASE)
_ALTER_SQL = re.compile(r"\bALTER\s+TABLE\b", re.IGNORECASE)


def database_operations(operations: list[Operation]) -> Iterator[Operation]:
    """The operations that reach the database, those inside ``SeparateDatabaseAndState`` included."""
    for operation in operations:
        if isinstance(operation, migrations.SeparateDatabaseAndState):
            yield from database_operations(operation.database_operations)
        else:
            yield operation


def _field_problem(field: models.Field) -> str | None:
    if field.many_to_many:
        return None
    if field.db_index or field.unique or field.remote_field is not None:
        return "builds an index or checks a foreign key while the table takes no writes"
    db_default = field.db_default
    if hasattr(db_default, "resolve_expression") and not isinstance(db_default, models.Value):
        return "adds a column whose default is an expression: a volatile one writes every row again"
    return None


def _large_table_problem(operation: Operation) -> str | None:
    """Why ``operation``, on a large table that exists, would block it on a live deployment."""
    if isinstance(operation, migrations.AddIndex | migrations.RemoveIndex):
        concurrent = isinstance(operation, AddIndexConcurrently | RemoveIndexConcurrently)
        return None if concurrent else "builds or drops an index without CONCURRENTLY"
    if isinstance(operation, migrations.AddConstraint):
        return "adds a constraint, which reads every row while the table takes no writes"
    if isinstance(operation, migrations.AddField):
        return _field_problem(operation.field)
    if isinstance(operation, migrations.AlterField):
        return "alters a column: a new type writes every row again, a new index blocks writes"
    if isinstance(operation, migrations.AlterUniqueTogether | migrations.AlterIndexTogether):
        return "builds an index without CONCURRENTLY"
    return None


def _sql_problem(operation: migrations.RunSQL) -> str | None:
    sql = str(operation.sql)
    tables = [f"{app}_{model}" for app, model in LARGE]
    if not any(table in sql for table in tables):
        return None
    if _INDEX_SQL.search(sql):
        return "creates an index on a large table without CONCURRENTLY"
    if _ALTER_SQL.search(sql):
        return "alters a large table: most forms lock it against reads and writes, some write every row again"
    return None


def _insert_problem(field: models.Field) -> str | None:
    if field.null or field.many_to_many or field.primary_key or field.db_default is not models.NOT_PROVIDED:
        return None
    return "adds a column that may not be null, with no db_default: the previous release's inserts fail"


def _contract_problem(operation: Operation) -> str | None:
    if isinstance(operation, migrations.RemoveField | migrations.RenameField | migrations.DeleteModel
                  | migrations.RenameModel):
        return "removes or renames what the previous release still reads"
    if isinstance(operation, migrations.RunPython):
        return "runs Python over the data, holding migrate's locks until it ends"
    return None


def problems(app: str, migration: migrations.Migration) -> list[str]:
    """What in ``migration`` (of ``app``) a live deployment cannot take while its previous release
    runs: one line per operation."""
    created = {op.name_lower for op in migration.operations if isinstance(op, migrations.CreateModel)}
    found = []
    for operation in database_operations(migration.operations):
        model = getattr(operation, "model_name_lower", None) or getattr(operation, "name_lower", None)
        problem = _contract_problem(operation)
        if problem is None and isinstance(operation, migrations.AddField) and model not in created:
            problem = _insert_problem(operation.field)
        if problem is None and isinstance(operation, migrations.RunSQL):
            problem = _sql_problem(operation)
        if problem is None and (app, model) in LARGE and model not in created:
            problem = _large_table_problem(operation)
        if problem is not None:
            found.append(f"{app}.{migration.name}: {operation.describe()}: {problem}")
    return found


def test_no_migration_blocks_a_large_table_or_takes_away_what_the_previous_release_reads() -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    found = [problem for (app, name), migration in sorted(loader.disk_migrations.items())
             if app in ("tenants", "scheduling", "workflows") and (app, name) not in REVIEWED
             for problem in problems(app, migration)]
    assert found == []


def test_every_reviewed_migration_exists_and_has_what_it_was_reviewed_for() -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    assert {key: bool(problems(key[0], loader.disk_migrations[key])) for key in REVIEWED} == dict.fromkeys(
        REVIEWED, True)


def _migration(*operations: Operation, atomic: bool = True) -> migrations.Migration:
    migration = migrations.Migration("9999_future", "workflows")
    migration.operations = list(operations)
    migration.atomic = atomic
    return migration


REFUSED = {
    "an index": migrations.AddIndex("steprun", models.Index(fields=["status"], name="step_status")),
    "an index in SQL": migrations.RunSQL('CREATE INDEX "x" ON "workflows_runevent" ("type")'),
    "a unique constraint": migrations.AddConstraint(
        "webhookdelivery", models.UniqueConstraint(fields=["run"], name="delivery_one_per_run")),
    "an indexed column": migrations.AddField("workflowrun", "label", models.CharField(max_length=8, db_index=True,
                                                                                      null=True)),
    "a foreign key": migrations.AddField("event", "endpoint", models.ForeignKey(
        "workflows.webhookendpoint", null=True, on_delete=models.SET_NULL)),
    "a volatile default": migrations.AddField("workflowrun", "token", models.UUIDField(
        db_default=models.Func(function="gen_random_uuid"))),
    "a column altered": migrations.AlterField("runevent", "type", models.CharField(max_length=64)),
    "a table altered in SQL": migrations.RunSQL('ALTER TABLE "workflows_steprun" ALTER COLUMN "node_id" TYPE text'),
    "a column the previous release's inserts leave out": migrations.AddField(
        "schedule", "note", models.TextField(default="")),
    "a column removed": migrations.RemoveField("workflowdefinition", "archived_at"),
    "a column renamed": migrations.RenameField("schedule", "jitter_s", "jitter"),
    "a data migration": migrations.RunPython(migrations.RunPython.noop),
}


@pytest.mark.parametrize("operation", REFUSED.values(), ids=REFUSED.keys())
def test_a_future_migration_that_would_block_a_large_table_is_refused(operation: Operation) -> None:
    assert len(problems("workflows", _migration(operation))) == 1


ALLOWED = {
    "an index built concurrently": AddIndexConcurrently("steprun", models.Index(fields=["status"], name="s")),
    "an index in SQL built concurrently": migrations.RunSQL(
        'CREATE INDEX CONCURRENTLY "x" ON "workflows_runevent" ("type")'),
    "a nullable column": migrations.AddField("steprun", "note", models.TextField(null=True)),
    "a column with a constant default in the database": migrations.AddField(
        "workflowrun", "label", models.CharField(max_length=8, db_default="")),
    "an index on a small table": migrations.AddIndex("schedule", models.Index(fields=["name"], name="n")),
}


@pytest.mark.parametrize("operation", ALLOWED.values(), ids=ALLOWED.keys())
def test_a_future_migration_that_keeps_the_large_tables_writable_passes(operation: Operation) -> None:
    assert problems("workflows", _migration(operation)) == []


def test_an_index_on_a_table_the_same_migration_creates_passes() -> None:
    create = migrations.CreateModel("steprun", fields=[("id", models.BigAutoField(primary_key=True))])
    index = migrations.AddIndex("steprun", models.Index(fields=["id"], name="i"))
    assert problems("workflows", _migration(create, index)) == []


def test_every_migration_can_be_migrated_back() -> None:
    """What a rollback may need, once no process of the release runs any more (docs/operations.md,
    Upgrading): every operation has its reverse (a seed's is to keep what it seeded)."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    one_way = [f"{app}.{name}: {operation.describe()}"
               for (app, name), migration in sorted(loader.disk_migrations.items())
               if app in ("tenants", "scheduling", "workflows")
               for operation in database_operations(migration.operations) if not operation.reversible]
    assert one_way == []
