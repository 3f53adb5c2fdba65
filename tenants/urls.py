from django.urls import re_path
from rest_framework.routers import SimpleRouter

from tenants import views

router = SimpleRouter()
router.trailing_slash = "/?"  # accept both /api/v1/api-keys and /api/v1/api-keys/
router.register("api-keys", views.ApiKeyViewSet, basename="api-key")
router.register("tenants", views.PlatformTenantViewSet, basename="platform-tenant")
router.register("plans", views.PlatformPlanViewSet, basename="platform-plan")

urlpatterns = [
    re_path(r"^tenant/?$", views.CurrentTenantView.as_view(), name="tenant-current"),
    re_path(r"^entitlements/?$", views.EntitlementsView.as_view(), name="entitlements"),
    *router.urls,
]
