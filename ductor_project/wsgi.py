import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ductor_project.settings")
application = get_wsgi_application()


def _warm_schema() -> None:
    """Build the OpenAPI schema once before serving: drf-spectacular's first build is
    not thread-safe, and concurrent first requests to /api/schema/ would race."""
    from drf_spectacular.generators import SchemaGenerator

    SchemaGenerator().get_schema(request=None, public=True)


_warm_schema()
