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
                            help="Seconds between reconciliations and housekeeping (retention); 0: every pass.")

    def handle(self, *args: Any, **options: Any) -> None:
        check_intervals(options["interval"], options["reconcile_every"])
        tracing.configure()
        coordinator = Coordinator(interval_s=options["interval"], reconcile_every_s=options["reconcile_every"])
        log.info("coordinator_started")
        run_until_signalled(coordinator.run_forever)
        log.info("coordinator_stopped")


def check_intervals(interval: float, reconcile_every: float) -> None:
    """Refuse what would spin or never run: a pass interval that is not above 0, a reconcile
    interval below 0 (0 reconciles on every pass), either not finite."""
    if not 0 < interval < float("inf"):
        raise CommandError(f"--interval is a number of seconds above 0, not {interval}")
    if not 0 <= reconcile_every < float("inf"):
        raise CommandError(f"--reconcile-every is a number of seconds, 0 or more, not {reconcile_every}")
