"""Fixtures of the SDK's tests: SDK clients talking HTTP to a live server on the test database.

Tests that use them are transactional (``live_server``): the server thread sees
what they commit, and the run's engine ticks inline in that thread.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ductor_sdk import Client

from tenants import services
from tenants.models import Tenant

MakeTenant = Callable[..., tuple[Tenant, str]]
StrictMypy = Callable[..., subprocess.CompletedProcess[str]]
SDK = Path(__file__).parents[2] / "sdk" / "python"


@pytest.fixture(scope="session")
def strict_mypy(tmp_path_factory: pytest.TempPathFactory) -> StrictMypy:
    """``mypy --strict`` of a team's files against the SDK's source, as a team's own check runs it (no
    config file), with one cache for this test process: the SDK and the stubs it reads are
    analysed once (about 9 s), not again for every check."""
    cache = tmp_path_factory.mktemp("mypy-cache")

    def check(*files: Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--config-file=", "--no-error-summary", "--show-error-codes",
             "--cache-dir", str(cache), *map(str, files)],
            capture_output=True, text=True, timeout=110, cwd=cwd, env={**os.environ, "MYPYPATH": str(SDK)},
        )

    return check


@pytest.fixture
def server_url(live_server: Any, redis_client: Any) -> str:
    """The live server's root URL; Redis is flushed first (the API rate limiter, the fair queue)."""
    return str(live_server.url)


@pytest.fixture
def connect(server_url: str) -> Iterator[Callable[[str], Client]]:
    """Make a client with a key; every client made is closed afterwards."""
    clients: list[Client] = []

    def make(api_key: str) -> Client:
        client = Client(server_url, api_key, timeout=20.0)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def sdk(connect: Callable[[str], Client], make_tenant: MakeTenant) -> Client:
    """A client of tenant ``sdk-a``."""
    return connect(make_tenant("sdk-a")[1])


@pytest.fixture
def other(connect: Callable[[str], Client], make_tenant: MakeTenant) -> Client:
    """A client of another tenant, ``sdk-b``."""
    return connect(make_tenant("sdk-b")[1])


@pytest.fixture
def platform(connect: Callable[[str], Client], transactional_db: None) -> Client:
    """A client with a platform key (``dctp_…``)."""
    _, raw = services.platform_key_create(name="ops")
    return connect(raw)
