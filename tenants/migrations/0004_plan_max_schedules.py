from django.db import migrations, models

# Each seeded plan's max_schedules. docs/entitlements.md documents these numbers; change both together.
MAX_SCHEDULES = {"free": 10, "pro": 200, "enterprise": 2000}


def seed_max_schedules(apps, schema_editor):
    Plan = apps.get_model("tenants", "Plan")
    for slug, value in MAX_SCHEDULES.items():
        Plan.objects.filter(slug=slug).update(max_schedules=value)


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0003_plans"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="max_schedules",
            field=models.PositiveIntegerField(default=10, help_text="Schedules (cron or interval triggers)."),
        ),
        migrations.RunPython(seed_max_schedules, migrations.RunPython.noop),
    ]
