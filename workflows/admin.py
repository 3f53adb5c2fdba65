from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from scheduling.connection_config import queue_name_error
from tenants.admin import SuperuserOnlyMixin
from tenants.admin_scoping import TenantScopedAdmin, TenantScopedInline
from tenants.models import Plan
from workflows import catalog
from workflows.dag_svg import render_dag
from workflows.models import RunEvent, StepRun, TaskCatalogEntry, WorkflowDefinition, WorkflowRun, WorkflowVersion


def _pretty(value: Any) -> SafeString:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True, default=str))


class ReadOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class VersionInline(ReadOnlyMixin, TenantScopedInline):
    model = WorkflowVersion
    fields = readonly_fields = ("number", "created_at")


@admin.register(WorkflowDefinition)
class WorkflowDefinitionAdmin(TenantScopedAdmin):
    list_display = ["name", "latest_version", "updated_at"]
    search_fields = ["name"]
    readonly_fields = ["latest_version", "created_at", "updated_at"]
    inlines = [VersionInline]


@admin.register(WorkflowVersion)
class WorkflowVersionAdmin(ReadOnlyMixin, TenantScopedAdmin):
    list_display = ["definition", "number", "created_at"]
    readonly_fields = ["definition", "number", "spec_pretty", "created_at"]
    exclude = ["spec"]

    @admin.display(description="spec")
    def spec_pretty(self, obj: WorkflowVersion) -> SafeString:
        return _pretty(obj.spec)


class StepInline(ReadOnlyMixin, TenantScopedInline):
    model = StepRun
    fk_name = "run"
    fields = readonly_fields = (
        "node_id", "node_type", "attempt", "status", "routing_trace", "error", "started_at", "finished_at"
    )

    @admin.display(description="routing")
    def routing_trace(self, obj: StepRun) -> SafeString:
        return _pretty(obj.routing) if obj.routing else mark_safe("—")


class EventInline(ReadOnlyMixin, TenantScopedInline):
    model = RunEvent
    fields = readonly_fields = ("seq", "type", "node_id", "data", "created_at")


@admin.register(WorkflowRun)
class WorkflowRunAdmin(ReadOnlyMixin, TenantScopedAdmin):
    list_display = ["id", "workflow_name", "status", "tier", "nesting_depth", "created_at", "finished_at"]
    list_filter = ["status", "tier", "workflow_name"]
    search_fields = ["id", "workflow_name", "idempotency_key"]
    fields = readonly_fields = (
        "dag", "lineage_links", "workflow", "status", "input_pretty", "output_pretty", "error_pretty",
        "idempotency_key", "tier", "tags", "nesting_depth", "cancel_requested", "created_at", "started_at",
        "finished_at",
    )
    inlines = [StepInline, EventInline]

    @admin.display(description="DAG")
    def dag(self, obj: WorkflowRun) -> SafeString:
        statuses: dict[str, str] = {}
        for step in StepRun.all_tenants.filter(run=obj).order_by("attempt"):
            statuses[step.node_id] = step.status
        return mark_safe(render_dag(obj.workflow.spec, statuses))  # noqa: S308 - every label is escaped

    @admin.display(description="lineage")
    def lineage_links(self, obj: WorkflowRun) -> SafeString:
        def link(run_id: Any, label: str) -> tuple[str, str]:
            return (reverse("admin:workflows_workflowrun_change", args=[run_id]), f"{label} {run_id}")

        links = []
        if obj.parent_run_id:
            links.append(link(obj.parent_run_id, "parent"))
        if obj.continued_from_id:
            links.append(link(obj.continued_from_id, "continued from"))
        successor = WorkflowRun.all_tenants.filter(continued_from_id=obj.pk).values_list("id", flat=True).first()
        if successor:
            links.append(link(successor, "successor"))
        for child in WorkflowRun.all_tenants.filter(parent_run_id=obj.pk).values_list("id", flat=True)[:50]:
            links.append(link(child, "child"))
        if not links:
            return mark_safe("—")
        return format_html_join(mark_safe("<br>"), '<a href="{}">{}</a>', links)

    @admin.display(description="input")
    def input_pretty(self, obj: WorkflowRun) -> SafeString:
        return _pretty(obj.input)

    @admin.display(description="output")
    def output_pretty(self, obj: WorkflowRun) -> SafeString:
        return _pretty(obj.output)

    @admin.display(description="error")
    def error_pretty(self, obj: WorkflowRun) -> SafeString:
        return _pretty(obj.error)


@admin.register(StepRun)
class StepRunAdmin(ReadOnlyMixin, TenantScopedAdmin):
    list_display = ["run", "node_id", "attempt", "status", "started_at", "finished_at"]
    list_filter = ["status", "node_type"]


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyMixin, TenantScopedAdmin):
    list_display = ["run", "seq", "type", "node_id", "created_at"]
    list_filter = ["type"]


class TaskCatalogEntryForm(forms.ModelForm[TaskCatalogEntry]):
    """The API's checks: a callable task name, a team queue, a valid JSON Schema, known plans."""

    class Meta:
        model = TaskCatalogEntry
        fields = ["name", "description", "queue", "arguments", "input_schema", "timeout_s", "plans", "tenants",
                  "enabled"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        checks = {
            "name": catalog.name_problem(data.get("name")),
            "queue": queue_name_error(data["queue"]) if data.get("queue") else None,
            "input_schema": catalog.schema_problem(data.get("input_schema") or {}),
        }
        plans = data.get("plans") or []
        if not isinstance(plans, list) or set(plans) - set(Plan.objects.values_list("slug", flat=True)):
            checks["plans"] = "must be a list of plan slugs"
        tenants = data.get("tenants") or []
        if not isinstance(tenants, list) or not all(isinstance(slug, str) for slug in tenants):
            checks["tenants"] = "must be a list of tenant slugs"
        for name, problem in checks.items():
            if problem:
                self.add_error(name, problem)
        return data


@admin.register(TaskCatalogEntry)
class TaskCatalogEntryAdmin(SuperuserOnlyMixin, admin.ModelAdmin[TaskCatalogEntry]):
    """The team's Celery tasks tenants may call as task nodes (platform data: superusers only)."""

    form = TaskCatalogEntryForm
    list_display = ["name", "queue", "arguments", "timeout_s", "enabled", "updated_at"]
    list_filter = ["enabled", "arguments"]
    search_fields = ["name", "description", "queue"]
