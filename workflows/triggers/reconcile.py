"""The schedules' reconciler: put back the wake-ups that Redis lost, from PostgreSQL.

A tenant's schedule wake-up lives in the fair queue only; what it must do is in
the schedules' rows (``wake_at``). Every pass of the coordinator's reconcilers
re-arms the wake-up of each tenant whose earliest ``wake_at`` is more than
``STALE_WAKE_S`` overdue: its wake-up was lost (a crash between a commit and its
enqueue) or is late. After Redis lost its data (``full``) every tenant with an
active schedule is re-armed at once. Arming is idempotent (a waiting wake-up
keeps the earlier due time; one in flight runs once more after its ack, and
finds nothing new), so re-arming one that was only late costs at most a no-op
wake-up. The fires missed meanwhile are then caught up within each schedule's
``catchup_window_s``. Crosses tenants by design: it is the system's housekeeping.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Min
from django.utils import timezone

from tenants.models import Tenant
from workflows.models import Schedule
from workflows.triggers.arming import arm

# An earliest wake this overdue is re-armed (twice the coordinator's pass, so that a wake-up being
# dispatched right now is left alone).
STALE_WAKE_S = 2.0


def reconcile_schedules(*, full: bool = False) -> int:
    """Re-arm the wake-up of every tenant whose schedules look forgotten, or with ``full`` of every
    tenant with an active schedule (see the module docs); returns how many tenants."""
    rows = Schedule.all_tenants.filter(paused=False, wake_at__isnull=False)
    if not full:
        rows = rows.filter(wake_at__lt=timezone.now() - timedelta(seconds=STALE_WAKE_S))
    per_tenant = rows.order_by().values("tenant_id").annotate(first=Min("wake_at"))
    firsts = {row["tenant_id"]: row["first"] for row in per_tenant}
    for tenant in Tenant.objects.filter(pk__in=list(firsts)):
        arm(tenant, firsts[tenant.pk])
    return len(firsts)
