"""A team's own Celery project, as a Ductor user has one: its own module, app and worker.

It knows nothing of Ductor (no Django, no Ductor import). Its worker consumes
the queue ``team`` on the broker ``TEAM_BROKER_URL`` and stores results in
``TEAM_RESULT_BACKEND`` (Ductor's own Redis in the tests, so that Ductor can
read a failed task's exception). Start it with
``celery -A tests.teamapp worker -Q team``.
"""

from tests.teamapp.tasks import app

__all__ = ["app"]
