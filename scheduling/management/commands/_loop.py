"""Run a loop until SIGINT/SIGTERM, for the long-running management commands."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from ductor_project.core.heap import freeze_startup_heap


def run_until_signalled(loop: Callable[[threading.Event], None]) -> None:
    stop = threading.Event()

    def handle(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)
    freeze_startup_heap()
    loop(stop)
