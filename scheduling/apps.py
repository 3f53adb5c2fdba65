from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from scheduling import routing_table  # noqa: F401 - routing cache invalidation signals
        from scheduling.coordinator import wakeups
        from scheduling.dispatch import worker
        from scheduling.dispatch.handlers import register_handler
        from scheduling.models import Connection, Pool, Rule
        from tenants.usage import register_ceiling_counter

        register_ceiling_counter("pools", lambda: Pool.objects.count())
        register_ceiling_counter("connections", lambda: Connection.objects.count())
        register_ceiling_counter("rules", lambda: Rule.objects.count())
        register_handler(wakeups.ITEM_KIND, wakeups.run_wakeup)
        worker.install()
