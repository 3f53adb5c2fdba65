from typing import Any

from django.apps import AppConfig
from django.core import checks


def check_action_modules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The modules of ``DUCTOR_ACTION_MODULES`` are imported at the first action looked up; one that
    does not import is told at start, not as a failure of every workflow's validation and step."""
    import importlib

    from django.conf import settings

    errors: list[checks.CheckMessage] = []
    for module in settings.DUCTOR_ACTION_MODULES:
        try:
            importlib.import_module(module)
        except Exception as exc:
            errors.append(checks.Error(f"DUCTOR_ACTION_MODULES: {module!r} does not import: "
                                       f"{type(exc).__name__}: {exc}", id="ductor.E003"))
    return errors


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from scheduling.admission import register_kept_queues
        from scheduling.coordinator.housekeeping import register_housekeeper
        from scheduling.coordinator.reconcile import register_reconciler
        from scheduling.coordinator.wakeups import register_wakeup
        from scheduling.dispatch.handlers import register_handler, register_publisher
        from tenants.usage import register_ceiling_counter
        from workflows import catalog, offboarding, retention
        from workflows.engine import items, reconcile, steps, task_nodes, tick, timers, waits
        from workflows.models import Schedule, WorkflowDefinition
        from workflows.triggers import arming, events, firing
        from workflows.triggers import reconcile as schedules_reconcile

        # Active workflows only: an archived one leaves the plan's max_workflows (services.active_workflows).
        register_ceiling_counter("workflows",
                                 lambda: WorkflowDefinition.objects.filter(archived_at__isnull=True).count())
        register_ceiling_counter("schedules", lambda: Schedule.objects.count())
        register_handler(items.TICK, tick.execute_tick)
        register_handler(items.STEP, steps.execute_step)
        register_publisher(items.TASK, task_nodes.publish)
        register_kept_queues(catalog.kept_for_others)
        for kind, wake in timers.WAKEUPS.items():
            register_wakeup(kind, wake)
        register_wakeup(waits.TIMEOUT_KIND, waits.wait_timeout)
        register_wakeup(tick.RUN_TIMEOUT, tick.run_timeout)
        register_wakeup(items.RUN_CANCEL, tick.run_cancel)
        register_housekeeper(events.expire_events)
        register_housekeeper(retention.expire_runs)
        register_housekeeper(offboarding.purge_deleting_tenants)
        register_reconciler(reconcile.reconcile_runs)
        register_wakeup(arming.WAKE_KIND, firing.fire_due)
        register_reconciler(schedules_reconcile.reconcile_schedules)
        # Webhooks: the deliveries of runs' outcomes, their items, retries and reconciler.
        from workflows.engine.events import register_listener
        from workflows.triggers import webhook_delivery, webhooks

        register_listener(webhooks.on_run_event)
        from workflows.services import workflow_deleted

        workflow_deleted.connect(webhooks.workflow_deleted, dispatch_uid="webhooks.workflow_deleted")
        checks.register(check_action_modules)
        register_handler(webhooks.ITEM_KIND, webhook_delivery.execute_delivery)
        register_wakeup(webhook_delivery.WAKE_KIND, webhook_delivery.retry_due)
        register_reconciler(webhook_delivery.reconcile_deliveries)
        register_housekeeper(webhook_delivery.purge_deleted_endpoints)
