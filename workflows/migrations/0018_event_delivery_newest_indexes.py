"""The admin's lists of every tenant's events and webhook deliveries, newest first, read an index of
their own (``event_newest``, ``delivery_newest``): without one, each page of either list sorted the
whole table (on 400,000 rows, a parallel scan and a sort: 163 and 180 ms a page).

Each table gives up the index of its tenant alone instead, so each row written has no more indexes to
write than before: every query of a tenant's events or deliveries is served by an index that leads
with the tenant (``event_tenant_age``, ``event_tenant_name``, ``delivery_endpoint``), and the foreign
key's checks too.

As ``0014``: the tenant's field changes through Django's operation in the state only, and the
database drops the two indexes and builds the two others ``CONCURRENTLY``: the tables keep taking
writes meanwhile."""

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from workflows.migrations._ops import drop_index_concurrently

EVENTS, EVENT_TENANT = "workflows_event", "workflows_event_tenant_id_53720ac3"
DELIVERIES, DELIVERY_TENANT = "workflows_webhookdelivery", "workflows_webhookdelivery_tenant_id_282b88a1"


def unindexed_tenant() -> models.ForeignKey:
    return models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name="+",
                             to="tenants.tenant")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tenants", "0008_usage_within_run_quota"),
        ("workflows", "0017_run_list_workflow_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(model_name="event", name="tenant", field=unindexed_tenant()),
                migrations.AlterField(model_name="webhookdelivery", name="tenant", field=unindexed_tenant()),
            ],
            database_operations=[
                drop_index_concurrently(EVENTS, EVENT_TENANT, "tenant_id"),
                drop_index_concurrently(DELIVERIES, DELIVERY_TENANT, "tenant_id"),
            ],
        ),
        AddIndexConcurrently(model_name="event",
                             index=models.Index(fields=["-created_at", "-id"], name="event_newest")),
        AddIndexConcurrently(model_name="webhookdelivery",
                             index=models.Index(fields=["-created_at", "-id"], name="delivery_newest")),
    ]
