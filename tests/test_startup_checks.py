"""A process started without ``manage.py`` (a Celery worker, the WSGI server under gunicorn) runs
Django's system checks as it starts, and stops on an error, naming it, before it takes any work."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, service_env

pytestmark = pytest.mark.django_db

BROKEN = {"DUCTOR_ACTION_MODULES": "workflows.actions,shop.actions_that_do_not_exist"}


def started(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, env={**service_env(), **env}, capture_output=True, text=True, timeout=90)


def test_a_worker_with_an_action_module_that_does_not_import_stops_before_it_takes_work() -> None:
    done = started([sys.executable, "-m", "celery", "-A", "ductor_project", "worker", "--pool", "solo",
                    "--without-gossip", "--without-mingle", "-Q", "ductor.nothing"], **BROKEN)
    assert done.returncode != 0
    assert "celery worker: ?: (ductor.E003) DUCTOR_ACTION_MODULES: 'shop.actions_that_do_not_exist'" in done.stderr
    assert "refused to start" in done.stderr
    assert " ready." not in done.stdout + done.stderr


def test_the_web_server_with_an_action_module_that_does_not_import_stops_as_it_loads() -> None:
    done = started([sys.executable, "-c", "import ductor_project.wsgi"], **BROKEN)
    assert done.returncode != 0
    assert "web server: ?: (ductor.E003)" in done.stderr


def test_the_web_server_loads_with_good_settings() -> None:
    done = started([sys.executable, "-c", "import ductor_project.wsgi"])
    assert done.returncode == 0, done.stderr
