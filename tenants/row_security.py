"""The second wall: PostgreSQL row-level security on every tenant-owned table.

Under the scoped managers (``tenants.scoping``), the database itself refuses
another tenant's rows. Every concrete ``TenantScopedModel`` gets, at the end of
each ``migrate`` (run as the tables' owner), row-level security on its table
and two policies: a session sees and writes the rows whose ``tenant_id``
is its ``ductor.tenant_id``, and the maintenance role sees them all. The
connection sets both from the code's context before each query
(``ductor_project.core.database``): a query outside any tenant's context, and
outside ``across_tenants``, sees no tenant's rows at all.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import connections, transaction

from ductor_project.core.database.security import building_the_wall, secure_tables
from tenants.scoping import TenantScopedModel


def tenant_tables() -> list[str]:
    """The tables of every concrete tenant-owned model, of every installed app."""
    return sorted(
        model._meta.db_table for model in apps.get_models()
        if issubclass(model, TenantScopedModel) and not model._meta.proxy and model._meta.managed
    )


def secure_tenant_tables(*, using: str = "default", **kwargs: Any) -> None:
    """The ``post_migrate`` receiver: put the wall up (again) on every tenant table, at the end of
    a ``migrate`` only (a test database's flush emits the signal too, as the app's role)."""
    if not building_the_wall():
        return
    with transaction.atomic(using=using):
        secure_tables(connections[using], tenant_tables(), app_role=settings.DUCTOR_DB_APP_ROLE,
                      maintenance_role=settings.DUCTOR_DB_MAINTENANCE_ROLE)
