from django.apps import AppConfig


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tenants.usage import register_ceiling_counter
        from workflows.models import WorkflowDefinition

        register_ceiling_counter("workflows", lambda: WorkflowDefinition.objects.count())
