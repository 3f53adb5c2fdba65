"""Fairness key weights through the API (``/api/v1/fairness-keys``): the rows, the errors, the plan
ceiling, and the fair queue following every committed change (and only those), its loss repaired by
the reconciler; each tenant's weights are its own. And the queue view's shares of worker time per key.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from django.db import transaction

from ductor_project.core.context import no_tenant, tenant_context
from scheduling import services
from scheduling.coordinator.reconcile import reconcile_all
from scheduling.models import FairnessKey
from tenants import services as tenancy
from tenants.models import Tenant
from tests.conftest import api_client, error_code
from tests.scheduling.test_fair_keys import fill, key_of, serve

pytestmark = pytest.mark.usefixtures("redis_client")

URL = "/api/v1/fairness-keys"


def shares(tenant: Tenant, count: int = 80) -> Counter[str]:
    """Which keys ``count`` dispatches of the tenant's backlog (200 items of "gold" and of "tin") went to."""
    fill(tenant, "gold", 200)
    fill(tenant, "tin", 200)
    return Counter(key_of(item) for item in serve({str(tenant.pk): tenant}, count))


def create(client: Any, key: str, weight: Any) -> Any:
    return client.post(URL, {"key": key, "weight": weight}, format="json")


def test_a_key_given_weight_3_through_the_api_gets_3_dispatches_to_1_and_deleted_weighs_1_again(
    transactional_db, make_tenant
):
    tenant, raw = make_tenant("kw-api")
    client = api_client(raw)

    response = create(client, "gold", 3)
    assert response.status_code == 201, response.content
    assert (response.json()["key"], response.json()["weight"]) == ("gold", 3)
    assert shares(tenant) == Counter({"gold": 60, "tin": 20})

    assert client.delete(f"{URL}/{response.json()['id']}").status_code == 204
    served = Counter(key_of(item) for item in serve({str(tenant.pk): tenant}, 80))
    assert abs(served["gold"] - served["tin"]) <= 2, served


def test_a_weight_changed_through_the_api_applies_to_the_next_dispatches(transactional_db, make_tenant):
    tenant, raw = make_tenant("kw-patch")
    client = api_client(raw)
    row = create(client, "gold", 1).json()

    response = client.patch(f"{URL}/{row['id']}", {"weight": 4}, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["weight"] == 4
    assert client.get(f"{URL}/{row['id']}").json()["weight"] == 4
    assert shares(tenant, 100) == Counter({"gold": 80, "tin": 20})


def test_the_list_is_by_key_and_shows_only_the_tenants_own(transactional_db, make_tenant):
    _, raw_a = make_tenant("kw-list-a")
    _, raw_b = make_tenant("kw-list-b")
    for key in ("zinc", "gold"):
        create(api_client(raw_a), key, 2)
    create(api_client(raw_b), "theirs", 5)

    rows = api_client(raw_a).get(URL).json()["results"]

    assert [(row["key"], row["weight"]) for row in rows] == [("gold", 2), ("zinc", 2)]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"key": "gold", "weight": 0}, "weight"),
        ({"key": "gold", "weight": 10_001}, "weight"),
        ({"key": "gold", "weight": "lots"}, "weight"),
        ({"key": "gold", "weight": True}, "weight"),
        ({"key": "gold"}, "weight"),
        ({"key": "", "weight": 2}, "key"),
        ({"key": "x" * 129, "weight": 2}, "key"),
        ({"key": ["gold"], "weight": 2}, "key"),
        ({"weight": 2}, "key"),
        ({"key": "gold", "weight": 2, "colour": "red"}, "colour"),
    ],
)
def test_a_bad_body_is_400_naming_the_field_and_writes_nothing(db, make_tenant, body, field):
    tenant, raw = make_tenant("kw-bad")

    response = api_client(raw).post(URL, body, format="json")

    assert response.status_code == 400, response.content
    assert error_code(response) == ("unknown_field" if field == "colour" else "invalid")
    assert field in response.json()["error"]["details"]
    assert not FairnessKey.all_tenants.filter(tenant=tenant).exists()


def test_a_key_that_has_a_weight_already_is_409_naming_key(db, make_tenant):
    _, raw = make_tenant("kw-twice")
    client = api_client(raw)
    assert create(client, "gold", 2).status_code == 201

    response = create(client, "gold", 3)

    assert (response.status_code, response.json()["error"]["code"]) == (409, "conflict")
    assert list(response.json()["error"]["details"]) == ["key"]


def test_a_patch_that_names_nothing_changes_nothing_and_a_put_needs_the_weight(db, make_tenant):
    _, raw = make_tenant("kw-partial")
    client = api_client(raw)
    row = create(client, "gold", 3).json()

    patched = client.patch(f"{URL}/{row['id']}", {}, format="json")
    assert patched.status_code == 200  # as its schema says: every field of a PATCH is optional
    assert (patched.json()["key"], patched.json()["weight"]) == ("gold", 3)
    put = client.put(f"{URL}/{row['id']}", {}, format="json")
    assert put.status_code == 400
    assert list(put.json()["error"]["details"]) == ["weight"]
    assert client.get(f"{URL}/{row['id']}").json()["weight"] == 3


def test_a_key_is_not_renamed_by_an_update(db, make_tenant):
    _, raw = make_tenant("kw-rename")
    client = api_client(raw)
    row = create(client, "gold", 2).json()

    response = client.patch(f"{URL}/{row['id']}", {"key": "silver", "weight": 2}, format="json")

    assert response.status_code == 400
    assert "key" in response.json()["error"]["details"]
    assert client.get(f"{URL}/{row['id']}").json()["key"] == "gold"


def test_past_the_plans_ceiling_a_create_is_403_and_the_queue_is_not_touched(transactional_db, make_tenant):
    tenant, raw = make_tenant("kw-ceiling")
    tenancy.override_set(tenant=tenant, field="max_fairness_keys", value=3)
    client = api_client(raw)
    for n in range(3):
        assert create(client, f"k{n}", 2).status_code == 201

    response = create(client, "one-too-many", 5)

    assert response.status_code == 403
    assert error_code(response) == "plan_limit_reached"
    fill(tenant, "one-too-many", 100)
    fill(tenant, "plain", 100)
    served = Counter(key_of(item) for item in serve({str(tenant.pk): tenant}, 40))
    assert served == Counter({"one-too-many": 20, "plain": 20})  # still weight 1


def test_a_change_rolled_back_never_reaches_the_queue(transactional_db, make_tenant):
    tenant, _ = make_tenant("kw-rollback")

    class Abort(Exception):
        pass

    def create_then_fail() -> None:
        with tenant_context(tenant), transaction.atomic():
            services.fairness_key_create(key="gold", weight=3)
            raise Abort

    with pytest.raises(Abort):
        create_then_fail()

    assert shares(tenant) == Counter({"gold": 40, "tin": 40})


def test_after_redis_lost_its_data_the_reconciler_writes_the_weights_again(transactional_db, make_tenant,
                                                                          redis_client):
    tenant, raw = make_tenant("kw-lost")
    create(api_client(raw), "gold", 3)
    redis_client.flushdb()

    with no_tenant():
        reconcile_all(full=True)

    assert shares(tenant) == Counter({"gold": 60, "tin": 20})


def test_idor_fairness_key_from_another_tenant_is_404_on_every_verb(db, make_tenant):
    _, raw_a = make_tenant("kw-owner")
    _, raw_b = make_tenant("kw-prober")
    row = create(api_client(raw_a), "gold", 3).json()
    prober = api_client(raw_b)

    answers = [
        prober.get(f"{URL}/{row['id']}").status_code,
        prober.patch(f"{URL}/{row['id']}", {"weight": 9}, format="json").status_code,
        prober.put(f"{URL}/{row['id']}", {"weight": 9}, format="json").status_code,
        prober.delete(f"{URL}/{row['id']}").status_code,
    ]

    assert answers == [404, 404, 404, 404]
    assert api_client(raw_a).get(f"{URL}/{row['id']}").json()["weight"] == 3


def test_one_tenants_key_weight_changes_nothing_of_the_same_key_in_another_tenant(transactional_db, make_tenant):
    a, raw_a = make_tenant("kw-a")
    b, _ = make_tenant("kw-b")
    create(api_client(raw_a), "gold", 3)
    for tenant in (a, b):
        fill(tenant, "gold", 200)
        fill(tenant, "tin", 200)

    served = serve({str(a.pk): a, str(b.pk): b}, 160)  # the two tenants weigh the same: 80 each

    by_tenant = {tenant: Counter(key_of(item) for item in served if item.tenant_id == str(tenant.pk))
                 for tenant in (a, b)}
    assert by_tenant == {a: Counter({"gold": 60, "tin": 20}), b: Counter({"gold": 40, "tin": 40})}


def test_the_queue_view_shows_each_keys_share_of_the_tenants_worker_time_beside_its_fair_share(
    transactional_db, make_tenant
):
    tenant, raw = make_tenant("kw-view")
    create(api_client(raw), "gold", 3)
    fill(tenant, "gold", 100)
    fill(tenant, "tin", 100)
    fill(tenant, "", 100)
    serve({str(tenant.pk): tenant}, 100)  # 60 gold, 20 tin, 20 of no key, 10 ms each

    work = api_client(raw).get("/api/v1/queue").json()["work"]

    keys = {row["key"]: row for row in work["keys"]}
    assert set(keys) == {"gold", "tin", ""}
    assert (keys["gold"]["weight"], keys["tin"]["weight"], keys[""]["weight"]) == (3, 1, 1)
    assert keys["gold"]["share"] == pytest.approx(0.6, abs=0.01)
    assert keys["tin"]["share"] == pytest.approx(0.2, abs=0.01)
    assert keys["gold"]["fair_share"] == pytest.approx(0.6, abs=0.01)
    assert keys[""]["fair_share"] == pytest.approx(0.2, abs=0.01)
    assert work["keys"][0]["key"] == "gold"  # most work first


def test_a_tenant_whose_work_has_no_key_shows_no_keys(transactional_db, make_tenant):
    tenant, raw = make_tenant("kw-none")
    fill(tenant, "", 20)
    serve({str(tenant.pk): tenant}, 20)

    assert api_client(raw).get("/api/v1/queue").json()["work"]["keys"] == []
