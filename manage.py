#!/usr/bin/env python
"""Django's command-line utility for Ductor."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ductor_project.settings")
    from ductor_project import embedded

    if embedded.command_needs_services(sys.argv):
        embedded.boot()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
