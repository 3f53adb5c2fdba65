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

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
