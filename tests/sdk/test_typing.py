"""The SDK's types as a team's code sees them: files under ``typecheck/`` checked by ``mypy --strict``.

Each line marked ``# E: <code>`` must be reported with that error code (a wrong call must be
caught), and every other line must be clean (``assert_type`` holds). mypy runs on the SDK's source
and the installed stubs (``celery-types``), with no config file: as a team's strict check would."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.sdk.conftest import StrictMypy

HERE = Path(__file__).parent
MARK = re.compile(r"#\s*E:\s*([a-z-]+)\s*$")
REPORTED = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")


def expected(path: Path) -> set[tuple[int, str]]:
    return {(number, found.group(1)) for number, line in enumerate(path.read_text().splitlines(), 1)
            if (found := MARK.search(line))}


@pytest.mark.parametrize("name", ["step_calls.py", "model_literals.py"])
def test_mypy_strict_reports_exactly_the_marked_lines(name: str, strict_mypy: StrictMypy) -> None:
    path = HERE / "typecheck" / name
    wanted = expected(path)
    assert wanted, "the file marks no wrong call"
    done = strict_mypy(path)
    reported = {(int(m["line"]), m["code"]) for line in done.stdout.splitlines() if (m := REPORTED.match(line))}
    others = [line for line in done.stdout.splitlines() if ": error:" in line and not REPORTED.match(line)]
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert not done.stderr.strip(), done.stderr
    assert not others, done.stdout
    assert sorted(reported - wanted) == [], f"unexpected errors:\n{done.stdout}"
    assert sorted(wanted - reported) == [], f"wrong calls mypy did not catch:\n{done.stdout}"
