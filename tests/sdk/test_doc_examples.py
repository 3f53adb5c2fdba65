"""The SDK's documented Python examples pass ``mypy --strict``, as its README tells a team to check its
code: each ```python block of ``DOCS``, on its own, after ``PREAMBLE``, which declares the names the
examples take as given (a client made in an earlier block, the team's own objects)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
DOCS = ["sdk/python/README.md", "docs/your-code.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
PREAMBLE = '''\
from typing import Any

from celery import Celery
from ductor_sdk import Client

client: Client  # made in the README's first example
app: Celery  # the team's Celery app
psp: Any  # the team's own objects
request: Any
Payment: Any
encode: Any
draw: Any
outage: Any
discard_partial_output: Any
'''


def blocks(doc: str) -> list[str]:
    return BLOCK.findall((ROOT / doc).read_text())


def test_every_python_example_of_the_sdk_docs_passes_mypy_strict(tmp_path: Path) -> None:
    files: dict[Path, str] = {}
    for doc in DOCS:
        found = blocks(doc)
        assert found, f"{doc} has no python example"
        for number, code in enumerate(found, 1):
            path = tmp_path / f"{Path(doc).stem.lower().replace('-', '_')}_{number}.py"
            path.write_text(PREAMBLE + "\n" + code)
            files[path] = f"{doc}, python example {number}"
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file=", "--no-error-summary", "--show-error-codes",
         "--cache-dir", str(tmp_path / "mypy-cache"), *map(str, files)],
        capture_output=True, text=True, timeout=110, cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(ROOT / "sdk" / "python")},
    )
    shift = PREAMBLE.count("\n") + 1
    errors = []
    for line in done.stdout.splitlines():
        name, _, rest = line.partition(":")
        number, _, message = rest.partition(":")
        if (where := files.get(tmp_path / name)) and number.isdigit():
            errors.append(f"{where}, line {int(number) - shift}:{message}")
        elif line.strip():
            errors.append(line)
    assert not done.stderr.strip(), done.stderr
    assert errors == [], "\n".join(errors)
