"""The fair queue's copy of each tenant's fairness key weights, kept current.

A key's weight lives in PostgreSQL (``FairnessKey``, written by ``scheduling.services`` or the admin)
and, for the dequeue, in the tenant's ``kw`` hash (``fair_queue.set_key_weights``). Every saved or
deleted row is written there once its transaction commits (``key_changed``, a model signal), so a
refused or rolled-back change never reaches the queue. When Redis lost its data, the reconciler
writes every tenant's weights again from PostgreSQL.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete

from ductor_project.core.context import tenant_context
from scheduling import fair_queue
from scheduling.models import FairnessKey
from tenants.models import Tenant


def key_changed(sender: Any, instance: FairnessKey, signal: Any, **kwargs: Any) -> None:
    """``post_save`` and ``post_delete`` of a ``FairnessKey``: its weight (1 once deleted) goes to its
    tenant's queue when the transaction commits."""
    weights = {instance.key: 1 if signal is post_delete else instance.weight}
    tenant = instance.tenant
    transaction.on_commit(lambda: fair_queue.set_key_weights(weights, tenant=tenant))


def reconcile_key_weights(*, full: bool = False) -> int:
    """A reconciler (``scheduling.coordinator.reconcile``): with ``full`` (Redis lost its data), make
    every tenant's queue weights those of its rows; otherwise nothing, since every change was
    written when it committed. Returns how many tenants were written."""
    if not full:
        return 0
    tenant_ids = FairnessKey.all_tenants.order_by().values_list("tenant_id", flat=True).distinct()
    written = 0
    for tenant in Tenant.objects.filter(pk__in=list(tenant_ids)):
        with tenant_context(tenant):
            weights = dict(FairnessKey.objects.values_list("key", "weight"))
            fair_queue.set_key_weights(weights, replace=True)
        written += 1
    return written
