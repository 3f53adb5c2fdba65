from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.reverse import reverse

from tenants.api import StrictModelSerializer, StrictSerializer, TextField
from workflows.models import RunEvent, StepRun, WorkflowDefinition, WorkflowRun, WorkflowVersion
from workflows.spec_schema import SpecField
from workflows.why import Cause


class WorkflowVersionSerializer(StrictModelSerializer):
    spec = SpecField(read_only=True)

    class Meta:
        model = WorkflowVersion
        fields = ["number", "spec", "created_at"]
        read_only_fields = fields


class WorkflowSerializer(StrictModelSerializer):
    spec = serializers.SerializerMethodField()

    class Meta:
        model = WorkflowDefinition
        fields = ["id", "name", "description", "latest_version", "spec", "created_at", "updated_at"]
        read_only_fields = fields

    @extend_schema_field(SpecField(allow_null=True, help_text="The latest version's spec."))
    def get_spec(self, obj: WorkflowDefinition) -> Any:
        if hasattr(obj, "latest_spec"):  # annotated by selectors.workflow_list: no query per row
            return obj.latest_spec
        latest = obj.versions.order_by("-number").first()
        return latest.spec if latest else None


class WorkflowCreateSerializer(StrictSerializer):
    name = serializers.RegexField(r"^[A-Za-z0-9_.\-]{1,100}$", help_text="Letters, digits, '_', '.', '-'.")
    description = TextField(max_length=500, required=False, allow_blank=True, default="")
    spec = SpecField()


class WorkflowUpdateSerializer(StrictSerializer):
    description = TextField(max_length=500, required=False, allow_blank=True, default="")
    spec = SpecField()


class RunStartSerializer(StrictSerializer):
    workflow = serializers.CharField(max_length=100)
    version = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    input = serializers.JSONField(required=False, default=dict)
    idempotency_key = serializers.CharField(max_length=200, required=False, allow_null=True, default=None)
    tier = serializers.ChoiceField(choices=["interactive", "standard", "batch"], required=False, default=None,
                                   allow_null=True)
    tags = serializers.ListField(child=serializers.CharField(max_length=100), required=False, default=list,
                                 max_length=50)


class RunRerunSerializer(StrictSerializer):
    input = serializers.JSONField(required=False, default=None, allow_null=True,
                                  help_text="The new run's input; by default the run's own.")
    idempotency_key = serializers.CharField(max_length=200, required=False, allow_null=True, default=None)


class RunBulkStartSerializer(StrictSerializer):
    runs = RunStartSerializer(many=True, help_text="1 to 500 runs, each as POST /runs takes it.")


class RunBulkItemSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    idempotency_key = serializers.CharField(allow_null=True)
    status = serializers.CharField()
    created = serializers.BooleanField(help_text="False: the key was used before; this is that run.")


class RunBulkResultSerializer(serializers.Serializer):
    created = serializers.IntegerField(help_text="How many runs this call started.")
    runs = RunBulkItemSerializer(many=True, help_text="One per item, in the order given.")


class RunFilterSerializer(StrictSerializer):
    status = serializers.ChoiceField(choices=WorkflowRun.Status.choices, required=False)
    workflow = serializers.CharField(required=False)
    created_after = serializers.DateTimeField(required=False)
    created_before = serializers.DateTimeField(required=False)
    root_run_id = serializers.UUIDField(required=False)
    cursor = serializers.CharField(required=False)
    page_size = serializers.IntegerField(required=False, min_value=1, max_value=500)


class StepRunSerializer(StrictModelSerializer):
    class Meta:
        model = StepRun
        fields = ["id", "node_id", "node_type", "attempt", "status", "input", "output", "error", "routing",
                  "child_run", "created_at", "scheduled_for", "started_at", "finished_at"]
        read_only_fields = fields


class RunSerializer(StrictModelSerializer):
    version = serializers.IntegerField(source="workflow.number", read_only=True)

    class Meta:
        model = WorkflowRun
        fields = ["id", "workflow_name", "version", "status", "input", "output", "error", "idempotency_key",
                  "tier", "tags", "parent_run", "parent_node_id", "root_run_id", "nesting_depth",
                  "continued_from", "rerun_of", "cancel_requested", "created_at", "started_at", "finished_at"]
        read_only_fields = fields


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
    class Meta:
        model = RunEvent
        fields = ["seq", "type", "node_id", "data", "created_at"]
        read_only_fields = fields


class WaitingSerializer(serializers.Serializer[Any]):
    """One waiting step (or the run's tick, node ``""``) and what holds it now."""

    node_id = serializers.CharField(read_only=True)
    attempt = serializers.IntegerField(read_only=True, help_text="0 for a node not started (or the tick).")
    step_id = serializers.CharField(read_only=True, help_text="The attempt's id; empty for the tick or a node "
                                                              "not started.")
    status = serializers.CharField(read_only=True)
    cause = serializers.ChoiceField(choices=[(cause.value, cause.value) for cause in Cause], read_only=True)
    message = serializers.CharField(read_only=True)
    until = serializers.DateTimeField(read_only=True, allow_null=True,
                                      help_text="When the cause lifts, where that is known.")
    details = serializers.DictField(read_only=True)


class RunWhySerializer(serializers.Serializer[Any]):
    run_id = serializers.UUIDField(read_only=True)
    status = serializers.CharField(read_only=True)
    waiting = WaitingSerializer(many=True, read_only=True)
