"""Dispatch: from the fair queue into Celery, without undoing the fairness.

Celery's own consumption is not fair (queue rotation, prefetch, redelivery
after the visibility timeout), so the fair order must hold when execution
starts. Work therefore waits in the fair queue, not in Celery, and every
item that leaves it has already been admitted (its tenant's, pool's and
connection's slots and rates taken at dequeue): "dispatched" means "will run
now".

- ``credits``: worker slots per Celery queue and the dispatch credits that
  bound the messages published but unfinished to those slots plus a buffer.
- ``dispatcher``: ``Dispatcher`` dequeues tenant-first, within the credits,
  and publishes one ``ductor.execute_item`` message per item.
- ``handlers``: the registry of what runs an item, by its payload's ``kind``
  (the apps register theirs in ``AppConfig.ready()``).
- ``delivery``: one delivery of an item on a worker: the lease check, the
  handler under lease renewal, the outcome.
- ``handoff``: a worker process that finishes an item takes the next one of
  its queue itself, in one round trip, in the fair order.
- ``finisher``: acks and freed credits, sent off the task's path.
- ``worker``: the Celery task and the worker process's lifecycle (slot
  heartbeat, warm shutdown).
"""
