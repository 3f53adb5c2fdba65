"""``python manage.py queue_reshard --shards N``: change the number of fair-queue shards while the
system runs (``scheduling.resharding``; docs/scaling.md, "Changing the number of shards")."""

from __future__ import annotations

import statistics
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ductor_project.core.context import no_tenant
from ductor_project.core.keys import hashed_shard, read_shard_map
from scheduling import resharding


class Command(BaseCommand):
    help = ("Change the number of fair-queue shards while the system runs: puts N in force and moves "
            "every tenant whose shard changes (its backlog, leases, limiters), one at a time.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--shards", type=int, required=True, help="The new number of shards.")
        parser.add_argument("--dry-run", action="store_true", help="List the tenants that would move; change nothing.")
        parser.add_argument("--tenant", action="append", default=[], metavar="ID",
                            help="Move only this tenant now (repeatable); the others stay pinned where they are.")

    def handle(self, *args: Any, **options: Any) -> None:
        count = options["shards"]
        try:
            with no_tenant():
                self._reshard(count, options["tenant"], dry_run=options["dry_run"])
        except resharding.ReshardError as exc:
            raise CommandError(str(exc)) from exc

    def _reshard(self, count: int, only: list[str], *, dry_run: bool) -> None:
        known = resharding.tenant_ids()
        unknown = sorted(set(only) - set(known))
        if unknown:
            raise CommandError(f"unknown tenant(s): {', '.join(unknown)}")
        plan = resharding.plan(count, tenants=known)
        self.stdout.write(f"shards: {plan.before} -> {plan.count}; {len(plan.moves)} of {len(known)} tenants move")
        for tenant_id, source, target in plan.moves:
            self.stdout.write(f"  {tenant_id}: shard {source} -> {target}")
        if dry_run:
            self.stdout.write("dry run: nothing changed")
            return
        resharding.start(plan)
        chosen = [move for move in plan.moves if not only or move[0] in only]
        reports = []
        for n, (tenant_id, _, target) in enumerate(chosen, 1):
            report = resharding.move_tenant(tenant_id, target)
            if report is not None:
                reports.append(report)
                self.stdout.write(f"[{n}/{len(chosen)}] moved {tenant_id}: shard {report.source} -> {report.target}, "
                                  f"{report.items} items, {report.keys} keys, paused {report.paused_s * 1000:.1f} ms")
        self._summary(reports, resharding.finish())

    def _summary(self, reports: list[resharding.MoveReport], final: Any) -> None:
        if reports:
            pauses = [r.paused_s * 1000 for r in reports]
            slowest = max(reports, key=lambda r: r.paused_s)
            self.stdout.write(
                f"moved {len(reports)} tenants in {sum(r.seconds for r in reports):.2f} s; pause per tenant: "
                f"median {statistics.median(pauses):.1f} ms, max {max(pauses):.1f} ms "
                f"({slowest.tenant_id}, {slowest.items} items)")
        current = read_shard_map()
        waiting = [t for t, shard in current.pins.items() if shard != hashed_shard(t, current.in_force())]
        if waiting or current.moves:
            self.stdout.write(f"{len(waiting)} tenants still wait in their old shards: run the command again "
                              f"(without --tenant) to move them")
        self.stdout.write(
            f"serving shards 0..{final.shards() - 1}; {current.in_force()} in force. To finish: set "
            f"DUCTOR_QUEUE_SHARDS={current.in_force()} in the environment and restart the processes at "
            f"leisure (the running ones follow the shard map meanwhile).")
