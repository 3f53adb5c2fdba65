"""The task catalog's endpoints: the platform manages it, a tenant lists what it may call.

- ``/api/v1/task-catalog`` (platform admin): create, list, read, change and
  delete entries, by task name.
- ``/api/v1/tasks`` (a tenant): the enabled entries its plan or slug may call,
  by name; any other name answers 404, like another tenant's object.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from ductor_project.core.context import SYSTEM_TENANT_SLUG
from ductor_project.core.errors import NotFound, conflict_on_duplicate
from scheduling.connection_config import queue_name_error
from tenants.api import (
    PatternField,
    PlatformViewSet,
    StrictModelSerializer,
    TenantViewSet,
    TextField,
    named_string,
)
from tenants.models import Plan, Tenant
from workflows import catalog, schemas
from workflows.models import TaskCatalogEntry
from workflows.spec import MAX_TIMEOUT_S

LOOKUP = r"[^/]+"
# A list's slugs, each a component of its own (``named_string``): inline, a generator named them Plan and Tenant.
PlanSlugField = named_string("PlanSlug", max_length=50)
TenantSlugField = named_string("TenantSlug", max_length=63)


class TaskCatalogEntrySerializer(StrictModelSerializer):
    # Declared: a taken name is a 409 conflict (conflict_on_duplicate), as everywhere else.
    name = PatternField(catalog.TASK_NAME.pattern, max_length=catalog.MAX_TASK_NAME,
                        rule=f"a Celery task name: dotted identifiers such as billing.tasks.charge, at most "
                             f"{catalog.MAX_TASK_NAME} characters (never ductor.* or celery.*)")
    description = TextField(max_length=500, required=False, allow_blank=True)
    input_schema = serializers.DictField(required=False, help_text="A JSON Schema (an object) the rendered input "
                                                                   "must match; {} matches anything.")
    plans = serializers.ListField(child=PlanSlugField(), required=False, max_length=100)
    tenants = serializers.ListField(child=TenantSlugField(), required=False, max_length=1000)
    timeout_s = serializers.FloatField(min_value=0.001, max_value=MAX_TIMEOUT_S, required=False, allow_null=True)

    class Meta:
        model = TaskCatalogEntry
        fields = ["name", "description", "queue", "arguments", "input_schema", "timeout_s", "plans", "tenants",
                  "enabled", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def validate_name(self, value: str) -> str:
        problem = catalog.name_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        if self.instance is not None and value != self.instance.name:
            raise serializers.ValidationError("cannot be changed; create another entry")
        return value

    def validate_queue(self, value: str) -> str:
        problem = queue_name_error(value) if value else None
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate_input_schema(self, value: Any) -> Any:
        problem = schemas.schema_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate_plans(self, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(Plan.objects.filter(slug__in=value).values_list("slug", flat=True)))
        if unknown:
            raise serializers.ValidationError(f"unknown plan '{unknown[0]}'")
        return sorted(set(value))

    def validate_tenants(self, value: list[str]) -> list[str]:
        # The system tenant runs no workflow and is not reachable through the platform API: unknown here.
        found = dict(Tenant.objects.filter(slug__in=value).exclude(slug=SYSTEM_TENANT_SLUG)
                     .values_list("slug", "status"))
        unknown = sorted(set(value) - set(found))
        if unknown:
            raise serializers.ValidationError(f"unknown tenant '{unknown[0]}'")
        # Its purge takes its slug out of every entry: one written meanwhile would pass to a later tenant of it.
        leaving = sorted(slug for slug, state in found.items() if state == Tenant.Status.DELETING)
        if leaving:
            raise serializers.ValidationError(f"tenant '{leaving[0]}' is being deleted")
        return sorted(set(value))


class TaskSerializer(serializers.ModelSerializer):
    """A catalog task as a tenant sees it: what to call and with what input."""

    class Meta:
        model = TaskCatalogEntry
        fields = ["name", "description", "queue", "arguments", "input_schema", "timeout_s"]
        read_only_fields = fields


def _entry(name: str, *, locked: bool = False) -> TaskCatalogEntry:
    entries = TaskCatalogEntry.objects.select_for_update() if locked else TaskCatalogEntry.objects
    found = entries.filter(name=name).first()
    if found is None:
        raise NotFound()
    return found


class PlatformTaskCatalogViewSet(PlatformViewSet):
    """Platform admin: the team's Celery tasks tenants may call as task nodes."""

    serializer_class = TaskCatalogEntrySerializer
    queryset = TaskCatalogEntry.objects.none()
    lookup_field = "name"
    lookup_value_regex = LOOKUP
    pagination_class = None  # a catalog is short: a plain array

    def list(self, request: Request) -> Response:
        return Response(TaskCatalogEntrySerializer(TaskCatalogEntry.objects.order_by("name"), many=True).data)

    def retrieve(self, request: Request, name: str) -> Response:
        return Response(TaskCatalogEntrySerializer(_entry(name)).data)

    @extend_schema(request=TaskCatalogEntrySerializer, responses={201: TaskCatalogEntrySerializer})
    def create(self, request: Request) -> Response:
        params = TaskCatalogEntrySerializer(data=request.data)
        params.is_valid(raise_exception=True)
        with conflict_on_duplicate("name", f"a catalog entry named '{params.validated_data['name']}' exists"):
            found = params.save()
        return Response(TaskCatalogEntrySerializer(found).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=TaskCatalogEntrySerializer, responses={200: TaskCatalogEntrySerializer})
    def partial_update(self, request: Request, name: str) -> Response:
        # The entry locked until the change commits: a deletion waits for it, or is waited for and the
        # change is a 404. Read unlocked, a change of an entry deleted meanwhile inserted it again.
        with transaction.atomic():
            params = TaskCatalogEntrySerializer(_entry(name, locked=True), data=request.data, partial=True)
            params.is_valid(raise_exception=True)
            return Response(TaskCatalogEntrySerializer(params.save()).data)

    def destroy(self, request: Request, name: str) -> Response:
        _entry(name).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class TaskViewSet(TenantViewSet):
    """The catalog tasks this tenant may call as task nodes."""

    serializer_class = TaskSerializer
    queryset = TaskCatalogEntry.objects.none()
    lookup_field = "name"
    lookup_value_regex = LOOKUP
    pagination_class = None

    def get_queryset(self) -> QuerySet[TaskCatalogEntry]:
        """The entries this tenant may call (``catalog.visible``): what its detail routes show."""
        return TaskCatalogEntry.objects.filter(name__in=[entry.name for entry in catalog.visible()])

    def list(self, request: Request) -> Response:
        return Response(TaskSerializer(catalog.visible(), many=True).data)

    def retrieve(self, request: Request, name: str) -> Response:
        check = catalog.callable_task(name, fresh=True)
        if check.entry is None:
            raise NotFound()
        return Response(TaskSerializer(check.entry).data)
