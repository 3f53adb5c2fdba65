"""The one reaper: items whose lease ended go back to their partitions, on every shard."""

from __future__ import annotations

from ductor_project.core.keys import queue_shards
from scheduling import fair_queue

# Items one pass returns per shard at most (a pass repeats while a shard had that many).
REAP_BATCH = 100


def reap_all() -> int:
    """Return every item of every shard whose lease has ended (its worker died or stalled) to
    its partition, to be delivered again; returns how many. One round trip per shard per
    ``REAP_BATCH`` items. Crosses tenants: the system's housekeeping."""
    total = 0
    for shard in queue_shards():
        while (reaped := fair_queue.reap(shard=shard, limit=REAP_BATCH)) > 0:
            total += reaped
            if reaped < REAP_BATCH:
                break
    return total
