"""The fair queue's copy of a tenant's limits and of its fairness keys' weights, brought up to date
between enqueues (``configure``, ``set_key_weights``), waking what a change may admit.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduling.fair_queue.items import TenantConf, conf_args, key_weight_args, scope_args
from scheduling.fair_queue.layout import tenant_call, tenant_of
from tenants.models import Tenant


def configure(
    *, scopes: Mapping[str, str] | None = None, replace_scopes: bool = False, tenant: Tenant | None = None
) -> int:
    """Bring the tenant's copy of its limits up to date now, instead of at its next enqueue,
    and wake what the change may admit.

    Writes the tenant's conf from its entitlements and status (a tenant parked at an old
    ceiling, or while suspended, is looked at again), and the admission scope confs given
    (see ``enqueue_many``; with ``replace_scopes``, every other scope conf of the tenant is
    deleted): the partitions parked on a changed pool, or on the pools of a changed
    connection, are woken. One round trip, atomic. Returns how many scope confs changed.
    Raises ``TenantScopeError`` without a tenant.
    """
    tenant = tenant_of(tenant)
    conf = TenantConf.for_tenant(tenant)
    args = [1, *conf_args(conf), 1 if replace_scopes else 0, *scope_args(scopes or {})]
    return int(tenant_call("fq_configure", tenant, *args))


# Fairness key weights written per script call (``set_key_weights``).
KEY_WEIGHTS_PER_CALL = 1000


def set_key_weights(
    weights: Mapping[str, int], *, replace: bool = False, tenant: Tenant | None = None
) -> int:
    """Set the weights of some of the tenant's fairness keys (key -> weight >= 1; 1 is the default),
    or with ``replace`` make them all of its key weights (every other key weighs 1 again). A
    backlogged key's next service is charged at its new weight. One round trip per
    ``KEY_WEIGHTS_PER_CALL`` keys, each atomic (with ``replace``, the keys of a later call weigh 1
    until it ran). Returns how many weights changed. Raises ``ValueError`` for a bad key or weight
    and ``TenantScopeError`` without a tenant."""
    tenant = tenant_of(tenant)
    pairs = list(weights.items())
    key_weight_args(weights)
    chunks = [pairs[i : i + KEY_WEIGHTS_PER_CALL] for i in range(0, len(pairs), KEY_WEIGHTS_PER_CALL)] or [[]]
    changed = 0
    for n, chunk in enumerate(chunks):
        if chunk or (replace and n == 0):
            changed += int(tenant_call("fq_key_weights", tenant, 1 if replace and n == 0 else 0,
                                        *key_weight_args(dict(chunk))))
    return changed

