"""The coordinator: timers and housekeeping, as work of the system tenant.

- ``wakeups``: timers (sleeps, retry backoffs, step timeouts, ...) are
  system-tenant items with a due time in the fair queue (tier ``system``,
  Celery queue ``ductor.system``), so they never compete with customer work
  and customer backlog never delays them. When one falls due, a worker runs
  the wake-up registered for its kind inside the owning tenant's context.
- ``reaper``: returns items whose lease ended (their worker died) to their
  partitions. The one reaper: only the coordinator runs it.
- ``reconcile``: the registered reconcilers rebuild Redis state from
  PostgreSQL (the source of truth), for example re-enqueueing runnable runs
  after a Redis flush.
- ``loop``: ``Coordinator``, which ``manage.py run_coordinator`` runs.
"""
