"""A run's ``tenant`` loses the index of its own, and its ``status`` the ``LIKE`` index Django adds
to an indexed text column. Each index of the runs table is written with every run started and with
every change of its status (an ``UPDATE`` of an indexed column is never HOT): sixteen of them were.

- The tenant's: every query of a tenant's runs is served by one of the indexes that lead with the
  tenant (the list's, the status filter's, retention's, the fairness key's), and the foreign key's
  checks too. Under row-level security a lone index on the tenant invites the planner to AND it
  with the run's own (``0010`` for attempts and events).
- The status's pattern index (``varchar_pattern_ops``): no query matches a status by pattern. The
  status keeps its btree, which the admin's filter over every tenant reads, renamed ``run_status``
  as the model now declares it.

As ``0010``: only the state changes through Django's operations; the database drops the two
indexes ``CONCURRENTLY`` and renames the third, rebuilding nothing."""

import django.db.models.deletion
from django.db import migrations, models

from workflows.migrations._ops import drop_index_concurrently

TABLE = "workflows_workflowrun"
TENANT, STATUS = "workflows_workflowrun_tenant_id_d39ee853", "workflows_workflowrun_status_f49f0a75"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tenants", "0008_usage_within_run_quota"),
        ("workflows", "0013_event_refused_triggers"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="workflowrun",
                    name="tenant",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT,
                                            related_name="+", to="tenants.tenant"),
                ),
                migrations.AlterField(
                    model_name="workflowrun",
                    name="status",
                    field=models.CharField(choices=[("pending", "Pending"), ("running", "Running"),
                                                    ("waiting", "Waiting"), ("succeeded", "Succeeded"),
                                                    ("failed", "Failed"), ("cancelled", "Cancelled"),
                                                    ("continued", "Continued")],
                                           default="pending", max_length=16),
                ),
                migrations.AddIndex(model_name="workflowrun", index=models.Index(fields=["status"], name="run_status")),
            ],
            database_operations=[
                drop_index_concurrently(TABLE, TENANT, "tenant_id"),
                migrations.RunSQL(f'DROP INDEX CONCURRENTLY IF EXISTS "{STATUS}_like"',
                                  reverse_sql=f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{STATUS}_like" '
                                              f'ON "{TABLE}" ("status" varchar_pattern_ops)'),
                migrations.RunSQL(f'ALTER INDEX "{STATUS}" RENAME TO "run_status"',
                                  reverse_sql=f'ALTER INDEX "run_status" RENAME TO "{STATUS}"'),
            ],
        ),
    ]
