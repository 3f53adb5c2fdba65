"""``docs/operations.md`` lists every metric that ``/metrics`` serves, with its labels, and no other;
and every warning and error the product logs, for an operator to alert on.

An operator builds dashboards and alerts from that list: a metric added without its row, a label
added or renamed without the docs, or a row left for a metric that is gone, fails here. Both kinds
are read from the code: the metrics the processes record (``ductor_project.core.metrics``), and the
gauges a scrape reads from Redis (``scheduling.metrics.SharedStateCollector``), fed a snapshot in
which every family has a sample, so each shows its labels.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from prometheus_client.metrics import MetricWrapperBase

from ductor_project.core import metrics as recorded
from scheduling import fair_queue as fq
from scheduling import metrics as served
from tests.conftest import ROOT

# A row of a table of the Metrics section: its first cell names one or more metrics (`a`, `b`).
METRIC_ROW = re.compile(r"^\| ((?:`ductor_\w+`(?:, )?)+) \|(.*)$", re.MULTILINE)
NAME = re.compile(r"`(\w+)`")
# What a labels cell says of a label's values, in parentheses after it.
EXPLAINED = re.compile(r"\([^)]*\)")


def metrics_section() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    start = text.index("\n## Metrics\n")
    return text[start:text.index("\n## ", start + 1)]


def documented() -> dict[str, frozenset[str]]:
    """Each metric the docs' tables list: its labels (the backquoted names of its labels cell,
    without what the parentheses say of their values)."""
    found: dict[str, frozenset[str]] = {}
    for names, rest in METRIC_ROW.findall(metrics_section()):
        cells = [cell.strip() for cell in rest.split(" | ")]
        # The processes' table has a type column (histogram, counter) before the labels.
        labels_cell = cells[1] if cells[0] in ("histogram", "counter", "gauge") else cells[0]
        labels = frozenset(NAME.findall(EXPLAINED.sub("", labels_cell)))
        for name in NAME.findall(names):
            found[name] = labels
    return found


def recorded_metrics() -> dict[str, frozenset[str]]:
    """The metrics the processes record, by the name a scrape shows (a counter's with ``_total``)."""
    found: dict[str, frozenset[str]] = {}
    for metric in vars(recorded).values():
        if isinstance(metric, MetricWrapperBase):
            (family,) = metric.describe()
            name = f"{family.name}_total" if family.type == "counter" else family.name
            found[name] = frozenset(metric._labelnames)
    return found


def full_snapshot() -> served.Snapshot:
    """Shared state in which every gauge has a sample: a shard with a tier, a tenant, a lease, a
    worker slot, breakers and a loop's heartbeat."""
    tier = fq.TierStats(backlog=2, due=1, in_flight=1, oldest_waiting_ms=5)
    tenant = fq.TenantDepth("00000000-0000-0000-0000-000000000001", 2, 1, 1)
    return served.Snapshot(
        depths=[fq.ShardDepth(shard=0, tiers={"standard": tier}, tenants=1, largest=[tenant])],
        stats=[fq.GlobalStats(shard=0, tiers={"standard": fq.GlobalTierStats(1, 0, 0.0)}, in_flight=1)],
        slots={"ductor.work": 4}, busy={"ductor.work": 1}, breakers=(1, 0),
        lags={"dispatcher": {"host-1": 0.5}})


def served_gauges(monkeypatch: pytest.MonkeyPatch) -> dict[str, frozenset[str]]:
    snapshot = full_snapshot()

    class Cached:
        def get(self) -> served.Snapshot:
            return snapshot

    monkeypatch.setattr(served, "_cache", Cached())
    found: dict[str, frozenset[str]] = {}
    for family in served.SharedStateCollector().collect():
        assert family.samples, f"{family.name} has no sample: the snapshot must give it one"
        found[family.name] = frozenset(family.samples[0].labels)
    return found


def differences(code: dict[str, frozenset[str]], docs: dict[str, Any]) -> list[str]:
    missing = [f"{name} (labels {sorted(labels)}) is not in the docs" for name, labels in code.items()
               if name not in docs]
    stale = [f"{name} is in the docs, not in the code" for name in docs if name not in code]
    wrong = [f"{name}: the code's labels are {sorted(labels)}, the docs say {sorted(docs[name])}"
             for name, labels in code.items() if name in docs and docs[name] != labels]
    return missing + stale + wrong


def test_operations_md_lists_every_metric_with_its_labels_and_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    code = {**recorded_metrics(), **served_gauges(monkeypatch)}
    assert len(code) > 20  # both kinds were found
    assert differences(code, documented()) == []


def test_no_metric_has_a_label_that_names_a_run_a_workflow_or_an_item() -> None:
    """The labels whose values grow with the platform's use; the only per-tenant label is the
    scrape's bounded ``tenant_id`` (the top N and ``other``)."""
    unbounded = {"tenant_id", "tenant", "run_id", "step_id", "item_id", "workflow", "node_id", "connection_id",
                 "path", "url", "error"}
    for name, labels in recorded_metrics().items():
        assert not labels & unbounded, name


# A warning or an error the product logs, by its event's name (the one logged by a name held in a
# variable, ``errors.service_out_of_reach``'s, is named in its own row).
WARNING_OR_WORSE = re.compile(r"\blog\.(?:warning|error|exception|critical)\(\s*\"([a-z_]+)\"")
PRODUCT = ("ductor_project", "tenants", "scheduling", "workflows")


def logs_section() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    start = text.index("\n## Logs\n")
    return text[start:text.index("\n## ", start + 1)]


def test_operations_md_lists_every_warning_and_error_the_product_logs() -> None:
    """An operator alerts on the events of the Logs section: each warning or error of the code is one."""
    logged = {name for package in PRODUCT for path in (ROOT / package).rglob("*.py")
              for name in WARNING_OR_WORSE.findall(path.read_text())}
    assert len(logged) > 40  # the pattern finds them
    listed = set(NAME.findall(logs_section()))
    assert sorted(logged - listed) == []
