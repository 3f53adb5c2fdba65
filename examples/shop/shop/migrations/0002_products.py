"""The warehouse's products. The poster is nearly sold out: an order of three fails with ``OutOfStock``."""

from django.db import migrations

PRODUCTS = [
    {"sku": "mug", "name": "Ductor mug", "price_cents": 1200, "stock": 1000},
    {"sku": "tee", "name": "Ductor T-shirt", "price_cents": 2500, "stock": 1000},
    {"sku": "poster", "name": "Signed poster", "price_cents": 4000, "stock": 2},
]


def add_products(apps, schema_editor):
    Product = apps.get_model("shop", "Product")
    for product in PRODUCTS:
        Product.objects.update_or_create(sku=product["sku"], defaults=product)


class Migration(migrations.Migration):
    dependencies = [("shop", "0001_initial")]
    operations = [migrations.RunPython(add_products, migrations.RunPython.noop)]
