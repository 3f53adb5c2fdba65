"""The web server serves the admin's and the API docs' assets itself: a browser gets a styled
admin and a working Swagger UI with no CDN and no separate static server."""

from __future__ import annotations

import pytest
from django.test import Client


@pytest.mark.parametrize("autorefresh", [False, True], ids=["production", "tests"])
@pytest.mark.parametrize("path", [
    "/static/admin/css/base.css",
    "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js",
])
def test_static_assets_are_served_by_the_app(path, autorefresh, settings):
    settings.WHITENOISE_AUTOREFRESH = autorefresh  # read when a client builds the middleware
    response = Client().get(path)

    assert response.status_code == 200
    assert b"".join(response.streaming_content)  # type: ignore[attr-defined]


@pytest.mark.django_db
def test_the_api_docs_page_loads_its_assets_from_this_server():
    page = Client().get("/api/docs/").content.decode()

    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in page
    assert "cdn" not in page.lower()
