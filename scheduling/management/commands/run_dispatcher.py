"""``python manage.py run_dispatcher``: move fair-queue items into Celery, tenant-first."""

from __future__ import annotations

from typing import Any

import structlog
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ductor_project.core import tracing
from ductor_project.core.keys import queue_shards, shard_map
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
        shards = _shards(options["shards"])
        dispatcher = Dispatcher(shards=shards)
        log.info("dispatcher_started", shards=dispatcher.shards)
        run_until_signalled(dispatcher.run_forever)
        log.info("dispatcher_stopped", dispatched=dispatcher.dispatched)


def _shards(text: str) -> list[int] | None:
    """``--shards``: the shards named, each one of the fair queue's; None (its share) when empty."""
    served = queue_shards()
    try:
        shards = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise CommandError(f"--shards is a comma-separated list of shard numbers, not {text!r}") from None
    wrong = [shard for shard in shards if shard not in served]
    if wrong:
        source = ("DUCTOR_QUEUE_SHARDS" if shard_map().count is None else
                  f"the count queue_reshard put in force; DUCTOR_QUEUE_SHARDS says {settings.DUCTOR_QUEUE_SHARDS}")
        raise CommandError(f"--shards: the fair queue has shards 0 to {len(served) - 1} "
                           f"({source}), not {', '.join(map(str, wrong))}")
    return shards or None
