"""The API's serializers: each instance's fields copied from its class's without building them again
(a response's model fields built once per class), and a writable one still judging related ids in
the request's own tenant context."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from ductor_project.core.context import tenant_context
from tenants.api import StrictModelSerializer, StrictSerializer
from tenants.models import Tenant
from workflows import services
from workflows.models import StepRun, WorkflowRun
from workflows.serializers import RunSerializer

pytestmark = pytest.mark.django_db

ONE = {"nodes": [{"id": "a", "type": "action", "action": "echo", "input": {}}]}


def started(tenant: Tenant) -> WorkflowRun:
    with tenant_context(tenant):
        services.workflow_put(name="one", spec=ONE)
        return services.run_start(workflow="one", input={"who": tenant.slug})[0]


class AttemptOfRun(StrictModelSerializer):
    """Writable: its ``run`` is an id the caller's tenant must own."""

    class Meta:
        model = StepRun
        fields = ["run"]


def test_a_responses_fields_are_built_once_and_each_serializer_gets_its_own_bound_copy(
        redis_client: Any, tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str]) -> None:
    runs = {tenant: started(tenant) for tenant in (tenant_a[0], tenant_b[0])}
    shown = {}
    for tenant, run in runs.items():
        with tenant_context(tenant):
            serializer = RunSerializer(run)
            shown[tenant.slug] = serializer.data
            assert all(field.parent is serializer for field in serializer.fields.values())
    assert RunSerializer in StrictModelSerializer._read_only_fields
    first, second = RunSerializer(runs[tenant_a[0]]), RunSerializer(runs[tenant_b[0]])
    assert first.fields["status"] is not second.fields["status"]
    for tenant, run in runs.items():
        assert (shown[tenant.slug]["id"], shown[tenant.slug]["input"]) == (str(run.pk), {"who": tenant.slug})
        assert shown[tenant.slug]["status"] == "running"


def test_a_writable_serializer_judges_a_related_id_in_each_requests_tenant(
        redis_client: Any, tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str]) -> None:
    a, b = tenant_a[0], tenant_b[0]
    run_a, run_b = started(a), started(b)
    for tenant, own, other in ((a, run_a, run_b), (b, run_b, run_a)):  # the same class, used by both in turn
        with tenant_context(tenant):
            assert AttemptOfRun(data={"run": str(own.pk)}).is_valid()
            refused = AttemptOfRun(data={"run": str(other.pk)})
            assert not refused.is_valid()
            assert list(refused.errors) == ["run"]
    assert AttemptOfRun not in StrictModelSerializer._read_only_fields


class Order(StrictSerializer):
    sku = serializers.CharField(max_length=3)
    tags = serializers.ListField(child=serializers.CharField(max_length=2), required=False)
    lines = serializers.ListField(child=serializers.ListField(child=serializers.IntegerField(max_value=9)),
                                  required=False)


def test_each_serializer_judges_with_fields_of_its_own_and_leaves_its_classs_unbound() -> None:
    good, bad = Order(data={"sku": "abc", "tags": ["x"], "lines": [[1]]}), Order(
        data={"sku": "abcd", "tags": ["xyz"], "lines": [[1, 10]]})
    assert good.is_valid(), good.errors
    assert not bad.is_valid()
    assert bad.errors == {"sku": ["Ensure this field has no more than 3 characters."],
                          "tags": {0: ["Ensure this field has no more than 2 characters."]},
                          "lines": {0: {1: ["Ensure this value is less than or equal to 9."]}}}
    assert good.validated_data == {"sku": "abc", "tags": ["x"], "lines": [[1]]}
    for serializer in (good, bad):
        tags, lines = serializer.fields["tags"], serializer.fields["lines"]
        assert tags.parent is serializer
        assert tags.child.parent is tags
        assert lines.child.parent is lines
        assert lines.child.child.parent is lines.child
        assert tags.root is serializer
        assert lines.child.child.root is serializer
    assert good.fields["tags"].child is not bad.fields["tags"].child
    declared = Order._declared_fields  # type: ignore[attr-defined]
    assert all(field.field_name is None and field.source is None for field in declared.values())
    assert declared["tags"].child.parent is declared["tags"]


class Batch(StrictSerializer):
    orders = serializers.ListField(child=Order())  # a nested serializer: copied whole, as DRF does


def test_a_list_of_nested_serializers_is_judged_item_by_item() -> None:
    batch = Batch(data={"orders": [{"sku": "abc"}, {"sku": "abcd"}]})
    assert not batch.is_valid()
    assert batch.errors == {"orders": {1: {"sku": ["Ensure this field has no more than 3 characters."]}}}
    assert batch.fields["orders"].child.root is batch


class Labels(StrictSerializer):
    names = serializers.ListField(child=serializers.CharField(), default=[])  # a default of one list


def test_a_mutable_default_is_each_requests_own() -> None:
    first, second = Labels(data={}), Labels(data={})
    assert first.is_valid()
    assert second.is_valid()
    first.validated_data["names"].append("changed by the first request")
    assert second.validated_data["names"] == []
    assert Labels(data={}).is_valid()
    assert Labels._declared_fields["names"].default == []  # type: ignore[attr-defined]
