from rest_framework.routers import SimpleRouter

from workflows import catalog_api, views, webhook_api

router = SimpleRouter()
router.trailing_slash = "/?"
router.register("workflows", views.WorkflowViewSet, basename="workflow")
router.register("runs", views.RunViewSet, basename="run")
router.register("schedules", views.ScheduleViewSet, basename="schedule")
router.register("events", views.EventViewSet, basename="event")
router.register("triggers", views.TriggerViewSet, basename="trigger")
router.register("webhooks", webhook_api.WebhookViewSet, basename="webhook")
router.register("tasks", catalog_api.TaskViewSet, basename="task")
router.register("task-catalog", catalog_api.PlatformTaskCatalogViewSet, basename="platform-task-catalog")

urlpatterns = router.urls
