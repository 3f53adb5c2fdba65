from django.db import migrations, models

# Each seeded plan's max_fairness_keys. docs/entitlements.md documents these numbers; change both together.
MAX_FAIRNESS_KEYS = {"free": 10, "pro": 1000, "enterprise": 100_000}


def seed_max_fairness_keys(apps, schema_editor):
    Plan = apps.get_model("tenants", "Plan")
    for slug, value in MAX_FAIRNESS_KEYS.items():
        Plan.objects.filter(slug=slug).update(max_fairness_keys=value)


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0006_plan_history_retention'),
    ]

    operations = [
        migrations.AddField(
            model_name='plan',
            name='max_fairness_keys',
            field=models.PositiveIntegerField(default=100, help_text='Fairness keys given a weight of their own (others weigh 1).'),
        ),
        migrations.RunPython(seed_max_fairness_keys, migrations.RunPython.noop),
    ]
