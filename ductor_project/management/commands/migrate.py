"""``migrate``, as the tables' owner: Django's command, run with ``DATABASE_OWNER_URL``'s
credentials when it is set, and the one step that builds the second wall (row-level security
on every tenant-owned table, after the migrations; ``tenants.row_security``). The roles the wall
needs are checked before anything is migrated."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.core.management.commands import migrate
from django.db import connections

from ductor_project.core.database.security import RowSecurityError, as_owner, check_roles, owner_credentials


class Command(migrate.Command):
    help = f"{migrate.Command.help} Runs as DATABASE_OWNER_URL's role when set, and secures the tenant tables."

    def handle(self, *args: Any, **options: Any) -> Any:
        connection = connections[options["database"]]
        try:
            with as_owner(connection):
                # Before any migration: refused roles create no table (the app role would own them).
                check_roles(connection, app_role=settings.DUCTOR_DB_APP_ROLE,
                            maintenance_role=settings.DUCTOR_DB_MAINTENANCE_ROLE)
                return super().handle(*args, **options)
        except RowSecurityError as exc:
            unset = "" if owner_credentials() else (
                " DATABASE_OWNER_URL is not set, so migrate would run as the app role (DATABASE_URL).")
            raise CommandError(f"{str(exc).rstrip('.')}.{unset}") from exc
