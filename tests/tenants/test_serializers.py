"""The API's model serializers: a response's fields built once per class and copied for each
instance, and a writable one still judging related ids in the request's own tenant context."""

from __future__ import annotations

from typing import Any

import pytest

from ductor_project.core.context import tenant_context
from tenants.api import StrictModelSerializer
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
