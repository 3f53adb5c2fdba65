"""``python manage.py delete_tenant SLUG [--yes]``: offboard a suspended tenant, to the end.

The same path as ``DELETE /api/v1/tenants/{slug}`` and the admin's delete: the tenant is marked
``deleting`` (``tenants.services.tenant_delete``), then this command runs its purge batch after batch
(``workflows.offboarding``), printing each stage as it ends. Stopped part-way, the tenant stays
``deleting``: running the command again, or the coordinator, finishes the purge."""

from __future__ import annotations

import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ductor_project.core.context import no_tenant
from ductor_project.core.errors import ApiError, NotFound
from tenants import selectors, services
from tenants.models import Tenant
from workflows import offboarding


class Command(BaseCommand):
    help = ("Delete a suspended tenant and all its data: its rows in batches, its Redis keys, then the tenant. "
            "Asks for the slug again unless --yes.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    def handle(self, *args: Any, **options: Any) -> None:
        slug = options["slug"]
        with no_tenant():
            try:
                tenant = selectors.get_tenant(slug)
            except NotFound:
                raise CommandError(f"No tenant '{slug}'.") from None
            if not options["yes"]:
                self._confirm(tenant)
            try:
                tenant = services.tenant_delete(tenant=tenant)
            except ApiError as exc:
                raise CommandError(str(exc.detail)) from exc
            self.stdout.write(f"Tenant {tenant.slug} ({tenant.pk}) is being deleted; purging its data.")
            self._purge(tenant)

    def _confirm(self, tenant: Tenant) -> None:
        """The slug typed again on a terminal; with no terminal, ``--yes`` is needed."""
        if not sys.stdin.isatty():
            raise CommandError(f"Deleting tenant '{tenant.slug}' erases all its data: pass --yes to confirm.")
        typed = input(f"Deleting tenant '{tenant.slug}' erases all its data. Type its slug to confirm: ")
        if typed.strip() != tenant.slug:
            raise CommandError("Not confirmed: nothing changed.")

    def _purge(self, tenant: Tenant) -> None:
        stage, count = "", 0
        while True:
            progress = offboarding.purge_batch(tenant)
            if progress.stage != stage and stage:
                self.stdout.write(f"  {stage}: {count} deleted")
                count = 0
            stage = progress.stage
            count += progress.deleted
            if progress.done:
                self.stdout.write(f"  {stage}: {count} keys deleted")
                self.stdout.write(f"Tenant {tenant.slug} deleted.")
                return
            time.sleep(progress.seconds * offboarding.REST_PER_BATCH)
