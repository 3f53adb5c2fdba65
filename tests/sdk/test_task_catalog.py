"""The task catalog through the SDK: the platform manages it, a tenant lists what it may call, and a
compiled ``task`` node validates on the server like one written by hand."""

from __future__ import annotations

import pytest
from ductor_sdk import BadRequest, Client, Conflict, Input, NotFound, Retry, Workflow

pytestmark = pytest.mark.django_db(transaction=True)

CHARGE = "billing.tasks.charge"
REFUND = "billing.tasks.refund"
ORDER_SCHEMA = {"type": "object", "required": ["order"]}


def test_the_catalog_decides_which_tasks_each_tenant_sees(platform: Client, sdk: Client, connect, make_tenant) -> None:
    catalog = platform.platform.task_catalog
    charge = catalog.create(CHARGE, queue="billing", input_schema=ORDER_SCHEMA, plans=["enterprise"],
                            description="Charge an order")
    catalog.create(REFUND, plans=["pro"])
    free = connect(make_tenant("sdk-free", plan="free")[1])

    assert (charge.plans, charge.enabled, charge.arguments) == (("enterprise",), True, "kwargs")
    assert [task.name for task in sdk.tasks.list()] == [CHARGE]
    assert sdk.tasks.get(CHARGE).input_schema == ORDER_SCHEMA
    assert "plans" not in sdk.tasks.get(CHARGE).raw  # a tenant does not see who else may call it
    assert free.tasks.list() == []
    with pytest.raises(NotFound):
        free.tasks.get(CHARGE)

    assert catalog.update(REFUND, tenants=["sdk-free"]).tenants == ("sdk-free",)
    assert [task.name for task in free.tasks.list()] == [REFUND]
    assert [entry.name for entry in catalog.list()] == [CHARGE, REFUND]
    catalog.delete(REFUND)
    with pytest.raises(NotFound):
        catalog.get(REFUND)


def test_the_catalog_refuses_a_taken_name_and_an_internal_task(platform: Client) -> None:
    catalog = platform.platform.task_catalog
    catalog.create(CHARGE)

    with pytest.raises(Conflict) as taken:
        catalog.create(CHARGE)
    with pytest.raises(BadRequest) as internal:
        catalog.create("ductor.tick")

    assert taken.value.field == "name"
    assert (internal.value.code, internal.value.field) == ("invalid", "name")


def test_a_task_node_in_the_catalog_applies_once_and_one_outside_is_refused_as_by_hand(
    platform: Client, sdk: Client
) -> None:
    platform.platform.task_catalog.create(CHARGE, queue="billing", input_schema=ORDER_SCHEMA)
    wf = Workflow("billing")
    charge = wf.task("charge", task=CHARGE, input={"order": Input["order_id"]}, retry=Retry(max_attempts=3),
                     timeout_s=60)
    wf.action("notify", "echo", depends_on=[charge], input={"charge": charge.output})
    bad = Workflow("bad")
    bad.task("charge", task="billing.tasks.nope")
    bad.task("literal", task=CHARGE, input={"amount": 3})
    by_hand = {"nodes": [
        {"id": "charge", "type": "task", "task": "billing.tasks.nope"},
        {"id": "literal", "type": "task", "task": CHARGE, "input": {"amount": 3}},
    ]}

    assert sdk.workflows.apply(wf).outcome == "created"
    assert sdk.workflows.apply(wf).outcome == "unchanged"
    assert sdk.workflows.get("billing").spec["nodes"][0]["task"] == CHARGE
    with pytest.raises(BadRequest) as compiled:
        sdk.workflows.apply(bad)
    with pytest.raises(BadRequest) as written:
        sdk.workflows.create("bad", by_hand)

    assert (compiled.value.message, compiled.value.details) == (written.value.message, written.value.details)
    assert compiled.value.details["spec.nodes[0].task"] == [
        "node 'charge': task: task 'billing.tasks.nope' is not in the task catalog (GET /api/v1/tasks lists those "
        "this tenant may call)"]
    assert any(name.startswith("spec.nodes[1].input") for name in compiled.value.fields)
