"""``python manage.py run_dispatcher``: move fair-queue items into Celery, tenant-first."""

from __future__ import annotations

from typing import Any

import structlog
from django.core.management.base import BaseCommand, CommandParser

from ductor_project.core import tracing
from scheduling.dispatch.dispatcher import Dispatcher
from scheduling.management.commands._loop import run_until_signalled

log = structlog.get_logger(__name__)


class Command(BaseCommand):
    help = "Run a fair dispatcher (any number may run at once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--shards", default="",
                            help="comma-separated shards (default: its share of them among the live dispatchers)")

    def handle(self, *args: Any, **options: Any) -> None:
        tracing.configure()
        shards = [int(s) for s in options["shards"].split(",") if s.strip()] or None
        dispatcher = Dispatcher(shards=shards)
        log.info("dispatcher_started", shards=dispatcher.shards)
        run_until_signalled(dispatcher.run_forever)
        log.info("dispatcher_stopped", dispatched=dispatcher.dispatched)
