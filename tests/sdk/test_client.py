"""The SDK client against a live server: CRUD, errors, tenant isolation, pagination, runs, platform.

Runs finish without workers when every node is skipped (a false ``when``): the
start's inline tick skips them and succeeds the run with its output. A run with
an ``echo`` step waits in the fair queue, as no worker runs here.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from ductor_sdk import (
    AsyncClient,
    AuthenticationError,
    BadRequest,
    Client,
    Conflict,
    Input,
    NotFound,
    PermissionDenied,
    WaitTimeout,
    Workflow,
)
from ductor_sdk.models import LineageNode

from tests.workflows.inline import run_items

pytestmark = pytest.mark.django_db(transaction=True)


def finishing(name: str = "greet", nodes: int = 1) -> Workflow:
    """A workflow whose nodes are all skipped unless ``input.loud``: its runs succeed inline."""
    wf = Workflow(name, description="says hello, quietly")
    for index in range(nodes):
        wf.action(f"say_{index}", "echo", input={"to": Input["name"]}, when=Input["loud"].eq(True))
    wf.output({"name": Input["name"], "said": wf.input["loud"]})
    return wf


def waiting(name: str = "slow") -> Workflow:
    """A workflow whose ``echo`` step waits for a worker."""
    wf = Workflow(name)
    wf.action("say", "echo", input={"to": Input["name"]})
    return wf


# --- the tenant, keys and errors -------------------------------------------------------------


def test_the_tenant_and_its_entitlements_are_the_key_s(sdk: Client) -> None:
    tenant = sdk.tenant.get()
    entitlements = sdk.entitlements.get()

    assert (tenant.slug, tenant.status, tenant.plan) == ("sdk-a", "active", "enterprise")
    assert tenant.created_at is not None
    assert tenant.created_at.tzinfo is not None
    assert entitlements.tenant == "sdk-a"
    assert entitlements.limits["plan"] == "enterprise"
    assert "runs_this_month" in entitlements.usage


def test_an_api_key_is_shown_once_works_and_once_revoked_is_refused(sdk: Client, connect) -> None:
    created = sdk.api_keys.create("ci", scopes=["read"])
    ci = connect(created.api_key)

    assert created.api_key.startswith("dct_")
    assert created.scopes == ("read",)
    assert ci.tenant.get().slug == "sdk-a"
    assert sdk.api_keys.get(created.id).name == "ci"
    assert "api_key" not in sdk.api_keys.get(created.id).raw
    with pytest.raises(PermissionDenied) as denied:
        ci.api_keys.create("more")
    assert denied.value.code == "insufficient_scope"

    assert sdk.api_keys.revoke(created.id).state == "revoked"
    assert sdk.api_keys.revoke(created.id).state == "revoked"  # idempotent
    with pytest.raises(AuthenticationError) as refused:
        ci.tenant.get()
    assert (refused.value.status, refused.value.code) == (401, "api_key_revoked")


def test_a_bad_key_is_an_authentication_error(connect) -> None:
    with pytest.raises(AuthenticationError) as refused:
        connect("dct_nope_nope").tenant.get()
    assert refused.value.code == "invalid_api_key"


def test_an_invalid_field_is_a_bad_request_naming_the_field(sdk: Client) -> None:
    sdk.workflows.apply(finishing())

    with pytest.raises(BadRequest) as invalid:
        sdk.runs.start("greet", {"name": "Ada"}, tier="turbo")
    conn = sdk.connections.create("crm", "http", config={"base_url": "https://crm.example.com"})
    with pytest.raises(BadRequest) as unknown:
        sdk.connections.update(conn.id, colour="red")

    assert (invalid.value.status, invalid.value.code, invalid.value.field) == (400, "invalid", "tier")
    assert "tier" in invalid.value.message
    assert (unknown.value.code, unknown.value.field, unknown.value.fields) == ("unknown_field", "colour", ("colour",))
    assert unknown.value.details == {"colour": ["Unknown field."]}


def test_a_lone_surrogate_in_an_input_is_a_bad_request_naming_the_field(sdk: Client) -> None:
    """A name ``os.listdir`` decoded with ``surrogateescape`` cannot be UTF-8: it is sent escaped, and
    the server names it, rather than the SDK raising ``UnicodeEncodeError``."""
    sdk.workflows.apply(finishing())
    name = b"report-\xff.csv".decode("utf-8", "surrogateescape")

    with pytest.raises(BadRequest) as refused:
        sdk.runs.start("greet", {"name": name, "city": "Zürich"})

    assert (refused.value.code, refused.value.field) == ("invalid", "input.name")
    assert "U+DCFF" in refused.value.message
    assert list(sdk.runs.iter()) == []


def test_a_start_of_an_unknown_workflow_or_version_is_not_found_naming_the_field(sdk: Client) -> None:
    sdk.workflows.apply(finishing())

    with pytest.raises(NotFound) as no_workflow:
        sdk.runs.start("greeet", {"name": "Ada"})
    with pytest.raises(NotFound) as no_version:
        sdk.runs.start("greet", {"name": "Ada"}, version=9)

    assert (no_workflow.value.code, no_workflow.value.field, no_workflow.value.fields) == (
        "not_found", "workflow", ("workflow",))
    assert (no_version.value.code, no_version.value.field) == ("not_found", "version")


def test_a_taken_name_is_a_conflict_naming_the_field(sdk: Client) -> None:
    with pytest.raises(Conflict) as taken:
        sdk.api_keys.create("test")  # make_tenant's key is named "test"
    assert (taken.value.status, taken.value.code, taken.value.field) == (409, "conflict", "name")


# --- tenant isolation ------------------------------------------------------------------------


def test_idor_run_of_another_tenant_is_not_found_on_every_verb(sdk: Client, other: Client) -> None:
    other.workflows.apply(finishing())
    theirs = other.runs.start("greet", {"name": "Bo"})
    sdk.workflows.apply(finishing())
    ours = sdk.runs.start("greet", {"name": "Ada"})

    for verb in (sdk.runs.get, sdk.runs.cancel, sdk.runs.events, sdk.runs.steps, sdk.runs.lineage, sdk.runs.why,
                 sdk.runs.retry, sdk.runs.rerun):
        with pytest.raises(NotFound) as hidden:
            verb(theirs.id)
        assert (hidden.value.status, hidden.value.code) == (404, "not_found")
    assert [run.id for run in sdk.runs.iter()] == [ours.id]
    assert other.runs.get(theirs.id).status == "succeeded"


def test_a_run_started_under_a_fairness_key_keeps_it(sdk: Client) -> None:
    sdk.workflows.apply(finishing())

    run = sdk.runs.start("greet", {"name": "Ada"}, fairness_key="customer-7")

    assert run.fairness_key == "customer-7"
    assert sdk.runs.get(run.id).fairness_key == "customer-7"


def test_why_names_what_holds_a_waiting_step(sdk: Client) -> None:
    wf = Workflow("napper")
    wf.sleep("nap", duration_s=600)
    sdk.workflows.apply(wf)
    run = sdk.runs.start("napper", {})

    why = sdk.runs.why(run.id)

    assert (why.run_id, why.status) == (run.id, "running")
    [waiting] = why.waiting
    assert (waiting.node_id, waiting.status, waiting.cause) == ("nap", "scheduled", "not_due")
    assert waiting.until is not None
    assert waiting.until > datetime.now(UTC)
    sdk.workflows.apply(finishing())
    assert sdk.runs.why(sdk.runs.start("greet", {"name": "Ada"}).id).waiting == ()  # it ended inline


def test_a_failed_run_is_retried_where_it_failed_and_rerun_as_a_new_run(sdk: Client) -> None:
    wf = Workflow("parent")
    wf.subworkflow("kid", workflow="later")  # no such workflow yet: the node is refused, the run fails at once
    sdk.workflows.apply(wf)
    run = sdk.runs.start("parent", {"order": 1})
    assert run.status == "failed"
    sdk.workflows.apply(finishing("later"))

    retried = sdk.runs.retry(run.id)
    rerun = sdk.runs.rerun(run.id, {"order": 2}, idempotency_key="rerun-1")
    again = sdk.runs.rerun(run.id, {"order": 2}, idempotency_key="rerun-1")
    with pytest.raises(Conflict) as reused:
        sdk.runs.rerun(run.id, {"order": 3}, idempotency_key="rerun-1")
    assert (reused.value.code, reused.value.field) == ("idempotency_key_reused", "idempotency_key")

    assert (retried.id, retried.status, retried.error) == (run.id, "running", None)
    assert [(s.node_id, s.attempt, s.status) for s in sdk.runs.iter_steps(run.id)] == [
        ("kid", 1, "failed"), ("kid", 2, "waiting")]
    assert (rerun.rerun_of, rerun.input, rerun.version) == (run.id, {"order": 2}, 1)
    assert (rerun.created, again.created, again.id, again.input) == (True, False, rerun.id, {"order": 2})
    with pytest.raises(Conflict) as refused:
        sdk.runs.retry(run.id)
    assert refused.value.status == 409


def test_retry_many_retries_the_matching_failed_runs_a_batch_at_a_time(sdk: Client, other: Client) -> None:
    for client in (sdk, other):
        wf = Workflow("parent")
        wf.subworkflow("kid", workflow="later")  # no such workflow yet: each run fails at once
        client.workflows.apply(wf)
    acme = [sdk.runs.start("parent", {"order": n}, fairness_key="acme").id for n in range(3)]
    globex = sdk.runs.start("parent", {"order": 9}, fairness_key="globex").id
    theirs = other.runs.start("parent", {"order": 1}, fairness_key="acme").id
    sdk.workflows.apply(finishing("later"))

    first = sdk.runs.retry_many(fairness_key="acme", limit=2)
    rest = sdk.runs.retry_many(fairness_key="acme", limit=2)
    with pytest.raises(BadRequest) as unfiltered:
        sdk.runs.retry_many()

    assert (first.retried, first.runs, first.more) == (2, tuple(acme[:2]), True)
    assert (rest.retried, rest.runs, rest.more) == (1, tuple(acme[2:]), False)
    assert sdk.runs.retry_many(ids=acme).retried == 0  # none failed any more
    assert unfiltered.value.field == "ids"
    assert [sdk.runs.get(run_id).status for run_id in acme] == ["running"] * 3
    assert sdk.runs.get(globex).status == "failed"
    assert other.runs.get(theirs).status == "failed"


def test_idor_api_key_and_workflow_of_another_tenant_are_not_found(sdk: Client, other: Client) -> None:
    other.workflows.apply(finishing("theirs"))
    their_key = other.api_keys.list().items[0]

    with pytest.raises(NotFound):
        sdk.api_keys.revoke(their_key.id)
    with pytest.raises(NotFound):
        sdk.workflows.get("theirs")
    with pytest.raises(NotFound):
        sdk.runs.start("theirs", {})
    assert other.api_keys.get(their_key.id).state == "active"


def test_a_workflow_is_archived_listed_apart_unarchived_and_deleted_once_it_has_no_run(
    sdk: Client, other: Client
) -> None:
    sdk.workflows.apply(finishing("kept"))
    sdk.workflows.apply(finishing("draft"))
    sdk.runs.start("kept", {"name": "x"})

    archived = sdk.workflows.archive("kept")

    assert archived.archived_at is not None
    assert [w.name for w in sdk.workflows.list().items] == ["draft"]
    assert [w.name for w in sdk.workflows.iter(archived=True)] == ["kept"]
    with pytest.raises(Conflict) as refused:
        sdk.runs.start("kept", {})
    assert refused.value.fields == ("workflow",)
    with pytest.raises(Conflict) as has_runs:
        sdk.workflows.delete("kept")
    assert has_runs.value.fields == ("runs",)
    for verb in (other.workflows.archive, other.workflows.unarchive, other.workflows.delete):
        with pytest.raises(NotFound):
            verb("kept")
    assert sdk.workflows.unarchive("kept").archived_at is None
    assert sdk.runs.start("kept", {"name": "y"}).workflow_name == "kept"

    sdk.workflows.delete("draft")
    with pytest.raises(NotFound):
        sdk.workflows.get("draft")


def test_a_create_or_an_update_with_if_version_adds_a_version_only_while_that_is_the_latest(
    sdk: Client, server_url: str, make_tenant: Any
) -> None:
    spec = finishing("kept").to_spec()
    _, key = make_tenant("sdk-async-if-version")

    created = sdk.workflows.create("kept", spec, if_version=0)
    with pytest.raises(Conflict) as second_create:
        sdk.workflows.create("kept", spec, if_version=0)
    updated = sdk.workflows.update("kept", spec, if_version=1)
    with pytest.raises(Conflict) as stale_update:
        sdk.workflows.update("kept", spec, if_version=1)

    async def scenario() -> tuple[int, str | None]:
        async with AsyncClient(server_url, key) as client:
            await client.workflows.create("kept", spec, if_version=0)
            try:
                await client.workflows.update("kept", spec, if_version=0)
            except Conflict as exc:
                return (await client.workflows.get("kept")).latest_version, exc.field
            return 0, None

    assert (created.latest_version, updated.latest_version) == (1, 2)
    assert (second_create.value.field, stale_update.value.field) == ("if_version", "if_version")
    assert sdk.workflows.get("kept").latest_version == 2
    assert asyncio.run(scenario()) == (1, "if_version")


def test_the_async_client_archives_unarchives_and_deletes_a_workflow(server_url: str, make_tenant) -> None:
    _, key = make_tenant("sdk-async-archive")

    async def scenario() -> tuple[bool, list[str], bool, str]:
        async with AsyncClient(server_url, key) as client:
            await client.workflows.apply(finishing("a"))
            archived = (await client.workflows.archive("a")).archived_at is not None
            listed = [w.name async for w in client.workflows.iter(archived=True)]
            active = (await client.workflows.unarchive("a")).archived_at is None
            await client.workflows.delete("a")
            try:
                await client.workflows.get("a")
            except NotFound as exc:
                return archived, listed, active, exc.code
            return archived, listed, active, ""

    assert asyncio.run(scenario()) == (True, ["a"], True, "not_found")


# --- routing resources -----------------------------------------------------------------------


def test_connections_pools_and_rules_are_created_changed_listed_explained_and_deleted(sdk: Client) -> None:
    conn = sdk.connections.create("crm", "http", config={"base_url": "https://crm.example.com"}, secret="s3cret",
                                  max_concurrency=4)
    conn = sdk.connections.update(conn.id, max_concurrency=8)
    pool = sdk.pools.create("main", members=["crm"])
    pool = sdk.pools.update(pool.id, members=[{"connection": conn.id, "weight": 3}])
    rule = sdk.rules.create("vip", priority=10, match={"tags": ["vip"]}, action={"pool": "main"})

    explained = sdk.routing.explain("order", "http.request", tags=["vip"])

    assert (conn.kind, conn.has_secret, conn.max_concurrency) == ("http", True, 8)
    assert "secret" not in conn.raw
    assert sdk.connections.rotate_secret(conn.id, "n3w").has_secret
    assert [(m.connection_name, m.weight) for m in pool.members] == [("crm", 3)]
    assert explained.allowed
    assert explained.pool is not None
    assert explained.pool["name"] == "main"
    assert explained.rule["name"] == "vip"
    assert [c["name"] for c in explained.candidates] == ["crm"]
    assert sdk.rules.update(rule.id, enabled=False).enabled is False
    assert [p.name for p in sdk.pools.iter()] == ["main"]
    assert sdk.queue.stats().backlog == 0

    sdk.rules.delete(rule.id)
    sdk.pools.delete(pool.id)
    sdk.connections.delete(conn.id)
    for get, key in ((sdk.rules.get, rule.id), (sdk.pools.get, pool.id), (sdk.connections.get, conn.id)):
        with pytest.raises(NotFound):
            get(key)


def test_a_routing_explanation_carries_the_fairness_key_its_rule_renders(sdk: Client) -> None:
    sdk.rules.create("per-customer", priority=10, match={"tags": ["vip"]},
                     action={"fairness_key": "{{ $input.customer_id }}"})

    explained = sdk.routing.explain("order", "http.request", tags=["vip"], input={"customer_id": "c-42"})

    assert explained.fairness_key == "c-42"


# --- runs ------------------------------------------------------------------------------------


def test_a_start_with_the_same_idempotency_key_starts_one_run(sdk: Client) -> None:
    sdk.workflows.apply(finishing())

    first = sdk.runs.start("greet", {"name": "Ada"}, idempotency_key="order-1", tags=["web"])
    again = sdk.runs.start("greet", {"name": "Ada"}, idempotency_key="order-1")
    # Options other than the workflow, its input and its version are not compared: the first run's stand.
    other_options = sdk.runs.start("greet", {"name": "Ada"}, idempotency_key="order-1", tags=["batch"],
                                   fairness_key="customer-7", version=1)
    for different in ({"input": {"name": "Someone else"}}, {"workflow": "another"}, {"version": 2}):
        start: dict[str, Any] = {"workflow": "greet", "input": {"name": "Ada"}, **different}
        with pytest.raises(Conflict) as reused:  # the key again, for another start: the client's bug, not the run
            sdk.runs.start(start["workflow"], start["input"], idempotency_key="order-1", version=start.get("version"))
        assert (reused.value.code, reused.value.field) == ("idempotency_key_reused", "idempotency_key")
    keyed_by_sdk = sdk.runs.start(finishing(), {"name": "Bo"})

    assert again.id == first.id == other_options.id
    assert again.input == {"name": "Ada"}
    assert (other_options.tags, other_options.fairness_key) == (("web",), "")
    assert (first.created, again.created, keyed_by_sdk.created) == (True, False, True)
    assert sdk.runs.get(first.id).created is None  # told by a start only
    assert first.tags == ("web",)
    assert first.version == 1
    assert keyed_by_sdk.idempotency_key is not None
    assert keyed_by_sdk.idempotency_key.startswith("sdk-")
    assert sorted(run.id for run in sdk.runs.iter()) == sorted([first.id, keyed_by_sdk.id])


def test_a_bulk_start_starts_each_key_once(sdk: Client) -> None:
    sdk.workflows.apply(finishing())
    sdk.runs.start("greet", {"name": "Ada"}, idempotency_key="k1")

    started = sdk.runs.start_many([
        {"workflow": "greet", "input": {"name": "Ada"}, "idempotency_key": "k1"},
        {"workflow": "greet", "input": {"name": "Bo"}},
        {"workflow": "greet", "input": {"name": "Cy"}, "idempotency_key": "k3"},
    ])

    assert started.created == 2
    assert [item.created for item in started.runs] == [False, True, True]
    assert started.runs[1].idempotency_key is not None
    assert started.runs[1].idempotency_key.startswith("sdk-")
    assert len(list(sdk.runs.iter())) == 3


def test_wait_returns_the_finished_run_with_its_output_steps_events_and_lineage(sdk: Client) -> None:
    sdk.workflows.apply(finishing(nodes=3))
    run = sdk.runs.start("greet", {"name": "Ada", "loud": False})

    done = sdk.runs.wait(run.id, timeout=10, poll_interval=0.05)

    assert done.status == "succeeded"
    assert done.is_terminal
    assert done.output == {"name": "Ada", "said": False}
    assert [step.status for step in done.steps] == ["skipped"] * 3
    assert done.finished_at is not None
    assert [step.node_id for step in sdk.runs.iter_steps(run.id, page_size=1)] == ["say_0", "say_1", "say_2"]
    page = sdk.runs.steps(run.id, page_size=2)
    assert len(page) == 2
    assert page.next is not None
    events = sdk.runs.events(run.id)
    assert events[0].type == "created"
    assert events[-1].type == "succeeded"
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    # Read on from each answer's last event, however short the answers: the same history.
    assert sdk.runs.events(run.id, page_size=2) == events
    assert sdk.runs.events(run.id, after=events[1].seq, page_size=3) == events[2:]
    lineage = sdk.runs.lineage(run.id)
    assert (lineage.root_run_id, lineage.runs, lineage.tree[0]["id"]) == (run.id, 1, run.id)
    root = lineage.tree[0]  # a LineageNode: the keys its type names are the server's
    assert set(root) == set(LineageNode.__annotations__)
    assert (root["status"], root["children"], root["successor"], root["nesting_depth"]) == ("succeeded", [], None, 0)


def test_wait_follows_a_run_that_continued_as_new_to_the_end_of_its_chain(connect, make_tenant) -> None:
    tenant, key = make_tenant("sdk-loop")
    sdk = connect(key)
    wf = Workflow("loop")
    wf.continue_as_new("again", input={"again": False, "name": Input["name"]}, when=Input["again"].eq(True))
    wf.output({"name": Input["name"]})
    sdk.workflows.apply(wf)
    first = sdk.runs.start("loop", {"again": True, "name": "Ada"})
    assert [kind for kind, _ in run_items(tenant)] == ["tick"]  # the successor's first tick, as a worker runs it

    done = sdk.runs.wait(first.id, timeout=10, poll_interval=0.05)
    continued = sdk.runs.wait(first.id, timeout=10, poll_interval=0.05, follow=False)

    assert (continued.status, continued.continued_as) == ("continued", done.id)
    assert (done.status, done.continued_from, done.continued_as, done.output) == (
        "succeeded", first.id, None, {"name": "Ada"})
    assert {run.id: run.continued_as for run in sdk.runs.iter(page_size=1)} == {first.id: done.id, done.id: None}


def test_wait_times_out_on_a_run_waiting_for_a_worker_and_cancel_asks_it_to_stop(sdk: Client) -> None:
    sdk.workflows.apply(waiting())
    run = sdk.runs.start("slow", {"name": "Ada"})

    with pytest.raises(WaitTimeout) as late:
        sdk.runs.wait(run.id, timeout=0.3, poll_interval=0.1)
    cancelled = sdk.runs.cancel(run.id)

    assert isinstance(late.value, TimeoutError)
    assert late.value.run.id == run.id
    assert not late.value.run.is_terminal
    assert cancelled.cancel_requested is True
    assert sdk.runs.cancel(run.id).cancel_requested is True  # idempotent


def test_cancel_many_asks_the_matching_active_runs_to_stop_a_batch_at_a_time(sdk: Client, other: Client) -> None:
    sdk.workflows.apply(waiting())
    other.workflows.apply(waiting())
    acme = [sdk.runs.start("slow", {"name": f"n{i}"}, fairness_key="acme", tags=["eu"]).id for i in range(3)]
    globex = sdk.runs.start("slow", {"name": "g"}, fairness_key="globex").id
    theirs = other.runs.start("slow", {"name": "t"}, fairness_key="acme").id

    first = sdk.runs.cancel_many(fairness_key="acme", tags=["eu"], limit=2)
    rest = sdk.runs.cancel_many(fairness_key="acme", tags=["eu"], limit=2)
    with pytest.raises(BadRequest) as unfiltered:
        sdk.runs.cancel_many()

    assert (first.cancelled, first.runs, first.more) == (2, tuple(acme[:2]), True)
    assert (rest.cancelled, rest.runs, rest.more) == (1, tuple(acme[2:]), False)
    assert sdk.runs.cancel_many(ids=acme).cancelled == 0  # asked already
    assert unfiltered.value.field == "ids"
    assert all(sdk.runs.get(run_id).cancel_requested for run_id in acme)
    assert not sdk.runs.get(globex).cancel_requested
    assert not other.runs.get(theirs).cancel_requested


def test_runs_list_one_page_and_iter_every_run_across_pages_newest_first(sdk: Client) -> None:
    sdk.workflows.apply(finishing())
    started = [sdk.runs.start("greet", {"name": f"n{i}"}).id for i in range(5)]

    page = sdk.runs.list(page_size=2)
    every = [run.id for run in sdk.runs.iter(page_size=2)]
    second = sdk.runs.list(page_size=2, cursor=page.next_cursor)
    by_link = sdk.runs.list(page_size=2, cursor=page.next)  # the link itself will do too
    back = sdk.runs.list(page_size=2, cursor=second.previous_cursor)

    assert len(page) == 2
    assert page.next is not None
    assert page.previous is None
    assert every == started[::-1]
    assert [run.id for run in second] == [run.id for run in by_link] == every[2:4]
    assert [run.id for run in back] == every[:2]
    assert page.previous_cursor is None
    assert [run.id for run in sdk.runs.iter(status="succeeded", workflow="greet")] == every
    assert list(sdk.runs.iter(status="failed")) == []


def test_runs_are_listed_by_every_tag_given_and_by_fairness_key_across_pages(sdk: Client, other: Client) -> None:
    sdk.workflows.apply(finishing())
    other.workflows.apply(finishing())
    both = [sdk.runs.start("greet", {"name": f"n{i}"}, tags=["nightly", "eu"], fairness_key="acme").id
            for i in range(3)]
    nightly = sdk.runs.start("greet", {"name": "x"}, tags=["nightly"]).id
    sdk.runs.start("greet", {"name": "y"})
    other.runs.start("greet", {"name": "z"}, tags=["nightly", "eu"], fairness_key="acme")

    # page_size=1: the next pages keep both values of the repeated ``tag``
    assert [run.id for run in sdk.runs.iter(tags=["nightly", "eu"], page_size=1)] == both[::-1]
    assert [run.id for run in sdk.runs.iter(tags=["nightly"])] == [nightly, *both[::-1]]
    assert [run.id for run in sdk.runs.list(fairness_key="acme", page_size=2)] == both[:0:-1]
    assert list(sdk.runs.iter(tags=["nightly"], fairness_key="globex")) == []
    with pytest.raises(BadRequest) as refused:
        sdk.runs.list(tags=["x" * 210])
    assert refused.value.field == "tag[0]"


# --- the platform API ------------------------------------------------------------------------


def test_the_platform_manages_tenants_plans_and_overrides(platform: Client, connect) -> None:
    admin = platform.platform
    created = admin.tenants.create("sdk-new", plan="pro", create_api_key=True)
    new = connect(created.api_key or "")

    assert {"free", "pro", "enterprise"} <= {plan.slug for plan in admin.plans.list()}
    assert admin.plans.get("pro").max_concurrency > 0
    assert (new.tenant.get().slug, new.tenant.get().plan) == ("sdk-new", "pro")
    assert admin.tenants.set_plan("sdk-new", "enterprise").plan == "enterprise"
    assert admin.tenants.set_override("sdk-new", "max_pools", 7, reason="trial").value == 7
    assert [o.field for o in admin.tenants.overrides("sdk-new")] == ["max_pools"]
    assert admin.tenants.entitlements("sdk-new").limits["max_pools"] == 7
    admin.tenants.clear_override("sdk-new", "max_pools")
    assert admin.tenants.overrides("sdk-new") == []
    assert "sdk-new" in {tenant.slug for tenant in admin.tenants.iter(page_size=1)}
    shards = admin.queue.stats()
    assert [shard.shard for shard in shards] == list(range(len(shards)))
    assert {"interactive", "standard", "batch"} <= set(shards[0].tiers)
    assert shards[0].tiers["standard"]["ready_tenants"] >= 0

    assert admin.tenants.suspend("sdk-new").status == "suspended"
    with pytest.raises(PermissionDenied) as suspended:
        new.tenant.get()
    assert suspended.value.code == "tenant_suspended"
    assert admin.tenants.activate("sdk-new").status == "active"
    assert new.tenant.get().status == "active"


def test_the_platform_deletes_a_suspended_tenant_only(platform: Client, connect) -> None:
    admin = platform.platform
    leaving = connect(admin.tenants.create("sdk-leaving", create_api_key=True).api_key or "")
    with pytest.raises(Conflict) as active:
        admin.tenants.delete("sdk-leaving")
    assert "status" in active.value.details
    admin.tenants.suspend("sdk-leaving")
    assert admin.tenants.delete("sdk-leaving").status == "deleting"
    assert admin.tenants.delete("sdk-leaving").status == "deleting"
    with pytest.raises(AuthenticationError) as refused:
        leaving.tenant.get()
    assert refused.value.code == "invalid_api_key"


def test_a_taken_slug_and_an_unknown_plan_are_refused_by_the_platform(platform: Client) -> None:
    platform.platform.tenants.create("sdk-taken")

    with pytest.raises(Conflict) as taken:
        platform.platform.tenants.create("sdk-taken")
    with pytest.raises(BadRequest) as unknown:
        platform.platform.tenants.create("sdk-other", plan="platinum")

    assert taken.value.field == "slug"
    assert unknown.value.code == "invalid"


def test_each_kind_of_key_is_refused_by_the_other_kind_of_endpoint(sdk: Client, platform: Client) -> None:
    with pytest.raises(NotFound):
        sdk.platform.tenants.list()
    with pytest.raises(PermissionDenied) as denied:
        platform.tenant.get()
    assert denied.value.code == "permission_denied"


# --- the async client ------------------------------------------------------------------------


def test_the_async_client_starts_waits_pages_and_raises_like_the_sync_one(server_url: str, make_tenant) -> None:
    _, key = make_tenant("sdk-async")

    async def scenario() -> tuple[str, str, list[str], list[str], str, bool]:
        async with AsyncClient(server_url, key) as client:
            applied = await client.workflows.apply(finishing())
            started = [(await client.runs.start("greet", {"name": f"n{i}"})).id for i in range(3)]
            done = await client.runs.wait(started[0], timeout=10, poll_interval=0.05)
            listed = [run.id async for run in client.runs.iter(page_size=2)]
            history = await client.runs.events(started[0])
            same_history = history == await client.runs.events(started[0], page_size=2) and len(history) > 2
            try:
                await client.runs.get("00000000-0000-0000-0000-000000000000")
            except NotFound as exc:
                missing = exc.code
            return applied.outcome, done.status, started, listed, missing, same_history

    outcome, status, started, listed, missing, same_history = asyncio.run(scenario())

    assert (outcome, status, missing) == ("created", "succeeded", "not_found")
    assert listed == started[::-1]
    assert same_history  # read two events at a time, the history is the same


# --- schedules -------------------------------------------------------------------------------


def test_a_schedule_is_created_read_changed_paused_resumed_and_deleted_and_hidden_from_others(
    sdk: Client, other: Client
) -> None:
    sdk.workflows.apply(finishing())
    made = sdk.schedules.create("mornings", finishing(), cron="0 7 * * *", timezone="Asia/Tokyo",
                                input={"name": "Ada"}, overlap="buffer_one", jitter_s=1.5)
    assert (made.workflow, made.cron, made.overlap, made.input) == ("greet", "0 7 * * *", "buffer_one", {"name": "Ada"})
    assert len(made.next_fires) == 5
    assert all(isinstance(fire, datetime) and fire.astimezone(UTC).hour == 22 for fire in made.next_fires)
    assert made.next_fire_at == made.next_fires[0]
    assert sdk.schedules.get(made.id).next_fires == made.next_fires
    assert [s.name for s in sdk.schedules.iter()] == ["mornings"]

    hourly = sdk.schedules.update(made.id, interval_s=3600)
    assert (hourly.cron, hourly.interval_s) == ("", 3600)
    assert sdk.schedules.pause(made.id).next_fires == ()
    assert len(sdk.schedules.resume(made.id).next_fires) == 5
    with pytest.raises(BadRequest) as bad:
        sdk.schedules.create("broken", "greet", cron="0 7 * *", timezone="Asia/Tokyo")
    assert (bad.value.code, bad.value.field) == ("invalid", "cron")
    for verb in (other.schedules.get, other.schedules.pause, other.schedules.resume, other.schedules.delete):
        with pytest.raises(NotFound):
            verb(made.id)
    assert list(other.schedules.iter()) == []
    sdk.schedules.delete(made.id)
    with pytest.raises(NotFound):
        sdk.schedules.get(made.id)


def test_a_schedule_s_past_fires_are_backfilled_once_and_a_run_triggered_now(
    connect: Any, make_tenant: Any, other: Client, server_url: str
) -> None:
    _, tenant_key = make_tenant("sdk-backfill")
    sdk = connect(tenant_key)
    sdk.workflows.apply(finishing())
    made = sdk.schedules.create("hourly", "greet", interval_s=3600, paused=True)
    start = datetime(2025, 1, 1, tzinfo=UTC)
    filled = sdk.schedules.backfill(made.id, start, start + timedelta(hours=2))
    assert [fire.fire_at for fire in filled.fires] == [start + timedelta(hours=n) for n in range(3)]
    assert (filled.started, filled.existing, filled.refused) == (3, 0, 0)
    assert all(fire.created and fire.run_id for fire in filled.fires)

    async def again() -> tuple[int, int, str]:
        async with AsyncClient(server_url, tenant_key) as client:
            refilled = await client.schedules.backfill(made.id, start, start + timedelta(hours=3))
            run = await client.schedules.trigger(made.id)
            return refilled.started, refilled.existing, run.workflow_name

    assert asyncio.run(again()) == (1, 3, "greet")
    with pytest.raises(BadRequest) as future:
        sdk.schedules.backfill(made.id, start, datetime.now(UTC) + timedelta(days=1))
    assert (future.value.code, future.value.field) == ("invalid", "end")
    for verb in (lambda: other.schedules.backfill(made.id, start, start), lambda: other.schedules.trigger(made.id)):
        with pytest.raises(NotFound):
            verb()


def test_an_event_sent_starts_the_workflows_its_triggers_subscribe_and_only_here(sdk: Client, other: Client) -> None:
    sdk.workflows.apply(finishing())
    trigger = sdk.triggers.create("greet", "user.signed_up", filter={"path": "event.payload.plan", "op": "eq",
                                                                     "value": "pro"})
    other.workflows.apply(finishing())
    other.triggers.create("greet", "user.signed_up")

    free = sdk.events.send("user.signed_up", {"plan": "free"}, key="u-1")
    pro = sdk.events.send("user.signed_up", {"plan": "pro", "name": "Ada"}, key="u-2", idempotency_key="signup-2")
    again = sdk.events.send("user.signed_up", {"plan": "pro", "name": "Ada"}, key="u-2", idempotency_key="signup-2")
    bulk = sdk.events.send_many([{"name": "user.signed_up", "payload": {"plan": "pro"}}, {"name": "other"}])

    assert free.runs == ()
    assert len(pro.runs) == 1
    assert again.id == pro.id
    assert again.runs == pro.runs
    assert bulk.created == 2
    assert [len(event.runs) for event in bulk.events] == [1, 0]
    run = sdk.runs.get(pro.runs[0])
    assert (run.workflow_name, run.input["key"], run.input["payload"]) == ("greet", "u-2", {"plan": "pro",
                                                                                          "name": "Ada"})
    assert [event.key for event in sdk.events.list(name="user.signed_up")] == ["", "u-2", "u-1"]
    assert [t.id for t in sdk.triggers.list()] == [trigger.id]
    assert list(other.runs.iter()) == []  # another tenant's events never start its runs
    with pytest.raises(NotFound):
        other.triggers.delete(trigger.id)
    with pytest.raises(BadRequest) as bad:
        sdk.triggers.create("greet", "x", filter={"path": "event.colour", "op": "eq", "value": 1})
    assert bad.value.field == "filter.path"


def test_events_and_triggers_are_read_one_by_one_and_across_pages_like_every_list(sdk: Client,
                                                                                server_url: str) -> None:
    sdk.workflows.apply(finishing())
    triggers = [sdk.triggers.create("greet", f"order.{kind}") for kind in ("paid", "shipped", "returned")]
    sent = [sdk.events.send("order.paid", {"n": n}).id for n in range(3)]
    sdk.events.send("order.shipped")

    assert sdk.triggers.get(triggers[1].id).event == "order.shipped"
    assert [t.id for t in sdk.triggers.iter(page_size=2)] == [t.id for t in triggers]
    assert [e.id for e in sdk.events.iter(name="order.paid", page_size=2)] == sent[::-1]

    async def read() -> tuple[str, list[str], list[str]]:
        async with AsyncClient(server_url, sdk.config.api_key) as client:
            return ((await client.triggers.get(triggers[0].id)).event,
                    [t.id async for t in client.triggers.iter(page_size=2)],
                    [e.id async for e in client.events.iter(name="order.paid", page_size=2)])

    assert asyncio.run(read()) == ("order.paid", [t.id for t in triggers], sent[::-1])


def test_a_signal_resumes_a_run_waiting_for_it_and_a_wait_for_event_compiles_and_runs(sdk: Client) -> None:
    wf = Workflow("approval")
    approved = wf.wait_for_event("approved", event="approved", key=Input["order_id"], timeout_s=3600)
    wf.output(approved.output)
    sdk.workflows.apply(wf)
    run = sdk.runs.start("approval", {"order_id": "o-1"})
    assert [(s.node_id, s.status) for s in sdk.runs.iter_steps(run.id)] == [("approved", "waiting")]
    assert sdk.runs.why(run.id).waiting[0].cause == "event"

    signal = sdk.runs.signal(run.id, "approved", {"by": "ann"}, idempotency_key="approve-o-1")
    again = sdk.runs.signal(run.id, "approved", {"by": "ann"}, idempotency_key="approve-o-1")

    assert signal.delivered_to is not None
    assert signal.delivered_to.node_id == "approved"
    assert again.id == signal.id
    stored = sdk.workflows.get("approval").spec or {}
    assert stored["nodes"][0]["key"] == "$input.order_id"
    assert "input" not in stored["nodes"][0]


def test_a_fairness_keys_weight_is_set_changed_listed_shown_and_deleted_and_hidden_from_others(
    sdk: Client, other: Client
) -> None:
    created = sdk.fairness_keys.create("customer-42", weight=3)
    changed = sdk.fairness_keys.update(created.id, weight=5)

    assert (created.key, created.weight, changed.weight) == ("customer-42", 3, 5)
    assert [(row.key, row.weight) for row in sdk.fairness_keys.iter()] == [("customer-42", 5)]
    assert "keys" in sdk.queue.stats().work
    with pytest.raises(NotFound):
        other.fairness_keys.get(created.id)
    with pytest.raises(Conflict) as refused:
        sdk.fairness_keys.create("customer-42", weight=2)
    assert (refused.value.status, refused.value.field) == (409, "key")
    sdk.fairness_keys.delete(created.id)
    assert list(sdk.fairness_keys.iter()) == []
