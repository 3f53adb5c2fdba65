"""The demo's terminal output: a live view (rich) on a terminal, periodic plain lines elsewhere (CI, pipes)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group
from rich.live import Live as RichLive
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ductor_project.demo.metrics import Live

PLAIN_EVERY_S = 5.0
NOTES_SHOWN = 6


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.1f} s" if value >= 1000 else f"{value:.0f} ms"


@dataclass(frozen=True)
class Row:
    slug: str
    label: str  # "pro · w4"
    live: Live
    queue: Mapping[str, Any] | None  # the tenant's GET /api/v1/queue, when read


class DemoView:
    """Call ``update()`` about once a second inside ``with view:``; ``note()`` for events."""

    def __init__(self, console: Console, header: str) -> None:
        self.console = console
        self.header = header
        self.interactive = console.is_terminal
        self.notes: list[str] = []
        self._live: RichLive | None = None
        self._started = time.monotonic()
        self._next_plain = 0.0

    def __enter__(self) -> DemoView:
        self._started = time.monotonic()
        if self.interactive:
            self._live = RichLive(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def note(self, message: str) -> None:
        stamped = f"{time.monotonic() - self._started:5.1f}s  {message}"
        self.notes.append(stamped)
        if not self.interactive:
            self.console.print(stamped, highlight=False)

    def update(self, rows: Sequence[Row], status: str) -> None:
        elapsed = time.monotonic() - self._started
        if self._live is not None:
            self._live.update(self._render(rows, status, elapsed))
            return
        if elapsed >= self._next_plain:
            self._next_plain = elapsed + PLAIN_EVERY_S
            parts = [
                f"{r.slug} {r.live.finished:,}/{r.live.started:,} runs, {r.live.dispatches_per_s:.1f} disp/s, "
                f"wait p50 {fmt_ms(r.live.wait_p50_ms)}"
                for r in rows
            ]
            self.console.print(f"{elapsed:5.1f}s  " + " | ".join(parts), highlight=False, soft_wrap=True)

    def _render(self, rows: Sequence[Row], status: str, elapsed: float) -> Group:
        table = Table(box=None, padding=(0, 1), header_style="bold")
        for name, justify in (("tenant", "left"), ("plan", "left"), ("runs finished / started", "left"),
                              ("", "right"), ("running", "right"), ("dispatches/s", "right"), ("wait p50", "right"),
                              ("queued", "right"), ("in flight", "right"), ("oldest waiting", "right")):
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for row in rows:
            live = row.live
            queue = row.queue or {}
            table.add_row(
                Text(row.slug, style="bold"), row.label,
                ProgressBar(total=max(live.started, 1), completed=live.finished, width=32),
                f"{live.finished:,}/{live.started:,}", f"{live.running:,}", f"{live.dispatches_per_s:.1f}",
                fmt_ms(live.wait_p50_ms),
                f"{queue.get('backlog', 0):,}" if queue else "-", f"{queue.get('in_flight', 0)}" if queue else "-",
                fmt_ms(queue.get("oldest_waiting_ms")) if queue else "-",
            )
        notes = Text("\n".join(self.notes[-NOTES_SHOWN:]), style="dim")
        legend = Text("dispatches/s and wait p50: the fair queue's hand-outs (ticks and steps) over the last "
                      "5 s, and how long they had been due; queued, in flight, oldest waiting: GET /api/v1/queue",
                      style="dim")
        head = Text.assemble((f"Ductor demo  {elapsed:5.1f}s  ", "bold"), (self.header, "dim"))
        return Group(head, Text(""), table, legend, Text(""), Text(status, style="cyan"), notes)
