"""The coordinator's housekeepers run independently: one that raises is logged, and the others run."""

from __future__ import annotations

import pytest

from scheduling.coordinator import housekeeping
from tests.conftest import LogLines


def test_a_housekeeper_that_raises_is_logged_and_the_others_run(monkeypatch: pytest.MonkeyPatch,
                                                                 logged: LogLines) -> None:
    """Retention, the purges and offboarding are independent: one failing on every pass (a row it
    cannot delete, a shard that is down) skipped those registered after it, for good, and failed the
    coordinator's pass, which then sent no heartbeat."""
    ran: list[str] = []

    def failing() -> int:
        ran.append("failing")
        raise RuntimeError("a row it cannot delete")

    def working() -> int:
        ran.append("working")
        return 3

    monkeypatch.setattr(housekeeping, "_housekeepers", [failing, working])

    assert housekeeping.housekeep_all() == 3

    assert ran == ["failing", "working"]
    (line,) = [event for event in logged.json() if event["event"] == "housekeeper_failed"]
    assert line["housekeeper"].endswith("failing")
    assert "RuntimeError: a row it cannot delete" in line["exception"]
