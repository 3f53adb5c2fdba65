"""An attempt's and an event's ``run`` lose the index of their own: the unique indexes on
``(run, node, attempt)`` and ``(run, seq)`` lead with it and serve every lookup by run (the
run's attempts, its history, the cascade of a deleted run), so each attempt and each event
written had one index more to write, and each vacuum after retention one more to clean.

Only the state changes through Django's operation; the database drops the two indexes
``CONCURRENTLY`` (not in a transaction), leaving the foreign keys as they are: Django's own
operation would drop and add each foreign key again, which checks every row under a lock."""

import django.db.models.deletion
from django.db import migrations, models

from workflows.migrations._ops import drop_index_concurrently

INDEXES = {"workflows_runevent": "workflows_runevent_run_id_73b2add6",
           "workflows_steprun": "workflows_steprun_run_id_7280c46a"}


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("workflows", "0008_run_list_and_reconcile_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="runevent",
                    name="run",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name="events", to="workflows.workflowrun"),
                ),
                migrations.AlterField(
                    model_name="steprun",
                    name="run",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name="steps", to="workflows.workflowrun"),
                ),
            ],
            database_operations=[
                drop_index_concurrently(table, index, "run_id") for table, index in INDEXES.items()
            ],
        ),
    ]
