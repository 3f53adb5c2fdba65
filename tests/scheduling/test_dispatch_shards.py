"""The fair queue's shards split between the live dispatchers (rendezvous hashing over their beats),
against the real Redis: each dispatcher's share, what moves when one joins or dies, and the shards
no live dispatcher serves in ``/readyz`` and the platform queue view."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from ductor_project.celery import RESULTS_QUEUE, SYSTEM_QUEUE, WORK_QUEUE
from ductor_project.core import heartbeats
from ductor_project.core.keys import forget_shard_map, shard_map_key
from scheduling.dispatch import credits, shards
from scheduling.dispatch.dispatcher import Dispatcher
from scheduling.dispatch.shards import ShardPlan, assigned
from scheduling.management.commands.run_coordinator import check_intervals
from tenants import services
from tests.conftest import api_client

pytestmark = pytest.mark.usefixtures("redis_client")

NAMES = [f"dispatcher-{n}" for n in range(5)]


def split(names: list[str], count: int) -> dict[str, list[int]]:
    return {name: assigned(name, names, count) for name in names}


@pytest.mark.parametrize("count", [1, 2, 6, 64])
@pytest.mark.parametrize("live", [1, 2, 3, 5])
def test_every_shard_is_served_and_by_as_few_dispatchers_as_the_numbers_allow(live: int, count: int) -> None:
    plan = split(NAMES[:live], count)
    served = [shard for shard_list in plan.values() for shard in shard_list]
    per_shard = -(-live // count)  # ceil: more dispatchers than shards share each shard
    assert sorted(set(served)) == list(range(count))
    assert all(served.count(shard) == per_shard for shard in range(count))


@pytest.mark.parametrize("count", [2, 3, 4, 6, 12, 64])
@pytest.mark.parametrize("live", [2, 3, 4, 5])
def test_each_dispatcher_serves_an_even_share_of_the_shards(live: int, count: int) -> None:
    """Plain rendezvous hashing gave one of two dispatchers all four shards about one time in eight."""
    for names in (NAMES[:live], [f"{name}@host-{count}" for name in NAMES[:live]], [f"d{n}" for n in range(live)]):
        loads = [len(shard_list) for shard_list in split(names, count).values()]
        assert max(loads) - min(loads) <= 1, (names, loads)
        assert min(loads) >= 1


def test_a_dispatcher_that_joins_takes_shards_only_from_the_others_and_gives_them_back_when_it_goes() -> None:
    before = split(NAMES[:2], 64)
    after = split(NAMES[:3], 64)
    for name in NAMES[:2]:
        assert set(after[name]) <= set(before[name])  # no shard moved between the two that stayed
    assert after[NAMES[2]]  # the newcomer took a share
    assert split(NAMES[:2], 64) == before


def test_a_dispatcher_counts_itself_among_the_live_ones_whatever_the_beats_say() -> None:
    assert assigned("alone", [], 6) == list(range(6))
    assert assigned("new", ["old"], 2) == split(["new", "old"], 2)["new"]


def test_a_dispatchers_plan_follows_the_live_beats_and_is_written_beside_them(settings) -> None:
    settings.DUCTOR_QUEUE_SHARDS = 6
    heartbeats.beat(heartbeats.DISPATCHER, "d-a")
    alone = ShardPlan(name="d-a", every_s=0)
    assert alone.shards() == list(range(6))
    heartbeats.beat(heartbeats.DISPATCHER, "d-b")
    mine = alone.shards()
    assert mine == assigned("d-a", ["d-a", "d-b"], 6)
    assert 0 < len(mine) < 6
    assert heartbeats.shards_served()["d-a"] == mine
    alone.stop()
    assert "d-a" not in heartbeats.shards_served()


def test_a_dispatcher_started_with_its_shards_keeps_them(settings) -> None:
    settings.DUCTOR_QUEUE_SHARDS = 4
    for name in NAMES:
        heartbeats.beat(heartbeats.DISPATCHER, name)
    assert Dispatcher(shards=[1, 3]).shards == [1, 3]


def test_a_dispatcher_started_with_its_shards_passes_over_those_a_reshard_stopped_serving(settings) -> None:
    """Every round of a dispatcher pinned to a shard that a shrink dropped failed on it, shards it
    still served included, and the dispatcher stopped beating."""
    settings.DUCTOR_QUEUE_SHARDS = 4
    dispatcher = Dispatcher(shards=[1, 3])
    dispatcher.plan.every_s = 0
    settings.DUCTOR_QUEUE_SHARDS = 2  # the count in force shrank beneath shard 3
    assert dispatcher.run_once() == 0
    assert dispatcher.shards == [1]
    settings.DUCTOR_QUEUE_SHARDS = 4  # and grew again: it serves shard 3 once more
    assert dispatcher.shards == [1, 3]


def test_the_others_split_every_shard_between_themselves_beside_a_dispatcher_started_with_its_own(
    settings, db
) -> None:
    """Counted in the split, a pinned dispatcher was given shards it never served: they waited."""
    settings.DUCTOR_QUEUE_SHARDS = 6
    names = ("d-a", "d-b", "pinned")
    for name in names:
        heartbeats.beat(heartbeats.DISPATCHER, name)
    ShardPlan([0], name="pinned").shards()
    a, b = ShardPlan(name="d-a", every_s=0), ShardPlan(name="d-b", every_s=0)
    assert sorted(a.shards() + b.shards()) == list(range(6))
    assert a.shards() == assigned("d-a", ["d-a", "d-b"], 6)
    assert shards.unserved() == []
    assert shards.serving()[0][-1] == "pinned"
    assert heartbeats.shards_served()["pinned"] == [0]


def ready() -> tuple[int, dict[str, Any]]:
    response = Client().get("/readyz")
    return response.status_code, response.json()


def test_a_shard_no_live_dispatcher_serves_is_named_in_readyz_and_the_platform_view(settings, db) -> None:
    settings.DUCTOR_QUEUE_SHARDS = 3
    credits.register_worker("w@host", [WORK_QUEUE, SYSTEM_QUEUE, RESULTS_QUEUE], 1)
    heartbeats.beat(heartbeats.COORDINATOR, "c")
    heartbeats.beat(heartbeats.DISPATCHER, "only-0-and-2")
    ShardPlan([0, 2], name="only-0-and-2").shards()

    status, body = ready()
    assert status == 503
    assert body["checks"]["dispatcher"]["ok"]  # one beats: the loop is fine, a shard is not served
    assert body["checks"]["shards"] | {"ms": 0} == {
        "ok": False, "shards": 3, "unserved": [1], "error": "no live dispatcher serves shard(s) 1", "ms": 0}
    _, platform_key = services.platform_key_create(name="ops")
    queue = api_client(platform_key).get("/api/v1/platform/queue").json()
    assert [row["dispatchers"] for row in queue] == [["only-0-and-2"], [], ["only-0-and-2"]]

    heartbeats.beat(heartbeats.DISPATCHER, "any")  # a dispatcher that wrote no plan serves every shard
    assert ready()[0] == 200
    assert shards.serving()[1] == ["any"]


def test_a_dead_dispatchers_shards_are_unserved_until_the_others_plan_again_then_they_take_them(settings) -> None:
    settings.DUCTOR_QUEUE_SHARDS = 6
    heartbeats.beat(heartbeats.DISPATCHER, "d-a")
    heartbeats.beat(heartbeats.DISPATCHER, "d-b")
    a, b = ShardPlan(name="d-a", every_s=0), ShardPlan(name="d-b", every_s=0)
    theirs = b.shards()
    assert sorted(a.shards() + theirs) == list(range(6))
    assert shards.unserved() == []

    heartbeats.forget(heartbeats.DISPATCHER, "d-b")  # its beat is gone (it died; staleness does the same)
    assert shards.unserved() == theirs  # until the live one plans again
    assert a.shards() == list(range(6))  # its next plan takes them all
    assert shards.unserved() == []


def test_a_dispatcher_of_a_shard_beyond_the_count_a_reshard_put_in_force_is_refused_naming_the_map(
    settings, redis_client
) -> None:
    """The refusal named DUCTOR_QUEUE_SHARDS, whose value the map's count had overridden."""
    settings.DUCTOR_QUEUE_SHARDS = 8
    redis_client.hset(shard_map_key(), "count", 3)
    forget_shard_map()
    try:
        with pytest.raises(CommandError) as refused:
            call_command("run_dispatcher", "--shards", "5")
    finally:
        redis_client.delete(shard_map_key())
        forget_shard_map()
    assert str(refused.value) == ("--shards: the fair queue has shards 0 to 2 (the count queue_reshard put "
                                  "in force; DUCTOR_QUEUE_SHARDS says 8), not 5")


def test_a_coordinator_may_reconcile_on_every_pass() -> None:
    # ``--reconcile-every 0`` (what bench/retention.py and docs/operations.md run) is no mistake.
    check_intervals(0.2, 0.0)


@pytest.mark.parametrize(("argv", "message"), [
    (["run_dispatcher", "--shards", "abc"], "--shards is a comma-separated list of shard numbers, not 'abc'"),
    (["run_dispatcher", "--shards", "1,9"], "--shards: the fair queue has shards 0 to 3 (DUCTOR_QUEUE_SHARDS), not 9"),
    (["run_coordinator", "--interval", "-1"], "--interval is a number of seconds above 0, not -1.0"),
    (["run_coordinator", "--reconcile-every", "-1"], "--reconcile-every is a number of seconds, 0 or more, not -1.0"),
    (["run_coordinator", "--reconcile-every", "inf"], "--reconcile-every is a number of seconds, 0 or more, not inf"),
    (["run_coordinator", "--interval", "nan"], "--interval is a number of seconds above 0, not nan"),
])
def test_a_loop_started_with_a_bad_option_refuses_to_start_naming_it(settings, argv: list[str], message: str) -> None:
    """Started, a dispatcher of a shard that does not exist failed every round, and a coordinator of a
    negative interval spun on the CPU."""
    settings.DUCTOR_QUEUE_SHARDS = 4
    with pytest.raises(CommandError) as refused:
        call_command(*argv)
    assert str(refused.value) == message
