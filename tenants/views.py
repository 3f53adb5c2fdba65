"""Tenancy endpoints: the current tenant, its API keys, and platform-admin tenants."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from ductor_project.core.context import current_tenant, tenant_context
from tenants import selectors, services
from tenants.api import PlatformViewSet, TenantAPIView, TenantViewSet, no_body
from tenants.entitlements import LIMIT_FIELDS
from tenants.models import ApiKey, Plan, Tenant
from tenants.serializers import (
    ApiKeyCreatedSerializer,
    ApiKeyCreateSerializer,
    ApiKeySerializer,
    EntitlementsSerializer,
    OverrideSerializer,
    OverrideSetSerializer,
    PlanSerializer,
    TenantCreatedSerializer,
    TenantCreateSerializer,
    TenantPlanSerializer,
    TenantSerializer,
)

# The limit an override sets or clears: one of the plans' limits (another is a 400 naming ``field``).
LIMIT_PARAMETER = OpenApiParameter("field", str, OpenApiParameter.PATH, enum=list(LIMIT_FIELDS),
                                   description="The limit: one of the plans' limits.")


class CurrentTenantView(TenantAPIView):
    """The tenant the API key acts for."""

    @extend_schema(summary="Get the key's tenant", responses=TenantSerializer, operation_id="tenant_current")
    def get(self, request: Request) -> Response:
        return Response(TenantSerializer(current_tenant()).data)


class EntitlementsView(TenantAPIView):
    """Effective limits (plan + overrides), current usage and reset times."""

    @extend_schema(summary="Get the tenant's limits and usage",
                   responses=EntitlementsSerializer, operation_id="entitlements_current")
    def get(self, request: Request) -> Response:
        return Response(EntitlementsSerializer(selectors.entitlements_report(current_tenant())).data)


class ApiKeyViewSet(TenantViewSet):
    """The tenant's API keys. The raw key is returned once, by create; revoking is idempotent."""

    serializer_class = ApiKeySerializer
    queryset = ApiKey.all_tenants.none()  # schema introspection only; reads go through selectors

    def get_queryset(self) -> Any:
        return selectors.api_key_list()

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(ApiKeySerializer(page, many=True).data)

    @extend_schema(request=ApiKeyCreateSerializer, responses={201: ApiKeyCreatedSerializer})
    def create(self, request: Request) -> Response:
        params = ApiKeyCreateSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        user_id = getattr(request.user, "id", None)
        key, raw = services.api_key_create(**params.validated_data, created_by_id=user_id)
        body = ApiKeyCreatedSerializer(key).data | {"api_key": raw}
        return Response(body, status=status.HTTP_201_CREATED)

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(ApiKeySerializer(selectors.get_api_key_for_tenant(pk)).data)

    @extend_schema(responses={200: ApiKeySerializer})
    def destroy(self, request: Request, pk: str) -> Response:
        key = services.api_key_revoke(key=selectors.get_api_key_for_tenant(pk))
        return Response(ApiKeySerializer(key).data)

    @extend_schema(summary="Revoke an API key", request=None, responses={200: ApiKeySerializer})
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str) -> Response:
        key = services.api_key_revoke(key=no_body(request, found=selectors.get_api_key_for_tenant(pk)))
        return Response(ApiKeySerializer(key).data)


class PlatformTenantViewSet(PlatformViewSet):
    """Platform admin: every customer tenant. Superusers and platform keys only."""

    serializer_class = TenantSerializer
    queryset = Tenant.objects.none()
    lookup_field = "slug"

    def get_queryset(self) -> Any:
        return selectors.tenant_list()

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(TenantSerializer(page, many=True).data)

    def retrieve(self, request: Request, slug: str) -> Response:
        return Response(TenantSerializer(selectors.get_tenant(slug)).data)

    @extend_schema(request=TenantCreateSerializer, responses={201: TenantCreatedSerializer})
    def create(self, request: Request) -> Response:
        params = TenantCreateSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        tenant = services.tenant_create(slug=data["slug"], name=data.get("name", ""), plan=data["plan"])
        body = dict(TenantSerializer(tenant).data)
        if data["create_api_key"]:
            with tenant_context(tenant):
                _, raw = services.api_key_create(
                    name="initial", scopes=[ApiKey.Scope.READ, ApiKey.Scope.WRITE]
                )
            body["api_key"] = raw
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(summary="Delete a tenant and all its data", request=None, responses={202: TenantSerializer})
    def destroy(self, request: Request, slug: str) -> Response:
        """Only a suspended tenant: it is marked ``deleting`` at once, and its data is purged in the
        background (docs/operations.md). Idempotent."""
        tenant = services.tenant_delete(tenant=selectors.get_tenant(slug))
        return Response(TenantSerializer(tenant).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(summary="Suspend a tenant", request=None, responses={200: TenantSerializer})
    @action(detail=True, methods=["post"])
    def suspend(self, request: Request, slug: str) -> Response:
        tenant = services.tenant_set_status(
            tenant=no_body(request, found=selectors.get_tenant(slug)), status=Tenant.Status.SUSPENDED
        )
        return Response(TenantSerializer(tenant).data)

    @extend_schema(summary="Activate a tenant", request=None, responses={200: TenantSerializer})
    @action(detail=True, methods=["post"])
    def activate(self, request: Request, slug: str) -> Response:
        tenant = services.tenant_set_status(
            tenant=no_body(request, found=selectors.get_tenant(slug)), status=Tenant.Status.ACTIVE
        )
        return Response(TenantSerializer(tenant).data)

    @extend_schema(summary="Move a tenant to another plan",
                   request=TenantPlanSerializer, responses={200: TenantSerializer})
    @action(detail=True, methods=["post"])
    def plan(self, request: Request, slug: str) -> Response:
        params = TenantPlanSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        tenant = selectors.get_tenant(slug)
        tenant = services.tenant_set_plan(tenant=tenant, plan_slug=params.validated_data["plan"])
        return Response(TenantSerializer(tenant).data)

    @extend_schema(summary="Get a tenant's limits and usage", responses={200: EntitlementsSerializer})
    @action(detail=True, methods=["get"])
    def entitlements(self, request: Request, slug: str) -> Response:
        tenant = selectors.get_tenant(slug)
        with tenant_context(tenant):
            return Response(EntitlementsSerializer(selectors.entitlements_report(tenant)).data)

    @extend_schema(summary="List a tenant's overrides", responses={200: OverrideSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None)  # a plain array, not a page
    def overrides(self, request: Request, slug: str) -> Response:
        rows = selectors.override_list(selectors.get_tenant(slug))
        return Response(OverrideSerializer(rows, many=True).data)

    @extend_schema(methods=["PUT"], summary="Override a limit of a tenant", parameters=[LIMIT_PARAMETER],
                   request=OverrideSetSerializer,
                   responses={200: OverrideSerializer})
    @extend_schema(methods=["DELETE"], summary="Remove a tenant's override of a limit", parameters=[LIMIT_PARAMETER],
                   request=None, responses={204: None})
    @action(detail=True, methods=["put", "delete"], url_path=r"overrides/(?P<field>[a-z_]+)")
    def override(self, request: Request, slug: str, field: str) -> Response:
        tenant = selectors.get_tenant(slug)
        if request.method == "DELETE":
            services.override_clear(tenant=tenant, field=field)
            return Response(status=status.HTTP_204_NO_CONTENT)
        params = OverrideSetSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        row = services.override_set(tenant=tenant, field=field, **params.validated_data)
        return Response(OverrideSerializer(row).data)


class PlatformPlanViewSet(PlatformViewSet):
    """Platform admin: the plans and their ceilings."""

    serializer_class = PlanSerializer
    queryset = Plan.objects.none()
    lookup_field = "slug"
    pagination_class = None  # a handful of plans: a plain array

    def list(self, request: Request) -> Response:
        return Response(PlanSerializer(selectors.plan_list(), many=True).data)

    def retrieve(self, request: Request, slug: str) -> Response:
        return Response(PlanSerializer(selectors.get_plan(slug)).data)
