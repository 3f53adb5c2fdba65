"""``python manage.py run_coordinator``: reap expired leases and reconcile Redis with PostgreSQL."""

from __future__ import annotations

from typing import Any

import structlog
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ductor_project.core import tracing
from scheduling.coordinator.loop import Coordinator
from scheduling.management.commands._loop import run_until_signalled

log = structlog.get_logger(__name__)


class Command(BaseCommand):
    help = "Run the coordinator (lease reaping, reconciliation)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval", type=float, default=1.0, help="Seconds between passes (lease reaping).")
        parser.add_argument("--reconcile-every", type=float, default=10.0,
                            help="Seconds between reconciliations and housekeeping (retention).")

    def handle(self, *args: Any, **options: Any) -> None:
        for option in ("interval", "reconcile_every"):
            if not 0 < options[option] < float("inf"):
                flag = "--" + option.replace("_", "-")
                raise CommandError(f"{flag} is a number of seconds above 0, not {options[option]}")
        tracing.configure()
        coordinator = Coordinator(interval_s=options["interval"], reconcile_every_s=options["reconcile_every"])
        log.info("coordinator_started")
        run_until_signalled(coordinator.run_forever)
        log.info("coordinator_stopped")
