"""Workflow, run, schedule, event and trigger endpoints. Views parse, call one service or selector, and serialize."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from ductor_project.pagination import CursorPagination
from scheduling.serializers import parse
from tenants.api import TenantViewSet, no_body
from workflows import selectors, services
from workflows.models import Event, EventTrigger, Schedule, StepRun, WorkflowDefinition, WorkflowRun
from workflows.serializers import (
    EventBulkResultSerializer,
    EventBulkSendSerializer,
    EventSendSerializer,
    EventSerializer,
    LineageNodeField,
    RunBulkResultSerializer,
    RunBulkStartSerializer,
    RunCancelManyResultSerializer,
    RunCancelManySerializer,
    RunDetailSerializer,
    RunEventSerializer,
    RunEventsQuerySerializer,
    RunFilterSerializer,
    RunRerunSerializer,
    RunRetryManyResultSerializer,
    RunRetryManySerializer,
    RunSerializer,
    RunStartSerializer,
    RunWhySerializer,
    ScheduleBackfillResultSerializer,
    ScheduleBackfillSerializer,
    ScheduleDetailSerializer,
    ScheduleSerializer,
    ScheduleWriteSerializer,
    SignalSendSerializer,
    SignalSerializer,
    StepRunSerializer,
    TriggerSerializer,
    TriggerWriteSerializer,
    WorkflowCreateSerializer,
    WorkflowDescribeSerializer,
    WorkflowFilterSerializer,
    WorkflowSerializer,
    WorkflowUpdateSerializer,
    WorkflowVersionSerializer,
)
from workflows.triggers import backfill
from workflows.triggers import events as event_services
from workflows.triggers import selectors as schedule_selectors
from workflows.triggers import services as schedule_services
from workflows.why import why_waiting


class ByNamePagination(CursorPagination):
    ordering = ("name", "id")


class ByCreationPagination(CursorPagination):
    ordering = ("created_at", "id")


class StepPagination(CursorPagination):
    """A run's steps, oldest first, forward only (``next`` links): each page holds at most
    ``page_size`` steps and ``DUCTOR_STEPS_MAX_BYTES`` of them, but always one."""

    ordering = ("created_at", "id")
    max_page_size = 100

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> list[Any]:
        page: list[StepRun] = super().paginate_queryset(selectors.sized(queryset), request, view) or []
        fit = selectors.within_bytes(page, settings.DUCTOR_STEPS_MAX_BYTES, at_least_one=True)
        if fit < len(page):
            self.has_next, self.next_position = True, self._get_position_from_instance(page[fit], self.ordering)
        self.page = selectors.loaded(page[:fit])
        return self.page

    def decode_cursor(self, request: Request) -> Any:
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.reverse:
            raise ValidationError({"cursor": ["This list pages forward only: use the next link."]})
        return cursor

    def get_previous_link(self) -> None:
        return None


class WorkflowViewSet(TenantViewSet):
    """Workflow definitions. Every update adds an immutable version; archiving one retires it."""

    serializer_class = WorkflowSerializer
    queryset = WorkflowDefinition.all_tenants.none()
    pagination_class = ByNamePagination
    lookup_field = "name"

    @extend_schema(parameters=[WorkflowFilterSerializer])
    def list(self, request: Request) -> Response:
        """The active workflows by name (``?archived=true``: the archived ones)."""
        archived = parse(WorkflowFilterSerializer, request.query_params.dict())["archived"]
        page = self.paginate_queryset(selectors.workflow_list(archived=archived))
        return self.get_paginated_response(WorkflowSerializer(page, many=True).data)

    @extend_schema(request=WorkflowCreateSerializer, responses={201: WorkflowSerializer, 200: WorkflowSerializer})
    def create(self, request: Request) -> Response:
        params = WorkflowCreateSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        version, created = services.workflow_put(**params.validated_data)
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(WorkflowSerializer(version.definition).data, status=code)

    def retrieve(self, request: Request, name: str) -> Response:
        return Response(WorkflowSerializer(selectors.get_workflow_for_tenant(name)).data)

    @extend_schema(summary="Replace a workflow's spec (a new version)",
                   request=WorkflowUpdateSerializer, responses={200: WorkflowSerializer})
    def update(self, request: Request, name: str) -> Response:
        definition = selectors.get_workflow_for_tenant(name)
        params = WorkflowUpdateSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        services.workflow_put(name=definition.name, **params.validated_data)
        return Response(WorkflowSerializer(selectors.get_workflow_for_tenant(name)).data)

    @extend_schema(summary="Change a workflow's description",
                   request=WorkflowDescribeSerializer, responses={200: WorkflowSerializer})
    def partial_update(self, request: Request, name: str) -> Response:
        """Change its description alone, archived or not; no new version (a ``PUT`` of a spec adds one).
        Left out, it keeps its value: ``{}`` changes nothing."""
        definition = selectors.get_workflow_for_tenant(name)  # another tenant's is not found, whatever the body
        params = WorkflowDescribeSerializer(data=request.data, partial=True)
        params.is_valid(raise_exception=True)
        if "description" in params.validated_data:
            services.workflow_describe(name=definition.name, **params.validated_data)
        return Response(WorkflowSerializer(selectors.get_workflow_for_tenant(name)).data)

    def destroy(self, request: Request, name: str) -> Response:
        """Delete a workflow that has no run in its history, with its versions, event triggers and
        schedules; its name is free again. ``409`` naming ``runs`` while it has runs: archive it instead."""
        services.workflow_delete(name=name)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(summary="Archive a workflow", request=None, responses={200: WorkflowSerializer})
    @action(detail=True, methods=["post"])
    def archive(self, request: Request, name: str) -> Response:
        """Archive it: it starts no new run (``409`` to a start, a failed step to a parent's sub-workflow,
        a refused fire to a schedule; its event triggers are skipped) and takes no new version, and it no
        longer counts toward the plan's ``max_workflows``. Its runs in flight go on. Idempotent."""
        no_body(request, found=selectors.get_workflow_for_tenant(name))
        return Response(WorkflowSerializer(services.workflow_archive(name=name)).data)

    @extend_schema(summary="Unarchive a workflow", request=None, responses={200: WorkflowSerializer})
    @action(detail=True, methods=["post"])
    def unarchive(self, request: Request, name: str) -> Response:
        """Make an archived workflow active again (``403 plan_limit_reached`` when the plan's
        ``max_workflows`` has no room for it). Idempotent."""
        no_body(request, found=selectors.get_workflow_for_tenant(name))
        return Response(WorkflowSerializer(services.workflow_unarchive(name=name)).data)

    @extend_schema(summary="List a workflow's versions", responses={200: WorkflowVersionSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None)  # a plain array, not a page
    def versions(self, request: Request, name: str) -> Response:
        rows = selectors.version_list(selectors.get_workflow_for_tenant(name))
        return Response(WorkflowVersionSerializer(rows, many=True).data)


class RunViewSet(TenantViewSet):
    """Runs: start (idempotent with a key), list with filters, detail, cancel, rerun, retry, steps, events, lineage,
    why."""

    serializer_class = RunSerializer
    queryset = WorkflowRun.all_tenants.none()

    @extend_schema(parameters=[RunFilterSerializer])  # each filter with its type, as it is validated
    def list(self, request: Request) -> Response:
        filters = RunFilterSerializer(data=request.query_params)  # the QueryDict: ``tag`` may repeat
        filters.is_valid(raise_exception=True)
        page = selectors.with_successors(selectors.with_version_numbers(
            self.paginate_queryset(selectors.run_list(filters.validated_data)) or []))
        return self.get_paginated_response(RunSerializer(page, many=True).data)

    @extend_schema(summary="Start a run",
                   request=RunStartSerializer, responses={201: RunSerializer, 200: RunSerializer})
    def create(self, request: Request) -> Response:
        params = RunStartSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        run, created = services.run_start(**params.validated_data)
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(summary="Start runs in bulk",
                   request=RunBulkStartSerializer, responses={201: RunBulkResultSerializer,
                                                              200: RunBulkResultSerializer})
    @action(detail=False, methods=["post"])
    def bulk(self, request: Request) -> Response:
        """Start up to 500 runs in one call, all or none (idempotent per item with its key)."""
        params = RunBulkStartSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        results = services.run_start_many(runs=params.validated_data["runs"], same_keys=True)
        created = sum(1 for _, new in results if new)
        body = {"created": created,
                "runs": [{"id": str(run.id), "idempotency_key": run.idempotency_key, "status": run.status,
                          "created": new} for run, new in results]}
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(responses=RunDetailSerializer)
    def retrieve(self, request: Request, pk: str) -> Response:
        """A run and its first steps, within a bound (``steps_truncated``; ``steps_url`` has them all)."""
        run = selectors.get_run_for_tenant(pk)
        preview = selectors.steps_preview(run, settings.DUCTOR_RUN_DETAIL_MAX_STEPS, settings.DUCTOR_STEPS_MAX_BYTES)
        return Response(RunDetailSerializer(run, context={"preview": preview, "request": request}).data)

    @extend_schema(summary="List a run's step attempts", responses=StepRunSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=StepPagination)
    def steps(self, request: Request, pk: str) -> Response:
        """Every step attempt of the run, oldest first, a bounded page at a time."""
        page = self.paginate_queryset(selectors.run_steps(selectors.get_run_for_tenant(pk)))
        return self.get_paginated_response(StepRunSerializer(page, many=True).data)

    @extend_schema(summary="Cancel a run", request=None, responses=RunSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        """Ask the run (and the children it waits on) to stop; idempotent. For a run that continued as
        new, the last run of its chain is asked, and answered."""
        run = no_body(request, found=selectors.get_run_for_tenant(pk))
        run = services.run_cancel(run=run)
        return Response(RunSerializer(run).data)

    @extend_schema(summary="Cancel the runs that match",
                   request=RunCancelManySerializer, responses=RunCancelManyResultSerializer,
                   operation_id="runs_cancel_many")
    @action(detail=False, methods=["post"], url_path="cancel", url_name="cancel-many")
    def cancel_many(self, request: Request) -> Response:
        """Ask the active runs that match (by ``ids`` and the run list's filters; at least one) to stop,
        up to ``limit`` (500) a call, oldest first: each as ``POST /runs/{id}/cancel`` does. ``more``:
        call again for the rest."""
        params = parse(RunCancelManySerializer, request.data)
        runs, more = services.run_cancel_many(filters=params, limit=params.pop("limit"))
        return Response({"cancelled": len(runs), "runs": [str(run.id) for run in runs], "more": more})

    @extend_schema(summary="Rerun a run",
                   request=RunRerunSerializer, responses={201: RunSerializer, 200: RunSerializer})
    @action(detail=True, methods=["post"])
    def rerun(self, request: Request, pk: str) -> Response:
        """Start a new run of this run's version, with its input (or ``input``), tier and tags. The new
        run's ``rerun_of`` names this one. Idempotent with an ``idempotency_key``; charged to the quota."""
        original = selectors.get_run_for_tenant(pk)  # another tenant's run is not found, whatever the body
        params = RunRerunSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        run, created = services.run_rerun(run=original, **params.validated_data)
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(summary="Retry a failed run", request=None, responses=RunSerializer)
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str) -> Response:
        """Resume a failed run: a new attempt of each node that failed (or that the failure cancelled),
        then the nodes that never ran; the nodes that succeeded keep their outputs and do not run again.
        ``409`` for a run that has not failed, and for a child run (retry its parent)."""
        run = no_body(request, found=selectors.get_run_for_tenant(pk))
        run = services.run_retry(run=run)
        return Response(RunSerializer(run).data)

    @extend_schema(summary="Retry the failed runs that match",
                   request=RunRetryManySerializer, responses=RunRetryManyResultSerializer,
                   operation_id="runs_retry_many")
    @action(detail=False, methods=["post"], url_path="retry", url_name="retry-many")
    def retry_many(self, request: Request) -> Response:
        """Retry the failed runs that match (by ``ids`` and the run list's filters; at least one), up to
        ``limit`` (100 by default, 500 at most) a call, oldest first: each as ``POST /runs/{id}/retry``
        does. A child run is not taken: retrying its root starts it again. ``more``: call again for
        the rest."""
        params = parse(RunRetryManySerializer, request.data)
        runs, more = services.run_retry_many(filters=params, limit=params.pop("limit"))
        return Response({"retried": len(runs), "runs": [str(run.id) for run in runs], "more": more})

    @extend_schema(summary="Send a signal to a run",
                   request=SignalSendSerializer, responses={201: SignalSerializer, 200: SignalSerializer})
    @action(detail=True, methods=["post"])
    def signal(self, request: Request, pk: str) -> Response:
        """Send a named payload to the run: it resumes the run's ``wait_for_event`` node waiting for that
        name (whatever its key), or, while none waits, is kept for the first that will. ``201`` with the
        signal and where it went; ``200`` with the signal an ``idempotency_key`` already sent; ``409`` for a
        run that has ended."""
        run = selectors.get_run_for_tenant(pk)  # another tenant's run is not found, whatever the body
        signal, created = services.run_signal(run.pk, **parse(SignalSendSerializer, request.data))
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(SignalSerializer(signal).data, status=code)

    @extend_schema(summary="List a run's history", parameters=[RunEventsQuerySerializer],
                   responses=RunEventSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)  # a plain array, not a page
    def events(self, request: Request, pk: str) -> Response:
        """The run's events in order, its first 1,000 at most (``limit``): a longer history is read on
        with ``after``, the last event's ``seq``, until an answer has fewer than ``limit``."""
        run = selectors.get_run_for_tenant(pk)
        query = parse(RunEventsQuerySerializer, request.query_params.dict())
        events = selectors.run_events(run).filter(seq__gt=query["after"])[:query["limit"]]
        return Response(RunEventSerializer(events, many=True).data)

    @extend_schema(summary="Explain why a run waits", responses=RunWhySerializer)
    @action(detail=True, methods=["get"], pagination_class=None)
    def why(self, request: Request, pk: str) -> Response:
        """Why is it waiting? For each waiting step of the run (and its tick, node ``""``), what holds it
        now: not due until T, behind N items of its partition, the tenant's concurrency k of k, a rate
        until T, its pool or connections full, their breakers open until T, the tenant suspended, or the
        monthly run quota used up; ``in_line`` when it is due and admissible and waits for its turn.
        Read only: nothing is taken or charged."""
        run = selectors.get_run_for_tenant(pk)
        return Response(RunWhySerializer({"run_id": run.id, "status": run.status, "waiting": why_waiting(run)}).data)

    @extend_schema(summary="Get a run's lineage",
                   responses=inline_serializer("Lineage", {"root_run_id": serializers.UUIDField(),
                                                           "runs": serializers.IntegerField(),
                                                           "truncated": serializers.BooleanField(),
                                                           "tree": serializers.ListField(child=LineageNodeField())}))
    @action(detail=True, methods=["get"])
    def lineage(self, request: Request, pk: str) -> Response:
        """The tree of the run's root, from any run of it: sub-workflow runs under ``children``, the
        run a run continued as under ``successor``. Its first 1,000 runs, 64 levels deep at most:
        ``truncated`` says some are left out, ``runs`` counts them all (the run list's ``root_run_id``
        filter lists every one)."""
        return Response(selectors.lineage(selectors.get_run_for_tenant(pk)))


class ScheduleViewSet(TenantViewSet):
    """Schedules: a workflow's runs started at the fire times of a cron expression (in a time zone) or of an
    interval, with an overlap policy, a catch-up window and jitter; pause and resume."""

    serializer_class = ScheduleSerializer
    queryset = Schedule.all_tenants.none()  # schema introspection only; reads go through selectors
    pagination_class = ByNamePagination

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(schedule_selectors.schedule_list())
        return self.get_paginated_response(ScheduleSerializer(page, many=True).data)

    @extend_schema(request=ScheduleWriteSerializer, responses={201: ScheduleDetailSerializer})
    def create(self, request: Request) -> Response:
        schedule = schedule_services.schedule_create(**parse(ScheduleWriteSerializer, request.data))
        return Response(ScheduleDetailSerializer(schedule).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=ScheduleDetailSerializer)
    def retrieve(self, request: Request, pk: str) -> Response:
        """A schedule with its next fire times (``next_fires``)."""
        return Response(ScheduleDetailSerializer(schedule_selectors.get_schedule_for_tenant(pk)).data)

    @extend_schema(request=ScheduleWriteSerializer, responses={200: ScheduleDetailSerializer})
    def update(self, request: Request, pk: str, partial: bool = False) -> Response:
        """Change it; a new timing (``cron``, ``interval_s``, ``timezone``) fires from now on."""
        schedule = schedule_selectors.get_schedule_for_tenant(pk)  # another tenant's is not found, whatever the body
        changes = parse(ScheduleWriteSerializer, request.data, partial=partial)
        schedule = schedule_services.schedule_update(schedule=schedule, changes=changes)
        return Response(ScheduleDetailSerializer(schedule).data)

    @extend_schema(request=ScheduleWriteSerializer, responses={200: ScheduleDetailSerializer})
    def partial_update(self, request: Request, pk: str) -> Response:
        return self.update(request, pk, partial=True)

    def destroy(self, request: Request, pk: str) -> Response:
        schedule_services.schedule_delete(schedule=schedule_selectors.get_schedule_for_tenant(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(summary="Pause a schedule", request=None, responses=ScheduleDetailSerializer)
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str) -> Response:
        """Pause: nothing fires until it resumes (a buffered fire is dropped). Idempotent."""
        schedule = no_body(request, found=schedule_selectors.get_schedule_for_tenant(pk))
        schedule = schedule_services.schedule_pause(schedule=schedule)
        return Response(ScheduleDetailSerializer(schedule).data)

    @extend_schema(summary="Resume a schedule", request=None, responses=ScheduleDetailSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str) -> Response:
        """Resume: it fires again from the first fire time after now (the pause is not caught up). Idempotent."""
        schedule = no_body(request, found=schedule_selectors.get_schedule_for_tenant(pk))
        schedule = schedule_services.schedule_resume(schedule=schedule)
        return Response(ScheduleDetailSerializer(schedule).data)

    @extend_schema(summary="Start a schedule's past fires", request=ScheduleBackfillSerializer,
                   responses=ScheduleBackfillResultSerializer)
    @action(detail=True, methods=["post"])
    def backfill(self, request: Request, pk: str) -> Response:
        """Start the run of each fire time from ``start`` to ``end`` (both included, none in the future, at
        most 1,000), each under its fire's key: a fire that has its run (it fired, or a backfill started
        it) starts nothing more, so a backfill may be sent again. Every fire of the span, whatever the
        overlap policy, the catch-up window or a pause; a start refused (the run quota) is listed, and
        the others go on. The schedule's own fires and counters do not change."""
        schedule = schedule_selectors.get_schedule_for_tenant(pk)  # another tenant's is not found, whatever the body
        span = parse(ScheduleBackfillSerializer, request.data)
        fires = backfill.schedule_backfill(schedule=schedule, start=span["start"], end=span["end"])
        items = [{"fire_at": fire, "run_id": outcome.run.pk if outcome.run else None, "created": outcome.created,
                  "error": outcome.error} for fire, outcome in fires]
        return Response(ScheduleBackfillResultSerializer({
            "fires": items, "started": sum(item["created"] for item in items),
            "existing": sum(item["run_id"] is not None and not item["created"] for item in items),
            "refused": sum(item["error"] is not None for item in items)}).data)

    @extend_schema(summary="Start a schedule's run now", request=None,
                   responses={201: RunSerializer, 200: RunSerializer})
    @action(detail=True, methods=["post"])
    def trigger(self, request: Request, pk: str) -> Response:
        """Start a run now, as a fire of this second would (under its key: a second trigger in the same
        second answers ``200`` with the same run), whatever the overlap policy or a pause. Refused as
        ``POST /runs`` is (the run quota: ``429``). The schedule's own fires and counters do not change."""
        schedule = no_body(request, found=schedule_selectors.get_schedule_for_tenant(pk))
        run, created = backfill.schedule_trigger(schedule=schedule)
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class EventViewSet(TenantViewSet):
    """Events: record what happened (one, or up to 100 at once); each starts a run of every workflow whose
    trigger it matches, in the same transaction. Read them back, newest first."""

    serializer_class = EventSerializer
    queryset = Event.all_tenants.none()  # schema introspection only

    @extend_schema(parameters=[OpenApiParameter("name", {"type": "string", "minLength": 1},
                                                description="Only the events of this name (not blank).")])
    def list(self, request: Request) -> Response:
        events = Event.objects.all()
        name = request.query_params.get("name")
        if name == "":  # a filter given empty is not no filter
            raise ValidationError({"name": ["This field may not be blank."]})
        if name is not None:
            events = events.filter(name=name)
        page = self.paginate_queryset(events)
        return self.get_paginated_response(EventSerializer(page, many=True).data)

    @extend_schema(summary="Record an event",
                   request=EventSendSerializer, responses={201: EventSerializer, 200: EventSerializer})
    def create(self, request: Request) -> Response:
        """Record an event and start the runs it triggers: ``201`` with it and its ``runs``; ``200`` with
        the event an ``idempotency_key`` already recorded, starting nothing."""
        [(event, created)] = event_services.events_send([parse(EventSendSerializer, request.data)], bulk=False)
        return Response(EventSerializer(event).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(summary="Record events in bulk",
                   request=EventBulkSendSerializer, responses={201: EventBulkResultSerializer,
                                                               200: EventBulkResultSerializer})
    @action(detail=False, methods=["post"])
    def bulk(self, request: Request) -> Response:
        """Record 1 to 100 events at once, all or none, and start the runs they trigger."""
        results = event_services.events_send(parse(EventBulkSendSerializer, request.data)["events"])
        created = sum(1 for _, new in results if new)
        body = {"created": created, "events": EventSerializer([event for event, _ in results], many=True).data}
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(responses=EventSerializer)
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(EventSerializer(event_services.event_of(pk)).data)


class TriggerViewSet(TenantViewSet):
    """Event triggers: a workflow subscribed to an event name, with an optional filter on the event."""

    serializer_class = TriggerSerializer
    queryset = EventTrigger.all_tenants.none()  # schema introspection only
    pagination_class = ByCreationPagination

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(EventTrigger.objects.select_related("workflow"))
        return self.get_paginated_response(TriggerSerializer(page, many=True).data)

    @extend_schema(request=TriggerWriteSerializer, responses={201: TriggerSerializer})
    def create(self, request: Request) -> Response:
        trigger = event_services.trigger_create(**parse(TriggerWriteSerializer, request.data))
        return Response(TriggerSerializer(trigger).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=TriggerSerializer)
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(TriggerSerializer(event_services.trigger_of(pk)).data)

    @extend_schema(request=TriggerWriteSerializer, responses=TriggerSerializer)
    def update(self, request: Request, pk: str, partial: bool = False) -> Response:
        trigger = event_services.trigger_of(pk)  # another tenant's is not found, whatever the body
        changes = parse(TriggerWriteSerializer, request.data, partial=partial)
        return Response(TriggerSerializer(event_services.trigger_update(trigger, changes)).data)

    @extend_schema(request=TriggerWriteSerializer, responses=TriggerSerializer)
    def partial_update(self, request: Request, pk: str) -> Response:
        return self.update(request, pk, partial=True)

    def destroy(self, request: Request, pk: str) -> Response:
        event_services.trigger_of(pk).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)
