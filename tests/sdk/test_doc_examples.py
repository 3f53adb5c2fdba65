"""The SDK's documented Python examples pass ``mypy --strict``, as its README tells a team to check its
code: each ```python block of ``DOCS``, on its own, after ``PREAMBLE``, which declares the names the
examples take as given (a client made in an earlier block, the team's own objects)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ductor_sdk import Client

from tests.sdk.conftest import StrictMypy

ROOT = Path(__file__).parents[2]
DOCS = ["sdk/python/README.md", "docs/your-code.md", "docs/triggers.md", "examples/shop/README.md"]
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


def test_every_python_example_of_the_sdk_docs_passes_mypy_strict(tmp_path: Path, strict_mypy: StrictMypy) -> None:
    files: dict[Path, str] = {}
    for doc in DOCS:
        found = blocks(doc)
        assert found, f"{doc} has no python example"
        for number, code in enumerate(found, 1):
            path = tmp_path / f"{Path(doc).stem.lower().replace('-', '_')}_{number}.py"
            path.write_text(PREAMBLE + "\n" + code)
            files[path] = f"{doc}, python example {number}"
    done = strict_mypy(*files, cwd=tmp_path)
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


def _block(doc: str, marker: str) -> str:
    """The one example of ``doc`` (any language) that holds ``marker``."""
    found = [code for code in re.findall(r"^```\w*\n(.*?)^```", (ROOT / doc).read_text(), re.DOTALL | re.MULTILINE)
             if marker in code]
    assert len(found) == 1, f"{doc}: {len(found)} examples hold {marker!r}"
    return found[0]


@pytest.mark.django_db(transaction=True)
def test_the_task_the_docs_catalog_is_the_one_the_sdk_readme_calls_and_runs(
    platform: Client, connect: Callable[[str], Client], make_tenant: Callable[..., Any]
) -> None:
    """A team catalogs ``billing.tasks.charge`` as docs/your-code.md shows (its ``curl``), writes the
    worker's task and the workflow as the SDK's README does, and starts runs as it does. The README's
    task took ``order`` alone, an int, where the catalog entry requires ``order`` (a string) and
    ``amount``: its workflow was refused (``spec.nodes[0].input.amount``), and its starts would fail."""
    curl = _block("docs/your-code.md", "/api/v1/task-catalog")
    entry = json.loads(curl[curl.index("-d '") + 4:curl.rindex("'")])
    platform.platform.task_catalog.create(**entry)
    client = connect(make_tenant("docs-pro", plan="pro")[1])

    exec(_block("sdk/python/README.md", 'Workflow("order", description='), {"client": client})  # noqa: S102 - the docs' own code: applies, or raises

    schema = entry["input_schema"]
    readme = (ROOT / "sdk/python/README.md").read_text()
    signature = re.search(r'@step\(app, name="billing\.tasks\.charge".*?\ndef charge\((.*?)\)', readme, re.DOTALL)
    assert signature, "the README's worker example of billing.tasks.charge"
    params = dict(part.split(": ") for part in signature.group(1).split(", "))
    assert params == {name: {"string": "str", "integer": "int"}[spec["type"]]
                      for name, spec in schema["properties"].items()}
    catalog = _block("sdk/python/README.md", "admin.task_catalog.create(")
    assert "billing.tasks.charge" in catalog
    for name in schema["required"]:
        assert f'"{name}"' in catalog, f"the README's catalog entry lacks {name!r}"
    inputs = [json.loads(found) for found in re.findall(r'runs\.start\("order", (\{"order_id".*?\})[,)]', readme)]
    assert inputs, "the README's starts of 'order'"
    for given in inputs:  # each start gives what the workflow's task node renders into the catalog's schema
        assert set(given) >= {"order_id", "amount"}, given
        assert isinstance(given["order_id"], str), given
        assert isinstance(given["amount"], int), given
