"""Routing endpoints: connections, pools, rules, the routing dry run, and fairness key weights.

Views parse, call one service and serialize. Lookups go through
``scheduling.selectors``, so another tenant's id is a 404 on every verb.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from ductor_project.celery import SYSTEM_QUEUE, WORK_QUEUE
from ductor_project.core.keys import queue_shards
from ductor_project.pagination import CursorPagination
from scheduling import fair_queue, selectors, services
from scheduling.dispatch import credits
from scheduling.dispatch import shards as dispatch_shards
from scheduling.models import Connection, FairnessKey, Pool, Rule
from scheduling.serializers import (
    ConnectionSerializer,
    ConnectionWriteSerializer,
    DecisionTraceSerializer,
    ExplainSerializer,
    FairnessKeySerializer,
    FairnessKeyWeightSerializer,
    FairnessKeyWriteSerializer,
    GlobalQueueStatsSerializer,
    PoolSerializer,
    PoolWriteSerializer,
    QueueStatsSerializer,
    RuleSerializer,
    RuleWriteSerializer,
    SecretSerializer,
    parse,
)
from tenants.api import PlatformAPIView, TenantAPIView, TenantViewSet


class ByNamePagination(CursorPagination):
    ordering = ("name", "id")


class ByPriorityPagination(CursorPagination):
    ordering = ("priority", "id")


class ConnectionViewSet(TenantViewSet):
    """The tenant's connections. The secret is write-only: reads show ``has_secret``."""

    serializer_class = ConnectionSerializer
    queryset = Connection.all_tenants.none()  # schema introspection only; reads go through selectors
    pagination_class = ByNamePagination

    def get_queryset(self) -> QuerySet[Connection]:
        return selectors.connection_list()

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(ConnectionSerializer(page, many=True).data)

    @extend_schema(request=ConnectionWriteSerializer, responses={201: ConnectionSerializer})
    def create(self, request: Request) -> Response:
        connection = services.connection_create(**parse(ConnectionWriteSerializer, request.data))
        return Response(ConnectionSerializer(connection).data, status=status.HTTP_201_CREATED)

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(ConnectionSerializer(selectors.get_connection_for_tenant(pk)).data)

    @extend_schema(request=ConnectionWriteSerializer, responses={200: ConnectionSerializer})
    def update(self, request: Request, pk: str, partial: bool = False) -> Response:
        connection = selectors.get_connection_for_tenant(pk)
        changes = parse(ConnectionWriteSerializer, request.data, partial=partial)
        connection = services.connection_update(connection=connection, **changes)
        return Response(ConnectionSerializer(connection).data)

    @extend_schema(request=ConnectionWriteSerializer, responses={200: ConnectionSerializer})
    def partial_update(self, request: Request, pk: str) -> Response:
        return self.update(request, pk, partial=True)

    def destroy(self, request: Request, pk: str) -> Response:
        services.connection_delete(connection=selectors.get_connection_for_tenant(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=SecretSerializer,
        responses={200: ConnectionSerializer},
        operation_id="connections_rotate_secret",
    )
    @extend_schema(summary="Rotate a connection's secret")
    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request: Request, pk: str) -> Response:
        connection = selectors.get_connection_for_tenant(pk)
        params = parse(SecretSerializer, request.data)
        connection = services.connection_rotate_secret(connection=connection, secret=params["secret"])
        return Response(ConnectionSerializer(connection).data)


class PoolViewSet(TenantViewSet):
    """The tenant's pools with their members. Members are given by connection id or name."""

    serializer_class = PoolSerializer
    queryset = Pool.all_tenants.none()  # schema introspection only; reads go through selectors
    pagination_class = ByNamePagination

    def get_queryset(self) -> QuerySet[Pool]:
        return selectors.pool_list()

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(PoolSerializer(page, many=True).data)

    @extend_schema(request=PoolWriteSerializer, responses={201: PoolSerializer})
    def create(self, request: Request) -> Response:
        pool = services.pool_create(**parse(PoolWriteSerializer, request.data))
        body = PoolSerializer(selectors.get_pool_for_tenant(pool.pk)).data
        return Response(body, status=status.HTTP_201_CREATED)

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(PoolSerializer(selectors.get_pool_for_tenant(pk)).data)

    @extend_schema(request=PoolWriteSerializer, responses={200: PoolSerializer})
    def update(self, request: Request, pk: str, partial: bool = False) -> Response:
        pool = selectors.get_pool_for_tenant(pk)
        pool = services.pool_update(pool=pool, **parse(PoolWriteSerializer, request.data, partial=partial))
        return Response(PoolSerializer(selectors.get_pool_for_tenant(pool.pk)).data)

    @extend_schema(request=PoolWriteSerializer, responses={200: PoolSerializer})
    def partial_update(self, request: Request, pk: str) -> Response:
        return self.update(request, pk, partial=True)

    def destroy(self, request: Request, pk: str) -> Response:
        services.pool_delete(pool=selectors.get_pool_for_tenant(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class RuleViewSet(TenantViewSet):
    """The tenant's routing rules, in evaluation order (lowest priority first)."""

    serializer_class = RuleSerializer
    queryset = Rule.all_tenants.none()  # schema introspection only; reads go through selectors
    pagination_class = ByPriorityPagination

    def get_queryset(self) -> QuerySet[Rule]:
        return selectors.rule_list()

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(RuleSerializer(page, many=True).data)

    @extend_schema(request=RuleWriteSerializer, responses={201: RuleSerializer})
    def create(self, request: Request) -> Response:
        rule = services.rule_create(**parse(RuleWriteSerializer, request.data))
        return Response(RuleSerializer(rule).data, status=status.HTTP_201_CREATED)

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(RuleSerializer(selectors.get_rule_for_tenant(pk)).data)

    @extend_schema(request=RuleWriteSerializer, responses={200: RuleSerializer})
    def update(self, request: Request, pk: str, partial: bool = False) -> Response:
        rule = selectors.get_rule_for_tenant(pk)
        rule = services.rule_update(rule=rule, **parse(RuleWriteSerializer, request.data, partial=partial))
        return Response(RuleSerializer(rule).data)

    @extend_schema(request=RuleWriteSerializer, responses={200: RuleSerializer})
    def partial_update(self, request: Request, pk: str) -> Response:
        return self.update(request, pk, partial=True)

    def destroy(self, request: Request, pk: str) -> Response:
        services.rule_delete(rule=selectors.get_rule_for_tenant(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class ByKeyPagination(CursorPagination):
    ordering = ("key", "id")


class FairnessKeyViewSet(TenantViewSet):
    """The weights of the tenant's fairness keys. Backlogged keys share the tenant's dispatches by
    weight; a key with no weight here weighs 1. A weight's key is fixed: delete it to weigh 1 again."""

    serializer_class = FairnessKeySerializer
    queryset = FairnessKey.all_tenants.none()  # schema introspection only; reads go through selectors
    pagination_class = ByKeyPagination

    def get_queryset(self) -> QuerySet[FairnessKey]:
        return selectors.fairness_key_list()

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(FairnessKeySerializer(page, many=True).data)

    @extend_schema(request=FairnessKeyWriteSerializer, responses={201: FairnessKeySerializer})
    def create(self, request: Request) -> Response:
        row = services.fairness_key_create(**parse(FairnessKeyWriteSerializer, request.data))
        return Response(FairnessKeySerializer(row).data, status=status.HTTP_201_CREATED)

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(FairnessKeySerializer(selectors.get_fairness_key_for_tenant(pk)).data)

    @extend_schema(request=FairnessKeyWeightSerializer, responses={200: FairnessKeySerializer})
    def update(self, request: Request, pk: str, partial: bool = False) -> Response:
        row = selectors.get_fairness_key_for_tenant(pk)
        changes = parse(FairnessKeyWeightSerializer, request.data, partial=partial)
        if changes:  # a PATCH may name nothing to change: the key as it is
            row = services.fairness_key_update(fairness_key=row, **changes)
        return Response(FairnessKeySerializer(row).data)

    @extend_schema(request=FairnessKeyWeightSerializer, responses={200: FairnessKeySerializer})
    def partial_update(self, request: Request, pk: str) -> Response:
        return self.update(request, pk, partial=True)

    def destroy(self, request: Request, pk: str) -> Response:
        services.fairness_key_delete(fairness_key=selectors.get_fairness_key_for_tenant(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class RoutingExplainView(TenantAPIView):
    """Dry run: how a hypothetical step would be routed now, with the trace. Takes no capacity."""

    changes_nothing = True  # a POST that only reads: the ``read`` scope is enough (IsTenantMember)

    @extend_schema(
        request=ExplainSerializer, responses={200: DecisionTraceSerializer}, operation_id="routing_explain"
    )
    @extend_schema(summary="Explain how a step would be routed")
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        explanation = services.routing_explain(**parse(ExplainSerializer, request.data))
        return Response(explanation.trace())


class QueueView(TenantAPIView):
    """The tenant's fair-queue backlog, items in flight, due counts per tier and oldest waiting age,
    and its share of worker time over the last minute beside its weight-fair share."""

    @extend_schema(summary="Get the tenant's queue", responses=QueueStatsSerializer, operation_id="queue_current")
    def get(self, request: Request) -> Response:
        row = {**dataclasses.asdict(fair_queue.stats()), "work": dataclasses.asdict(fair_queue.work_share())}
        return Response(QueueStatsSerializer(row).data)


class PlatformQueueView(PlatformAPIView):
    """Platform admin: the global view of every shard (tenants ready, parked, leases, worker slots,
    the live dispatchers that serve it: none, and its due items wait)."""

    @extend_schema(summary="Get every shard's queue",
                   responses=GlobalQueueStatsSerializer(many=True), operation_id="platform_queue")
    def get(self, request: Request) -> Response:
        shards = []
        serving = dispatch_shards.serving()
        for shard in queue_shards():
            row = dataclasses.asdict(fair_queue.global_stats(shard))
            row["dispatchers"] = serving.get(shard, [])
            row["worker_slots"] = {q: credits.worker_slots(q) for q in (WORK_QUEUE, SYSTEM_QUEUE)}
            row["busy"] = {q: credits.busy(q) for q in (WORK_QUEUE, SYSTEM_QUEUE)}
            row["work_shares"] = [dataclasses.asdict(share) for share in fair_queue.work_shares(shard)]
            shards.append(row)
        return Response(GlobalQueueStatsSerializer(shards, many=True).data)
