from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tenants import entitlements, schema, usage  # noqa: F401 - signal receivers, OpenAPI auth extension
