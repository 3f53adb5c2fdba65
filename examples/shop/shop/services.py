"""Writes: reserve, charge and ship a tenant's order. Each is idempotent, since Ductor delivers a step at
least once and runs a failed one again (a new attempt): asked again, it returns what it did the first time."""

from __future__ import annotations

from django.db import transaction
from shop.models import Order, Payment, Product
from shop.selectors import order_for_tenant


class OutOfStock(Exception):
    """The warehouse holds fewer of the product than the order asks for; nothing was reserved. Asking
    again at once would not change that: its Ductor step fails for good, whatever its retry policy
    (``ductor_retryable``, which ``ductor_sdk``'s errback reads; the shop's domain imports no SDK)."""

    ductor_retryable = False


class NotCharged(Exception):
    """An order is shipped only once it is charged."""


def order_reserve(*, tenant_id: str, ref: str, sku: str, quantity: int) -> Order:
    """Take ``quantity`` of ``sku`` from the stock for the tenant's order ``ref``, once: an order that
    exists is returned as it is. Raises ``OutOfStock`` (nothing taken) or ``Product.DoesNotExist``."""
    with transaction.atomic():
        # The product's lock also serializes two deliveries of one reservation.
        product = Product.objects.select_for_update().get(sku=sku)
        existing = Order.objects.filter(tenant_id=tenant_id, ref=ref).first()
        if existing is not None:
            return existing
        if product.stock < quantity:
            raise OutOfStock(f"order {ref} asks for {quantity} x {sku}, {product.stock} in stock")
        product.stock -= quantity
        product.save(update_fields=["stock"])
        return Order.objects.create(tenant_id=tenant_id, ref=ref, sku=sku, quantity=quantity)


def order_charge(*, tenant_id: str, ref: str, idempotency_key: str, attempt: int) -> Payment:
    """Charge the tenant's order ``ref`` once: the order's payment if it has one (a delivery again, or a
    later attempt after an answer that was lost), else a new one under ``idempotency_key``."""
    with transaction.atomic():
        order = order_for_tenant(tenant_id=tenant_id, ref=ref, for_update=True)
        existing = Payment.objects.filter(order=order).first()
        if existing is not None:
            return existing
        amount = order.quantity * Product.objects.get(sku=order.sku).price_cents
        payment = Payment.objects.create(order=order, idempotency_key=idempotency_key, attempt=attempt,
                                         amount_cents=amount)
        order.status, order.charged_cents = Order.Status.CHARGED, amount
        order.save(update_fields=["status", "charged_cents"])
        return payment


def order_ship(*, tenant_id: str, ref: str) -> Order:
    """Ship the tenant's charged order ``ref`` once (its tracking number is kept). Raises ``NotCharged``."""
    with transaction.atomic():
        order = order_for_tenant(tenant_id=tenant_id, ref=ref, for_update=True)
        if order.status == Order.Status.RESERVED:
            raise NotCharged(f"order {ref} is not charged")
        if not order.tracking:
            order.status, order.tracking = Order.Status.SHIPPED, f"SHOP-{order.pk:06d}"
            order.save(update_fields=["status", "tracking"])
        return order
