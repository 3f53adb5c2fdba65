"""The documentation agrees with itself and with the settings.

- Every link of the repository's Markdown files to another file of it leads to a file that exists,
  and its ``#anchor`` to a heading of that file (as GitHub makes a heading's anchor) or to an
  ``<a id="…">`` of it.
- ``docs/configuration.md`` names every setting that ``ductor_project/settings.py`` reads from the
  environment, each setting it names is read by the product (the OpenTelemetry SDK reads the
  ``OTEL_*`` ones), and the default it shows (in ``docs/operations.md`` too) is the one the settings
  take when the variable is unset, wherever that default is a literal of the settings' code.
- Each shell variable a Markdown file's commands use (``$PKEY``) is set by one of its commands, or by
  the README's tour (``KEY``, ``RUN``), which the other documents' commands follow: a reader is
  never told to send a key or a URL no step of theirs gave.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
EXPLICIT_ANCHOR = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PRODUCT = ("ductor_project", "tenants", "scheduling", "workflows")
# The settings' readers (ductor_project/settings.py) whose first argument is a variable's name.
READERS = {"number", "flag", "options", "pairs", "listed", "writable_directory", "database_url", "cache_client_class",
           "_redis_setting"}
ENV_READERS = {"str", "list", "bool", "int", "float"}
SETTINGS_TABLES = ("docs/configuration.md", "docs/operations.md")
TABLE_ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]+)` \| ([^|]*) \|", re.MULTILINE)
SHELL_BLOCK = re.compile(r"^```(?:sh|bash)\n(.*?)^```", re.DOTALL | re.MULTILINE)
SHELL_USE = re.compile(r"\$\{?([A-Z][A-Z0-9_]*)")
SHELL_SET = re.compile(r"(?:^|[\s;(])([A-Z][A-Z0-9_]*)=")


def markdown_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / name for name in listed.stdout.split()]


def prose(path: Path) -> str:
    """The file's text without its fenced code blocks, whose lines are no headings and no links."""
    return FENCE.sub("", path.read_text())


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: the text of its links, lower case, without punctuation
    (but ``-`` and ``_``), each space a ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text.replace("`", "")).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text, found = prose(path), set(EXPLICIT_ANCHOR.findall(path.read_text()))
    seen: dict[str, int] = {}
    for heading in HEADING.findall(text):
        base = slug(heading)
        found.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
    return found


def test_every_link_between_the_docs_leads_to_a_file_and_a_heading_that_exist() -> None:
    broken = []
    for path in markdown_files():
        for link in LINK.findall(prose(path)):
            if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto:, …
                continue
            target, _, anchor = link.partition("#")
            file = (path.parent / target).resolve() if target else path
            where = f"{path.relative_to(ROOT)}: {link}"
            if not file.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{where} (no such heading)")
    assert broken == []


def commands(path: Path) -> str:
    """The text of the file's ```sh and ```bash blocks."""
    return "\n".join(SHELL_BLOCK.findall(path.read_text()))


def test_every_shell_variable_the_docs_commands_use_is_set_by_a_command_of_theirs() -> None:
    tour = set(SHELL_SET.findall(commands(ROOT / "README.md")))
    unset = []
    for path in markdown_files():
        text = commands(path)
        unset += [f"{path.relative_to(ROOT)}: ${name}"
                  for name in sorted(set(SHELL_USE.findall(text)) - set(SHELL_SET.findall(text)) - tour)]
    assert unset == []


def value(node: ast.expr) -> Any:
    """A default written as a literal (``30_000``, ``1024 * 1024``, ``["a"]``); ``...`` for any other."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        left, right = value(node.left), value(node.right)
        return left * right if ... not in (left, right) else ...
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ...


def settings_read() -> dict[str, Any]:
    """Each variable ``ductor_project/settings.py`` reads, and its default (``...`` when not a literal)."""
    read: dict[str, Any] = {}
    for node in ast.walk(ast.parse((ROOT / "ductor_project" / "settings.py").read_text())):
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
            continue
        name, function = str(node.args[0].value), node.func
        if isinstance(function, ast.Name) and function.id in READERS:
            literal = len(node.args) > 1 and function.id in ("number", "flag", "listed")
            read[name] = value(node.args[1]) if literal else ...
        elif (isinstance(function, ast.Attribute) and function.attr in ENV_READERS
              and isinstance(function.value, ast.Name) and function.value.id == "env"):
            default: Any = next((value(k.value) for k in node.keywords if k.arg == "default"), ...)
            read.setdefault(name, default)
    return read


def documented(doc: str) -> dict[str, str]:
    """The variables of ``doc``'s settings tables (a row per variable), each with its default's cell."""
    return dict(TABLE_ROW.findall((ROOT / doc).read_text()))


def test_configuration_md_names_every_setting_the_settings_read_and_no_other() -> None:
    read, named = settings_read(), set(documented("docs/configuration.md"))
    assert sorted(set(read) - named) == []
    sources = [path.read_text() for package in PRODUCT for path in (ROOT / package).rglob("*.py")]
    sources.append((ROOT / "manage.py").read_text())
    unread = [name for name in named if not name.startswith("OTEL_")
              and not any(f'"{name}"' in source for source in sources)]
    assert sorted(unread) == []


def shown(cell: str) -> str:
    """The default a table's cell shows: its first ``code`` span, else its text."""
    code = re.search(r"`([^`]*)`", cell)
    return code.group(1) if code else cell.strip()


def same(default: Any, text: str) -> bool:
    if isinstance(default, bool):
        return text == str(default).lower()
    if isinstance(default, int | float):
        return re.fullmatch(r"-?\d+(\.\d+)?", text) is not None and float(text) == default
    if isinstance(default, list):
        return text == ",".join(default)
    return text == default


def test_the_defaults_the_docs_show_are_those_of_the_settings() -> None:
    read, wrong = settings_read(), []
    for doc in SETTINGS_TABLES:
        for name, cell in documented(doc).items():
            default = read.get(name, ...)
            if default is ... or default in ("", []):  # not a literal, or none ("empty", "(none)")
                continue
            if not same(default, shown(cell)):
                wrong.append(f"{doc}: {name} shows {cell.strip()!r}, the settings take {default!r}")
    assert wrong == []
