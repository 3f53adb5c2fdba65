"""The shop's Celery tasks, which Ductor's workflows call as ``task`` nodes (queue ``shop``).

Thin wrappers of ``shop.services``: each reads its tenant and idempotency key from the Ductor step
it runs for (``current_step()``, which raises ``NotInStep`` outside one) and returns JSON, the
step's output. An exception fails the step with its type and message (``OutOfStock: ...``).
"""

from __future__ import annotations

from typing import Any

from ductor_sdk.worker import current_step, step
from shop import services
from shop_project.celery import app


@step(app, name="shop.reserve_stock")
def reserve_stock(order: str, sku: str, quantity: int) -> dict[str, Any]:
    """Reserve the order's stock; raises ``OutOfStock``."""
    row = services.order_reserve(tenant_id=current_step().tenant_id, ref=order, sku=sku, quantity=quantity)
    return {"order": row.ref, "sku": row.sku, "quantity": row.quantity}


@step(app, name="shop.charge")
def charge(order: str) -> dict[str, Any]:
    """Charge the reserved order, once whatever the number of deliveries and attempts."""
    ctx = current_step()
    payment = services.order_charge(tenant_id=ctx.tenant_id, ref=order, idempotency_key=ctx.idempotency_key,
                                    attempt=ctx.attempt)
    return {"order": order, "charged_cents": payment.amount_cents, "payment": payment.idempotency_key,
            "charged_on_attempt": payment.attempt}


@step(app, name="shop.ship")
def ship(order: str) -> dict[str, Any]:
    """Ship the charged order; its tracking number."""
    row = services.order_ship(tenant_id=current_step().tenant_id, ref=order)
    return {"order": row.ref, "tracking": row.tracking}
