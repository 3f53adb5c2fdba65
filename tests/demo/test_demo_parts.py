"""The demo's pure parts: its fairness arithmetic, its reading of the children's logs, its HTTP service."""

from __future__ import annotations

import json
import socket
import struct
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from ductor_project.demo import metrics
from ductor_project.demo.service import FLAKY_FAILURES, DemoService


def test_jain_index_is_one_when_equal_and_one_over_n_when_one_tenant_has_everything():
    assert metrics.jain([0.9, 0.9, 0.9]) == pytest.approx(1.0)
    assert metrics.jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert metrics.jain([]) is None


def test_weighted_fair_dispatches_give_a_ratio_of_one_and_a_starved_tenant_zero():
    # Both tenants always have work waiting; "heavy" (weight 3) gets 3 of every 4 dispatches.
    fair = {"heavy": metrics.TenantData(), "light": metrics.TenantData()}
    for i in range(400):
        fair["heavy" if i % 4 else "light"].items.append((0.0, 1.0 + i))
    for row in fair.values():
        row.items.append((0.0, None))  # still waiting at the end: backlogged throughout
    shares = metrics.shares(fair, {"heavy": 3, "light": 1}, until=1000.0)
    assert shares["heavy"].ratio == pytest.approx(1.0)
    assert shares["light"].ratio == pytest.approx(1.0)
    assert shares["light"].fair == pytest.approx(0.25)

    starved = {"hog": metrics.TenantData(), "victim": metrics.TenantData()}
    starved["hog"].items.extend((0.0, 1.0 + i) for i in range(100))
    starved["hog"].items.append((0.0, None))
    starved["victim"].items.append((0.0, None))
    shares = metrics.shares(starved, {"hog": 1, "victim": 1}, until=1000.0)
    assert shares["victim"].ratio == 0
    assert shares["hog"].ratio == pytest.approx(2.0)


def test_a_tenant_alone_with_work_is_not_counted_as_competing():
    alone = {"a": metrics.TenantData(), "b": metrics.TenantData()}
    alone["a"].items.extend((0.0, 1.0 + i) for i in range(10))
    shares = metrics.shares(alone, {"a": 1, "b": 1}, until=100.0)
    assert shares["a"].contested == 0
    assert shares["a"].ratio is None


def test_worker_time_shared_by_weight_gives_a_ratio_of_one_however_cheap_a_tenants_items_are():
    # One process, both tenants backlogged throughout: every 0.4 s "heavy" (weight 3) runs one 0.3 s item,
    # "light" (weight 1) ten 0.01 s items. Worker time is 3 : 1, as the weights say; dispatches are 1 : 10.
    data = {"heavy": metrics.TenantData(), "light": metrics.TenantData()}
    for cycle in range(100):
        at = cycle * 0.4
        data["heavy"].work.append((at, at + 0.3))
        data["heavy"].items.append((0.0, at))
        for i in range(10):
            began = at + 0.3 + i * 0.01
            data["light"].work.append((began, began + 0.01))
            data["light"].items.append((0.0, began))
    for row in data.values():
        row.items.append((0.0, None))  # still waiting at the end: backlogged throughout
    weights = {"heavy": 3, "light": 1}
    work = metrics.work_shares(data, weights, until=40.0)
    assert work["heavy"].got == pytest.approx(30.0)
    assert work["light"].contested == pytest.approx(40.0)
    assert work["light"].fair == pytest.approx(0.25)
    assert work["heavy"].ratio == pytest.approx(1.0)
    assert work["light"].ratio == pytest.approx(1.0)
    assert metrics.shares(data, weights, until=40.0)["light"].share == pytest.approx(10 / 11)


def test_a_tenant_kept_from_the_workers_while_backlogged_gets_no_worker_time():
    data = {"hog": metrics.TenantData(), "victim": metrics.TenantData()}
    data["hog"].work.extend((i * 1.0, i * 1.0 + 1.0) for i in range(10))
    for row in data.values():
        row.items.append((0.0, None))
    work = metrics.work_shares(data, {"hog": 1, "victim": 1}, until=10.0)
    assert work["victim"].ratio == 0
    assert work["victim"].owed == pytest.approx(5.0)
    assert work["hog"].ratio == pytest.approx(2.0)


def test_worker_time_counts_only_while_the_tenant_and_another_are_backlogged_and_only_inside_the_window():
    # "a" is backlogged from 0 to 10 s, "b" from 5 s on; a's item runs from -1 to 12 s, b's from 6 to 8 s.
    # "c" never waits: its item, handed out before, runs from 5 to 10 s and is nobody's to share.
    data = {"a": metrics.TenantData(), "b": metrics.TenantData(), "c": metrics.TenantData()}
    data["a"].items.append((0.0, 10.0))
    data["b"].items.append((5.0, None))
    data["a"].work.append((-1.0, 12.0))
    data["b"].work.append((6.0, 8.0))
    data["c"].work.append((5.0, 10.0))
    work = metrics.work_shares(data, {"a": 1, "b": 1, "c": 1}, until=11.0)
    assert work["a"].got == pytest.approx(5.0)  # from 5 to 10 s, not before b waited nor after a stopped
    assert work["a"].contested == pytest.approx(7.0)  # and b's 2 s; not c's 5 s
    assert work["b"].got == pytest.approx(2.0)
    assert work["b"].contested == pytest.approx(7.0)  # b alone from 10 s on: not contested
    assert work["a"].owed == work["b"].owed == pytest.approx(3.5)
    assert work["c"].contested == 0

    alone = {"a": metrics.TenantData(), "b": metrics.TenantData()}
    alone["a"].items.append((0.0, None))
    alone["a"].work.append((0.0, 5.0))
    shares = metrics.work_shares(alone, {"a": 1, "b": 1}, until=10.0)
    assert shares["a"].contested == 0
    assert shares["a"].ratio is None


def test_bucket_work_is_cut_where_it_was_done_and_shares_add_up_to_one():
    # 0-10 s: a (weight 3) and b (1) wait; a works throughout, b from 5 s, c (nothing waiting) until 5 s.
    # 10-20 s: nobody waits; a's next item runs from 15 to 25 s, half in each bucket.
    # 20-30 s: b waits alone and works from 22 to 26 s; 30-40 s: nothing done.
    data = {"a": metrics.TenantData(), "b": metrics.TenantData(), "c": metrics.TenantData()}
    data["a"].items.append((0.0, 10.0))
    data["b"].items.extend([(0.0, 10.0), (20.0, None)])
    data["a"].work.extend([(0.0, 10.0), (15.0, 25.0)])
    data["b"].work.extend([(5.0, 10.0), (22.0, 26.0)])
    data["c"].work.append((0.0, 5.0))
    buckets = metrics.work_per_bucket(data, {"a": 3, "b": 1, "c": 1}, until=40.0, bucket_s=10.0)
    assert buckets.busy["a"] == pytest.approx([1.0, 0.5, 0.5, 0.0])
    assert buckets.busy["b"] == pytest.approx([0.5, 0.0, 0.4, 0.0])
    assert buckets.share["a"][0] == pytest.approx(10 / 20)
    assert buckets.share["c"][0] == buckets.fair["c"][0] == pytest.approx(5 / 20)  # nobody kept from c's work
    assert buckets.fair["a"][0] == pytest.approx(0.75 * 15 / 20)  # 3 of 4 of the waiting tenants' work
    assert buckets.fair["b"][0] == pytest.approx(0.25 * 15 / 20)
    assert buckets.share["a"][1] == buckets.fair["a"][1] == 1.0
    assert buckets.fair["a"][2] == pytest.approx(5 / 9)
    assert buckets.fair["b"][2] == pytest.approx(4 / 9)  # the only tenant waiting is owed all the waiting work
    for bucket in (0, 1, 2):
        assert sum(buckets.share[s][bucket] or 0 for s in data) == pytest.approx(1.0)
        assert sum(buckets.fair[s][bucket] or 0 for s in data) == pytest.approx(1.0)
    assert buckets.share["a"][3] is None
    assert buckets.fair["b"][3] is None


def test_task_steps_wait_for_their_teams_worker_so_they_make_no_backlog_on_the_pool(tenant_a):
    # acme's step is a task step published to the shop's queue: it waited for the shop's slot, not the
    # pool's, so it is neither acme's backlog nor one of its dispatches or waits; its tick is all three.
    tenant, _ = tenant_a
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    at = t0 + timedelta(seconds=10)
    dispatches = [metrics.Dispatch("acme", at, 2000.0, "tick:1"), metrics.Dispatch("acme", at, 5000.0, "step:2")]
    starts = [metrics.TaskStart("acme", at, 5000.0, "shop.charge", "shop", "step:2")]
    work = [metrics.Work("acme", "tick", at + timedelta(seconds=1), 250.0)]
    data = metrics.collect({"acme": tenant}, dispatches, work, t0, task_starts=starts)
    assert data["acme"].items == [(8.0, 10.0)]
    assert data["acme"].waits_ms == [2000.0]
    assert data["acme"].work == [(pytest.approx(10.75), 11.0)]
    everything = metrics.collect({"acme": tenant}, dispatches, work, t0)
    assert sorted(everything["acme"].items) == [(5.0, 10.0), (8.0, 10.0)]


def test_the_item_log_reads_only_new_complete_lines_of_known_tenants(tmp_path: Path):
    log = tmp_path / "dispatcher-1.log"
    log.write_text(json.dumps({"event": "dispatched", "tenant_id": "t1", "waited_ms": 5,
                               "timestamp": "2026-01-01T00:00:00Z"}) + "\n")
    reader = metrics.ItemLog([log], {"t1": "acme", "t2": "globex"})
    line = {"event": "dispatched", "tenant_id": "t2", "waited_ms": 40, "timestamp": "2026-01-01T00:00:01Z"}
    finished = {"event": "item_finished", "tenant_id": "t1", "kind": "step", "outcome": "ok", "work_ms": 12.5,
                "timestamp": "2026-01-01T00:00:02Z"}
    with log.open("a") as handle:
        handle.write("not json at all\n")
        handle.write(json.dumps({**line, "tenant_id": "system"}) + "\n")
        handle.write(json.dumps({**finished, "work_ms": "lots"}) + "\n")
        handle.write(json.dumps(line) + "\n")
        handle.write(json.dumps(finished) + "\n")
        handle.write(json.dumps(line)[:20])  # a line still being written
    assert [(d.slug, d.waited_ms) for d in reader.read()] == [("globex", 40.0)]
    with log.open("a") as handle:
        handle.write(json.dumps(line)[20:] + "\n")
    assert [d.slug for d in reader.read()] == ["globex"]
    assert len(reader.dispatches) == 2
    assert [(w.slug, w.kind, w.work_ms, w.finished.second) for w in reader.work] == [("acme", "step", 12.5, 2)]
    # The whole file, as the fairness benchmark reads it: the record before the reader began is there too.
    log.write_text(json.dumps(finished) + "\n" + json.dumps({**finished, "tenant_id": "t3"}) + "\n")
    assert [w.slug for w in metrics.read_work([log, tmp_path / "missing.log"], {"t1": "acme"})] == ["acme"]


def test_the_demo_service_wants_the_secret_fails_flaky_calls_then_answers_and_counts_slow_ones():
    service = DemoService(token="s3cret", delay_s=0)
    service.start()
    try:
        auth = {"Authorization": "Bearer s3cret"}
        assert httpx.get(f"{service.url}/eu/price", params={"sku": "A"}).status_code == 401
        codes = [httpx.get(f"{service.url}/pay/flaky", params={"key": "k"}, headers=auth).status_code
                 for _ in range(FLAKY_FAILURES + 1)]
        assert codes == [503] * FLAKY_FAILURES + [200]
        assert httpx.get(f"{service.url}/us/countdown", params={"n": 3}, headers=auth).json() == {"n": 2}
        calls = [threading.Thread(target=httpx.get, args=(f"{service.url}/reports/slow",),
                                  kwargs={"params": {"ms": 200}, "headers": auth}) for _ in range(3)]
        for call in calls:
            call.start()
        for call in calls:
            call.join()
        stats = service.stats()
        assert stats["slow_max_concurrent"] == 3
        assert stats["refused"] == 1
        assert stats["calls"]["pay flaky"] == FLAKY_FAILURES + 1
    finally:
        service.stop()


def test_the_demo_service_says_nothing_of_a_client_that_resets_its_connection(capsys: pytest.CaptureFixture[str]):
    service = DemoService(token="s3cret", delay_s=0)
    service._server.daemon_threads = False  # so that stop() waits for every request's thread
    service.start()
    try:
        host, port = service._server.server_address[:2]
        gone = socket.create_connection((str(host), int(port)))
        gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        gone.close()  # a reset (RST), before the request line: as a killed worker's connection
        # Accepted after the reset one (the listen queue is first in, first out), and answered.
        assert httpx.get(f"{service.url}/eu/price", params={"sku": "A"}).status_code == 401
    finally:
        service.stop()
    assert capsys.readouterr().err == ""
