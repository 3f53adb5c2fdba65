"""The engine: a run advances in idempotent ticks, under its tenant's context.

- ``tick``: load the run with a row lock, apply what happened since the last
  tick (finished child runs, failed attempts to retry), start the nodes that
  are ready (``nodes``), and finish the run when nothing is left. Every
  decision is derived from the rows, so a duplicate tick changes nothing.
- ``nodes``: starting a ready node by its type. An ``action`` is routed once
  (``scheduling.routing.route``) and enqueued as a ``step`` item in the tier,
  partition and pool of that decision; a ``sleep`` is a coordinator wake-up; a
  ``subworkflow`` is a child run; ``continue_as_new`` a successor run.
- ``steps``: a step item on a worker. The fair queue admitted it at dequeue
  (tenant, pool and connection slots and rates) and chose its connection, so
  the worker runs the action at once, records the ``Outcome`` and ticks the
  run in the same transaction.
- ``timers``: the wake-ups of retries, sleeps and step timeouts.
- ``reconcile``: puts back the Redis side of active runs that stopped moving.
- ``items``, ``events``, ``attempts``: the engine's fair-queue items, a run's
  history, and the rows of its step attempts.

A run's queued ticks share one fair-queue partition (``run:<id>``), and its
row lock keeps any two ticks of it from overlapping, wherever they run: the
first tick runs in the transaction that starts the run, and the tick after a
step's outcome in the transaction that records it (``advance_locked``); other ticks
(timers, children, cancellation) go through the queue. Rows are written in
the transaction of the state change; fair-queue items are enqueued on commit.
The workflows app registers the handlers, wake-ups and reconciler in
``ready()``.
"""
