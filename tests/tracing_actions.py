"""Actions for the tracing tests, registered by importing this module (``DUCTOR_ACTION_MODULES``).

``test.rendezvous`` makes the steps that call it run at the same time, so in
as many worker processes: a process runs one attempt at a time, and none of
them returns before all have started.
"""

from __future__ import annotations

import os

from ductor_project.core.keys import redis_key
from ductor_project.core.redis import get_redis
from workflows.actions import ActionCall, action

# How long an attempt waits for the others before it fails (the run then fails, and the test says so).
RENDEZVOUS_WAIT_S = 60


@action("test.rendezvous")
def rendezvous(call: ActionCall) -> dict[str, int]:
    """Return once ``input.parties`` attempts named ``input.name`` have arrived (the last to arrive
    releases the others); raise after ``RENDEZVOUS_WAIT_S`` without them. Its output is the id of the
    process that ran it."""
    name, parties = str(call.input["name"]), int(call.input["parties"])
    client = get_redis()
    arrived, released = redis_key("test", "rendezvous", name, "arrived"), redis_key("test", "rendezvous", name, "go")
    if client.incr(arrived) >= parties:
        if parties > 1:
            client.rpush(released, *["go"] * (parties - 1))
    elif client.blpop([released], timeout=RENDEZVOUS_WAIT_S) is None:
        raise RuntimeError(f"rendezvous {name}: {parties} parties did not all arrive within {RENDEZVOUS_WAIT_S} s")
    return {"pid": os.getpid()}
