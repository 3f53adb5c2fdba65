"""Tenancy endpoints: the current tenant, its API keys, and platform-admin tenants."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from tenants import selectors, services
from tenants.api import PlatformViewSet, TenantAPIView, TenantViewSet
from tenants.context import current_tenant, tenant_context
from tenants.models import ApiKey, Tenant
from tenants.serializers import (
    ApiKeyCreatedSerializer,
    ApiKeyCreateSerializer,
    ApiKeySerializer,
    TenantCreatedSerializer,
    TenantCreateSerializer,
    TenantSerializer,
)


class CurrentTenantView(TenantAPIView):
    """The tenant the API key acts for."""

    @extend_schema(responses=TenantSerializer, operation_id="tenant_current")
    def get(self, request: Request) -> Response:
        return Response(TenantSerializer(current_tenant()).data)


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

    @extend_schema(request=None, responses={200: ApiKeySerializer})
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str) -> Response:
        key = services.api_key_revoke(key=selectors.get_api_key_for_tenant(pk))
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
        tenant = services.tenant_create(slug=data["slug"], name=data.get("name", ""))
        body = dict(TenantSerializer(tenant).data)
        if data["create_api_key"]:
            with tenant_context(tenant):
                _, raw = services.api_key_create(
                    name="initial", scopes=[ApiKey.Scope.READ, ApiKey.Scope.WRITE]
                )
            body["api_key"] = raw
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: TenantSerializer})
    @action(detail=True, methods=["post"])
    def suspend(self, request: Request, slug: str) -> Response:
        tenant = services.tenant_set_status(
            tenant=selectors.get_tenant(slug), status=Tenant.Status.SUSPENDED
        )
        return Response(TenantSerializer(tenant).data)

    @extend_schema(request=None, responses={200: TenantSerializer})
    @action(detail=True, methods=["post"])
    def activate(self, request: Request, slug: str) -> Response:
        tenant = services.tenant_set_status(
            tenant=selectors.get_tenant(slug), status=Tenant.Status.ACTIVE
        )
        return Response(TenantSerializer(tenant).data)
