"""Ductor's PostgreSQL backend: Django's, with the second wall under the scoped managers.

Every tenant-owned table has row-level security (``tenants.row_security``):
its rows are visible, and writable, only to a session whose
``ductor.tenant_id`` names their tenant, or to the maintenance role. This
backend (``ENGINE = "ductor_project.core.database"``) sets both from the code's
context before each query (``base.DatabaseWrapper``), and ``security`` holds
the roles, the policies and the owner's credentials that migrations use.
"""
