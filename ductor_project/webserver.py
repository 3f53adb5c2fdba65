"""Run the real web server (gunicorn) as a child process, for ``up``, the demo and benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ductor_project.stack import stop_group

ROOT = Path(__file__).resolve().parent.parent


def wait_for_http(url: str, *, timeout_s: float = 30) -> None:
    """Wait until ``url`` answers 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer in {timeout_s}s")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class WebServer:
    """gunicorn serving ``ductor_project.wsgi`` on 127.0.0.1; stopped by ``stop()``."""

    def __init__(self, *, port: int | None = None, workers: int = 2, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "a") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(  # noqa: S603 - fixed argv
            [
                sys.executable, "-m", "gunicorn", "ductor_project.wsgi:application",
                "--bind", f"127.0.0.1:{self.port}", "--workers", str(workers),
                "--threads", "4", "--timeout", "60", "--graceful-timeout", "5",
            ],
            cwd=ROOT,
            env=dict(os.environ),
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 30) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"web server exited with {self.proc.returncode}")
        wait_for_http(f"{self.url}/api/schema/", timeout_s=timeout)

    def stop(self) -> None:
        stop_group(self.proc)
        if hasattr(self._log, "close"):
            self._log.close()
