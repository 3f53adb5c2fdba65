"""Stored rules in the one template and condition language (``scheduling.templates``).

Before it, a rule condition's path was a path into the step's input (``customer.tier``)
and a partition key used single-brace placeholders (``c-{input.customer}``,
``{workflow}``, ``{action}``). Every stored rule was written so: its paths get the
``input.`` root and its partition key the ``{{ $… }}`` references.
"""

import re

from django.db import migrations

_REFERENCE = re.compile(r"\{\{ \$(input(?:\.[A-Za-z0-9_]+)+|workflow|action) \}\}")


def forwards(apps, schema_editor):
    from scheduling.templates import upgrade_legacy_placeholders

    Rule = apps.get_model("scheduling", "Rule")
    for rule in Rule.objects.all().iterator():  # the historical manager crosses tenants
        for condition in rule.match.get("conditions", []):
            condition["path"] = f"input.{condition['path']}"
        if "partition_key" in rule.action:
            rule.action["partition_key"] = upgrade_legacy_placeholders("action.partition_key",
                                                                       rule.action["partition_key"])
        rule.save(update_fields=["match", "action"])


def backwards(apps, schema_editor):
    Rule = apps.get_model("scheduling", "Rule")
    for rule in Rule.objects.all().iterator():
        for condition in rule.match.get("conditions", []):
            condition["path"] = condition["path"].removeprefix("input.")
        if "partition_key" in rule.action:
            rule.action["partition_key"] = _REFERENCE.sub(r"{\1}", rule.action["partition_key"])
        rule.save(update_fields=["match", "action"])


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards)]
