"""GCRA rate limits against the real Redis, timed by Redis TIME."""

from __future__ import annotations

from typing import Any

import pytest

from ductor_project.core.capacity import rate_check, rate_key, rate_peek
from ductor_project.core.context import tenant_context
from tests.scheduling.helpers import redis_now_ms, sleep_until

TOLERANCE_S = 0.015


@pytest.fixture
def tenant(redis_client: Any, tenant_a: Any) -> Any:
    with tenant_context(tenant_a[0]) as tenant:
        yield tenant


def test_from_idle_exactly_burst_pass_then_one_every_interval(tenant, redis_client):
    """Every bound is bracketed by Redis TIME read around the calls, so a slow host cannot fail it."""
    rate, burst = 20.0, 4
    interval = 1 / rate

    start = redis_now_ms(redis_client)
    assert [rate_check("steps", rate, burst).allowed for _ in range(burst)] == [True] * burst
    before = redis_now_ms(redis_client)
    refused = rate_check("steps", rate, burst)
    after = redis_now_ms(redis_client)
    assert refused.allowed is False
    # The first call (made between start and before) set the pace: the next slot opens
    # one interval after it.
    opens_lo, opens_hi = start / 1000 + interval, before / 1000 + interval
    assert opens_lo - after / 1000 - 1e-6 <= refused.retry_after_s <= opens_hi - before / 1000 + 1e-6

    # Just before the slot opens: refused with the short wait left (or, if the host was
    # too slow to call before the slot opened, allowed only once it could have opened).
    sleep_until(redis_client, before + (refused.retry_after_s - TOLERANCE_S) * 1000)
    probe_before = redis_now_ms(redis_client) / 1000
    early = rate_check("steps", rate, burst)
    probe_after = redis_now_ms(redis_client) / 1000
    if early.allowed:
        assert probe_after >= opens_lo
    else:
        assert probe_before <= opens_hi
        assert opens_lo - probe_after - 1e-6 <= early.retry_after_s <= opens_hi - probe_before + 1e-6

    for _ in range(3):
        # Wait for the next slot, then take what has accrued: never more than the burst,
        # and the refusal that follows asks for at most one interval.
        sleep_until(redis_client, redis_now_ms(redis_client) + interval * 1000)
        passed = 0
        while (decision := rate_check("steps", rate, burst)).allowed:
            passed += 1
        assert 1 <= passed <= burst
        assert 0 < decision.retry_after_s <= interval + 1e-6


def test_remaining_counts_down_and_reset_is_the_time_to_a_full_burst(tenant, redis_client):
    start = redis_now_ms(redis_client) / 1000
    decisions = [rate_check("api", 1, 3) for _ in range(4)]
    took = redis_now_ms(redis_client) / 1000 - start
    assert [d.remaining for d in decisions] == [2, 1, 0, 0]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert decisions[0].reset_after_s == pytest.approx(1, abs=TOLERANCE_S)
    assert 3 - took - TOLERANCE_S <= decisions[2].reset_after_s <= 3 + TOLERANCE_S
    assert decisions[0].retry_after_s == 0


def test_a_cost_charges_several_calls(tenant):
    assert rate_check("api", 1, 5, cost=3).allowed is True
    assert rate_check("api", 1, 5, cost=3).allowed is False
    assert rate_check("api", 1, 5, cost=2).allowed is True
    assert rate_check("api", 1, 5).allowed is False


def test_a_refused_call_and_a_peek_change_nothing(tenant, redis_client):
    key = rate_key("api")
    assert rate_peek("api", 1, 2).allowed is True
    assert redis_client.exists(key) == 0
    assert rate_check("api", 1, 2).allowed is True
    assert rate_check("api", 1, 2).allowed is True
    state = redis_client.get(key)
    assert rate_peek("api", 1, 2).allowed is False
    assert rate_check("api", 1, 2).allowed is False
    assert redis_client.get(key) == state


def test_an_idle_limiter_key_expires(tenant, redis_client):
    rate_check("api", 10, 5)
    # Idle again 0.1 s after the call; the key lives that long plus a second of grace.
    assert 0 < redis_client.pttl(rate_key("api")) <= 1100


def test_limiters_are_separate_keys(tenant):
    assert rate_check("api", 1, 1).allowed is True
    assert rate_check("api", 1, 1).allowed is False
    assert rate_check("steps", 1, 1).allowed is True


@pytest.mark.parametrize(
    ("rate", "burst", "cost"),
    [(0, 1, 1), (-1, 1, 1), (float("inf"), 1, 1), (1, 0, 1), (1, 2, 0), (1, 2, 3)],
)
def test_impossible_limits_are_refused(tenant, redis_client, rate, burst, cost):
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        rate_check("api", rate, burst, cost)
    assert redis_client.dbsize() == 0


def test_a_raised_rate_counts_at_once_not_once_the_old_rates_debt_is_paid(tenant):
    """A tenant whose API rate is raised (an operator's override, a new plan) from one call per
    1,000 s: its limiter's state was written at the old pace, and the new rate refused it for the
    1,000 s the old one had ahead, where its limits allow a call a tenth of a second after its last.
    The raised rate counts from the next call: the burst is used, the next call one new interval
    away. A lowered rate changes nothing of what the old one allowed."""
    assert rate_check("api", 0.001, 1).allowed is True
    refused = rate_check("api", 10, 1)
    assert refused.allowed is False
    assert refused.retry_after_s <= 0.1 + 1e-6

    assert rate_check("api-lowered", 10, 2).allowed is True
    assert rate_check("api-lowered", 0.001, 2).allowed is True  # the burst left by the old pace
