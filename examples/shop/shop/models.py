"""The shop's rows. Products are the warehouse's, shared; an order and its payment belong to the tenant
whose Ductor step made them (``tenant_id``, from ``current_step()``): read them through ``shop.selectors``."""

from __future__ import annotations

from django.db import models


class Product(models.Model):
    sku = models.CharField(max_length=32, unique=True)
    name = models.CharField(max_length=100)
    price_cents = models.PositiveIntegerField()
    stock = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.sku} ({self.stock} in stock)"


class Order(models.Model):
    class Status(models.TextChoices):
        RESERVED = "reserved"
        CHARGED = "charged"
        SHIPPED = "shipped"

    tenant_id = models.CharField(max_length=64)
    ref = models.CharField(max_length=64, help_text="The tenant's own order number.")
    sku = models.CharField(max_length=32)
    quantity = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RESERVED)
    charged_cents = models.PositiveIntegerField(default=0)
    tracking = models.CharField(max_length=32, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant_id", "ref"], name="shop_order_once_per_tenant")]

    def __str__(self) -> str:
        return f"{self.ref} of {self.tenant_id} ({self.status})"


class Payment(models.Model):
    """The one charge of an order (its unique ``order``), made under the Ductor idempotency key of the
    attempt that charged it."""

    order = models.OneToOneField(Order, on_delete=models.PROTECT, related_name="payment")
    idempotency_key = models.CharField(max_length=200, unique=True)
    attempt = models.PositiveIntegerField()
    amount_cents = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.amount_cents} cents under {self.idempotency_key}"
