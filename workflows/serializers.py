from __future__ import annotations

import math
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.reverse import reverse

from ductor_project.core.bounds import MAX_SOURCE_TAG_CHARS, MAX_TAG_CHARS, MAX_TAGS
from ductor_project.core.errors import ERROR_CODE_COMPONENT, StepErrorCode
from ductor_project.core.openapi import ComponentJSONField, component_ref
from scheduling.models import MAX_FAIRNESS_KEY
from scheduling.serializers import (
    PATH_SEGMENT,
    TRACE_CONNECTION,
    TRACE_POOL,
    TRACE_RULE,
    condition_tree,
    trace_components,
)
from scheduling.templates import MAX_PATH_SEGMENTS
from tenants.api import (
    AnyJSONField,
    CanonicalUUIDField,
    DateTimeField,
    PatternField,
    StrictModelSerializer,
    StrictSerializer,
    TextField,
)
from tenants.models import Tier
from workflows import selectors
from workflows.models import (
    Event,
    EventTrigger,
    RunEvent,
    RunSignal,
    Schedule,
    StepRun,
    WorkflowDefinition,
    WorkflowRun,
    WorkflowVersion,
)
from workflows.spec import EVENT_NAME, NODE_TYPES
from workflows.spec_schema import SpecField
from workflows.triggers.selectors import next_fires
from workflows.triggers.timing import MAX_CATCHUP_WINDOW_S, MAX_CRON_CHARS, MAX_INTERVAL_S, MAX_JITTER_S
from workflows.why import STATUSES, Cause

STEP_ERROR, RUN_ERROR, STEP_ERROR_CODE = "StepError", "RunError", "StepErrorCode"
STEP_ERROR_EXCEPTION = "StepErrorException"


def error_components() -> dict[str, dict[str, Any]]:
    """The schemas of a step attempt's stored ``error`` and of a run's (the step's that failed it)."""
    text, number = {"type": "string"}, {"type": "number", "nullable": True}
    return {
        STEP_ERROR_CODE: {"type": "string", "enum": [code.value for code in StepErrorCode],
                          "description": "Why a step attempt failed (docs/workflows.md, step error codes)."},
        STEP_ERROR: {
            "type": "object", "required": ["code", "message", "retryable"], "additionalProperties": True,
            "description": "Why a step attempt failed. An action's error adds `status`, `retry_after_s` and "
                           "`details`; the engine's may add `field`, `exception` or `child_error`.",
            "properties": {
                "code": component_ref(STEP_ERROR_CODE),
                "message": {**text, "description": "For people; a task's names its exception's type."},
                "retryable": {"type": "boolean", "description": "Whether the retry policy may try it again."},
                "field": {**text, "description": "The field it is about (`input`, `output`, `task`, `key`)."},
                "status": {"type": "integer", "nullable": True, "description": "An HTTP action's answer status."},
                "retry_after_s": {**number, "description": "The server's hint, when it gave one."},
                "details": {"type": "object", "additionalProperties": True},
                "exception": component_ref(STEP_ERROR_EXCEPTION),
                "child_error": {"allOf": [component_ref(RUN_ERROR)], "nullable": True,
                                "description": "The error of the child run (`child_failed`)."},
            },
        },
        STEP_ERROR_EXCEPTION: {"type": "object", "description": "A task's exception (`task_failed`).",
                               "properties": {"type": text, "module": text}},
        RUN_ERROR: {
            "type": "object", "required": ["node", "attempt", "error"], "additionalProperties": True,
            "description": "Why a run failed: the step attempt that failed it (`node` and `attempt` null "
                           "when the run itself was refused, such as an output over the plan).",
            "properties": {"node": {**text, "nullable": True}, "attempt": {"type": "integer", "nullable": True},
                           "error": component_ref(STEP_ERROR)},
        },
    }


class StepErrorField(ComponentJSONField):
    """A step attempt's ``error`` (null unless it failed)."""

    component = STEP_ERROR

    @classmethod
    def components(cls) -> dict[str, dict[str, Any]]:
        return error_components()


class RunErrorField(StepErrorField):
    """A run's ``error`` (null unless it failed)."""

    component = RUN_ERROR


STEP_ROUTING, STEP_ROUTING_CANDIDATE, STEP_ROUTING_TASK = "StepRouting", "StepRoutingCandidate", "StepRoutingTask"
# What workflows.engine records (record_event), as docs/workflows.md lists them.
RUN_EVENT_TYPES = (
    "created", "started", "step_queued", "step_skipped", "step_sleeping", "step_waiting", "signal_received",
    "child_started", "step_succeeded", "step_failed", "step_result_discarded", "step_retry_scheduled",
    "step_timed_out", "cancel_requested", "cancelled", "tick_failed", "continued", "retried", "succeeded", "failed",
)


def step_routing_components() -> dict[str, dict[str, Any]]:
    """``StepRouting``: the trace an attempt keeps, ``RoutingDecision.trace()``, with what its admission adds
    (``connection``, ``admitted``) and, for a task node, how it is published (``task``). Pure."""
    text = {"type": "string"}
    return {**trace_components(), STEP_ROUTING: {
        "type": "object", "additionalProperties": True,
        "description": "How the attempt was routed, and the connection its admission chose.",
        "required": ["allowed", "reason", "rule", "tier", "partition_key", "pool", "candidates", "connection"],
        "properties": {
            "allowed": {"type": "boolean", "description": "False: refused (`reason` says why)."},
            "reason": text,
            "rule": component_ref(TRACE_RULE),
            "tier": {"type": "string", "enum": list(Tier.values)},
            "partition_key": {"type": "string", "nullable": True},
            "fairness_key": {"type": "string", "nullable": True},
            "pool": {"allOf": [component_ref(TRACE_POOL)], "nullable": True},
            "candidates": {"type": "array", "description": "The pool's connections.",
                           "items": component_ref(STEP_ROUTING_CANDIDATE)},
            "connection": {"allOf": [component_ref(TRACE_CONNECTION)], "nullable": True,
                           "description": "Chosen at admission; null until then."},
            "admitted": {**text, "description": "Why admission chose it."},
            "queue": {**text, "description": "A task node's: the queue its message went to, its connection's, "
                                             "else its catalog entry's; set when it is published."},
            "worker": {**text, "description": "A task node's: the Celery worker (its node name) its task runs or "
                                              "ran on, as its heartbeats or its outcome named it "
                                              "(`ductor_sdk`'s hook)."},
            "task": component_ref(STEP_ROUTING_TASK),
        },
    }, STEP_ROUTING_CANDIDATE: {
        "type": "object", "required": ["connection_id", "name"], "additionalProperties": True,
        "description": "A connection of the step's pool.", "properties": {"connection_id": text, "name": text},
    }, STEP_ROUTING_TASK: {
        "type": "object", "description": "A task node's: how its attempt is published.", "additionalProperties": True,
        "properties": {"name": text, "arguments": text, "queue": text, "timeout_s": {"type": "number"}},
    }}


class StepRoutingField(ComponentJSONField):
    """A step attempt's ``routing`` (null for a node that is not routed)."""

    component = STEP_ROUTING

    @classmethod
    def components(cls) -> dict[str, dict[str, Any]]:
        return step_routing_components()


LINEAGE_NODE = "LineageNode"


class LineageNodeField(ComponentJSONField):
    """A run in a lineage tree (``selectors.lineage``), with its children and its successor."""

    component = LINEAGE_NODE

    @classmethod
    def components(cls) -> dict[str, dict[str, Any]]:
        uuid, node = {"type": "string", "format": "uuid"}, component_ref(LINEAGE_NODE)
        return {LINEAGE_NODE: {
            "type": "object",
            "required": ["id", "workflow_name", "status", "parent_run_id", "continued_from_id", "nesting_depth",
                         "created_at", "children", "successor"],
            "properties": {
                "id": uuid, "workflow_name": {"type": "string"},
                "status": {"type": "string", "enum": list(WorkflowRun.Status.values)},
                "parent_run_id": {**uuid, "nullable": True}, "continued_from_id": {**uuid, "nullable": True},
                "nesting_depth": {"type": "integer"}, "created_at": {"type": "string", "format": "date-time"},
                "children": {"type": "array", "items": node, "description": "The sub-workflow runs it started."},
                "successor": {"allOf": [node], "nullable": True, "description": "The run it continued as new as."},
            },
        }}


class WorkflowVersionSerializer(StrictModelSerializer):
    spec = SpecField(read_only=True)

    class Meta:
        model = WorkflowVersion
        fields = ["number", "spec", "created_at"]
        read_only_fields = fields


class WorkflowSerializer(StrictModelSerializer):
    spec = serializers.SerializerMethodField()
    archived_at = serializers.DateTimeField(read_only=True, allow_null=True,
                                            help_text="When it was archived; null while it is active.")

    class Meta:
        model = WorkflowDefinition
        fields = ["id", "name", "description", "latest_version", "spec", "archived_at", "created_at", "updated_at"]
        read_only_fields = fields

    @extend_schema_field(SpecField(allow_null=True, help_text="The latest version's spec."))
    def get_spec(self, obj: WorkflowDefinition) -> Any:
        if hasattr(obj, "latest_spec"):  # annotated by selectors.workflow_list: no query per row
            return obj.latest_spec
        latest = obj.versions.order_by("-number").first()
        return latest.spec if latest else None


IF_VERSION_HELP = ("The latest version you read (0: none, the workflow does not exist yet): the spec is taken "
                   "only if it is still the latest, else 409 conflict naming if_version. Without it, always taken.")


class WorkflowCreateSerializer(StrictSerializer):
    # Not "." or "..": a client removes such a segment from /api/v1/workflows/{name}, so no URL names it.
    name = PatternField(r"^(?!\.\.?$)[A-Za-z0-9_.\-]+$", max_length=100,
                        rule="Letters, digits, '_', '.' and '-', at most 100; not '.' or '..'.")
    description = TextField(max_length=500, required=False, allow_blank=True, default="")
    spec = SpecField()
    if_version = serializers.IntegerField(min_value=0, max_value=2**31 - 1, required=False, help_text=IF_VERSION_HELP)


class WorkflowUpdateSerializer(StrictSerializer):
    description = TextField(max_length=500, required=False, allow_blank=True, default="")
    spec = SpecField()
    if_version = serializers.IntegerField(min_value=0, max_value=2**31 - 1, required=False, help_text=IF_VERSION_HELP)


class WorkflowDescribeSerializer(StrictSerializer):
    description = TextField(max_length=500, allow_blank=True)


class WorkflowFilterSerializer(StrictSerializer):
    typed = False  # a query string's: every value is a string
    archived = serializers.BooleanField(
        required=False, default=False,
        help_text="true: the archived workflows only; false (the default): the active ones only.")
    cursor = serializers.CharField(required=False, help_text="The pagination cursor value.")
    page_size = serializers.IntegerField(required=False, min_value=1, max_value=500,
                                         help_text="Number of results to return per page.")


class RunStartSerializer(StrictSerializer):
    workflow = serializers.CharField(max_length=100)
    version = serializers.IntegerField(min_value=1, max_value=2**31 - 1, required=False, allow_null=True, default=None)
    input = AnyJSONField(required=False, default=dict, help_text="The run's input: any JSON; absent or null: {}.")
    idempotency_key = serializers.CharField(max_length=200, required=False, allow_null=True, default=None)
    tier = serializers.ChoiceField(choices=["interactive", "standard", "batch"], required=False, default=None,
                                   allow_null=True)
    tags = serializers.ListField(child=serializers.CharField(max_length=MAX_TAG_CHARS), required=False, default=list,
                                 max_length=MAX_TAGS)
    fairness_key = serializers.CharField(
        max_length=MAX_FAIRNESS_KEY, required=False, allow_blank=True, default="", trim_whitespace=False,
        help_text="Its fairness key inside your tenant (your own customer, say): your backlogged keys share your "
                  "dispatches by weight, so one key's flood does not hold up the others. Empty by default: no key.")


class RunRerunSerializer(StrictSerializer):
    input = serializers.JSONField(required=False, default=None, allow_null=True,
                                  help_text="The new run's input; by default the run's own.")
    idempotency_key = serializers.CharField(max_length=200, required=False, allow_null=True, default=None)


class RunBulkStartSerializer(StrictSerializer):
    runs = serializers.ListField(child=RunStartSerializer(), min_length=1, max_length=500,
                                 help_text="1 to 500 runs, each as POST /runs takes it.")


class RunBulkItemSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    idempotency_key = serializers.CharField(allow_null=True)
    status = serializers.ChoiceField(choices=WorkflowRun.Status.choices)
    created = serializers.BooleanField(help_text="False: the key was used before; this is that run.")


class RunBulkResultSerializer(serializers.Serializer):
    created = serializers.IntegerField(help_text="How many runs this call started.")
    runs = RunBulkItemSerializer(many=True, help_text="One per item, in the order given.")


class RunMatchSerializer(StrictSerializer):
    """What picks runs out of the tenant's: the run list's filters and the cancel of many's."""

    workflow = serializers.CharField(required=False, max_length=100, help_text="The runs of this workflow.")
    created_after = DateTimeField(required=False, help_text="Created at or after.")
    created_before = DateTimeField(required=False, help_text="Created before.")
    root_run_id = CanonicalUUIDField(required=False, help_text="The runs of this run tree.")
    tag = serializers.ListField(
        child=serializers.CharField(max_length=MAX_SOURCE_TAG_CHARS), required=False, max_length=10,
        help_text="The runs that have every one of these tags (in a query string, `?tag=a&tag=b`).")
    fairness_key = serializers.CharField(max_length=MAX_FAIRNESS_KEY, required=False, trim_whitespace=False,
                                         help_text="The runs of this fairness key of your tenant.")


class RunFilterSerializer(RunMatchSerializer):
    typed = False  # a query string's: every value is a string
    status = serializers.ChoiceField(choices=WorkflowRun.Status.choices, required=False)
    cursor = serializers.CharField(required=False, help_text="The pagination cursor value.")
    page_size = serializers.IntegerField(required=False, min_value=1, max_value=500,
                                         help_text="Number of results to return per page.")


class RunManySerializer(RunMatchSerializer):
    """The runs a call on many picks: by ``ids`` and the run list's filters, at least one of them
    (a call on every run is not taken), ``limit`` a call."""

    verb = ""  # what the call does to them, as its refusal says
    ids = serializers.ListField(child=CanonicalUUIDField(), required=False, max_length=500,
                                help_text="The runs, by id (the filters given apply too).")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not any(value for name, value in attrs.items() if name != "limit"):
            raise serializers.ValidationError({"ids": [
                "Give the runs' ids or at least one filter (workflow, tag, fairness_key, created_after, "
                f"created_before, root_run_id): a {self.verb} of every run is not taken."]})
        return attrs


class RunCancelManySerializer(RunManySerializer):
    verb = "cancel"
    limit = serializers.IntegerField(min_value=1, max_value=500, required=False, default=500,
                                     help_text="At most this many runs in this call (`more` tells of the rest).")


class RunCancelManyResultSerializer(serializers.Serializer):
    cancelled = serializers.IntegerField(help_text="How many runs this call asked to stop.")
    runs = serializers.ListField(child=serializers.UUIDField(), help_text="Their ids, oldest first.")
    more = serializers.BooleanField(help_text="True: more active runs match; call again for them.")


class RunRetryManySerializer(RunManySerializer):
    verb = "retry"
    limit = serializers.IntegerField(min_value=1, max_value=500, required=False, default=100,
                                     help_text="At most this many runs in this call (`more` tells of the rest).")


class RunRetryManyResultSerializer(serializers.Serializer):
    retried = serializers.IntegerField(help_text="How many failed runs this call retried.")
    runs = serializers.ListField(child=serializers.UUIDField(), help_text="Their ids, oldest first.")
    more = serializers.BooleanField(help_text="True: more failed runs match; call again for them.")


class StepRunSerializer(StrictModelSerializer):
    node_type = serializers.ChoiceField(choices=NODE_TYPES, read_only=True)
    error = StepErrorField(read_only=True, allow_null=True)
    routing = StepRoutingField(read_only=True, allow_null=True, help_text="The routing decision trace; null for a "
                               "node that is not routed (only action and task nodes are).")

    class Meta:
        model = StepRun
        fields = ["id", "node_id", "node_type", "attempt", "status", "input", "output", "error", "routing",
                  "child_run", "created_at", "scheduled_for", "started_at", "finished_at", "heartbeat_at",
                  "heartbeat_details"]
        read_only_fields = fields
        extra_kwargs = {
            "heartbeat_at": {"help_text": "When the task's last heartbeat came (task nodes; null: none came)."},
            "heartbeat_details": {"help_text": "The progress the task's last heartbeat reported, which the "
                                               "node's next attempt is given to resume from (null: none)."},
        }


class RunSerializer(StrictModelSerializer):
    version = serializers.IntegerField(source="workflow.number", read_only=True)
    tier = serializers.ChoiceField(choices=["interactive", "standard", "batch"], read_only=True)
    tags = serializers.ListField(child=serializers.CharField(), read_only=True)
    error = RunErrorField(read_only=True, allow_null=True)
    continued_as = serializers.SerializerMethodField(
        help_text="The run this one continued as new as (status `continued`), which carries its work on; "
                  "null for a run that did not.")

    class Meta:
        model = WorkflowRun
        fields = ["id", "workflow_name", "version", "status", "input", "output", "error", "idempotency_key",
                  "tier", "tags", "fairness_key", "parent_run", "parent_node_id", "root_run_id", "nesting_depth",
                  "continued_from", "continued_as", "rerun_of", "cancel_requested", "created_at", "started_at",
                  "finished_at"]
        read_only_fields = fields

    @extend_schema_field({"type": "string", "format": "uuid", "nullable": True})
    def get_continued_as(self, run: WorkflowRun) -> str | None:
        found = selectors.continued_as(run)
        return None if found is None else str(found)


class RunDetailSerializer(RunSerializer):
    """A run with its first steps: as many as fit the response's bound (``context["preview"]``,
    a ``selectors.StepsPreview``); ``steps_url`` lists them all."""

    steps = serializers.SerializerMethodField(help_text="The first steps, oldest first, as many as fit.")
    steps_total = serializers.SerializerMethodField(help_text="How many step attempts the run has.")
    steps_truncated = serializers.SerializerMethodField(help_text="True when `steps` does not hold them all.")
    steps_url = serializers.SerializerMethodField(help_text="Every step attempt, a page at a time.")

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "steps", "steps_total", "steps_truncated", "steps_url"]
        read_only_fields = fields

    @extend_schema_field(StepRunSerializer(many=True))
    def get_steps(self, run: WorkflowRun) -> Any:
        return StepRunSerializer(self.context["preview"].steps, many=True).data

    def get_steps_total(self, run: WorkflowRun) -> int:
        return int(self.context["preview"].total)

    def get_steps_truncated(self, run: WorkflowRun) -> bool:
        return bool(self.context["preview"].truncated)

    def get_steps_url(self, run: WorkflowRun) -> str:
        return str(reverse("run-steps", args=[run.pk], request=self.context.get("request")))


class RunEventSerializer(StrictModelSerializer):
    type = serializers.ChoiceField(choices=RUN_EVENT_TYPES, read_only=True)

    class Meta:
        model = RunEvent
        fields = ["seq", "type", "node_id", "data", "created_at"]
        read_only_fields = fields


# The most events one read of a run's history answers: a longer history is read on from the last
# one's ``seq`` (``?after=``).
MAX_HISTORY_EVENTS = 1000


class RunEventsQuerySerializer(StrictSerializer):
    typed = False  # a query string's: every value is a string
    after = serializers.IntegerField(
        required=False, default=0, min_value=0,
        help_text="Only the events after this one (its seq): read a long history on from the last event read.")
    limit = serializers.IntegerField(
        required=False, default=MAX_HISTORY_EVENTS, min_value=1, max_value=MAX_HISTORY_EVENTS,
        help_text=f"At most this many events (default and most: {MAX_HISTORY_EVENTS}); fewer means the history "
                  "ends there, for now.")


class WaitingSerializer(serializers.Serializer[Any]):
    """One waiting step (or the run's tick, node ``""``) and what holds it now."""

    node_id = serializers.CharField(read_only=True)
    attempt = serializers.IntegerField(read_only=True, help_text="0 for a node not started (or the tick).")
    step_id = serializers.CharField(read_only=True, help_text="The attempt's id; empty for the tick or a node "
                                                              "not started.")
    status = serializers.ChoiceField(choices=STATUSES, read_only=True, help_text="The step's status; `pending` for a "
                                     "node not started, `tick` for the run's tick.")
    cause = serializers.ChoiceField(choices=[(cause.value, cause.value) for cause in Cause], read_only=True)
    message = serializers.CharField(read_only=True)
    until = serializers.DateTimeField(read_only=True, allow_null=True,
                                      help_text="When the cause lifts, where that is known.")
    details = serializers.DictField(read_only=True)


class RunWhySerializer(serializers.Serializer[Any]):
    run_id = serializers.UUIDField(read_only=True)
    status = serializers.ChoiceField(choices=WorkflowRun.Status.choices, read_only=True)
    waiting = WaitingSerializer(many=True, read_only=True)


# --- schedules -------------------------------------------------------------------------------

SCHEDULE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,99}$"
EVENT_NAME_RULE = "Letters, digits and '_.:/-' (starting with a letter or digit), at most 200."
SCHEDULE_ERROR = "ScheduleError"


class ScheduleErrorField(ComponentJSONField):
    """A schedule's ``last_error``, as ``workflows.triggers.firing`` records a refused fire."""

    component = SCHEDULE_ERROR

    @classmethod
    def components(cls) -> dict[str, dict[str, Any]]:
        return {SCHEDULE_ERROR: {
            "type": "object", "required": ["fire_at", "code", "message"],
            "description": "Why a fire's run start was refused.",
            "properties": {"fire_at": {"type": "string", "format": "date-time", "description": "The fire (UTC)."},
                           "code": component_ref(ERROR_CODE_COMPONENT), "message": {"type": "string"}},
        }}


class ScheduleSerializer(StrictModelSerializer):
    last_run_id = serializers.UUIDField(read_only=True, allow_null=True, help_text="The last run it started.")
    last_error = ScheduleErrorField(read_only=True, allow_null=True,
                                    help_text="Why the last refused start was refused; null: none was.")

    class Meta:
        model = Schedule
        fields = ["id", "name", "workflow", "version", "input", "cron", "interval_s", "timezone", "overlap",
                  "catchup_window_s", "jitter_s", "paused", "next_fire_at", "buffered_fire_at", "last_fire_at",
                  "last_run_id", "fired_count", "skipped_count", "missed_count", "failed_count", "last_missed_at",
                  "last_error", "created_at", "updated_at"]
        read_only_fields = fields
        extra_kwargs = {
            "next_fire_at": {"help_text": "The next fire time (nominal, UTC); null while paused."},
            "buffered_fire_at": {"help_text": "The fire `buffer_one` keeps until the active run ends."},
        }


class ScheduleDetailSerializer(ScheduleSerializer):
    next_fires = serializers.SerializerMethodField(help_text="The next fire times (nominal, UTC), the next first; "
                                                             "none while paused.")

    class Meta(ScheduleSerializer.Meta):
        fields = [*ScheduleSerializer.Meta.fields, "next_fires"]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.DateTimeField()))
    def get_next_fires(self, schedule: Schedule) -> list[str]:
        field = serializers.DateTimeField()
        return [field.to_representation(fire) for fire in next_fires(schedule)]


class ScheduleWriteSerializer(StrictSerializer):
    name = PatternField(SCHEDULE_NAME, max_length=100, rule="Letters, digits and '_.:-' (starting with a letter or "
                        "digit), at most 100; unique per tenant.")
    workflow = serializers.CharField(max_length=100, help_text="The name of one of your workflows.")
    version = serializers.IntegerField(min_value=1, max_value=2**31 - 1, allow_null=True, default=None,
                                       help_text="The workflow version its runs start on; null: the latest.")
    input = AnyJSONField(default=dict, help_text="The input of every run it starts (absent or null: {}).")
    cron = serializers.CharField(max_length=MAX_CRON_CHARS, allow_blank=True, allow_null=True, default="",
                                 help_text="5 fields (minute hour day month weekday) or 6 (seconds first), read "
                                           "in `timezone`. Give this or `interval_s`.")
    interval_s = serializers.IntegerField(min_value=1, max_value=MAX_INTERVAL_S, allow_null=True, default=None,
                                          help_text="Fire every this many seconds, at its whole multiples since "
                                                    "the Unix epoch. Give this or `cron`.")
    timezone = serializers.CharField(max_length=64, default="UTC", help_text="An IANA time zone name.")
    overlap = serializers.ChoiceField(choices=Schedule.Overlap.choices, default=Schedule.Overlap.SKIP)
    catchup_window_s = serializers.IntegerField(min_value=1, max_value=MAX_CATCHUP_WINDOW_S, default=60,
                                                help_text="How late a fire may still start, in seconds; an "
                                                          "older one is missed.")
    jitter_s = serializers.FloatField(min_value=0.0, max_value=MAX_JITTER_S, default=0.0,
                                      help_text="Each fire starts up to this many seconds after its time.")
    paused = serializers.BooleanField(default=False)

    def validate_cron(self, value: str | None) -> str:
        return value or ""

    def validate_jitter_s(self, value: float) -> float:
        if not math.isfinite(value):
            raise serializers.ValidationError("Must be a finite number.")
        return value


class ScheduleBackfillSerializer(StrictSerializer):
    start = DateTimeField(help_text="The first fire time to start (included); without a time zone: UTC.")
    end = DateTimeField(help_text="The last fire time to start (included), not in the future; at most "
                                  "1,000 fire times from `start`.")


class BackfilledFireSerializer(StrictSerializer):
    fire_at = serializers.DateTimeField(read_only=True, help_text="The fire time (nominal, UTC).")
    run_id = serializers.UUIDField(read_only=True, allow_null=True,
                                   help_text="Its run: started now, or the one it had; null when refused.")
    created = serializers.BooleanField(read_only=True, help_text="True: its run started now; false: it had one.")
    error = ScheduleErrorField(read_only=True, allow_null=True, help_text="Why its start was refused; null: it "
                                                                           "was not.")


class ScheduleBackfillResultSerializer(StrictSerializer):
    fires = BackfilledFireSerializer(many=True, read_only=True, help_text="Each fire time of the span, in order.")
    started = serializers.IntegerField(read_only=True, help_text="How many runs started now.")
    existing = serializers.IntegerField(read_only=True, help_text="How many fires had their run already.")
    refused = serializers.IntegerField(read_only=True, help_text="How many starts were refused.")


# --- events and triggers ---------------------------------------------------------------------

EVENT_FILTER, EVENT_FILTER_ALL, EVENT_FILTER_ANY = "EventFilter", "EventFilterAll", "EventFilterAny"
EVENT_CONDITION = "EventCondition"
# A condition's path in a trigger's filter: the events' language (scheduling.templates.EVENTS) without its "$".
EVENT_PATH = rf"^event\.(?:name|key|payload(?:\.{PATH_SEGMENT}){{0,{MAX_PATH_SEGMENTS - 2}}})$"


def event_filter_components() -> dict[str, dict[str, Any]]:
    """``EventFilter`` (one condition, or ``all`` / ``any`` of a list of them) and its parts: what
    ``workflows.triggers.events.checked_filter`` takes. Pure."""
    return condition_tree(
        (EVENT_FILTER, EVENT_FILTER_ALL, EVENT_FILTER_ANY, EVENT_CONDITION),
        "A condition on the event, or `all` or `any` of a list of them.",
        {"type": "string", "pattern": EVENT_PATH,
         "description": "`event.name`, `event.key` or `event.payload.<path>`: a reference without its `$`."})


class EventFilterField(ComponentJSONField):
    """An event trigger's ``filter`` (null: every event of its name)."""

    component = EVENT_FILTER

    @classmethod
    def components(cls) -> dict[str, dict[str, Any]]:
        return event_filter_components()


class EventSendSerializer(StrictSerializer):
    name = PatternField(EVENT_NAME, max_length=200, rule=EVENT_NAME_RULE,
                        help_text=f"What happened (`order.paid`): {EVENT_NAME_RULE}")
    # Kept as sent, spaces too: a wait matches the key its template renders, which nothing trims.
    key = serializers.CharField(max_length=200, required=False, allow_blank=True, default="", trim_whitespace=False,
                                help_text="What it is about (an order id): a correlation key.")
    payload = AnyJSONField(required=False, default=dict, help_text="What it carries: any JSON; absent or null: {}.")
    idempotency_key = serializers.CharField(max_length=200, required=False, allow_null=True, default=None)


class SignalSendSerializer(StrictSerializer):
    name = PatternField(EVENT_NAME, max_length=200, rule=EVENT_NAME_RULE,
                        help_text=f"What it says: the name a `wait_for_event` node of the run waits for (`approved`): "
                                  f"{EVENT_NAME_RULE}")
    payload = AnyJSONField(required=False, default=dict, help_text="The waiting node's output (absent or null: {}).")
    idempotency_key = serializers.CharField(max_length=200, required=False, allow_null=True, default=None,
                                            help_text="The same key again answers the first signal, and does nothing.")


class SignalDeliverySerializer(serializers.Serializer[Any]):
    """The ``wait_for_event`` attempt a signal resumed."""

    step_id = serializers.UUIDField()
    node_id = serializers.CharField()
    attempt = serializers.IntegerField()


class SignalSerializer(StrictModelSerializer):
    delivered_to = serializers.SerializerMethodField(help_text="The waiting node it resumed; null: it is kept "
                                                     "until the run waits for it.")

    class Meta:
        model = RunSignal
        fields = ["id", "run", "name", "payload", "idempotency_key", "delivered_to", "created_at"]
        read_only_fields = fields

    @extend_schema_field(SignalDeliverySerializer(allow_null=True))
    def get_delivered_to(self, signal: RunSignal) -> dict[str, Any] | None:
        if signal.delivered_to_id is None:
            return None
        step = StepRun.objects.filter(pk=signal.delivered_to_id).values("node_id", "attempt").first()
        return {"step_id": str(signal.delivered_to_id), **(step or {})}


class EventBulkSendSerializer(StrictSerializer):
    events = serializers.ListField(child=EventSendSerializer(), min_length=1, max_length=100,
                                   help_text="1 to 100 events, each as POST /events takes it.")


class EventRefusalSerializer(serializers.Serializer[Any]):
    trigger = serializers.UUIDField(help_text="The trigger that started nothing for the event.")
    workflow = serializers.CharField(help_text="Its workflow, whose input_schema refused the event.")
    details = serializers.DictField(child=serializers.CharField(), help_text="Why, by field (`input.payload.qty`).")


class EventSerializer(StrictModelSerializer):
    runs = serializers.ListField(child=serializers.UUIDField(), read_only=True, help_text="The ids of the runs it "
                                 "started.")
    refused = EventRefusalSerializer(many=True, read_only=True)

    class Meta:
        model = Event
        fields = ["id", "name", "key", "payload", "idempotency_key", "runs", "refused", "created_at"]
        read_only_fields = fields


class EventBulkResultSerializer(serializers.Serializer[Any]):
    created = serializers.IntegerField(help_text="How many events were recorded now.")
    events = EventSerializer(many=True)


class TriggerSerializer(StrictModelSerializer):
    workflow = serializers.CharField(source="workflow.name", read_only=True)
    filter = EventFilterField(read_only=True, allow_null=True,
                              help_text="A condition the event must meet; null: every one.")

    class Meta:
        model = EventTrigger
        fields = ["id", "workflow", "event", "filter", "enabled", "created_at", "updated_at"]
        read_only_fields = fields


class TriggerWriteSerializer(StrictSerializer):
    workflow = serializers.CharField(max_length=100, help_text="The workflow whose runs its events start.")
    event = PatternField(EVENT_NAME, max_length=200, rule=EVENT_NAME_RULE,
                         help_text=f"The name of the events it starts runs for: {EVENT_NAME_RULE}")
    filter = EventFilterField(required=False, allow_null=True, default=None,
                              help_text="A condition on `event.name`, `event.key` or `event.payload…`; "
                                        "none: every event of the name.")
    enabled = serializers.BooleanField(required=False, default=True)
