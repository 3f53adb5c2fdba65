#!/usr/bin/env python
"""Django's command-line utility for Ductor."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ductor_project.settings")
    from ductor_project import embedded

    if embedded.command_needs_services(sys.argv):
        try:
            embedded.boot()
        except embedded.EmbeddedServiceError as exc:
            sys.exit(f"manage.py: the embedded PostgreSQL and Redis did not start: {exc}")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        settings.INSTALLED_APPS  # noqa: B018  # loads the settings: a bad environment variable is named
    except ImproperlyConfigured as exc:
        sys.exit(f"manage.py: the configuration is wrong: {exc}")

    try:
        execute_from_command_line(sys.argv)
    except KeyboardInterrupt:  # Ctrl-C: the operator's own stop, not a failure to show a traceback for
        if "--traceback" in sys.argv:
            raise
        sys.stderr.write("manage.py: interrupted\n")
        sys.exit(130)
    except Exception as exc:
        from ductor_project.core.errors import service_out_of_reach

        # A server that does not answer is the operator's to bring back, not a bug: one line names
        # it (--traceback still shows where).
        event = service_out_of_reach(exc)
        if event is None or "--traceback" in sys.argv:
            raise
        service = "Redis" if event == "redis_unavailable" else "PostgreSQL"
        sys.exit(f"manage.py: {service} is out of reach: {' '.join(str(exc).split())}")


if __name__ == "__main__":
    main()
