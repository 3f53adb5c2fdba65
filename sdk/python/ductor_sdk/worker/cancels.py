"""A running task learns, through its heartbeats, that its step has ended.

When a step ends while its task still runs (its run cancelled, failed or timed
out, or the attempt timed out and its retry is on its way), the task's result
is discarded when it comes. A task that sends heartbeats (``heartbeat()``) can
stop early instead: Ductor tells the worker its heartbeats named as the step
ends, and answers any later heartbeat of it the same way, by Celery's remote
control (the ``ductor_cancel`` command, to that worker alone). ``install``
registers the command. The worker's main
process receives it and marks the step on a board it shares with its pool
processes (an anonymous shared memory map, made before they fork). The task's
next ``heartbeat()`` raises ``StepCancelled``; ``cancel_requested()`` says so
without sending anything:

    @step(app, name="media.tasks.transcode")
    def transcode(video: str) -> dict[str, Any]:
        for chunk in range(CHUNKS):
            encode(video, chunk)
            heartbeat({"chunks": chunk + 1})  # raises StepCancelled once the step has ended
        return {"chunks": CHUNKS}

So the news comes at once, or with the first heartbeat sent after the step
ended (at most a third of the node's ``heartbeat_s`` later, or
``heartbeats.INTERVAL_S`` without one), and is seen at the next call. A worker of the ``solo`` pool
runs its remote control between tasks only, and learns it after the task.
"""

from __future__ import annotations

import mmap
import uuid
from typing import Any

COMMAND = "ductor_cancel"
# A step id as text (a UUID's 36 characters) per slot; the oldest is overwritten when all are taken.
SLOT = 36
SLOTS = 1024


class StepCancelled(Exception):
    """The step this task runs for has ended (cancelled, failed, timed out): its result would be
    discarded. Let it propagate, after any clean-up the task needs."""


class Board:
    """The steps a worker was told have ended, shared by its main process (which writes them) and
    the pool processes forked from it (which read them): ``SLOTS`` ids, the oldest overwritten."""

    def __init__(self) -> None:
        self.memory = mmap.mmap(-1, SLOT * SLOTS)
        self.next = 0

    def mark(self, step_id: str) -> None:
        """Mark ``step_id`` (a step's UUID) as ended. Raises ``ValueError`` for anything else."""
        text = str(uuid.UUID(str(step_id))).encode()
        if self.holds(text.decode()):
            return
        offset = self.next * SLOT
        self.memory[offset:offset + SLOT] = text
        self.next = (self.next + 1) % SLOTS

    def holds(self, step_id: str) -> bool:
        """Whether ``step_id`` was marked (and not overwritten since)."""
        needle = step_id.encode("ascii", "replace")
        if len(needle) != SLOT:
            return False
        at = self.memory.find(needle)
        while at != -1 and at % SLOT:  # a match across two slots is none
            at = self.memory.find(needle, at + 1)
        return at != -1


_board: Board | None = None


def board() -> Board:
    """This process's board: made on first use (by ``install``, in the worker's main process,
    before its pool processes fork and share it)."""
    global _board
    if _board is None:
        _board = Board()
    return _board


def requested(step_id: str) -> bool:
    """Whether this worker was told that the step ``step_id`` has ended."""
    return _board is not None and _board.holds(step_id)


def cancel(state: Any, task_id: str = "", **_: Any) -> dict[str, str]:
    """The ``ductor_cancel`` remote control command: the step ``task_id`` (its task's id) has ended."""
    try:
        board().mark(task_id)
    except ValueError:
        return {"error": f"not a step id: {str(task_id)[:100]!r}"}
    return {"ok": f"step {task_id} marked as ended"}


def register_command() -> None:
    """Register the ``ductor_cancel`` command with Celery's workers in this process (once), and make
    the board now, before a worker forks its pool processes."""
    from celery.worker.control import Panel, control_command

    board()
    if COMMAND not in Panel.data:
        control_command(name=COMMAND, args=[("task_id", str)], signature="<task_id>")(cancel)
