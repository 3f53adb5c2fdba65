"""The index of the run list's filter by workflow (``?workflow=``, and the cancel and retry of many
runs by it): a tenant's runs of one workflow, newest first. Without it the filter walked the tenant's
runs newest first until it had a page, and the planner, which knows a rare workflow is rare, read the
whole table instead: on a tenant with a million runs, a workflow with a few old ones, or none, cost a
scan of every tenant's runs.

Its columns never change once the run is written, so a run's status updates stay as they were.

Built ``CONCURRENTLY``, as ``0008`` and ``0012``: the runs table keeps taking writes meanwhile."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("workflows", "0016_webhook_deleted_at"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="workflowrun",
            index=models.Index(fields=["tenant", "workflow_name", "-created_at", "-id"], name="run_tenant_workflow"),
        ),
    ]
