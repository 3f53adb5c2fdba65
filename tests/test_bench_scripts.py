"""The benchmarks import on a fresh install: every package a script needs is a dependency.

``make bench`` runs them from the project's virtualenv; a module that only some other package
happened to pull in (``psutil`` did) breaks them on a clean one. Importing a script starts
nothing (it measures in ``main``), so this starts no server.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
# The scripts ``make bench`` runs (``bench/run_all.py``), and their shared modules; the worker
# modules (``_plain_celery``, ``_worker_tasks``, ``_team_tasks``) are imported by the workers the
# scripts start, in their environment.
SCRIPTS = sorted(path.stem for path in BENCH.glob("*.py") if not path.stem.startswith("_") or path.stem in
                 ("_common", "_costs"))


def test_every_script_is_found() -> None:
    assert {"run_all", "workflows", "tasks", "step_cost", "_costs"} <= set(SCRIPTS)


def test_every_script_imports_in_a_fresh_interpreter() -> None:
    # A process of its own: this one has the test settings and every test's imports loaded.
    code = ("import importlib, traceback\n"
            f"for name in {SCRIPTS!r}:\n"
            "    try:\n"
            "        importlib.import_module('bench.' + name)\n"
            "    except Exception:\n"
            "        print(name, traceback.format_exc(limit=1))\n")
    found = subprocess.run([sys.executable, "-c", code], cwd=BENCH.parent, capture_output=True, text=True,
                           timeout=120, check=False)
    assert (found.returncode, found.stdout) == (0, ""), found.stdout + found.stderr[-2000:]


def test_every_script_run_has_its_goals_in_the_table() -> None:
    # ``run_all`` runs each script not starting with an underscore; its table reads their goals.
    run_all = importlib.import_module("bench.run_all")
    run = {name for name in SCRIPTS if not name.startswith("_")} - {"run_all"}
    assert set(run_all.GOALS) == run, set(run_all.GOALS) ^ run
