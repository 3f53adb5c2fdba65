from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from ductor_project import health
from ductor_project.core import errors
from scheduling import metrics


class SchemaView(SpectacularAPIView):
    """The schema, in YAML or JSON. Its errors (a ``format`` it has no renderer for, an Accept it cannot
    meet, a bad key) are in the API's JSON error shape, not rendered as a schema document."""

    def handle_exception(self, exc: Exception) -> Response:
        response: Response = super().handle_exception(exc)
        self.request.accepted_renderer, self.request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
        return response


urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/schema/", SchemaView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/", include("tenants.urls")),
    path("api/v1/", include("scheduling.urls")),
    path("api/v1/", include("workflows.urls")),
]

handler400 = errors.json_400
handler403 = errors.json_403
handler404 = errors.json_404
handler500 = errors.json_500
