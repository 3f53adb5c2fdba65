"""Triggers: what starts a tenant's runs without an API call of its own.

- ``timing``: when a schedule fires (a cron expression in a time zone, or an interval), its
  jitter and the idempotency key of each fire;
- ``services`` / ``selectors``: writes and reads of schedules, for the tenant in context;
- ``firing``: the coordinator wake-up that fires due schedules, and its reconciler;
- ``events``: events a tenant sends, and the triggers through which they start its workflows.
- ``webhooks``: endpoints told of runs' outcomes, and the deliveries an outcome makes in its own
  transaction; ``webhook_delivery``: each delivery's signed POSTs from a fair-queue item of the
  tenant, retried with backoff, an endpoint that keeps failing disabled, and their reconciler.

See ``docs/triggers.md``.
"""
