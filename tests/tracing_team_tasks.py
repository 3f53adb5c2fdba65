"""A task of the team's own project for the tracing tests (``celery -A tests.teamapp worker --include
tests.tracing_team_tasks``): it returns the trace context its message came with, read off the Celery
request as any of the team's tasks could. The team's worker itself does not trace.
"""

from __future__ import annotations

from typing import Any

from tests.teamapp.tasks import app, header


@app.task(name="team.traceparent", bind=True)
def traceparent(self: Any, **ignored: Any) -> dict[str, Any]:
    """The W3C ``traceparent`` header of this task's message (None without one)."""
    return {"traceparent": header(self.request, "traceparent")}
