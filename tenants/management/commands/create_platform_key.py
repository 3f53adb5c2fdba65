"""``python manage.py create_platform_key NAME``: a key for the platform-admin endpoints."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants import services
from tenants.models import PlatformKey


class Command(BaseCommand):
    help = "Create a platform operator key (dctp_...) for /api/v1/tenants and other admin endpoints."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"].strip()
        if not name or len(name) > 100:
            raise CommandError("NAME is 1 to 100 characters: what the key is for (e.g. 'ops', 'billing-sync')")
        if PlatformKey.objects.filter(name=name).exists():
            raise CommandError(f"A platform key named {name!r} exists already: give another name")
        key, raw = services.platform_key_create(name=name)
        if options["json"]:
            self.stdout.write(json.dumps({"name": key.name, "platform_key": raw}))
        else:
            self.stdout.write(f"Platform key {key.name} (shown once): {raw}")
