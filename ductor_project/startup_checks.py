"""Django's system checks, run where a process starts without ``manage.py``.

``manage.py`` commands run them before they start (``up``, ``check``,
``run_dispatcher``, ``run_coordinator``). A Celery worker and a WSGI server
(gunicorn under a Procfile, systemd or compose) do not: without this they
started with an action module that does not import, or a bad secret key, took
work and failed it. ``refuse_to_start`` makes them stop at once, naming each
error, as ``manage.py check`` would.
"""

from __future__ import annotations

import sys


class RefusedToStart(SystemExit):
    """The process stops at start: a system check found an error."""


def refuse_to_start(process: str) -> None:
    """Run Django's system checks (not the database's); on an error, write each to stderr and stop
    the process with ``RefusedToStart`` (a ``SystemExit``, which Celery's signal dispatch does not
    swallow, and which fails a gunicorn worker's boot)."""
    from django.core import checks

    errors = [message for message in checks.run_checks(include_deployment_checks=False)
              if message.is_serious() and not message.is_silenced()]
    if not errors:
        return
    for error in errors:
        print(f"{process}: {error}", file=sys.stderr)
    raise RefusedToStart(f"{process} refused to start: {len(errors)} system check error(s) (manage.py check "
                         f"lists them)")
