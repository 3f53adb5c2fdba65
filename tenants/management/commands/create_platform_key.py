"""``python manage.py create_platform_key NAME``: a key for the platform-admin endpoints."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from tenants import services


class Command(BaseCommand):
    help = "Create a platform operator key (dctp_...) for /api/v1/tenants and other admin endpoints."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        key, raw = services.platform_key_create(name=options["name"])
        if options["json"]:
            self.stdout.write(json.dumps({"name": key.name, "platform_key": raw}))
        else:
            self.stdout.write(f"Platform key {key.name} (shown once): {raw}")
