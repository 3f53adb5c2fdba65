"""Two small scoped models that prove the scoping layer before the product's own exist."""

from django.db import models

from tenants.scoping import TenantScopedModel


class Folder(TenantScopedModel):
    name = models.CharField(max_length=50)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="folder_unique_name")]


class Note(TenantScopedModel):
    folder = models.ForeignKey(Folder, on_delete=models.CASCADE, related_name="notes")
    body = models.CharField(max_length=200, default="")
    size = models.IntegerField(default=0)
