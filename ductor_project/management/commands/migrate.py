"""``migrate``, as the tables' owner: Django's command, run with ``DATABASE_OWNER_URL``'s
credentials when it is set, and the one step that builds the second wall (row-level security
on every tenant-owned table, after the migrations; ``tenants.row_security``)."""

from __future__ import annotations

from typing import Any

from django.core.management.commands import migrate
from django.db import connections

from ductor_project.core.database.security import as_owner


class Command(migrate.Command):
    help = f"{migrate.Command.help} Runs as DATABASE_OWNER_URL's role when set, and secures the tenant tables."

    def handle(self, *args: Any, **options: Any) -> Any:
        with as_owner(connections[options["database"]]):
            return super().handle(*args, **options)
