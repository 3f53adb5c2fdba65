"""The indexes of the run list (a tenant's runs newest first) and of the reconciler's pass (the
active runs, keyed on a column no tick changes): without them both read every run of the history.

Built ``CONCURRENTLY`` (so not in a transaction): on a large history the build takes a while,
and the runs table keeps taking writes meanwhile."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("workflows", "0007_run_fairness_key"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="workflowrun",
            index=models.Index(fields=["tenant", "-created_at", "-id"], name="run_tenant_newest"),
        ),
        AddIndexConcurrently(
            model_name="workflowrun",
            index=models.Index(
                condition=models.Q(("status__in", ["cancelled", "continued", "failed", "succeeded"]), _negated=True),
                fields=["created_at"],
                name="run_active",
            ),
        ),
    ]
