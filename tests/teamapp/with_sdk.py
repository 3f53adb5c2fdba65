"""A team's Celery app that runs Ductor's steps with ``ductor_sdk``'s worker hook (``install``).

Its own app instance, on the queue ``team_sdk``; nothing of Django or Ductor's
server. Start it with ``celery -A tests.teamapp.with_sdk worker -Q team_sdk``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from ductor_sdk.worker import current_step, heartbeat, install, step

app = Celery("teamapp-sdk", broker=os.environ.get("TEAM_BROKER_URL"))
app.conf.update(task_default_queue="team_sdk", worker_prefetch_multiplier=1, task_serializer="json",
                accept_content=["json"], worker_hijack_root_logger=False)
install(app)


@step(app, name="team_sdk.beat")
def beat(seconds: float, every_s: float) -> dict[str, Any]:
    """Works ``seconds``, with a heartbeat every ``every_s``."""
    beats, ends = 0, time.monotonic() + seconds
    while time.monotonic() < ends:
        time.sleep(every_s)
        beats += 1
        heartbeat({"beats": beats})
    return {"attempt": current_step().attempt, "beats": beats}


@step(app, name="team_sdk.resume")
def resume(chunks: int, hang_s: float) -> dict[str, Any]:
    """Works through ``chunks``, reporting each; its first attempt then hangs ``hang_s`` without a
    heartbeat (stuck). A later attempt resumes from the progress the earlier one reported."""
    ctx = current_step()
    done = int((ctx.heartbeat_details or {}).get("chunks", 0))
    resumed_from = done
    while done < chunks:
        time.sleep(0.4)  # past a third of the node's heartbeat_s: each report goes out at once
        done += 1
        heartbeat({"chunks": done})
    if ctx.attempt == 1:
        time.sleep(hang_s)
    return {"attempt": ctx.attempt, "resumed_from": resumed_from, "chunks": done}


@step(app, name="team_sdk.until_cancelled")
def until_cancelled(every_s: float, most_s: float = 120) -> dict[str, Any]:
    """Works, with a heartbeat every ``every_s``, until Ductor says its step has ended (``heartbeat()``
    raises ``StepCancelled``), or for ``most_s`` at most."""
    beats, ends = 0, time.monotonic() + most_s
    while time.monotonic() < ends:
        time.sleep(every_s)
        beats += 1
        heartbeat({"beats": beats})
    return {"beats": beats}
