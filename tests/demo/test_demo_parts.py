"""The demo's pure parts: its fairness arithmetic, its reading of the dispatcher log, its HTTP service."""

from __future__ import annotations

import json
import threading
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


def test_bucket_shares_add_up_to_one_and_owe_each_backlogged_tenant_its_weight():
    # 0-10 s: heavy (3) and light (1) both backlogged, heavy gets 3 of every 4; 10-20 s: light alone.
    data = {"heavy": metrics.TenantData(), "light": metrics.TenantData()}
    for i in range(40):
        data["heavy" if i % 4 else "light"].items.append((0.0, 0.1 + i * 0.25))
    data["heavy"].items.append((0.0, 9.99))  # its last item: backlogged until then
    data["light"].items.extend((0.0, 10.0 + i * 0.5) for i in range(20))
    got, fair = metrics.shares_per_bucket(data, {"heavy": 3, "light": 1}, until=20.0, bucket_s=10.0)
    assert got["heavy"][0] == pytest.approx(31 / 41)
    assert fair["heavy"][0] == pytest.approx(0.75)
    assert fair["light"][0] == pytest.approx(0.25)
    assert got["light"][1] == fair["light"][1] == 1.0
    assert got["heavy"][1] == fair["heavy"][1] == 0.0
    for bucket in (0, 1):
        assert sum(got[s][bucket] or 0 for s in data) == pytest.approx(1.0)
        assert sum(fair[s][bucket] or 0 for s in data) == pytest.approx(1.0)
    _, empty = metrics.shares_per_bucket(data, {"heavy": 3, "light": 1}, until=30.0, bucket_s=10.0)
    assert empty["light"][2] is None


def test_the_dispatch_log_reads_only_new_complete_lines_of_known_tenants(tmp_path: Path):
    log = tmp_path / "dispatcher-1.log"
    log.write_text(json.dumps({"event": "dispatched", "tenant_id": "t1", "waited_ms": 5,
                               "timestamp": "2026-01-01T00:00:00Z"}) + "\n")
    reader = metrics.DispatchLog([log], {"t1": "acme", "t2": "globex"})
    line = {"event": "dispatched", "tenant_id": "t2", "waited_ms": 40, "timestamp": "2026-01-01T00:00:01Z"}
    with log.open("a") as handle:
        handle.write("not json at all\n")
        handle.write(json.dumps({**line, "tenant_id": "system"}) + "\n")
        handle.write(json.dumps(line) + "\n")
        handle.write(json.dumps(line)[:20])  # a line still being written
    assert [(d.slug, d.waited_ms) for d in reader.read()] == [("globex", 40.0)]
    with log.open("a") as handle:
        handle.write(json.dumps(line)[20:] + "\n")
    assert [d.slug for d in reader.read()] == ["globex"]
    assert len(reader.dispatches) == 2


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
