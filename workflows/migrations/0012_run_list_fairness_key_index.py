"""The index of the run list's filter by fairness key (``?fairness_key=``, and the cancel of many
runs by it): a tenant's runs of one key, newest first. Partial, over the runs that have a key, so
the many that have none cost their inserts nothing.

The filter by tag has no index of its own: under row-level security the planner may not read a
column's statistics through ``jsonb`` operators (they are not leakproof), so it takes every tag for
a common one and would never choose a tag index over the tenant's newest-first walk.

Built ``CONCURRENTLY``, as ``0008``: the runs table keeps taking writes meanwhile."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("workflows", "0011_workflow_archived_at"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="workflowrun",
            index=models.Index(fields=["tenant", "fairness_key", "-created_at", "-id"],
                               condition=~models.Q(fairness_key=""), name="run_tenant_fairness_key"),
        ),
    ]
