"""Schedules without workers: their timing, what a wake-up fires, the API and its isolation.

Real PostgreSQL and Redis. The wake-up is called directly (``fire_schedules``) with the moment it
acts at, so no assertion depends on the clock; ``tests/workflows/test_schedules_e2e.py`` runs them
through real workers and coordinators.
"""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from ductor_project.core.context import tenant_context
from scheduling import fair_queue
from tenants import services as tenant_services
from tenants.models import Tenant
from tests.conftest import error_code, in_threads
from tests.tenants.helpers import assert_error
from workflows import services as workflow_services
from workflows.models import Schedule, WorkflowRun
from workflows.triggers import arming, firing, reconcile
from workflows.triggers import services as schedules
from workflows.triggers.timing import COUNT_CAP, Timing, fire_key, fire_of_key, jitter_delay

pytestmark = pytest.mark.usefixtures("redis_client")

FLOW = {"nodes": [{"id": "a", "type": "action", "action": "noop"}]}
T0 = datetime(2025, 1, 1, tzinfo=UTC)  # fire times of the past: a wake-up is told when it acts


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def with_flow(tenant: Tenant, name: str = "nightly") -> None:
    with tenant_context(tenant):
        workflow_services.workflow_put(name=name, spec=FLOW)


def make(tenant: Tenant, **fields: Any) -> Schedule:
    """A schedule of ``tenant`` (every second by default) whose next fire is ``T0``, due at ``T0``."""
    fields = {"name": "s", "workflow": "nightly", "interval_s": 1, **fields}
    with tenant_context(tenant):
        schedule = schedules.schedule_create(**fields)
        Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=T0, wake_at=arming.due_at(schedule, T0))
        return Schedule.objects.get(pk=schedule.pk)


def fire(tenant: Tenant, now: datetime) -> Schedule:
    """Run the tenant's wake-up as if at ``now``; its latest schedule afterwards."""
    with tenant_context(tenant):
        firing.fire_schedules(now=now)
        return Schedule.objects.order_by("created_at").last()  # type: ignore[no-any-return]


def fired_at(tenant: Tenant) -> list[datetime]:
    """The nominal fire times of the tenant's scheduled runs, from their keys, in order."""
    with tenant_context(tenant):
        keys = WorkflowRun.objects.values_list("idempotency_key", flat=True)
        return sorted(found[1] for key in keys if key and (found := fire_of_key(key)))


# --- timing -------------------------------------------------------------------------------------


def test_a_cron_fires_at_its_wall_clock_time_in_its_time_zone_across_a_daylight_saving_change() -> None:
    paris = Timing(cron="0 9 * * *", interval_s=None, timezone="Europe/Paris")
    fires = paris.upcoming(paris.next_after(datetime(2026, 3, 27, 12, tzinfo=UTC)), 3)
    # 09:00 in Paris is 08:00 UTC before the change of 29 March 2026 and 07:00 UTC after it.
    assert fires == [datetime(2026, 3, 28, 8, tzinfo=UTC), datetime(2026, 3, 29, 7, tzinfo=UTC),
                     datetime(2026, 3, 30, 7, tzinfo=UTC)]
    skipped = Timing(cron="30 2 * * *", interval_s=None, timezone="Europe/Paris")
    # 02:30 does not exist on 29 March in Paris: it fires at the first moment after the jump, 03:00 CEST.
    assert skipped.next_after(datetime(2026, 3, 28, 12, tzinfo=UTC)) == datetime(2026, 3, 29, 1, tzinfo=UTC)


def test_a_time_an_autumn_change_repeats_fires_once_and_never_in_the_past_from_inside_that_hour() -> None:
    berlin = Timing(cron="30 2 * * *", interval_s=None, timezone="Europe/Berlin")
    # 31 October 2027: 03:00 CEST (01:00 UTC) goes back to 02:00 CET; 02:30 fired at 00:30 UTC, once.
    assert berlin.next_after(datetime(2027, 10, 31, 0, tzinfo=UTC)) == datetime(2027, 10, 31, 0, 30, tzinfo=UTC)
    for inside in (datetime(2027, 10, 31, 1, tzinfo=UTC), datetime(2027, 10, 31, 1, 40, tzinfo=UTC)):
        assert berlin.next_after(inside) == datetime(2027, 11, 1, 1, 30, tzinfo=UTC)  # not 00:30, gone by


def fires_between(cron: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    """The fire times of ``cron`` in ``zone`` strictly after ``start`` and before ``end``."""
    timing, fires = Timing(cron=cron, interval_s=None, timezone=zone), []
    for fire in timing.after(start):
        if fire >= end:
            return fires
        fires.append(fire)
    return fires


def test_a_daily_2_am_in_new_york_and_paris_fires_once_on_both_change_days_at_the_instants_the_docs_name() -> None:
    utc = lambda *parts: datetime(*parts, tzinfo=UTC)  # noqa: E731
    # New York, 8 March 2026: 02:00 EST does not exist; it fires at 03:00 EDT (07:00 UTC).
    assert fires_between("0 2 * * *", "America/New_York", utc(2026, 3, 7, 12), utc(2026, 3, 9, 12)) == [
        utc(2026, 3, 8, 7), utc(2026, 3, 9, 6)]
    # New York, 1 November 2026: 01:00-02:00 happens twice; 01:00 fires once, at its first pass (EDT).
    assert fires_between("0 1 * * *", "America/New_York", utc(2026, 10, 31, 12), utc(2026, 11, 2, 12)) == [
        utc(2026, 11, 1, 5), utc(2026, 11, 2, 6)]
    # Paris, 25 October 2026: 02:00-03:00 happens twice; 02:00 fires once, at 02:00 CEST (00:00 UTC).
    assert fires_between("0 2 * * *", "Europe/Paris", utc(2026, 10, 24, 12), utc(2026, 10, 26, 12)) == [
        utc(2026, 10, 25, 0), utc(2026, 10, 26, 1)]


def test_an_hourly_cron_fires_by_the_clock_23_times_on_the_spring_day_and_25_on_the_autumn_one() -> None:
    spring = fires_between("0 * * * *", "America/New_York", datetime(2026, 3, 8, 4, 59, tzinfo=UTC),
                           datetime(2026, 3, 9, 4, tzinfo=UTC))
    autumn = fires_between("0 * * * *", "America/New_York", datetime(2026, 11, 1, 3, 59, tzinfo=UTC),
                           datetime(2026, 11, 2, 5, tzinfo=UTC))
    assert (len(spring), len(autumn)) == (23, 25)
    assert all(b - a == timedelta(hours=1) for fires in (spring, autumn) for a, b in itertools.pairwise(fires))
    # A wildcard minute in a fixed hour: nothing on the night that hour is skipped, both passes when repeated.
    assert fires_between("*/20 2 * * *", "Europe/Paris", datetime(2026, 3, 28, 12, tzinfo=UTC),
                         datetime(2026, 3, 29, 12, tzinfo=UTC)) == []
    assert len(fires_between("*/20 2 * * *", "Europe/Paris", datetime(2026, 10, 24, 12, tzinfo=UTC),
                             datetime(2026, 10, 25, 12, tzinfo=UTC))) == 6


def test_zones_whose_offset_is_not_whole_hours_fire_at_their_wall_clock_time() -> None:
    assert fires_between("0 9 * * *", "Asia/Kolkata", datetime(2026, 3, 28, 12, tzinfo=UTC),
                         datetime(2026, 3, 30, tzinfo=UTC)) == [datetime(2026, 3, 29, 3, 30, tzinfo=UTC)]
    # Adelaide (+09:30, +10:30 in summer): 4 October 2026 skips 02:00-03:00; 5 April 2026 repeats it.
    assert fires_between("0 2 * * *", "Australia/Adelaide", datetime(2026, 10, 3, tzinfo=UTC),
                         datetime(2026, 10, 5, tzinfo=UTC)) == [datetime(2026, 10, 3, 16, 30, tzinfo=UTC),
                                                                datetime(2026, 10, 4, 15, 30, tzinfo=UTC)]
    assert fires_between("0 2 * * *", "Australia/Adelaide", datetime(2026, 4, 4, tzinfo=UTC),
                         datetime(2026, 4, 6, tzinfo=UTC)) == [datetime(2026, 4, 4, 15, 30, tzinfo=UTC),
                                                               datetime(2026, 4, 5, 16, 30, tzinfo=UTC)]


def test_both_day_fields_restricted_match_either_and_a_starred_one_makes_both_match() -> None:
    jan = datetime(2025, 12, 31, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC)
    days = lambda cron: [fire.day for fire in fires_between(cron, "UTC", *jan)]  # noqa: E731
    assert days("0 0 13 * FRI") == [2, 9, 13, 16, 23, 30]  # the 13th, or a Friday
    assert days("0 0 */10 * FRI") == []  # the 1st, 11th, 21st or 31st, and a Friday: none in January 2026
    assert days("0 0 L * *") == [31]
    assert days("0 0 * * 5L") == [30]
    assert days("0 0 * * MON#2") == [12]
    assert days("0 0 1,15 * MON-FRI") == [1, 2, 5, 6, 7, 8, 9, 12, 13, 14, 15, 16, 19, 20, 21, 22, 23, 26, 27, 28,
                                          29, 30]
    day = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    assert [(fire.hour, fire.minute) for fire in fires_between("*/15 9-17/4 * * *", "UTC", *day)] == [
        (hour, minute) for hour in (9, 13, 17) for minute in (0, 15, 30, 45)]


@pytest.mark.parametrize("seconds", ["0", "15"])
def test_six_fields_move_a_time_of_day_across_daylight_saving_changes_as_five_do(seconds: str) -> None:
    five = Timing(cron="30 2 * 3,10 *", interval_s=None, timezone="Europe/Berlin")
    six = Timing(cron=f"{seconds} 30 2 * 3,10 *", interval_s=None, timezone="Europe/Berlin")
    for start in (datetime(2027, 3, 26, tzinfo=UTC), datetime(2027, 10, 29, tzinfo=UTC)):
        expected = five.upcoming(five.next_after(start), 4)
        assert six.upcoming(six.next_after(start), 4) == [fire + timedelta(seconds=int(seconds)) for fire in expected]
    # Spring: 02:30 on 28 March does not exist and fires at 03:00 CEST; autumn: 02:30 on 31 October fires once.
    assert six.next_after(datetime(2027, 3, 27, 12, tzinfo=UTC)) == datetime(2027, 3, 28, 1, 0, int(seconds),
                                                                               tzinfo=UTC)
    assert six.upcoming(six.next_after(datetime(2027, 10, 30, 12, tzinfo=UTC)), 2) == [
        datetime(2027, 10, 31, 0, 30, int(seconds), tzinfo=UTC), datetime(2028, 3, 1, 1, 30, int(seconds), tzinfo=UTC)]


def test_six_fields_fire_at_each_of_their_seconds_from_inside_a_minute_and_back_from_a_cutoff() -> None:
    twice = Timing(cron="10,40 * * * * *", interval_s=None)
    assert twice.upcoming(twice.next_after(at(15)), 3) == [at(40), at(70), at(100)]
    assert twice.next_after(at(40)) == at(70)
    assert twice.skip_before(at(10), at(COUNT_CAP * 30 + 55)) == (
        COUNT_CAP, at(COUNT_CAP * 30 + 40), at(COUNT_CAP * 30 + 70))


def test_an_interval_fires_at_whole_multiples_since_the_epoch_strictly_after_a_moment() -> None:
    every_minute = Timing(cron="", interval_s=60)
    assert every_minute.next_after(at(0)) == at(60)
    assert every_minute.next_after(at(0.5)) == at(60)
    assert every_minute.next_after(at(-0.5)) == at(0)
    assert every_minute.upcoming(at(60), 3) == [at(60), at(120), at(180)]


def test_six_fields_fire_every_second() -> None:
    assert Timing(cron="* * * * * *", interval_s=None).upcoming(at(1), 3) == [at(1), at(2), at(3)]


def test_skip_before_counts_the_fires_before_a_cutoff_exactly_or_up_to_the_cap() -> None:
    every_second = Timing(cron="", interval_s=1)
    assert every_second.skip_before(at(0), at(10.5)) == (11, at(10), at(11))
    assert every_second.skip_before(at(0), at(0)) == (0, None, at(0))
    cron = Timing(cron="* * * * * *", interval_s=None)
    assert cron.skip_before(at(0), at(10.5)) == (11, at(10), at(11))
    assert cron.skip_before(at(0), at(COUNT_CAP + 50.5)) == (COUNT_CAP, at(COUNT_CAP + 50), at(COUNT_CAP + 51))


def test_a_fire_key_names_the_schedule_and_the_nominal_time_to_the_second_in_utc() -> None:
    key = fire_key("abc", datetime(2026, 12, 1, 19, 0, tzinfo=UTC).astimezone(Timing("", 1, "Asia/Tokyo").zone))
    assert key == "schedule:abc:2026-12-01T19:00:00Z"
    assert fire_of_key(key) == ("abc", datetime(2026, 12, 1, 19, 0, tzinfo=UTC))
    assert fire_of_key("sdk-123") is None


def test_jitter_is_within_bounds_and_the_same_wherever_it_is_computed() -> None:
    delays = [jitter_delay("abc", at(n), 5.0) for n in range(200)]
    assert all(timedelta(0) <= d < timedelta(seconds=5) for d in delays)
    assert delays == [jitter_delay("abc", at(n), 5.0) for n in range(200)]
    assert len(set(delays)) > 150  # spread, not one offset
    assert jitter_delay("abc", at(0), 0.0) == timedelta(0)


# --- what a wake-up fires -------------------------------------------------------------------------


def test_each_fire_starts_one_run_keyed_by_its_nominal_time_and_a_second_wake_up_starts_nothing(
    tenant_a: tuple[Tenant, str]
) -> None:
    tenant = tenant_a[0]
    with_flow(tenant)
    make(tenant, overlap="allow_all")
    schedule = fire(tenant, at(2.2))
    assert fired_at(tenant) == [at(0), at(1), at(2)]
    assert (schedule.fired_count, schedule.next_fire_at, schedule.wake_at) == (3, at(3), at(3))
    with tenant_context(tenant):  # tagged with the schedule's name, as an event's runs are with the event's
        assert {tuple(run.tags) for run in WorkflowRun.objects.all()} == {(f"schedule:{schedule.name}",)}
    assert schedule.last_fire_at == at(2)
    again = fire(tenant, at(2.2))  # the same wake-up again: nothing moves
    assert (again.fired_count, again.next_fire_at, again.updated_at) == (
        3, at(3), schedule.updated_at)
    with tenant_context(tenant):
        Schedule.objects.update(next_fire_at=at(0), wake_at=at(0))  # as if the state were lost
    again = fire(tenant, at(2.2))
    assert fired_at(tenant) == [at(0), at(1), at(2)]  # the keys already had their runs
    assert again.fired_count == 3


def test_the_catch_up_window_starts_what_it_covers_and_counts_the_rest_as_missed(
    tenant_a: tuple[Tenant, str]
) -> None:
    tenant = tenant_a[0]
    with_flow(tenant)
    make(tenant, overlap="allow_all", catchup_window_s=4)
    schedule = fire(tenant, at(10.5))  # down for ten seconds
    assert fired_at(tenant) == [at(7), at(8), at(9), at(10)]  # 10.5 - 4 = 6.5: the fires from 7 on
    assert (schedule.missed_count, schedule.last_missed_at, schedule.next_fire_at) == (7, at(6), at(11))


def test_a_long_outage_is_jumped_over_and_counted() -> None:
    schedule = Schedule(interval_s=1, cron="", catchup_window_s=5, next_fire_at=T0, overlap="allow_all")
    plan = firing.plan_fires(schedule, at(86_400), suspended=False, active=False)
    assert plan.start == [at(86_400 - n) for n in range(5, -1, -1)]
    assert (plan.missed, plan.last_missed, plan.next_fire) == (86_400 - 5, at(86_400 - 6), at(86_401))


def test_a_wake_up_walks_at_most_its_share_of_fires_and_goes_on_at_once(tenant_a: tuple[Tenant, str]) -> None:
    tenant = tenant_a[0]
    with_flow(tenant)
    make(tenant, overlap="allow_all", catchup_window_s=600)
    now = at(firing.MAX_FIRES_PER_WAKE + 20.5)
    schedule = fire(tenant, now)
    assert (schedule.fired_count, schedule.wake_at) == (firing.MAX_FIRES_PER_WAKE, now)
    schedule = fire(tenant, now)
    assert schedule.fired_count == firing.MAX_FIRES_PER_WAKE + 21
    assert fired_at(tenant) == [at(n) for n in range(firing.MAX_FIRES_PER_WAKE + 21)]


def test_a_jitter_longer_than_the_interval_is_spread_over_the_interval_and_a_healthy_system_misses_nothing(
    tenant_a: tuple[Tenant, str]
) -> None:
    tenant = tenant_a[0]
    with_flow(tenant)
    schedule = make(tenant, interval_s=60, jitter_s=3600, overlap="allow_all")
    for _ in range(30):  # each wake-up on time, as on a healthy system
        assert schedule.wake_at is not None
        assert schedule.next_fire_at is not None
        assert schedule.next_fire_at <= schedule.wake_at < schedule.next_fire_at + timedelta(seconds=60)
        schedule = fire(tenant, schedule.wake_at)
    assert (schedule.missed_count, schedule.fired_count) == (0, 30)
    assert fired_at(tenant) == [at(60 * n) for n in range(30)]


def test_skip_starts_nothing_while_the_schedule_s_run_is_active(tenant_a: tuple[Tenant, str]) -> None:
    tenant = tenant_a[0]
    with_flow(tenant)
    make(tenant, overlap="skip")
    schedule = fire(tenant, at(2.5))
    assert fired_at(tenant) == [at(0)]
    assert schedule.skipped_count == 2
    schedule = fire(tenant, at(3.5))
    assert fired_at(tenant) == [at(0)]
    assert schedule.skipped_count == 3
    with tenant_context(tenant):
        WorkflowRun.objects.update(status=WorkflowRun.Status.SUCCEEDED)
    fire(tenant, at(4.5))
    assert fired_at(tenant) == [at(0), at(4)]


def test_skip_counts_a_continue_as_new_successor_as_the_run_going_on(tenant_a: tuple[Tenant, str]) -> None:
    tenant = tenant_a[0]
    with_flow(tenant)
    make(tenant, overlap="skip")
    fire(tenant, at(0.5))
    with tenant_context(tenant):
        first = WorkflowRun.objects.get()
        WorkflowRun.objects.filter(pk=first.pk).update(status=WorkflowRun.Status.CONTINUED)
        successor = WorkflowRun.objects.create(workflow=first.workflow, workflow_name=first.workflow_name,
                                               root_run_id=first.root_run_id, continued_from=first,
                                               status=WorkflowRun.Status.RUNNING)
    assert fire(tenant, at(1.5)).skipped_count == 1
    with tenant_context(tenant):
        WorkflowRun.objects.filter(pk=successor.pk).update(status=WorkflowRun.Status.SUCCEEDED)
    fire(tenant, at(2.5))
    assert fired_at(tenant) == [at(0), at(2)]


def test_buffer_one_keeps_the_first_fire_while_a_run_is_active_and_starts_it_once_the_run_ended(
    tenant_a: tuple[Tenant, str], settings: Any
) -> None:
    settings.DUCTOR_SCHEDULE_BUFFER_CHECK_S = 0.25
    tenant = tenant_a[0]
    with_flow(tenant)
    make(tenant, overlap="buffer_one", interval_s=10)
    fire(tenant, at(0.1))
    schedule = fire(tenant, at(20.1))
    assert fired_at(tenant) == [at(0)]
    assert (schedule.buffered_fire_at, schedule.skipped_count) == (at(10), 1)
    assert schedule.wake_at == at(20.35)  # looked at again soon, not only at the next fire
    with tenant_context(tenant):
        WorkflowRun.objects.update(status=WorkflowRun.Status.FAILED)
    schedule = fire(tenant, at(20.4))
    assert fired_at(tenant) == [at(0), at(10)]  # under the buffered fire's own key
    assert (schedule.buffered_fire_at, schedule.wake_at) == (None, at(30))


def test_a_suspended_tenant_s_fires_start_nothing_and_are_counted_as_missed(tenant_a: tuple[Tenant, str]) -> None:
    tenant = tenant_a[0]
    with_flow(tenant)
    make(tenant)
    tenant_services.tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)
    schedule = fire(tenant, at(2.5))
    assert fired_at(tenant) == []
    assert (schedule.missed_count, schedule.next_fire_at) == (3, at(3))
    tenant_services.tenant_set_status(tenant=tenant, status=Tenant.Status.ACTIVE)
    fire(tenant, at(3.5))
    assert fired_at(tenant) == [at(3)]  # the suspension is not caught up


def test_a_tenant_being_deleted_s_fires_start_nothing_and_are_counted_as_missed(tenant_a: tuple[Tenant, str]) -> None:
    tenant = tenant_a[0]
    with_flow(tenant)
    make(tenant, overlap="allow_all")
    tenant_services.tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)
    tenant_services.tenant_delete(tenant=tenant)
    schedule = fire(tenant, at(2.5))
    assert fired_at(tenant) == []
    assert (schedule.missed_count, schedule.next_fire_at, schedule.wake_at) == (3, at(3), at(3))  # moved on


def test_a_paused_schedule_does_not_fire_and_resumes_from_now(tenant_a: tuple[Tenant, str]) -> None:
    tenant = tenant_a[0]
    with_flow(tenant)
    schedule = make(tenant)
    with tenant_context(tenant):
        paused = schedules.schedule_pause(schedule=schedule)
    assert (paused.paused, paused.next_fire_at, paused.wake_at) == (True, None, None)
    fire(tenant, at(5))
    assert fired_at(tenant) == []
    with tenant_context(tenant):
        resumed = schedules.schedule_resume(schedule=schedule)
        assert resumed.next_fire_at is not None
        assert resumed.next_fire_at > T0
        assert schedules.schedule_resume(schedule=schedule).next_fire_at == resumed.next_fire_at  # idempotent


def test_a_refused_start_fails_that_fire_alone_and_keeps_the_reason(tenant_a: tuple[Tenant, str]) -> None:
    tenant = tenant_a[0]
    with_flow(tenant)
    gone = make(tenant, name="gone", overlap="allow_all")
    make(tenant, name="kept", overlap="allow_all")
    with tenant_context(tenant):
        Schedule.objects.filter(pk=gone.pk).update(workflow="deleted-since")
        firing.fire_schedules(now=at(0.5))
        refused, kept = Schedule.objects.get(name="gone"), Schedule.objects.get(name="kept")
    assert (refused.failed_count, refused.fired_count, refused.next_fire_at) == (1, 0, at(1))
    assert refused.last_error is not None
    assert refused.last_error["code"] == "invalid"
    assert refused.last_error["fire_at"] == T0.isoformat().replace("+00:00", "Z")  # as every time the API gives
    assert kept.fired_count == 1


def test_an_archived_workflow_s_schedule_counts_each_fire_as_failed_and_fires_again_once_unarchived(
    tenant_a: tuple[Tenant, str]
) -> None:
    tenant = tenant_a[0]
    with_flow(tenant)
    make(tenant, overlap="allow_all")
    with tenant_context(tenant):
        workflow_services.workflow_archive(name="nightly")
    schedule = fire(tenant, at(1.5))
    assert fired_at(tenant) == []
    assert (schedule.failed_count, schedule.next_fire_at) == (2, at(2))
    assert schedule.last_error is not None
    assert (schedule.last_error["code"], schedule.last_error["fire_at"]) == ("invalid", "2025-01-01T00:00:01Z")
    assert "archived" in schedule.last_error["message"]
    with tenant_context(tenant):
        workflow_services.workflow_unarchive(name="nightly")
    assert fire(tenant, at(2.5)).fired_count == 1
    assert fired_at(tenant) == [at(2)]


def test_a_new_cron_while_armed_drops_the_old_timing_and_fires_each_new_time_once(
    tenant_a: tuple[Tenant, str], django_capture_on_commit_callbacks: Any
) -> None:
    tenant = tenant_a[0]
    with_flow(tenant)
    schedule = make(tenant, overlap="allow_all")
    fire(tenant, at(0.5))
    with tenant_context(tenant), django_capture_on_commit_callbacks(execute=True):
        changed = schedules.schedule_update(schedule=schedule, changes={"cron": "*/10 * * * * *"})
    assert changed.interval_s is None
    new = changed.next_fire_at
    assert new is not None
    assert new.second % 10 == 0
    assert wake_pending(tenant)  # armed at the new time
    assert fire(tenant, at(5)).next_fire_at == new  # the old timing's fires: dropped, none started
    for moment in (new, new + timedelta(seconds=5), new + timedelta(seconds=5)):  # a wake-up again: nothing new
        fire(tenant, moment)
    assert fire(tenant, new + timedelta(seconds=10)).next_fire_at == new + timedelta(seconds=20)
    assert fired_at(tenant) == [T0, new, new + timedelta(seconds=10)]


def test_a_schedule_whose_time_zone_a_host_cannot_read_is_put_off_alone_and_the_others_fire(
    tenant_a: tuple[Tenant, str]
) -> None:
    tenant = tenant_a[0]
    with_flow(tenant)
    unread = make(tenant, name="unread", cron="* * * * * *", interval_s=None, timezone="Europe/Kyiv")
    make(tenant, name="kept", overlap="allow_all")
    with tenant_context(tenant):  # as a host whose tzdata is older than the zone finds it
        Schedule.objects.filter(pk=unread.pk).update(timezone="Nowhere/Zone")
        firing.fire_schedules(now=at(1.5))
        put_off, kept = Schedule.objects.get(name="unread"), Schedule.objects.get(name="kept")
    assert fired_at(tenant) == [at(0), at(1)]  # the kept schedule's fires
    assert (kept.fired_count, kept.next_fire_at) == (2, at(2))
    assert (put_off.fired_count, put_off.next_fire_at, put_off.wake_at) == (0, T0, at(61.5))
    assert put_off.last_error is not None
    assert put_off.last_error["code"] == "invalid"
    assert "Nowhere/Zone" in put_off.last_error["message"]


def test_the_run_quota_refuses_a_fire_with_quota_exceeded(tenant_a: tuple[Tenant, str]) -> None:
    tenant = tenant_a[0]
    with_flow(tenant)
    tenant_services.override_set(tenant=tenant, field="monthly_run_quota", value=1)
    make(tenant, overlap="allow_all")
    schedule = fire(tenant, at(1.5))
    assert fired_at(tenant) == [at(0)]
    assert (schedule.fired_count, schedule.failed_count) == (1, 1)
    assert schedule.last_error is not None
    assert schedule.last_error["code"] == "quota_exceeded"


@pytest.mark.django_db(transaction=True)
def test_wake_ups_of_one_tenant_running_at_once_start_each_fire_once(make_tenant: Any) -> None:
    tenant = make_tenant("racing")[0]
    with_flow(tenant)
    for n in range(5):
        make(tenant, name=f"s{n}", overlap="allow_all")

    def wake(_: int) -> None:
        with tenant_context(tenant):
            firing.fire_schedules(now=at(3.5))

    assert in_threads(4, wake) == [None] * 4
    with tenant_context(tenant):
        keys = list(WorkflowRun.objects.values_list("idempotency_key", flat=True))
        assert sum(Schedule.objects.values_list("fired_count", flat=True)) == 20
    assert len(keys) == 20
    assert max(Counter(keys).values()) == 1


# --- the wake-up and its reconciler -------------------------------------------------------------


def wake_pending(tenant: Tenant) -> bool:
    item = f"wake:{tenant.pk}:{arming.WAKE_KIND}:{arming.WAKE_REF}"
    return fair_queue.pending([(Tenant.system(), item)])[0]


def test_the_reconciler_re_arms_forgotten_wake_ups_and_every_one_after_redis_lost_its_data(
    make_tenant: Any, redis_client: Any
) -> None:
    late, on_time = make_tenant("late")[0], make_tenant("on-time")[0]
    with_flow(late)
    with_flow(on_time)
    make(late)  # due at T0, long ago
    with tenant_context(on_time):
        schedules.schedule_create(name="s", workflow="nightly", cron="0 0 1 1 *")  # next January
    assert not wake_pending(late)
    assert not wake_pending(on_time)
    assert reconcile.reconcile_schedules() == 1
    assert wake_pending(late)
    assert not wake_pending(on_time)
    redis_client.flushdb()
    assert reconcile.reconcile_schedules(full=True) == 2
    assert wake_pending(late)
    assert wake_pending(on_time)


def test_creating_a_schedule_arms_its_tenant_s_wake_up_once_committed(
    tenant_a: tuple[Tenant, str], django_capture_on_commit_callbacks: Any
) -> None:
    with_flow(tenant_a[0])
    with tenant_context(tenant_a[0]), django_capture_on_commit_callbacks(execute=True):
        schedules.schedule_create(name="s", workflow="nightly", interval_s=60)
    assert wake_pending(tenant_a[0])


# --- the API ------------------------------------------------------------------------------------


def post(client: APIClient, **body: Any) -> Any:
    return client.post("/api/v1/schedules", {"name": "s", "workflow": "nightly", **body}, format="json")


def test_a_schedule_whose_time_zone_this_host_cannot_read_is_answered_without_its_next_fires(
    client_a: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    """A zone that a host with older tzdata does not know (saved through another host): the schedule's
    page answered 500, where its ``last_error`` says why it does not fire."""
    with_flow(tenant_a[0])
    created = post(client_a, cron="0 9 * * *", timezone="Europe/Kyiv")
    assert created.status_code == 201, created.content
    with tenant_context(tenant_a[0]):
        Schedule.objects.filter(pk=created.json()["id"]).update(timezone="Nowhere/Zone")
    answered = client_a.get(f"/api/v1/schedules/{created.json()['id']}")
    assert answered.status_code == 200, answered.content
    assert (answered.json()["timezone"], answered.json()["next_fires"]) == ("Nowhere/Zone", [])


def test_a_schedule_is_created_read_listed_changed_paused_resumed_and_deleted(
    client_a: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    with_flow(tenant_a[0])
    created = post(client_a, cron="0 9 * * MON-FRI", timezone="Europe/Paris", input={"report": "daily"},
                   overlap="buffer_one", catchup_window_s=300, jitter_s=2.5)
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["cron"], body["timezone"], body["overlap"], body["input"]) == (
        "0 9 * * MON-FRI", "Europe/Paris", "buffer_one", {"report": "daily"})
    fires = [datetime.fromisoformat(f) for f in body["next_fires"]]
    assert len(fires) == 5
    assert fires == sorted(fires)
    assert fires[0] == datetime.fromisoformat(body["next_fire_at"])
    assert all(f.astimezone(Timing("", 1, "Europe/Paris").zone).hour == 9 for f in fires)
    assert all(f.weekday() < 5 for f in fires)
    url = f"/api/v1/schedules/{body['id']}"
    assert client_a.get(url).json()["next_fires"] == body["next_fires"]
    assert [row["name"] for row in client_a.get("/api/v1/schedules").json()["results"]] == ["s"]

    changed = client_a.patch(url, {"interval_s": 3600}, format="json").json()
    assert (changed["cron"], changed["interval_s"], changed["jitter_s"]) == ("", 3600, 2.5)
    assert all(datetime.fromisoformat(f).timestamp() % 3600 == 0 for f in changed["next_fires"])
    replaced = client_a.put(url, {"name": "renamed", "workflow": "nightly", "cron": "*/5 * * * *"}, format="json")
    assert replaced.status_code == 200, replaced.content
    assert (replaced.json()["name"], replaced.json()["overlap"], replaced.json()["jitter_s"]) == ("renamed", "skip", 0)

    paused = client_a.post(f"{url}/pause").json()
    assert (paused["paused"], paused["next_fire_at"], paused["next_fires"]) == (True, None, [])
    assert client_a.post(f"{url}/pause").json()["paused"] is True
    resumed = client_a.post(f"{url}/resume").json()
    assert resumed["paused"] is False
    assert len(resumed["next_fires"]) == 5
    assert client_a.delete(url).status_code == 204
    assert client_a.get(url).status_code == 404


def test_the_runs_of_a_schedule_with_a_long_name_are_listed_by_its_whole_tag(
    client_a: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    """Two schedules whose names (of up to 100 characters) begin alike each tag their runs with their
    own whole name, and ``?tag=schedule:<name>`` lists each one's. Before, the tag was cut at 100
    characters: the two shared it, and the list refused the whole tag as too long."""
    with_flow(tenant_a[0])
    names = ["n" * 99 + "a", "n" * 99 + "b"]
    runs = {}
    for name in names:
        created = post(client_a, name=name, interval_s=3600)
        assert created.status_code == 201, created.content
        triggered = client_a.post(f"/api/v1/schedules/{created.json()['id']}/trigger")
        assert triggered.status_code == 201, triggered.content
        assert triggered.json()["tags"] == [f"schedule:{name}"]
        runs[name] = triggered.json()["id"]
    for name in names:
        listed = client_a.get("/api/v1/runs", {"tag": f"schedule:{name}"})
        assert listed.status_code == 200, listed.content
        assert [run["id"] for run in listed.json()["results"]] == [runs[name]]


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"cron": "61 * * * *"}, "cron", ["field 1 of 5, the minute, is '61'", "0-59"]),
    ({"cron": "0 0 1 1 * 2099"}, "cron", ["field 6 of 6, the day of week, is '2099'", "0-7",
                                          "the second comes first", "no year field"]),
    ({"cron": "0 0 1 1 * 2099 *"}, "cron", ["it has 7 fields; give 5", "or 6"]),
    ({"cron": "* * 31 2 *"}, "cron", ["the day of month, is '31'", "one of the months named has"]),
    ({"cron": "0 0 * * L"}, "cron", ["the day of week, is 'L'", "5L (the last Friday)", "MON#2"]),
    ({"cron": "0 0 15W * *"}, "cron", ["the day of month, is '15W'", "LW (the last weekday)"]),
    ({"cron": "0 0 ? * MON"}, "cron", ["the day of month, is '?'"]),
    ({"cron": "every day"}, "cron", ["Not a cron expression"]),
    ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone", ["Unknown time zone"]),
    ({"cron": "* * * * *", "timezone": "localtime"}, "timezone", ["Unknown time zone"]),
    ({}, "cron", ["Give cron or interval_s"]),
    ({"cron": "* * * * *", "interval_s": 60}, "interval_s", ["either"]),
    ({"interval_s": 0}, "interval_s", []),
    ({"interval_s": 60, "catchup_window_s": 0}, "catchup_window_s", []),
    ({"interval_s": 60, "jitter_s": -1}, "jitter_s", []),
    ({"interval_s": 60, "overlap": "queue"}, "overlap", []),
    ({"interval_s": 60, "workflow": "missing"}, "workflow", ["not found"]),
    ({"interval_s": 60, "version": 7}, "version", ["no version 7"]),
    ({"interval_s": 60, "name": "bad name"}, "name", []),
    ({"interval_s": 60, "input": {"text": "nul\x00"}}, "input.text", ["NUL"]),
    ({"interval_s": 60, "input": [{"nul\x00": 1}]}, "input[0].nul\x00", ["NUL"]),
    ({"cron": "* * * * *\x00"}, "cron", ["NUL"]),
])
def test_bad_input_is_a_400_naming_the_field_and_leaves_nothing(
    client_a: APIClient, tenant_a: tuple[Tenant, str], body: dict[str, Any], field: str, words: list[str]
) -> None:
    with_flow(tenant_a[0])
    response = post(client_a, **body)
    error = assert_error(response, 400, "invalid")
    assert field in error["details"], error
    assert all(word in " ".join(error["details"][field]) for word in words), error
    with tenant_context(tenant_a[0]):
        assert not Schedule.objects.exists()


@pytest.mark.parametrize("body", [{}, {"cron": "* * * * *", "interval_s": 60}])
def test_a_message_said_of_both_cron_and_interval_s_is_said_once(
    client_a: APIClient, tenant_a: tuple[Tenant, str], body: dict[str, Any]
) -> None:
    with_flow(tenant_a[0])
    error = assert_error(post(client_a, **body), 400, "invalid")
    assert sorted(error["details"]) == ["cron", "interval_s"]
    said = error["details"]["cron"][0]
    assert error["message"] == f"Invalid field(s): cron, interval_s. {said}"


def test_unknown_fields_a_taken_name_and_a_bad_patch_are_refused(
    client_a: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    with_flow(tenant_a[0])
    assert error_code(post(client_a, interval_s=60, every="day")) == "unknown_field"
    schedule_id = post(client_a, interval_s=60).json()["id"]
    taken = post(client_a, interval_s=60)
    assert assert_error(taken, 409, "conflict")["details"] == {"name": ["A schedule named 's' already exists."]}
    url = f"/api/v1/schedules/{schedule_id}"
    before = client_a.get(url).json()
    for change, field in (({"cron": "nope"}, "cron"), ({"interval_s": None}, "cron"),
                          ({"timezone": "Nowhere"}, "timezone"), ({"workflow": "missing"}, "workflow")):
        assert field in assert_error(client_a.patch(url, change, format="json"), 400, "invalid")["details"]
    assert client_a.get(url).json() == before


def test_an_input_over_the_plan_s_payload_limit_is_a_413_naming_input(
    client_a: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    with_flow(tenant_a[0])
    tenant_services.override_set(tenant=tenant_a[0], field="max_payload_bytes", value=100)
    response = post(client_a, interval_s=60, input={"blob": "x" * 200})
    assert "input" in assert_error(response, 413, "payload_too_large")["details"]


def test_a_schedule_whose_input_a_lowered_payload_limit_refuses_can_still_be_paused_and_retimed(
    client_a: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    with_flow(tenant_a[0])
    url = f"/api/v1/schedules/{post(client_a, interval_s=60, input={'blob': 'x' * 200}).json()['id']}"
    tenant_services.override_set(tenant=tenant_a[0], field="max_payload_bytes", value=100)
    paused = client_a.post(f"{url}/pause")
    assert paused.status_code == 200, paused.content
    retimed = client_a.patch(url, {"cron": "0 * * * *"}, format="json")
    assert retimed.status_code == 200, retimed.content
    assert client_a.post(f"{url}/resume").status_code == 200
    # Its input is still checked when it is given again.
    refused = client_a.patch(url, {"input": {"blob": "y" * 200}}, format="json")
    assert "input" in assert_error(refused, 413, "payload_too_large")["details"]


def test_max_schedules_is_a_403_and_shows_in_the_entitlements(
    client_a: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    with_flow(tenant_a[0])
    tenant_services.override_set(tenant=tenant_a[0], field="max_schedules", value=1)
    assert post(client_a, interval_s=60).status_code == 201
    refused = assert_error(post(client_a, name="two", interval_s=60), 403, "plan_limit_reached")
    assert refused["details"]["limit"] == "max_schedules"
    entitlements = client_a.get("/api/v1/entitlements").json()
    assert entitlements["limits"]["max_schedules"] == 1
    assert entitlements["usage"]["objects"]["schedules"] == 1


# --- isolation ----------------------------------------------------------------------------------


def test_idor_tenant_b_gets_404_on_every_verb_of_tenant_a_s_schedule_and_it_is_unchanged(
    client_a: APIClient, client_b: APIClient, tenant_a: tuple[Tenant, str]
) -> None:
    with_flow(tenant_a[0])
    url = f"/api/v1/schedules/{post(client_a, interval_s=60).json()['id']}"
    before = client_a.get(url).json()
    body = {"name": "mine", "workflow": "nightly", "interval_s": 1}
    assert_error(client_b.get(url), 404, "not_found")
    assert_error(client_b.put(url, body, format="json"), 404, "not_found")
    assert_error(client_b.patch(url, {"paused": True}, format="json"), 404, "not_found")
    assert_error(client_b.delete(url), 404, "not_found")
    for action in ("pause", "resume"):
        assert_error(client_b.post(f"{url}/{action}"), 404, "not_found")
    assert client_b.get("/api/v1/schedules").json()["results"] == []
    assert client_a.get(url).json() == before


def test_a_schedule_cannot_name_another_tenant_s_workflow(
    client_b: APIClient, tenant_a: tuple[Tenant, str], tenant_b: tuple[Tenant, str]
) -> None:
    with_flow(tenant_a[0], name="theirs")
    error = assert_error(post(client_b, workflow="theirs", interval_s=60), 400, "invalid")
    assert list(error["details"]) == ["workflow"]


def test_a_wake_up_fires_only_the_schedules_of_its_own_tenant(make_tenant: Any) -> None:
    a, b = make_tenant("wake-a")[0], make_tenant("wake-b")[0]
    with_flow(a)
    with_flow(b)
    make(a)
    make(b)
    fire(a, at(0.5))
    assert fired_at(a) == [at(0)]
    assert fired_at(b) == []
    with tenant_context(b):
        assert Schedule.objects.get().fired_count == 0


def test_staff_see_their_own_tenant_s_schedules_in_the_admin_and_not_another_s(make_tenant: Any) -> None:
    from django.test import Client
    from django.urls import reverse

    from tests.tenants.helpers import grant, make_user

    a, b = make_tenant("admin-a")[0], make_tenant("admin-b")[0]
    with_flow(a)
    with_flow(b)
    ours, theirs = make(a, name="ours"), make(b, name="theirs")
    user = make_user("staff-a", tenant=a, is_staff=True)
    grant(user, "workflows.view_schedule", "workflows.delete_schedule")
    staff = Client()
    staff.force_login(user)
    page = staff.get(reverse("admin:workflows_schedule_changelist"))
    assert page.status_code == 200
    assert [row.pk for row in page.context["cl"].result_list] == [ours.pk]
    assert staff.get(reverse("admin:workflows_schedule_change", args=[ours.pk])).status_code == 200
    assert staff.get(reverse("admin:workflows_schedule_change", args=[theirs.pk])).status_code in (302, 404)
    assert staff.post(reverse("admin:workflows_schedule_delete", args=[theirs.pk]), {"post": "yes"}).status_code in (
        302, 404)
    with tenant_context(b):
        assert Schedule.objects.filter(pk=theirs.pk).exists()
