"""``python manage.py demo``: the whole platform under a noisy neighbour, live in the terminal.

Brings the stack up (gunicorn, a Celery worker, a dispatcher, the
coordinator), the example shop's worker (``examples/shop``) and a small local
HTTP service, creates four tenants on three plans through the public API,
floods the platform from one of them while two others run the feature
workflows, keep themselves backlogged and order from the shop, and a latecomer
trickles in, shows it live, then prints a fairness summary, writes a PNG chart
to the data dir, checks that every feature worked, and stops everything. Exits
non-zero if a check failed.

The demo works in scratch databases that it drops at the end, whatever
happens (``ductor_project.demo.scratch`` says why).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from rich.console import Console

from ductor_project.core.context import SYSTEM_TENANT_SLUG
from ductor_project.demo import runner, scratch
from ductor_project.demo.scenario import DemoApiError
from tenants.models import Tenant

PLAIN_WIDTH = 140


class Command(BaseCommand):
    help = "Run the Ductor demo: the whole stack under a noisy-neighbour workload, with a fairness summary."

    def handle(self, *args: Any, **options: Any) -> None:
        if os.environ.get("DATABASE_URL") or os.environ.get("REDIS_URL"):
            raise CommandError("The demo runs on the embedded PostgreSQL and Redis (it creates and drops a "
                               "scratch database there): unset DATABASE_URL and REDIS_URL.")
        console = Console() if sys.stdout.isatty() else Console(width=PLAIN_WIDTH)
        # Copy the project database only while it holds nothing of anyone's (a fresh checkout).
        pristine = not Tenant.objects.exclude(slug=SYSTEM_TENANT_SLUG).exists()
        connections.close_all()  # a template database must have no other session
        box = scratch.create(settings.DATABASE_URL, settings.REDIS_URL, copy=pristine,
                             admin_url=settings.DATABASE_OWNER_URL or settings.DATABASE_URL)
        try:
            scratch.use(box)
            failures = runner.run(console, box)
        except DemoApiError as exc:
            raise CommandError(f"the demo stopped: {exc} (the children's logs are in "
                               f"{settings.DUCTOR_DATA_DIR / 'logs'})") from exc
        except KeyboardInterrupt:
            console.print("[yellow]Interrupted; everything the demo started has stopped.")
            sys.exit(130)
        finally:
            connections.close_all()
            scratch.drop(box)
        if failures:
            raise CommandError(f"{failures} demo check(s) failed")
        console.print("[green]All demo checks passed; everything the demo started has stopped.")
