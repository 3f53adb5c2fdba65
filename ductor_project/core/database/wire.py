"""What a connection sends PostgreSQL, read off the wire: for the benchmarks and the tests.

libpq's protocol trace of Django's connection lists each message: a statement run is an
``Execute`` (its text in the ``Parse`` before it, unless the connection prepared it earlier)
or a ``Query``, and the server ends each round trip with a ``ReadyForQuery``. Counting those
is exact whatever batches the statements travelled in. Costly: only to measure.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import connection
from psycopg import pq


@dataclass
class Wire:
    """What was sent: the statements' texts (as parsed), how many ran, and the round trips."""

    statements: list[str] = field(default_factory=list)
    executed: int = 0
    round_trips: int = 0

    def sent(self, prefix: str) -> list[str]:
        """The statements parsed that start with ``prefix``."""
        return [s for s in self.statements if s.startswith(prefix)]

    def read(self, line: str) -> None:
        """Count one line of libpq's trace (timestamps suppressed; a value with a line break
        goes on over lines of its own, which are skipped)."""
        fields = line.rstrip("\n").split("\t")
        if len(fields) < 3 or fields[0] not in ("F", "B"):
            return
        direction, _, kind, *rest = fields
        if direction == "F" and kind in ("Execute", "Query"):
            self.executed += 1
        if direction == "F" and kind in ("Parse", "Query"):
            text = rest[0].strip()  # Parse: "" "<statement>" <types>; Query: "<statement>"
            self.statements.append(text.split('"', 3)[3].rsplit('"', 1)[0] if kind == "Parse" else text.strip('"'))
        elif direction == "B" and kind == "ReadyForQuery":
            self.round_trips += 1


@contextmanager
def wire(into: Wire | None = None) -> Iterator[Wire]:
    """Count what the default connection sends inside the block (added to ``into``, if given)."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    seen = into if into is not None else Wire()
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield seen
        finally:
            pgconn.untrace()
            trace.seek(0)
            for line in trace:
                seen.read(line)
