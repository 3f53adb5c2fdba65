from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from tenants import entitlements, schema, usage  # noqa: F401 - signal receivers, OpenAPI auth extension
        from tenants.row_security import secure_tenant_tables

        # Once per migrate (this app's signal), which Django sends once every app's migrations ran.
        post_migrate.connect(secure_tenant_tables, sender=self, dispatch_uid="tenants.row_security")
