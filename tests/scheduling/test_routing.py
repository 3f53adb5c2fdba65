"""The routing pipeline against real PostgreSQL and Redis: rules, tiers, partitions, pools, and the
per-tenant routing cache. How a routed step is admitted (strategies, breakers, limits) is
``test_admission.py``."""

from __future__ import annotations

import json
import pickle
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection as db_connection
from django.db import transaction
from django.test.utils import CaptureQueriesContext

from ductor_project.core.context import current_tenant, tenant_context
from scheduling import routing_table
from scheduling.models import Connection, Pool, PoolMember, Rule
from scheduling.routing import route
from scheduling.rules import Step, matches, validate_action, validate_match
from scheduling.templates import FieldError
from tenants.entitlements import effective_entitlements

STEP = Step(workflow="billing.invoice", action="http.request")


@pytest.fixture
def tenant(redis_client: Any, tenant_a: Any) -> Iterator[Any]:
    with tenant_context(tenant_a[0]) as tenant:
        yield tenant


def conn(name: str, **fields: Any) -> Connection:
    return Connection.objects.create(
        name=name, kind="http", config={"base_url": f"https://{name}.example.com"}, **fields
    )


def pool(
    name: str, members: list[Connection] | list[tuple[Connection, int, int]], *,
    strategy: str = Pool.Strategy.ROUND_ROBIN, is_default: bool = False, **fields: Any,
) -> Pool:
    """A pool; members are connections or (connection, weight, priority)."""
    created = Pool.objects.create(name=name, strategy=strategy, is_default=is_default, **fields)
    for index, member in enumerate(members):
        connection, weight, priority = member if isinstance(member, tuple) else (member, 1, index)
        PoolMember.objects.create(pool=created, connection=connection, weight=weight, priority=priority)
    return created


def rule(priority: int, match: dict[str, Any], action: dict[str, Any], *, enabled: bool = True) -> Rule:
    """A rule, validated the way the API validates it."""
    tiers = effective_entitlements(current_tenant()).allowed_tiers
    return Rule.objects.create(
        name=f"rule-{priority}", priority=priority, enabled=enabled,
        match=validate_match(match), action=validate_action(action, allowed_tiers=tiers),
    )


def routed_rule(step: Step) -> str:
    decision = route(step)
    return decision.rule.name if decision.rule else "default"


# --- rules ----------------------------------------------------------------------------------


def test_the_lowest_priority_matching_rule_wins_whatever_the_creation_order(tenant):
    for name in ("p10", "p20", "p30"):
        pool(name, [])
    rule(30, {}, {"pool": "p30"})
    rule(10, {"workflow": "billing.*"}, {"pool": "p10"})
    rule(20, {}, {"pool": "p20"})
    rule(-5, {"workflow": "other.*"}, {"pool": "p30"})  # first in order, but does not match
    decision = route(STEP)
    assert decision.rule.name == "rule-10"
    assert decision.pool.name == "p10"
    assert decision.trace()["rule"] == {"id": decision.rule.id, "name": "rule-10", "priority": 10}


@pytest.mark.parametrize(
    ("condition", "data", "hit"),
    [
        ({"path": "customer.tier", "op": "eq", "value": "gold"}, {"customer": {"tier": "gold"}}, True),
        ({"path": "customer.tier", "op": "eq", "value": "gold"}, {"customer": {"tier": "silver"}}, False),
        ({"path": "count", "op": "eq", "value": 3}, {"count": 3}, True),
        ({"path": "customer.tier", "op": "ne", "value": "gold"}, {"customer": {"tier": "silver"}}, True),
        ({"path": "customer.tier", "op": "ne", "value": "gold"}, {"customer": {"tier": "gold"}}, False),
        ({"path": "customer.tier", "op": "ne", "value": "gold"}, {}, True),  # missing is "not equal"
        ({"path": "region", "op": "in", "value": ["eu", "uk"]}, {"region": "uk"}, True),
        ({"path": "region", "op": "in", "value": ["eu", "uk"]}, {"region": "us"}, False),
        ({"path": "region", "op": "in", "value": ["eu", "uk"]}, {}, False),
        ({"path": "trace.id", "op": "exists", "value": True}, {"trace": {"id": None}}, True),
        ({"path": "trace.id", "op": "exists", "value": True}, {"trace": {}}, False),
        ({"path": "trace.id", "op": "exists"}, {"trace": {"id": 1}}, True),  # value defaults to true
        ({"path": "trace.id", "op": "exists", "value": False}, {"trace": {}}, True),
        ({"path": "trace.id", "op": "exists", "value": False}, {"trace": {"id": 0}}, False),
        ({"path": "sku", "op": "prefix", "value": "EU-"}, {"sku": "EU-123"}, True),
        ({"path": "sku", "op": "prefix", "value": "EU-"}, {"sku": "US-123"}, False),
        ({"path": "sku", "op": "prefix", "value": "1"}, {"sku": 123}, False),  # not a string
        ({"path": "amount", "op": "gt", "value": 100}, {"amount": 100.5}, True),
        ({"path": "amount", "op": "gt", "value": 100}, {"amount": 100}, False),
        ({"path": "amount", "op": "gt", "value": 0}, {"amount": "5"}, False),  # not a number
        ({"path": "amount", "op": "gt", "value": 0}, {"amount": True}, False),  # a bool is not a number
        ({"path": "amount", "op": "lt", "value": 10}, {"amount": 9}, True),
        ({"path": "amount", "op": "lt", "value": 10}, {"amount": 10}, False),
        ({"path": "amount", "op": "lt", "value": 10}, {}, False),
        ({"path": "items.1.sku", "op": "eq", "value": "b"}, {"items": [{"sku": "a"}, {"sku": "b"}]}, True),
    ],
)
def test_every_condition_operator(tenant, condition, data, hit):
    pool("matched", [])
    rule(1, {"conditions": [condition]}, {"pool": "matched"})
    decision = route(Step(workflow="w", action="a", input=data))
    assert (decision.rule is not None) is hit
    assert (decision.pool.name if decision.pool else None) == ("matched" if hit else None)


def test_all_conditions_of_a_rule_must_hold(tenant):
    rule(1, {"conditions": [{"path": "a", "op": "eq", "value": 1}, {"path": "b", "op": "eq", "value": 2}]},
         {"tier": "batch"})
    assert routed_rule(Step(workflow="w", action="a", input={"a": 1, "b": 2})) == "rule-1"
    assert routed_rule(Step(workflow="w", action="a", input={"a": 1, "b": 3})) == "default"


@pytest.mark.parametrize(
    ("glob", "workflow", "hit"),
    [
        ("billing.*", "billing.invoice", True),
        ("billing.*", "billing", False),
        ("billing.*", "shipping.label", False),
        ("*.invoice", "billing.invoice", True),
        ("billing.invoice", "billing.invoice", True),
        ("billing.invoic?", "billing.invoice", True),
        ("billing.[ij]nvoice", "billing.invoice", True),
        ("billing.[!i]nvoice", "billing.invoice", False),
        ("Billing.*", "billing.invoice", False),  # case-sensitive
    ],
)
def test_workflow_glob(tenant, glob, workflow, hit):
    rule(1, {"workflow": glob}, {"tier": "batch"})
    assert (routed_rule(Step(workflow=workflow, action="a")) == "rule-1") is hit


@pytest.mark.parametrize(
    ("glob", "action", "hit"),
    [("http.*", "http.request", True), ("http.*", "python.call", False), ("*", "anything", True),
     ("http.request", "http.requests", False)],
)
def test_action_glob(tenant, glob, action, hit):
    rule(1, {"action": glob}, {"tier": "batch"})
    assert (routed_rule(Step(workflow="w", action=action)) == "rule-1") is hit


@pytest.mark.parametrize(
    ("tags", "hit"),
    [(("pii", "eu", "extra"), True), (("eu", "pii"), True), (("pii",), False), ((), False)],
)
def test_every_tag_of_the_rule_must_be_on_the_step(tenant, tags, hit):
    rule(1, {"tags": ["pii", "eu"]}, {"tier": "batch"})
    assert (routed_rule(Step(workflow="w", action="a", tags=tags)) == "rule-1") is hit


def test_workflow_action_tags_and_conditions_combine(tenant):
    rule(1, {"workflow": "billing.*", "action": "http.*", "tags": ["eu"],
             "conditions": [{"path": "amount", "op": "gt", "value": 10}]}, {"tier": "batch"})
    full = Step(workflow="billing.x", action="http.request", tags=("eu",), input={"amount": 11})
    assert routed_rule(full) == "rule-1"
    for partial in (
        Step(workflow="shop.x", action="http.request", tags=("eu",), input={"amount": 11}),
        Step(workflow="billing.x", action="python.call", tags=("eu",), input={"amount": 11}),
        Step(workflow="billing.x", action="http.request", tags=(), input={"amount": 11}),
        Step(workflow="billing.x", action="http.request", tags=("eu",), input={"amount": 1}),
    ):
        assert routed_rule(partial) == "default"


def test_an_empty_match_matches_every_step(tenant):
    rule(1, {}, {"tier": "batch"})
    assert routed_rule(Step(workflow="anything", action="at.all")) == "rule-1"


def test_a_deny_rule_refuses_the_step_with_its_reason(tenant):
    pool("main", [conn("c1")], is_default=True)
    rule(1, {"workflow": "billing.*", "tags": ["blocked"]}, {"deny": "billing is frozen"})
    denied = route(Step(workflow="billing.invoice", action="http.request", tags=("blocked",)))
    assert denied.allowed is False
    assert "billing is frozen" in denied.reason
    assert denied.pool is None
    assert denied.trace()["allowed"] is False
    assert denied.trace()["connection"] is None
    assert route(STEP).allowed is True  # not tagged: falls through to the default pool


def test_the_default_pool_takes_steps_no_rule_matches(tenant):
    c1 = conn("c1")
    pool("main", [c1], is_default=True)
    pool("other", [conn("c2")])
    rule(1, {"workflow": "shipping.*"}, {"pool": "other"})
    decision = route(STEP)
    assert decision.allowed is True
    assert decision.rule is None
    assert decision.pool.name == "main"
    assert [m.connection_id for m in decision.pool.members] == [str(c1.id)]
    assert "tenant default" in decision.reason
    assert decision.trace()["rule"] == "default"


def test_without_a_default_pool_a_step_routes_to_no_pool(tenant):
    pool("other", [conn("c1")])
    decision = route(STEP)
    assert decision.allowed is True
    assert decision.pool is None
    assert decision.trace()["candidates"] == []
    assert "no pool" in decision.reason


def test_a_rule_without_a_pool_still_uses_the_default_pool(tenant):
    pool("main", [conn("c1")], is_default=True)
    rule(1, {}, {"tier": "batch"})
    decision = route(STEP)
    assert decision.rule.name == "rule-1"
    assert decision.tier == "batch"
    assert decision.pool.name == "main"


def test_the_steps_pool_hint_is_used_when_no_rule_names_a_pool(tenant):
    pool("main", [conn("c1")], is_default=True)
    pool("hinted", [conn("c2")])
    assert route(Step(workflow="w", action="a", pool="hinted")).pool.name == "hinted"
    rule(1, {}, {"pool": "main"})
    assert route(Step(workflow="w", action="a", pool="hinted")).pool.name == "main"  # the rule wins


def test_a_rule_naming_a_deleted_pool_refuses_the_step(tenant):
    gone = pool("gone", [])
    rule(1, {}, {"pool": "gone"})
    gone.delete()
    decision = route(STEP)
    assert decision.allowed is False
    assert "'gone'" in decision.reason


def test_disabled_rules_are_skipped(tenant):
    pool("p1", [])
    pool("p2", [])
    first = rule(1, {}, {"pool": "p1"}, enabled=False)
    rule(2, {}, {"pool": "p2"})
    assert route(STEP).pool.name == "p2"
    first.enabled = True
    first.save()
    assert route(STEP).pool.name == "p1"


def test_a_disabled_deny_rule_denies_nothing(tenant):
    rule(1, {}, {"deny": "closed"}, enabled=False)
    assert route(STEP).allowed is True


def test_the_tier_comes_from_the_rule_then_the_step_then_standard(tenant):
    rule(1, {"workflow": "batchy.*"}, {"tier": "batch"})
    assert route(Step(workflow="batchy.x", action="a", tier="interactive")).tier == "batch"
    assert route(Step(workflow="w", action="a", tier="interactive")).tier == "interactive"
    assert route(Step(workflow="w", action="a")).tier == "standard"


def test_the_free_plan_refuses_the_interactive_tier(make_tenant, redis_client):
    free, _ = make_tenant("free-tenant", plan="free")
    with tenant_context(free):
        decision = route(Step(workflow="w", action="a", tier="interactive"))
        assert decision.allowed is False
        assert "interactive" in decision.reason
        assert "free" in decision.reason
        assert route(Step(workflow="w", action="a", tier="batch")).allowed is True
        with pytest.raises(FieldError) as caught:
            rule(1, {}, {"tier": "interactive"})
        assert caught.value.field == "action.tier"
        # A rule stored while the plan allowed the tier does not outlive a downgrade.
        Rule.objects.create(name="old", priority=1, match={}, action={"tier": "interactive"})
        decision = route(Step(workflow="w", action="a"))
        assert decision.allowed is False
        assert decision.rule.name == "old"


def test_the_enterprise_plan_allows_the_interactive_tier(tenant):
    rule(1, {}, {"tier": "interactive"})
    decision = route(STEP)
    assert (decision.allowed, decision.tier) == (True, "interactive")


def test_the_partition_key_template_is_rendered_from_the_step(tenant):
    rule(1, {"workflow": "billing.*"}, {"partition_key": "{workflow}/{action}/cust-{input.customer.id}"})
    rule(2, {}, {"partition_key": "region-{input.region}-{input.missing}"})
    step = Step(workflow="billing.invoice", action="http.request", input={"customer": {"id": 42}})
    assert route(step).partition_key == "billing.invoice/http.request/cust-42"
    assert route(Step(workflow="w", action="a", input={"region": "eu"})).partition_key == "region-eu-"
    assert route(Step(workflow="w", action="a", input={"region": "eu"})).trace()["partition_key"] == (
        "region-eu-"
    )


def test_no_partition_key_without_a_template(tenant):
    assert route(STEP).partition_key is None


@pytest.mark.parametrize(
    ("match", "field"),
    [
        ("not an object", "match"),
        ({"labels": ["x"]}, "match.labels"),
        ({"workflow": "bad glob with spaces"}, "match.workflow"),
        ({"workflow": "a[b"}, "match.workflow"),
        ({"action": ""}, "match.action"),
        ({"action": 5}, "match.action"),
        ({"tags": "pii"}, "match.tags"),
        ({"tags": [""]}, "match.tags[0]"),
        ({"conditions": {}}, "match.conditions"),
        ({"conditions": [{"path": "a", "op": "eq", "value": 1}] * 21}, "match.conditions"),
        ({"conditions": ["x"]}, "match.conditions[0]"),
        ({"conditions": [{"path": "a", "op": "regex", "value": ".*"}]}, "match.conditions[0].op"),
        ({"conditions": [{"path": "a", "op": "eq", "value": 1}, {"path": "__import__('os')", "op": "eq",
                                                                  "value": 1}]}, "match.conditions[1].path"),
        ({"conditions": [{"path": "a..b", "op": "eq", "value": 1}]}, "match.conditions[0].path"),
        ({"conditions": [{"path": "a", "op": "eq"}]}, "match.conditions[0].value"),
        ({"conditions": [{"path": "a", "op": "in", "value": "x"}]}, "match.conditions[0].value"),
        ({"conditions": [{"path": "a", "op": "gt", "value": "10"}]}, "match.conditions[0].value"),
        ({"conditions": [{"path": "a", "op": "lt", "value": True}]}, "match.conditions[0].value"),
        ({"conditions": [{"path": "a", "op": "prefix", "value": 1}]}, "match.conditions[0].value"),
        ({"conditions": [{"path": "a", "op": "exists", "value": "yes"}]}, "match.conditions[0].value"),
        ({"conditions": [{"path": "a", "op": "eq", "value": 1, "extra": 1}]}, "match.conditions[0].extra"),
    ],
)
def test_invalid_matches_name_the_field(match, field):
    with pytest.raises(FieldError) as caught:
        validate_match(match)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


@pytest.mark.parametrize(
    ("action", "field"),
    [
        ({}, "action"),
        ([], "action"),
        ({"queue": "x"}, "action.queue"),
        ({"deny": "no", "pool": "p"}, "action.deny"),
        ({"deny": "  "}, "action.deny"),
        ({"pool": ""}, "action.pool"),
        ({"tier": "platinum"}, "action.tier"),
        ({"partition_key": ""}, "action.partition_key"),
        ({"partition_key": "x" * 201}, "action.partition_key"),
        ({"partition_key": "{tenant}"}, "action.partition_key"),
        ({"partition_key": "{input.a-b}"}, "action.partition_key"),
        ({"partition_key": "{input.}"}, "action.partition_key"),
    ],
)
def test_invalid_actions_name_the_field(action, field):
    with pytest.raises(FieldError) as caught:
        validate_action(action, allowed_tiers=("standard", "batch"))
    assert caught.value.field == field


def test_validation_normalizes_what_it_accepts():
    match = validate_match({"tags": ["b", "a", "b"], "conditions": [{"path": "x", "op": "exists"}]})
    # A path without its root is the deprecated form of a path into the step's input.
    assert match == {"tags": ["a", "b"], "conditions": [{"path": "input.x", "op": "exists", "value": True}]}
    assert validate_action({"deny": "  closed  "}, allowed_tiers=()) == {"deny": "closed"}
    assert matches(match, Step(workflow="w", action="a", tags=("a", "b"), input={"x": 1}))


# --- cache isolation and invalidation ---------------------------------------------------------


def test_tenants_with_a_pool_of_the_same_name_each_route_only_to_their_own(tenant_a, tenant_b, redis_client):
    own: dict[str, set[str]] = {}
    for label, (t, _) in (("a", tenant_a), ("b", tenant_b)):
        with tenant_context(t):
            members = [conn(f"{label}-1"), conn(f"{label}-2")]
            pool("main", members, is_default=True)
            rule(1, {"workflow": "billing.*"}, {"pool": "main"})
            own[label] = {str(c.id) for c in members}
    assert not own["a"] & own["b"]
    for _ in range(20):  # interleaved, so both tenants' tables are warm in this process at once
        for label, (t, _) in (("a", tenant_a), ("b", tenant_b)):
            with tenant_context(t):
                decision = route(STEP)
                assert {m.connection_id for m in decision.pool.members} == own[label]
                assert {c["connection_id"] for c in decision.trace()["candidates"]} == own[label]


def test_an_edited_rule_takes_effect_on_the_very_next_route(tenant):
    pool("p1", [conn("c1")])
    pool("p2", [conn("c2")])
    edited = rule(1, {}, {"pool": "p1"})
    assert route(STEP).pool.name == "p1"
    assert route(STEP).pool.name == "p1"  # warm
    edited.action = {"pool": "p2"}
    edited.save()
    assert route(STEP).pool.name == "p2"


def test_another_process_sees_the_edit_too(tenant):
    """``forget_local`` drops this process's copy: the next route reads the shared cache (or PG)."""
    pool("p1", [conn("c1")])
    pool("p2", [conn("c2")])
    edited = rule(1, {}, {"pool": "p1"})
    assert route(STEP).pool.name == "p1"
    routing_table.forget_local()
    assert route(STEP).pool.name == "p1"
    edited.action = {"pool": "p2"}
    edited.save()
    routing_table.forget_local()
    assert route(STEP).pool.name == "p2"  # built from PostgreSQL for the new version
    routing_table.forget_local()
    with CaptureQueriesContext(db_connection) as queries:
        assert route(STEP).pool.name == "p2"  # a fresh process: from the shared cache, not PostgreSQL
    assert len(queries) == 0


def test_the_shared_cache_holds_the_table_as_json_which_reads_back_as_the_same_table(tenant, redis_client):
    """JSON, never a pickle: whoever can write to the cache's Redis must not get code run by its readers."""
    from django.core.cache import cache

    pool("p1", [conn("c1"), conn("c2")], is_default=True)
    rule(1, {"workflow": "billing.*", "conditions": [{"path": "input.tier", "op": "eq", "value": "gold"}]},
         {"pool": "p1", "tier": "batch"})
    routing_table.forget_local()
    table = routing_table.routing_table()

    stored = redis_client.get(cache.make_key(routing_table.table_key()))
    assert json.loads(stored) == json.loads(json.dumps(table.as_json()))
    assert routing_table.RoutingTable.from_json(json.loads(json.dumps(table.as_json()))) == table
    assert routing_table.RoutingTable.from_json({"version": table.version}) is None


def test_a_routing_version_an_earlier_ductor_cached_as_a_pickle_is_not_read(tenant, redis_client):
    """Its key under the cache's version 1: read as JSON it was missing, and cache.add could not
    replace it, so every process took the routing version to be "None" until an edit."""
    from django.core.cache import cache

    redis_client.set(cache.make_key(routing_table._version_key(), version=1), pickle.dumps("from-pickles"))

    version = routing_table.current_version()

    assert version not in ("None", "from-pickles")
    assert routing_table.current_version() == version


def test_a_tenant_keeps_one_routing_table_in_the_shared_cache_however_often_it_edits(tenant, redis_client):
    """Every edit gives the tenant a new routing version; the table of each was kept under a key of
    its own for a day, so that a tenant editing a large table in a loop filled Redis, which every
    tenant's work needs, at its API rate. One entry per tenant now holds the table of one version."""
    from django.core.cache import cache

    pool("p1", [conn("c1")])
    pool("p2", [conn("c2")])
    edited = rule(1, {}, {"pool": "p1"})
    for name in ["p2", "p1"] * 10:
        edited.action = {"pool": name}
        edited.save()
        routing_table.forget_local()
        assert route(STEP).pool.name == name
    pattern = cache.make_key("routing:table") + "*"
    assert [key.decode() for key in redis_client.scan_iter(pattern)] == [cache.make_key("routing:table")]


def test_created_and_deleted_routing_rows_take_effect_at_once(tenant):
    c1, c2 = conn("c1"), conn("c2")
    main = pool("main", [c1], is_default=True)

    def candidates() -> list[str]:
        return [c["name"] for c in route(STEP).trace()["candidates"]]

    assert candidates() == ["c1"]
    PoolMember.objects.create(pool=main, connection=c2, priority=5)
    assert candidates() == ["c1", "c2"]
    c1.delete()
    assert candidates() == ["c2"]
    rule(1, {}, {"deny": "maintenance"})
    assert route(STEP).allowed is False
    Rule.objects.get(priority=1).delete()
    assert route(STEP).allowed is True


def test_a_warm_route_does_not_query_postgresql(tenant, django_assert_num_queries):
    pool("main", [conn("c1"), conn("c2")], strategy=Pool.Strategy.ROUND_ROBIN, is_default=True)
    for priority in range(1, 51):
        rule(priority, {"workflow": f"other{priority}.*"}, {"tier": "batch"})
    route(STEP)
    with django_assert_num_queries(0):
        for _ in range(20):
            decision = route(STEP)
    assert decision.pool is not None
    assert decision.pool.name == "main"


@pytest.mark.django_db(transaction=True)
def test_a_table_read_by_another_process_during_the_edit_is_not_served_after_commit(make_tenant):
    """The version is bumped at save and again at commit: a table built from the pre-commit rows
    under the first bump is never used once the edit is committed."""
    from ductor_project.core.redis import get_redis

    get_redis().flushdb()
    tenant, _ = make_tenant("mid-edit")
    with tenant_context(tenant):
        pool("p1", [conn("c1")])
        pool("p2", [conn("c2")])
        edited = rule(1, {}, {"pool": "p1"})
        assert route(STEP).pool.name == "p1"
        seen_by_other: list[str] = []

        def other_process() -> None:
            try:
                with tenant_context(tenant):
                    seen_by_other.append(route(STEP).pool.name)  # own DB connection: sees committed rows
            finally:
                db_connection.close()

        with transaction.atomic():
            edited.action = {"pool": "p2"}
            edited.save()
            worker = threading.Thread(target=other_process)
            worker.start()
            worker.join(30)
        assert seen_by_other == ["p1"]  # it read the old committed rule, under the new version
        assert route(STEP).pool.name == "p2"
