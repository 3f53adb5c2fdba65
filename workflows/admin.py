from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import capfirst

from ductor_project.core.context import tenant_context
from ductor_project.core.errors import ApiError
from scheduling.connection_config import queue_name_error
from tenants.admin import SuperuserOnlyMixin
from tenants.admin_scoping import (
    ChangelistLimitsMixin,
    ServiceDeleteMixin,
    StorableJSONMixin,
    TenantScopedAdmin,
    TenantScopedInline,
    TenantScopedInlineFormSet,
    admin_may_write,
    admin_tenant,
)
from tenants.models import Plan, Tenant, Tier
from workflows import catalog, console, schemas, services
from workflows.admin_lists import BigTableListMixin, choices_filter
from workflows.dag_svg import render_dag
from workflows.models import (
    Event,
    EventTrigger,
    EventWait,
    RunEvent,
    RunSignal,
    Schedule,
    StepRun,
    TaskCatalogEntry,
    WebhookDelivery,
    WebhookEndpoint,
    WorkflowDefinition,
    WorkflowRun,
    WorkflowVersion,
)
from workflows.serializers import RUN_EVENT_TYPES
from workflows.spec import NODE_TYPES
from workflows.triggers import services as schedules
from workflows.triggers import webhooks


def _may_write(request: HttpRequest, tenant_id: Any, permission: str) -> bool:
    """Whether the user may change an object of the tenant ``tenant_id``: a superuser, or staff of
    that tenant with ``permission`` who may write its rows (``admin_may_write``)."""
    if request.user.is_superuser:
        return True
    tenant = admin_tenant(request)
    return (tenant is not None and tenant.pk == tenant_id and request.user.has_perm(permission)
            and admin_may_write(request))


def _writable_actions(request: HttpRequest, actions: Any, permission: str) -> Any:
    """``actions`` (a change list's), without those that write when the user may not write for the
    tenant of the admin (a viewer, or staff without ``permission``): offered, they answered 403."""
    tenant = admin_tenant(request)
    if not _may_write(request, tenant.pk if tenant is not None else None, permission):
        return {name: action for name, action in actions.items() if name == "delete_selected"}
    return actions


def _workflow_names(request: HttpRequest) -> list[str]:
    """The names of the workflows of the tenant the list shows (read from the workflows, not the runs):
    the staff user's, or the one a superuser chose in the tenant filter. None before a superuser chose
    one: every tenant's names were read, and drawn, on each page of the list."""
    if request.user.is_superuser:
        chosen = _chosen_tenant(request)
    else:
        tenant = admin_tenant(request)
        chosen = tenant.pk if tenant is not None else None
    if chosen is None:
        return []
    return list(WorkflowDefinition.all_tenants.filter(tenant_id=chosen).order_by("name").values_list("name", flat=True))


def _chosen_tenant(request: HttpRequest) -> uuid.UUID | None:
    """The tenant a superuser's list is filtered by (``?tenant__id__exact=``), if it names one."""
    return _uuid(request.GET.get("tenant__id__exact", ""))


def _uuid(text: str) -> uuid.UUID | None:
    """``text`` as a UUID, or None when it is not one."""
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


WorkflowNameFilter = choices_filter("workflow_name", "workflow", _workflow_names)


def _pretty(value: Any) -> SafeString:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True, default=str))


class ReadOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class EngineRowsMixin(ReadOnlyMixin):
    """Rows the engine writes and reads back (a run's steps, its history, its waits and signals, the
    versions its runs run, the deliveries of its outcomes): read only, and never deleted here. Deleting
    one under a live run left the engine without what it goes on from: a wait that no event finds any
    more, a step the run's next tick counts on, a history with a hole in its sequence."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class LatestVersionsFormSet(TenantScopedInlineFormSet):
    """A workflow's latest ``VersionInline.shown`` versions, newest first, without their specs: its
    versions are never deleted (each change adds one), each spec may be a megabyte, and its page read
    every version, spec and all, to show their numbers."""

    def get_queryset(self) -> Any:
        if not hasattr(self, "_latest"):
            self._latest = super().get_queryset().defer("spec").order_by("-number")[: VersionInline.shown]
        return self._latest


class VersionInline(EngineRowsMixin, TenantScopedInline):
    """The workflow's latest versions; every one is in the version list (each with its spec)."""

    model = WorkflowVersion
    formset = LatestVersionsFormSet
    shown = 100
    verbose_name_plural = f"latest {shown} versions"
    fields = readonly_fields = ("number", "created_at")


@admin.register(WorkflowDefinition)
class WorkflowDefinitionAdmin(ServiceDeleteMixin, TenantScopedAdmin):
    """A tenant's workflows. They are created, and take new versions, through the API (with a spec);
    here the description changes (``workflow_describe``), and a workflow is archived, unarchived or
    deleted (``workflow_delete``, with its schedules). Its name is read only: schedules, triggers,
    webhooks and runs refer to it by name."""

    list_display = ["name", "latest_version", "archived_at", "updated_at"]
    list_filter = [("archived_at", admin.EmptyFieldListFilter)]
    search_fields = ["name"]
    fields = ["tenant", "name", "description", "latest_version", "archived_at", "created_at", "updated_at"]
    readonly_fields = ["name", "latest_version", "archived_at", "created_at", "updated_at"]
    inlines = [VersionInline]
    actions = ["archive", "unarchive"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: WorkflowDefinition, form: Any, change: bool) -> None:
        with tenant_context(obj.tenant):
            services.workflow_describe(name=obj.name, description=obj.description)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        """As Django's, less the permission to delete its versions (``workflow_delete`` takes them with
        it, while a version alone is never deleted here), and with a workflow that has runs named as
        refused, as ``workflow_delete`` refuses it, rather than walked: Django's walk reads every run
        of it, whole, to list each one, which for a long history is millions of rows for one page."""
        objs = list(objs)
        with_runs = [obj for obj in objs if WorkflowRun.all_tenants.filter(workflow__definition=obj).exists()]
        free = [obj for obj in objs if obj not in with_runs]
        deleted, counts, perms_needed, protected = (super().get_deleted_objects(free, request) if free
                                                    else ([], {}, set(), []))
        perms_needed.discard(WorkflowVersion._meta.verbose_name)
        protected = [*protected, *(f"Workflow '{obj.name}' has runs in its history and cannot be deleted: archive "
                                   "it instead (its runs are kept until the plan's history retention removes them)."
                                   for obj in with_runs)]
        return deleted, counts, perms_needed, protected

    def delete_one(self, obj: WorkflowDefinition) -> None:
        services.workflow_delete(name=obj.name)

    def get_actions(self, request: HttpRequest) -> Any:
        return _writable_actions(request, super().get_actions(request), "workflows.change_workflowdefinition")

    @admin.action(description="Archive selected workflows (they start no new run)")
    def archive(self, request: HttpRequest, queryset: Any) -> None:
        self._each(request, queryset, services.workflow_archive, "archived")

    @admin.action(description="Unarchive selected workflows")
    def unarchive(self, request: HttpRequest, queryset: Any) -> None:
        self._each(request, queryset, services.workflow_unarchive, "unarchived")

    def _each(self, request: HttpRequest, queryset: Any, change: Any, done: str) -> None:
        """Apply ``change`` (a service taking ``name``) to each selected workflow, in its tenant's
        context; a refusal (the plan's ``max_workflows``) is shown and the others go on."""
        changed = 0
        for definition in queryset.select_related("tenant"):
            if not _may_write(request, definition.tenant_id, "workflows.change_workflowdefinition"):
                raise PermissionDenied
            try:
                with tenant_context(definition.tenant):
                    change(name=definition.name)
            except ApiError as exc:
                messages.warning(request, f"{definition.name}: {exc.detail}")
                continue
            self.log_change(request, definition, done.capitalize() + ".")
            changed += 1
        if changed:
            messages.success(request, f"{changed} workflow(s) {done}.")


@admin.register(WorkflowVersion)
class WorkflowVersionAdmin(EngineRowsMixin, TenantScopedAdmin):
    list_display = ["definition", "number", "created_at"]
    readonly_fields = ["definition", "number", "spec_pretty", "created_at"]
    exclude = ["spec"]

    @admin.display(description="spec")
    def spec_pretty(self, obj: WorkflowVersion) -> SafeString:
        return _pretty(obj.spec)


class LatestEventsFormSet(TenantScopedInlineFormSet):
    """A run's latest ``EventInline.shown`` events, newest first: a run's history has no bound (each
    retry, wait and tick adds to it), and its page rendered every event of it."""

    def get_queryset(self) -> Any:
        if not hasattr(self, "_latest"):
            self._latest = super().get_queryset().order_by("-seq")[: EventInline.shown]
        return self._latest


class EventInline(EngineRowsMixin, TenantScopedInline):
    """The run's latest events; its whole history is the run-event list of the run (``history_link``)."""

    model = RunEvent
    formset = LatestEventsFormSet
    shown = 100
    verbose_name_plural = f"latest {shown} events"
    fields = readonly_fields = ("seq", "type", "node_id", "data", "created_at")


def _run_url(run_id: Any) -> str:
    return reverse("admin:workflows_workflowrun_change", args=[run_id])


def _details(label: str, value: Any, *, opened: bool = False) -> SafeString:
    """``value`` as pretty JSON under a ``<details>`` that opens it; ``—`` when there is none."""
    if value is None:
        return mark_safe("—")
    text = console.pretty_json(value)
    return format_html('<details class="ductor-payload"{}><summary>{} ({} bytes)</summary><pre>{}</pre></details>',
                       mark_safe(" open") if opened else "", label, len(text.encode()), text)


@admin.register(WorkflowRun)
class WorkflowRunAdmin(BigTableListMixin, ReadOnlyMixin, TenantScopedAdmin):
    """The run console (``workflows.console``): the run list, the run page with its timeline, routing,
    why-waiting and lineage, the cancel action, and the tenant page (usage, queue, fairness).

    Runs are never deleted here: they are a tenant's history (no delete permission, no bulk delete).
    """

    list_display = ["short_id", "workflow_column", "status_badge", "tier", "created", "duration"]
    list_filter = ["status", choices_filter("tier", "tier", lambda request: Tier.values), WorkflowNameFilter,
                   ("created_at", admin.DateFieldListFilter)]
    search_fields = ["id", "workflow_name", "idempotency_key"]
    search_help_text = "A run's id or idempotency key, or a workflow name, whole."
    fieldsets = (
        (None, {"fields": ("status_badge", "workflow_link", "tenant_link", "tier", "tag_list", "idempotency_key",
                           "nesting_depth")}),
        ("Timing", {"fields": ("created", "started", "finished", "duration")}),
        ("Lineage", {"fields": ("lineage_links", "history_link")}),
        ("DAG", {"fields": ("dag",)}),
        ("Input, output and error", {"fields": ("input_pretty", "output_pretty", "error_pretty")}),
    )
    readonly_fields = (
        "status_badge", "workflow_link", "tenant_link", "tier", "tag_list", "idempotency_key", "nesting_depth",
        "created", "started", "finished", "duration", "lineage_links", "history_link", "dag", "input_pretty",
        "output_pretty",
        "error_pretty",
    )
    inlines = [EventInline]
    actions = ["cancel_selected", "retry_selected"]

    # --- the run list --------------------------------------------------------------------------

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[WorkflowRun],
                           search_term: str) -> tuple[QuerySet[WorkflowRun], bool]:
        """The runs whose id, idempotency key or workflow name is the search, whole: in a tenant's
        runs, each one index lookup. Django's search for a part of any of them read every run of the
        table, twice (the page, then its count)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        found = Q(workflow_name=term) | Q(idempotency_key=term)
        run_id = _uuid(term)
        return queryset.filter(found | Q(pk=run_id) if run_id else found), False

    def get_list_display(self, request: HttpRequest) -> Any:
        columns = list(super().get_list_display(request))
        if "tenant" in columns:  # a superuser's: next to the run
            columns.remove("tenant")
            columns.insert(1, "tenant")
        return columns

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_actions(self, request: HttpRequest) -> Any:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return _writable_actions(request, actions, "workflows.change_workflowrun")

    def _each_tenants(self, request: HttpRequest, queryset: Any, act: Callable[..., Any]) -> int:
        """``act(filters=..., limit=...)`` (a service on many runs) on the selected runs, each tenant's in
        its context; how many it acted on. ``PermissionDenied`` for a run the user may not act on."""
        by_tenant: dict[Tenant, list[Any]] = {}
        for run in queryset.select_related("tenant"):
            if not self.may_act(request, run):
                raise PermissionDenied
            by_tenant.setdefault(run.tenant, []).append(run.pk)
        done = 0
        for tenant, ids in by_tenant.items():
            with tenant_context(tenant):
                done += len(act(filters={"ids": ids}, limit=len(ids))[0])
        return done

    @admin.action(description="Cancel selected runs (those still active)")
    def cancel_selected(self, request: HttpRequest, queryset: Any) -> None:
        """Ask the selected runs to stop (``run_cancel_many``)."""
        asked = self._each_tenants(request, queryset, services.run_cancel_many)
        messages.success(request, f"{asked} run(s) asked to stop; the others had ended or were asked already.")

    @admin.action(description="Retry selected runs (those that failed)")
    def retry_selected(self, request: HttpRequest, queryset: Any) -> None:
        """Retry the selected failed runs (``run_retry_many``)."""
        retried = self._each_tenants(request, queryset, services.run_retry_many)
        messages.success(request, f"{retried} run(s) retried; the others had not failed, or are child runs "
                                  "(retry their root).")

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        tenant = admin_tenant(request)
        url = reverse("admin:workflows_tenant_console", args=[tenant.pk]) if tenant is not None else ""
        return super().changelist_view(request, {**(extra_context or {}), "tenant_console_url": url})

    @admin.display(description="run", ordering="id")
    def short_id(self, obj: WorkflowRun) -> SafeString:
        return format_html('<span class="ductor-id" title="{}">{}…</span>', obj.pk, str(obj.pk)[:8])

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: WorkflowRun) -> SafeString:
        if obj.cancel_requested and not obj.is_terminal:
            return format_html("{} cancellation requested", console.status_badge(obj.status))
        return console.status_badge(obj.status)

    @admin.display(description="workflow", ordering="workflow_name")
    def workflow_column(self, obj: WorkflowRun) -> SafeString:
        if not obj.nesting_depth:
            return format_html("{}", obj.workflow_name)
        return format_html('{} <span class="ductor-quiet">child, depth {}</span>', obj.workflow_name, obj.nesting_depth)

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: WorkflowRun) -> str:
        return console.moment(obj.created_at)

    @admin.display(description="started", ordering="started_at")
    def started(self, obj: WorkflowRun) -> str:
        return console.moment(obj.started_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, obj: WorkflowRun) -> str:
        return console.moment(obj.finished_at)

    @admin.display(description="duration")
    def duration(self, obj: WorkflowRun) -> str:
        return console.run_duration(obj)

    # --- the run page --------------------------------------------------------------------------

    @admin.display(description="workflow")
    def workflow_link(self, obj: WorkflowRun) -> SafeString:
        url = reverse("admin:workflows_workflowversion_change", args=[obj.workflow_id])
        return format_html('<a href="{}">{} v{}</a>', url, obj.workflow_name, obj.workflow.number)

    @admin.display(description="tenant")
    def tenant_link(self, obj: WorkflowRun) -> SafeString:
        url = reverse("admin:workflows_tenant_console", args=[obj.tenant_id])
        return format_html('{} (<a href="{}">usage, queue and fairness</a>)', obj.tenant, url)

    @admin.display(description="tags")
    def tag_list(self, obj: WorkflowRun) -> str:
        return ", ".join(str(tag) for tag in obj.tags) if obj.tags else "—"

    @admin.display(description="DAG")
    def dag(self, obj: WorkflowRun) -> SafeString:
        statuses: dict[str, str] = {}
        for step in StepRun.all_tenants.filter(run=obj).order_by("attempt"):
            statuses[step.node_id] = step.status
        return mark_safe(render_dag(obj.workflow.spec, statuses))  # noqa: S308 - every label is escaped

    @admin.display(description="related runs")
    def lineage_links(self, obj: WorkflowRun) -> SafeString:
        links = console.lineage(obj)
        if not links:
            return mark_safe("—")
        rows = format_html_join(
            "", '<li>{}{}: <a href="{}">{} {}</a> {}</li>',
            ((link.relation, f" (node {link.node_id})" if link.node_id else "", _run_url(link.run_id),
              link.workflow_name, str(link.run_id), link.badge) for link in links),
        )
        return format_html('<ul class="ductor-lineage">{}</ul>', rows)

    @admin.display(description="history")
    def history_link(self, obj: WorkflowRun) -> SafeString:
        url = reverse("admin:workflows_runevent_changelist") + f"?run__id__exact={obj.pk}"
        return format_html('<a href="{}">every event of the run</a> (the latest {} are below)', url, EventInline.shown)

    @admin.display(description="input")
    def input_pretty(self, obj: WorkflowRun) -> SafeString:
        return _details("input", obj.input)

    @admin.display(description="output")
    def output_pretty(self, obj: WorkflowRun) -> SafeString:
        return _details("output", obj.output)

    @admin.display(description="error")
    def error_pretty(self, obj: WorkflowRun) -> SafeString:
        return _details("error", obj.error, opened=True)

    def _run_or_404(self, request: HttpRequest, object_id: str) -> WorkflowRun:
        """The run, if this user's admin shows it: another tenant's run is simply not found."""
        run = self.get_object(request, unquote(object_id))
        if run is None:
            raise Http404("No such run.")
        return run

    def may_act(self, request: HttpRequest, run: WorkflowRun) -> bool:
        """Whether the user may act on ``run`` (cancel it)."""
        return _may_write(request, run.tenant_id, "workflows.change_workflowrun")

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        run = self._run_or_404(request, object_id)
        allowed = self.may_act(request, run)
        actions = [{"label": action.label, "url": reverse(action.url_name, args=[run.pk])}
                   for action in console.RUN_ACTIONS if allowed and action.offered(run)]
        context = {**(extra_context or {}), "timeline": console.timeline(run), "waiting": console.waiting(run),
                   "run_actions": actions}
        return super().change_view(request, object_id, form_url, context)

    # --- actions and the tenant page ---------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path("<path:object_id>/cancel/", view(self.cancel_view), name="workflows_workflowrun_cancel"),
            path("<path:object_id>/retry/", view(self.retry_view), name="workflows_workflowrun_retry"),
            path("<path:object_id>/rerun/", view(self.rerun_view), name="workflows_workflowrun_rerun"),
            path("tenant/<uuid:tenant_id>/", view(self.tenant_view), name="workflows_tenant_console"),
            *super().get_urls(),
        ]

    def _acted_on(self, request: HttpRequest, object_id: str) -> WorkflowRun | HttpResponse:
        """The run a POST of the run page acts on, once the user may act on it (404 for a run this
        admin does not show, 403 without the right); a response refusing anything but a POST."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        run = self._run_or_404(request, object_id)
        if not self.may_act(request, run):
            raise PermissionDenied
        return run

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Resume the failed run where it failed (``run_retry``), then back to its page."""
        run = self._acted_on(request, object_id)
        if isinstance(run, HttpResponse):
            return run
        try:
            with tenant_context(run.tenant):
                retried = services.run_retry(run=run)
        except ApiError as exc:
            messages.warning(request, str(exc.detail))
            return redirect(_run_url(run.pk))
        self.log_change(request, retried, "Retried.")
        messages.success(request, f"Run {run.pk} resumes: its failed and cancelled steps run again, then what "
                                  "never ran.")
        return redirect(_run_url(run.pk))

    def rerun_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Start a new run of the run's version with its input (``run_rerun``), then to the new run's page."""
        run = self._acted_on(request, object_id)
        if isinstance(run, HttpResponse):
            return run
        try:
            with tenant_context(run.tenant):
                new, _ = services.run_rerun(run=run)
        except ApiError as exc:
            messages.warning(request, str(exc.detail))
            return redirect(_run_url(run.pk))
        self.log_addition(request, new, f"Rerun of run {run.pk}.")
        messages.success(request, f"Run {new.pk} started: a rerun of run {run.pk}.")
        return redirect(_run_url(new.pk))

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Ask the run to stop (``run_cancel``), then back to its page with what happened."""
        run = self._acted_on(request, object_id)
        if isinstance(run, HttpResponse):
            return run
        already = run.is_terminal or run.cancel_requested
        with tenant_context(run.tenant):
            cancelled = services.run_cancel(run=run)
        if already:
            messages.warning(request, f"Run {run.pk} is {cancelled.status}"
                             f"{'' if cancelled.is_terminal else ' and already asked to stop'}: nothing to do.")
        else:
            self.log_change(request, cancelled, "Cancellation requested.")
            messages.success(request, f"Cancellation of run {run.pk} requested: it stops at its next tick, "
                                      "and so do its waiting children.")
        return redirect(_run_url(run.pk))

    def tenant_view(self, request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
        """The tenant page: usage against the plan, the queue now, the recent fairness share. Staff see
        their own tenant only (another one is not found)."""
        tenant = self._tenant_or_404(request, tenant_id)
        if not self.has_view_permission(request):
            raise PermissionDenied
        everyone = bool(request.user.is_superuser)
        context = {
            **self.admin_site.each_context(request), **console.tenant_page(tenant, everyone=everyone),
            "title": f"{tenant.slug}: usage, queue and fairness", "tenant": tenant, "opts": self.model._meta,
            "everyone": everyone, "runs_url": reverse("admin:workflows_workflowrun_changelist")
            + (f"?tenant__id__exact={tenant.pk}" if everyone else ""),
            "tenant_url": reverse("admin:tenants_tenant_change", args=[tenant.pk])
            if request.user.has_perm("tenants.view_tenant") else "",
        }
        return TemplateResponse(request, "admin/workflows/tenant_console.html", context)

    def _tenant_or_404(self, request: HttpRequest, tenant_id: uuid.UUID) -> Tenant:
        if request.user.is_superuser:
            tenant = Tenant.objects.filter(pk=tenant_id).first()
        else:
            own = admin_tenant(request)
            tenant = own if own is not None and own.pk == tenant_id else None
        if tenant is None:
            raise Http404("No such tenant.")
        return tenant


@admin.register(StepRun)
class StepRunAdmin(BigTableListMixin, EngineRowsMixin, TenantScopedAdmin):
    """Every attempt, run by run, the newest run first, as indexes serve them (the runs' by creation,
    then each run's ``steprun_unique_attempt``): ordered by when each attempt was created, which no
    index serves, each page sorted the whole table, the largest of all (5.5 s a page on 800,000
    attempts). A run's attempts in time order are its page's timeline."""

    ordering = ["run", "node_id", "attempt"]
    list_display = ["run", "node_id", "attempt", "status", "started_at", "finished_at"]
    list_filter = ["status", choices_filter("node_type", "node type", lambda request: NODE_TYPES)]


@admin.register(RunEvent)
class RunEventAdmin(BigTableListMixin, EngineRowsMixin, TenantScopedAdmin):
    list_display = ["run", "seq", "type", "node_id", "created_at"]
    list_filter = [choices_filter("type", "type", lambda request: RUN_EVENT_TYPES)]


class TaskCatalogEntryForm(forms.ModelForm[TaskCatalogEntry]):
    """The API's checks: a callable task name, a team queue, a valid JSON Schema, known plans."""

    class Meta:
        model = TaskCatalogEntry
        fields = ["name", "description", "queue", "arguments", "input_schema", "timeout_s", "plans", "tenants",
                  "enabled"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        # An empty box is what the help texts call empty ("empty: every plan"); Django's JSON field reads it
        # as null, which these columns refuse.
        for name, empty in (("plans", list), ("tenants", list), ("input_schema", dict)):
            if name in data and data[name] is None:
                data[name] = empty()
        checks = {
            "name": catalog.name_problem(data.get("name")),
            "queue": queue_name_error(data["queue"]) if data.get("queue") else None,
            "input_schema": schemas.schema_problem(data.get("input_schema") or {}),
        }
        plans = data.get("plans") or []
        known = set(Plan.objects.values_list("slug", flat=True))
        if not isinstance(plans, list) or not all(isinstance(slug, str) and slug in known for slug in plans):
            checks["plans"] = "must be a list of plan slugs"
        tenants = data.get("tenants") or []
        if not isinstance(tenants, list) or not all(isinstance(slug, str) for slug in tenants):
            checks["tenants"] = "must be a list of tenant slugs"
        for name, problem in checks.items():
            if problem:
                self.add_error(name, problem)
        return data


@admin.register(TaskCatalogEntry)
class TaskCatalogEntryAdmin(SuperuserOnlyMixin, StorableJSONMixin, ChangelistLimitsMixin,
                            admin.ModelAdmin[TaskCatalogEntry]):
    """The team's Celery tasks tenants may call as task nodes (platform data: superusers only)."""

    form = TaskCatalogEntryForm
    list_display = ["name", "queue", "arguments", "timeout_s", "enabled", "updated_at"]
    list_filter = ["enabled", "arguments"]
    search_fields = ["name", "description", "queue"]


@admin.register(Schedule)
class ScheduleAdmin(ServiceDeleteMixin, ReadOnlyMixin, TenantScopedAdmin):
    """A tenant's schedules, read only: they change through the API, which keeps their next fire times
    computed. Deleting one here stops it (``schedule_delete``, after a firing under way; the runs it
    started are kept)."""

    list_display = ["name", "workflow", "timing", "overlap", "paused", "next_fire_at", "last_fire_at", "fired_count",
                    "missed_count"]
    list_filter = ["paused", "overlap"]
    search_fields = ["name", "workflow"]
    readonly_fields = ["name", "workflow", "version", "input_pretty", "cron", "interval_s", "timezone", "overlap",
                       "catchup_window_s", "jitter_s", "paused", "next_fire_at", "buffered_fire_at", "last_fire_at",
                       "last_run_link", "fired_count", "skipped_count", "missed_count", "failed_count",
                       "last_missed_at", "last_error", "created_at", "updated_at"]
    exclude = ["input", "last_run_id", "wake_at"]

    def delete_one(self, obj: Schedule) -> None:
        schedules.schedule_delete(schedule=obj)

    @admin.display(description="timing")
    def timing(self, obj: Schedule) -> str:
        return f"cron {obj.cron} ({obj.timezone})" if obj.cron else f"every {obj.interval_s} s"

    @admin.display(description="input")
    def input_pretty(self, obj: Schedule) -> SafeString:
        return _pretty(obj.input)

    @admin.display(description="last run")
    def last_run_link(self, obj: Schedule) -> SafeString:
        if obj.last_run_id is None:
            return mark_safe("—")
        return format_html('<a href="{}">{}</a>', _run_url(obj.last_run_id), obj.last_run_id)


@admin.register(Event)
class EventAdmin(BigTableListMixin, ReadOnlyMixin, TenantScopedAdmin):
    """A tenant's events, read only, with the runs each started. Found by their name, key or idempotency
    key in the search box (a filter offering every name would read every event's on each page)."""

    list_display = ["name", "key", "created_at", "run_count"]
    search_fields = ["name", "key", "idempotency_key"]
    readonly_fields = ["name", "key", "payload_pretty", "idempotency_key", "run_links", "created_at"]
    exclude = ["payload", "runs"]

    @admin.display(description="runs")
    def run_count(self, obj: Event) -> int:
        return len(obj.runs or [])

    @admin.display(description="payload")
    def payload_pretty(self, obj: Event) -> SafeString:
        return _pretty(obj.payload)

    @admin.display(description="runs started")
    def run_links(self, obj: Event) -> SafeString:
        if not obj.runs:
            return mark_safe("—")
        return format_html_join(mark_safe("<br>"), '<a href="{}">{}</a>', ((_run_url(run), run) for run in obj.runs))


@admin.register(EventWait)
class EventWaitAdmin(BigTableListMixin, EngineRowsMixin, TenantScopedAdmin):
    """The open waits of ``wait_for_event`` nodes (the index events and signals find them by), read only:
    one per waiting step, as many as the runs that wait. Found by their event or key in the search box
    (a filter offering every event name read every wait's on each page)."""

    list_display = ["event", "key", "run_link", "expires_at", "armed_at", "matched_at"]
    list_select_related: ClassVar[list[str]] = []  # its columns read the wait's own fields: join no run, step, version
    search_fields = ["event", "key"]
    readonly_fields = ["run_link", "event", "key", "lookback_s", "expires_at", "armed_at", "matched_at", "matched_by",
                       "created_at"]
    exclude = ["run", "step", "payload"]

    @admin.display(description="run")
    def run_link(self, obj: EventWait) -> SafeString:
        return format_html('<a href="{}">{}</a>', _run_url(obj.run_id), obj.run_id)


@admin.register(RunSignal)
class RunSignalAdmin(BigTableListMixin, EngineRowsMixin, TenantScopedAdmin):
    """Signals sent to runs, read only: the wait each resumed, or none while it is kept. They stay as
    long as their runs, so there are as many as the runs they were sent to. Found by their name in the
    search box (a filter offering every name read every signal's on each page)."""

    list_display = ["name", "run_link", "delivered_to", "created_at"]
    search_fields = ["name", "idempotency_key"]
    readonly_fields = ["run_link", "name", "payload_pretty", "idempotency_key", "delivered_to", "created_at"]
    exclude = ["run", "payload"]

    @admin.display(description="run")
    def run_link(self, obj: RunSignal) -> SafeString:
        return format_html('<a href="{}">{}</a>', _run_url(obj.run_id), obj.run_id)

    @admin.display(description="payload")
    def payload_pretty(self, obj: RunSignal) -> SafeString:
        return _pretty(obj.payload)


@admin.register(EventTrigger)
class EventTriggerAdmin(ReadOnlyMixin, TenantScopedAdmin):
    """A tenant's event triggers, read only: they change through the API, which checks their filters."""

    list_display = ["event", "workflow", "enabled", "created_at"]
    list_filter = ["enabled"]
    search_fields = ["event"]
    readonly_fields = ["event", "workflow", "filter", "enabled", "created_at", "updated_at"]


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ServiceDeleteMixin, ReadOnlyMixin, TenantScopedAdmin):
    """A tenant's webhook endpoints, read only: they change through the API, which checks their URLs.
    Their secrets are never shown. Deleting one here deletes it as the API does (``webhook_delete``:
    it is gone at once, every process forgets it and sends it nothing more, and the coordinator's
    purge removes its delivery log a batch at a time). A deleted one is not listed."""

    list_display = ["url", "enabled", "consecutive_failures", "disabled_reason", "created_at"]
    list_filter = ["enabled"]
    search_fields = ["url", "description"]
    readonly_fields = ["url", "description", "events", "workflows", "enabled", "disabled_reason", "disabled_at",
                       "consecutive_failures", "previous_secret_expires_at", "created_at", "updated_at"]
    exclude = ["secret", "previous_secret"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).filter(deleted_at__isnull=True)

    def delete_one(self, obj: WebhookEndpoint) -> None:
        webhooks.webhook_delete(obj)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        """The endpoints, and their deliveries counted: the delivery log goes with them (the purge
        after ``webhook_delete`` removes it), and is never deleted here on its own, so no permission
        to delete deliveries is asked for. Django's walk read every delivery, whole, to list each
        one (a busy endpoint's log is millions), and refused the deletion for want of that
        permission."""
        objs = list(objs)
        deleted = [f"{capfirst(WebhookEndpoint._meta.verbose_name)}: {obj}" for obj in objs]
        counts = {WebhookEndpoint._meta.verbose_name_plural: len(objs)}
        deliveries = WebhookDelivery.all_tenants.filter(endpoint__in=[obj.pk for obj in objs]).count()
        if deliveries:
            counts[WebhookDelivery._meta.verbose_name_plural] = deliveries
        lacking = {WebhookEndpoint._meta.verbose_name for obj in objs if not self.has_delete_permission(request, obj)}
        return deleted, counts, lacking, []


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(BigTableListMixin, EngineRowsMixin, TenantScopedAdmin):
    """The webhooks' delivery log, read only: each delivery's body and attempts."""

    list_display = ["type", "endpoint", "status", "attempt_count", "created_at", "finished_at"]
    list_filter = ["status", choices_filter("type", "type", lambda request: webhooks.EVENT_TYPES)]
    list_select_related = ["endpoint"]
    readonly_fields = ["endpoint", "run_link", "type", "status", "attempts_pretty", "next_attempt_at", "body_pretty",
                       "created_at", "finished_at"]
    exclude = ["run", "attempts", "body"]

    @admin.display(description="attempts")
    def attempt_count(self, obj: WebhookDelivery) -> int:
        return sum(1 for entry in obj.attempts or [] if "status_code" in entry)

    @admin.display(description="run")
    def run_link(self, obj: WebhookDelivery) -> SafeString:
        if obj.run_id is None:
            return mark_safe("—")
        return format_html('<a href="{}">{}</a>', _run_url(obj.run_id), obj.run_id)

    @admin.display(description="attempts")
    def attempts_pretty(self, obj: WebhookDelivery) -> SafeString:
        return _pretty(obj.attempts)

    @admin.display(description="body")
    def body_pretty(self, obj: WebhookDelivery) -> SafeString:
        return _pretty(obj.body)
