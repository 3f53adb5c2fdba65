from rest_framework.routers import SimpleRouter

from workflows import views

router = SimpleRouter()
router.trailing_slash = "/?"
router.register("workflows", views.WorkflowViewSet, basename="workflow")
router.register("runs", views.RunViewSet, basename="run")

urlpatterns = router.urls
