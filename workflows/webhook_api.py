"""The webhooks' endpoints: a tenant's subscriptions to its runs' outcomes, and their delivery logs.

- ``/api/v1/webhooks``: list, create, read, change (``PUT``/``PATCH``) and delete endpoints; the
  create answers the secret in full, once;
- ``POST /api/v1/webhooks/{id}/rotate``: a new secret (answered once); the previous one goes on
  signing for ``grace_s``;
- ``GET /api/v1/webhooks/{id}/deliveries`` (newest first) and ``…/deliveries/{delivery_id}``: the
  delivery log; ``POST …/deliveries/{delivery_id}/redeliver`` sends one again.

Views parse, call one service of ``workflows.triggers.webhooks``, and serialize. Another tenant's
endpoint or delivery is not found.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from ductor_project.core.openapi import ComponentJSONField, component_ref
from ductor_project.pagination import CursorPagination
from scheduling.serializers import parse
from tenants.api import StrictModelSerializer, StrictSerializer, TenantViewSet, TextField, named_string, no_body
from workflows.models import WebhookDelivery, WebhookEndpoint
from workflows.triggers import webhooks
from workflows.views import ByCreationPagination

DELIVERY_ID = OpenApiParameter("delivery_id", OpenApiTypes.UUID, OpenApiParameter.PATH,
                               description="A delivery of this endpoint.")
DELIVERY_PATH = r"deliveries/(?P<delivery_id>[^/.]+)"
MAX_EVENTS = 10


@extend_schema_field(serializers.ListField(child=serializers.ChoiceField(choices=webhooks.EVENT_TYPES)))
class EventTypesField(serializers.ListField):
    """The event types an endpoint receives: declared as one or more of ``EVENT_TYPES``, each item
    checked by ``webhooks.checked_events``, so that a refusal names ``events``, not one of its items."""

    def __init__(self, **kwargs: Any) -> None:
        one_or_more = f"Give one or more of {', '.join(webhooks.EVENT_TYPES)}."
        super().__init__(child=serializers.CharField(max_length=32), min_length=1, max_length=MAX_EVENTS,
                         error_messages={"min_length": one_or_more}, **kwargs)


# A workflow's name in a list, a component of its own (``named_string``): inline, a generator named it Workflow.
WorkflowNameField = named_string("WorkflowName", max_length=100)


class WebhookSerializer(StrictModelSerializer):
    """An endpoint; its secret is never shown again after its create or a rotation."""

    events = serializers.ListField(child=serializers.ChoiceField(choices=webhooks.EVENT_TYPES), read_only=True,
                                   help_text=f"What it receives: some of {', '.join(webhooks.EVENT_TYPES)}.")
    workflows = serializers.ListField(child=serializers.CharField(), read_only=True,
                                      help_text="Only the runs of these workflows; empty: all.")

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "description", "events", "workflows", "enabled", "disabled_reason", "disabled_at",
                  "consecutive_failures", "previous_secret_expires_at", "created_at", "updated_at"]
        read_only_fields = fields


class WebhookRevealedSerializer(WebhookSerializer):
    """An endpoint with its secret in full: the answer of its create and of a rotation, once."""

    secret = serializers.CharField(read_only=True, help_text="The signing secret (`whsec_…`), in full: shown "
                                   "this once. Keep it: it checks the signature of every delivery.")

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]
        read_only_fields = fields

    def to_representation(self, instance: webhooks.Revealed) -> dict[str, Any]:
        return {**WebhookSerializer(instance.endpoint).data, "secret": instance.secret}


class WebhookWriteSerializer(StrictSerializer):
    url = serializers.CharField(max_length=2000, help_text="Where the deliveries are POSTed: an https URL whose "
                                "host is public.")
    events = EventTypesField(help_text=f"What it receives: one or more of {', '.join(webhooks.EVENT_TYPES)}.")
    workflows = serializers.ListField(child=WorkflowNameField(), max_length=100, required=False,
                                      default=list, help_text="Only the runs of these workflows; empty: all.")
    description = TextField(max_length=200, required=False, allow_blank=True, default="")
    enabled = serializers.BooleanField(required=False, default=True, help_text="true enables a disabled endpoint "
                                       "again and zeroes its failures; false stops its pending deliveries.")


class WebhookRotateSerializer(StrictSerializer):
    grace_s = serializers.IntegerField(min_value=0, max_value=webhooks.MAX_GRACE_S, required=False,
                                       default=webhooks.DEFAULT_GRACE_S,
                                       help_text="How long the previous secret goes on signing too (0: not at all).")


DELIVERY_LOG_ENTRY, ATTEMPT, NOTE = "WebhookDeliveryLogEntry", "WebhookAttempt", "WebhookNote"


class DeliveryLogEntryField(ComponentJSONField):
    """An entry of a delivery's log: an attempt, or a note of what happened to it without one."""

    component = DELIVERY_LOG_ENTRY

    @classmethod
    def components(cls) -> dict[str, dict[str, Any]]:
        at = {"type": "string", "format": "date-time"}
        return {
            DELIVERY_LOG_ENTRY: {"oneOf": [component_ref(ATTEMPT), component_ref(NOTE)]},
            ATTEMPT: {"type": "object", "required": ["at", "status_code", "error", "duration_ms", "response"],
                      "description": "One POST to the endpoint.", "properties": {
                          "at": at, "status_code": {"type": "integer", "nullable": True,
                                                    "description": "Null: no answer (a timeout, a refused address)."},
                          "error": {"type": "string", "nullable": True}, "duration_ms": {"type": "number"},
                          "response": {"type": "string", "description": "The answer's first 500 characters."}}},
            NOTE: {"type": "object", "required": ["at", "note"], "additionalProperties": False,
                   "description": "Not an attempt: why the delivery stopped, or that it was asked again.",
                   "properties": {"at": at, "note": {"type": "string"}}},
        }


class WebhookDeliverySerializer(StrictModelSerializer):
    type = serializers.ChoiceField(choices=webhooks.EVENT_TYPES, read_only=True, help_text="What it tells of.")
    attempts = serializers.ListField(child=DeliveryLogEntryField(), read_only=True,
                                     help_text="Its log: the attempts, and the notes between them, oldest first.")

    class Meta:
        model = WebhookDelivery
        fields = ["id", "endpoint", "run", "type", "status", "attempts", "next_attempt_at", "created_at",
                  "finished_at"]
        read_only_fields = fields


class WebhookDeliveryDetailSerializer(WebhookDeliverySerializer):
    class Meta(WebhookDeliverySerializer.Meta):
        fields = [*WebhookDeliverySerializer.Meta.fields, "body"]
        read_only_fields = fields


class WebhookViewSet(TenantViewSet):
    """Webhooks: endpoints told of the tenant's runs' outcomes (succeeded, failed, cancelled, and step
    failures) by signed JSON POSTs, retried with backoff, with a delivery log."""

    serializer_class = WebhookSerializer
    queryset = WebhookEndpoint.all_tenants.none()  # schema introspection only; reads go through the services
    pagination_class = ByCreationPagination

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(webhooks.live_endpoints())
        return self.get_paginated_response(WebhookSerializer(page, many=True).data)

    @extend_schema(request=WebhookWriteSerializer, responses={201: WebhookRevealedSerializer})
    def create(self, request: Request) -> Response:
        """Subscribe an endpoint; the answer holds its secret in full, shown this once."""
        revealed = webhooks.webhook_create(**parse(WebhookWriteSerializer, request.data))
        return Response(WebhookRevealedSerializer(revealed).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=WebhookSerializer)
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(WebhookSerializer(webhooks.webhook_of(pk)).data)

    @extend_schema(request=WebhookWriteSerializer, responses=WebhookSerializer)
    def update(self, request: Request, pk: str, partial: bool = False) -> Response:
        endpoint = webhooks.webhook_of(pk)  # another tenant's is not found, whatever the body
        changes = parse(WebhookWriteSerializer, request.data, partial=partial)
        return Response(WebhookSerializer(webhooks.webhook_update(endpoint, changes)).data)

    @extend_schema(request=WebhookWriteSerializer, responses=WebhookSerializer)
    def partial_update(self, request: Request, pk: str) -> Response:
        return self.update(request, pk, partial=True)

    def destroy(self, request: Request, pk: str) -> Response:
        webhooks.webhook_delete(webhooks.webhook_of(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(summary="Rotate a webhook endpoint's secret",
                   request=WebhookRotateSerializer, responses=WebhookRevealedSerializer)
    @action(detail=True, methods=["post"])
    def rotate(self, request: Request, pk: str) -> Response:
        """A new secret, answered in full this once; the previous one also signs for ``grace_s``."""
        endpoint = webhooks.webhook_of(pk)
        revealed = webhooks.webhook_rotate(endpoint, **parse(WebhookRotateSerializer, request.data))
        return Response(WebhookRevealedSerializer(revealed).data)

    @extend_schema(summary="List a webhook endpoint's deliveries", responses=WebhookDeliverySerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=CursorPagination)  # newest first
    def deliveries(self, request: Request, pk: str) -> Response:
        """The endpoint's delivery log, newest first: each delivery's status and attempts."""
        endpoint = webhooks.webhook_of(pk)
        page = self.paginate_queryset(WebhookDelivery.objects.filter(endpoint=endpoint))
        return self.get_paginated_response(WebhookDeliverySerializer(page, many=True).data)

    @extend_schema(summary="Get a webhook delivery",
                   parameters=[DELIVERY_ID], responses=WebhookDeliveryDetailSerializer)
    @action(detail=True, methods=["get"], url_path=DELIVERY_PATH, pagination_class=None)
    def delivery(self, request: Request, pk: str, delivery_id: str) -> Response:
        """One delivery, with the body it sends."""
        found = webhooks.delivery_of(webhooks.webhook_of(pk), delivery_id)
        return Response(WebhookDeliveryDetailSerializer(found).data)

    @extend_schema(summary="Send a webhook delivery again",
                   parameters=[DELIVERY_ID], request=None, responses=WebhookDeliveryDetailSerializer)
    @action(detail=True, methods=["post"], url_path=f"{DELIVERY_PATH}/redeliver", pagination_class=None)
    def redeliver(self, request: Request, pk: str, delivery_id: str) -> Response:
        """Send the delivery again, at once, with a new series of attempts (``409`` while the endpoint
        is disabled)."""
        found = no_body(request, found=webhooks.delivery_of(webhooks.webhook_of(pk), delivery_id))
        return Response(WebhookDeliveryDetailSerializer(webhooks.delivery_redeliver(found)).data)
