"""The production artifacts (``Procfile``, ``examples/deploy``) run the product's real commands:
every process kind appears in each, with a program and a ``manage.py`` command that exist, and
the workers with the queues and pool of their kind (``ductor_project.celery``): the steps' workers
leave the results queue to the results workers, which run the solo pool."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import yaml
from django.core.management import get_commands

from ductor_project.celery import RESULTS_WORKER_ARGS, STEP_WORKER_ARGS

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "examples" / "deploy"
# What each process kind runs: the program, and its first arguments.
KINDS = {
    "web": ["gunicorn", "ductor_project.wsgi:application"],
    "worker": ["celery", "-A", "ductor_project", "worker", *STEP_WORKER_ARGS],
    "results": ["celery", "-A", "ductor_project", "worker", *RESULTS_WORKER_ARGS],
    "dispatcher": ["python", "manage.py", "run_dispatcher"],
    "coordinator": ["python", "manage.py", "run_coordinator"],
}


def _starts_like(words: list[str], expected: list[str]) -> bool:
    program = Path(words[0]).name if words else ""
    return program == expected[0] and words[1:len(expected)] == expected[1:]


def test_the_procfile_runs_each_process_kind_and_the_release_migrates():
    entries = dict(line.split(": ", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line.strip())
    assert set(entries) == {"release", *KINDS}
    for kind, expected in KINDS.items():
        assert _starts_like(shlex.split(entries[kind]), expected), entries[kind]
    assert shlex.split(entries["release"])[:3] == ["python", "manage.py", "migrate"]


def test_the_compose_file_runs_each_process_kind_after_the_migration_with_no_secret_in_it():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    for kind, expected in KINDS.items():
        assert _starts_like(services[kind]["command"], expected), services[kind]["command"]
        assert services[kind]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["command"][:3] == ["python", "manage.py", "migrate"]
    environment = services["web"]["environment"]
    assert all(":?" in environment[name] for name in ("SECRET_KEY", "DUCTOR_SECRET_KEYS"))
    assert "${POSTGRES_PASSWORD:?" in environment["DATABASE_OWNER_URL"]


def test_each_systemd_unit_runs_its_process_kind_from_the_virtualenv():
    units = {"web": "ductor-web.service", "worker": "ductor-worker.service", "results": "ductor-results@.service",
             "dispatcher": "ductor-dispatcher@.service", "coordinator": "ductor-coordinator.service"}
    for kind, name in units.items():
        unit = configparser.ConfigParser(strict=False, interpolation=None)
        unit.optionxform = str  # type: ignore[assignment,method-assign]
        unit.read(DEPLOY / "systemd" / name)
        words = shlex.split(unit["Service"]["ExecStart"])
        assert words[0].startswith("/opt/ductor/.venv/bin/"), words
        assert _starts_like(words, KINDS[kind]), words
        assert unit["Service"]["EnvironmentFile"] == "/etc/ductor/ductor.env"
        assert unit["Service"]["Restart"] == "always"


def test_the_manage_py_commands_they_name_exist():
    commands = get_commands()
    assert {"migrate", "run_dispatcher", "run_coordinator", "create_tenant", "create_platform_key"} <= set(commands)
