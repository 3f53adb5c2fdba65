"""``python manage.py create_tenant SLUG [--name N] [--plan P] [--json]``: a tenant and its first write key."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from rest_framework import serializers

from ductor_project.core.context import tenant_context
from ductor_project.core.errors import ApiError
from tenants import services
from tenants.models import ApiKey
from tenants.serializers import TenantCreateSerializer


class Command(BaseCommand):
    help = "Create a tenant on a plan (free unless --plan names another) and its first read+write API key."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument("--plan", default="free", help="the plan's name (default: free)")
        parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        name = _name(options["name"])
        try:
            with transaction.atomic():  # a refused key leaves no tenant behind
                tenant = services.tenant_create(slug=options["slug"], name=name, plan=options["plan"])
                with tenant_context(tenant):
                    _, raw = services.api_key_create(name="initial", scopes=[ApiKey.Scope.READ, ApiKey.Scope.WRITE])
        except ApiError as exc:
            raise CommandError(str(exc.detail)) from exc
        if options["json"]:
            payload = {"tenant": tenant.slug, "tenant_id": str(tenant.pk), "plan": tenant.plan_id, "api_key": raw}
            self.stdout.write(json.dumps(payload))
        else:
            self.stdout.write(f"Tenant {tenant.slug} ({tenant.pk}) on plan {tenant.plan_id}\n"
                              f"API key (shown once): {raw}")


def _name(raw: str) -> str:
    """``--name`` read as the API reads a tenant's name (trimmed, printable characters only, at most
    200 of them): a newline or a blank name was stored as given."""
    try:
        name: str = TenantCreateSerializer().fields["name"].run_validation(raw)
    except serializers.ValidationError as exc:
        raise CommandError(f"--name: {' '.join(str(message) for message in exc.detail)}") from None
    return name
