from django.urls import re_path
from rest_framework.routers import SimpleRouter

from scheduling import views

router = SimpleRouter()
router.trailing_slash = "/?"  # accept both /api/v1/pools and /api/v1/pools/
router.register("connections", views.ConnectionViewSet, basename="connection")
router.register("pools", views.PoolViewSet, basename="pool")
router.register("rules", views.RuleViewSet, basename="rule")
router.register("fairness-keys", views.FairnessKeyViewSet, basename="fairness-key")

urlpatterns = [
    re_path(r"^routing/explain/?$", views.RoutingExplainView.as_view(), name="routing-explain"),
    re_path(r"^queue/?$", views.QueueView.as_view(), name="queue"),
    re_path(r"^platform/queue/?$", views.PlatformQueueView.as_view(), name="platform-queue"),
    *router.urls,
]
