"""The shape of the product code, as STYLE.md asks: small pieces.

No function of the apps and the project is longer than ``MAX_LINES`` (from its ``def`` to its
last line); tests, benchmarks and migrations are not product code.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

MAX_LINES = 60
PACKAGES = ("ductor_project", "tenants", "scheduling", "workflows")


def test_no_function_of_the_product_is_longer_than_60_lines() -> None:
    long = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                    if lines > MAX_LINES:
                        long.append(f"{Path(path).relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []
