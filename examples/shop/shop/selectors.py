"""Reads. An order is only ever found under its tenant: there is no lookup by ``ref`` alone."""

from __future__ import annotations

from shop.models import Order


def order_for_tenant(*, tenant_id: str, ref: str, for_update: bool = False) -> Order:
    """The tenant's order ``ref`` (locked with ``for_update``, inside a transaction). Raises
    ``Order.DoesNotExist``, also for another tenant's order of that number."""
    rows = Order.objects.select_for_update() if for_update else Order.objects
    return rows.get(tenant_id=tenant_id, ref=ref)
