"""The WSGI entry point (gunicorn, runserver): boots the embedded servers it needs, then Django.

Each gunicorn worker imports it after its fork (the stack runs gunicorn without
``--preload``), so each sets up its own tracing, before Django loads its
middleware: the request spans' is one of them.
"""

import os

from django.core.wsgi import get_wsgi_application

from ductor_project import embedded
from ductor_project.chunked import ChunkedBodies
from ductor_project.core import tracing
from ductor_project.core.heap import freeze_startup_heap
from ductor_project.startup_checks import refuse_to_start

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ductor_project.settings")
embedded.boot()
tracing.configure()
application = ChunkedBodies(get_wsgi_application())
refuse_to_start("web server")  # a bad setting stops it here, not as a failure of every request


def _warm_schema() -> None:
    """Build the OpenAPI schema once before serving: drf-spectacular's first build is
    not thread-safe, and concurrent first requests to /api/schema/ would race."""
    from drf_spectacular.generators import SchemaGenerator

    SchemaGenerator().get_schema(request=None, public=True)


_warm_schema()
freeze_startup_heap()  # what it loaded, the schema included, out of the collector's way
