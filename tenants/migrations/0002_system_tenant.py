"""The reserved system tenant: owner of engine-internal work. It can never authenticate."""

from django.db import migrations

SYSTEM_TENANT_ID = "00000000-0000-0000-0000-000000000001"


def create_system_tenant(apps, schema_editor):
    Tenant = apps.get_model("tenants", "Tenant")
    Tenant.objects.get_or_create(
        slug="system",
        defaults={"id": SYSTEM_TENANT_ID, "name": "System (engine-internal)", "status": "active"},
    )


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]

    operations = [migrations.RunPython(create_system_tenant, migrations.RunPython.noop)]
