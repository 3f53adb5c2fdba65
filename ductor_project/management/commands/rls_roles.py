"""``manage.py rls_roles``: the SQL an administrator runs once, before the first ``migrate``, when
Ductor uses a PostgreSQL of their own (``DATABASE_URL``): the maintenance role, and the app role's
membership of it. Embedded mode creates them itself."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from ductor_project.core.database.security import roles_sql


class Command(BaseCommand):
    help = "Print the SQL that creates the database roles row-level security needs (run it as a superuser)."

    def handle(self, *args: Any, **options: Any) -> None:
        app_role, database = connection.settings_dict["USER"], connection.settings_dict["NAME"]
        # Without either, the SQL would name the role or database "", which PostgreSQL refuses.
        example = "postgresql://ductor_app:…@host:5432/ductor"
        if not app_role:
            raise CommandError(f"DATABASE_URL names no user, and its user is the app role the SQL is for: {example}")
        if not database:
            raise CommandError(f"DATABASE_URL names no database, and the app role is granted its database: {example}")
        for statement in roles_sql(app_role, settings.DUCTOR_DB_MAINTENANCE_ROLE, database):
            self.stdout.write(f"{statement.as_string(None)};")
