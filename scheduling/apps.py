from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured


def check_task_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``DUCTOR_TASK_QUEUE_SLOTS`` is read when work is enqueued, and ``DUCTOR_TASK_BROKERS`` when a
    task is published; a bad value is told at start."""
    from django.conf import settings
    from kombu.transport import TRANSPORT_ALIASES

    from ductor_project.core import redis_urls
    from scheduling import admission
    from scheduling.connection_config import DEFAULT_BROKER

    errors: list[checks.CheckMessage] = []
    try:
        admission.queue_slots()
    except ImproperlyConfigured as exc:
        errors.append(checks.Error(str(exc), id="ductor.E001"))
    brokers = settings.DUCTOR_TASK_BROKERS
    for name, value in settings.DUCTOR_TASK_QUEUE_SLOTS.items():
        broker = name.partition("/")[0] if "/" in name else DEFAULT_BROKER
        if broker != DEFAULT_BROKER and broker not in brokers:  # no connection can name it: never bounds a step
            errors.append(checks.Error(
                f"DUCTOR_TASK_QUEUE_SLOTS: {name}={value} names the broker {broker!r}, which is neither "
                f"{DEFAULT_BROKER} nor one of DUCTOR_TASK_BROKERS ({', '.join(brokers) or 'none'})", id="ductor.E001"))
    for name, url in settings.DUCTOR_TASK_BROKERS.items():
        scheme = str(url).partition("://")[0].lower() if "://" in str(url) else ""
        if name == DEFAULT_BROKER:  # a connection naming it publishes to Ductor's own, whatever this URL
            errors.append(checks.Error(f"DUCTOR_TASK_BROKERS: broker {name!r}: the name of Ductor's own broker "
                                       "(CELERY_BROKER_URL); give this one another name", id="ductor.E002"))
        elif scheme not in TRANSPORT_ALIASES:
            found = f"its scheme {scheme!r} is not a broker's" if scheme else "its URL has no scheme"
            errors.append(checks.Error(f"DUCTOR_TASK_BROKERS: broker {name!r}: {found} (redis://, rediss://, "
                                       "sentinel://, amqp:// …)", id="ductor.E002"))
        else:  # a Redis URL is read as Ductor's own broker's is (a port that is not a number)
            try:
                redis_urls.kombu_config(str(url), setting=f"DUCTOR_TASK_BROKERS: broker {name!r}")
            except ImproperlyConfigured as exc:
                errors.append(checks.Error(str(exc), id="ductor.E002"))
    return errors


def check_secret_keys(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``DUCTOR_SECRET_KEYS`` is read when a secret is first saved or read; a bad key is told at start."""
    from scheduling import secrets

    problem = secrets.key_problem()
    return [checks.Error(problem, id="ductor.E004")] if problem else []


class SchedulingConfig(AppConfig):
    name = "scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from ductor_project.health import register_check
        from scheduling import admission, fairness_keys, routing_table
        from scheduling.coordinator import wakeups
        from scheduling.coordinator.reconcile import register_reconciler
        from scheduling.dispatch import credits, shards, worker
        from scheduling.dispatch.handlers import register_handler
        from scheduling.models import Connection, FairnessKey, Pool, PoolMember, Rule
        from tenants.entitlements import limits_changed
        from tenants.usage import register_ceiling_counter

        for model in (Connection, Pool, PoolMember, Rule):
            for signal in (post_save, post_delete):
                # The routing cache's version first, then the fair queue's copy of the limits.
                signal.connect(routing_table.routing_changed, sender=model, dispatch_uid=f"routing-{model.__name__}")
                signal.connect(admission.routing_changed, sender=model, dispatch_uid=f"admission-{model.__name__}")
        limits_changed.connect(admission.limits_changed, dispatch_uid="admission-limits")
        for signal in (post_save, post_delete):
            signal.connect(fairness_keys.key_changed, sender=FairnessKey, dispatch_uid="fairness-key-weights")

        register_ceiling_counter("pools", lambda: Pool.objects.count())
        register_ceiling_counter("connections", lambda: Connection.objects.count())
        register_ceiling_counter("rules", lambda: Rule.objects.count())
        register_ceiling_counter("fairness_keys", lambda: FairnessKey.objects.count())
        register_reconciler(fairness_keys.reconcile_key_weights)
        register_handler(wakeups.ITEM_KIND, wakeups.run_wakeup)
        worker.install()
        register_check("shards", shards.readiness)
        register_check("workers", credits.readiness)
        checks.register(check_task_settings)
        checks.register(check_secret_keys)
