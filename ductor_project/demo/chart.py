"""The demo's PNG (matplotlib, Agg): the worker processes each tenant's items kept busy over time, each
tenant's share of the worker time against its weighted-fair share, and the waiting time of the dispatched
items."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes

COLORS = {"floodco": "#d62728", "acme": "#1f77b4", "globex": "#2ca02c", "latecomer": "#9467bd"}


def write_chart(
    path: Path,
    *,
    labels: Mapping[str, str],
    times: Sequence[float],
    busy: Mapping[str, Sequence[float]],
    processes: int,
    share: Mapping[str, Sequence[float | None]],
    fair: Mapping[str, Sequence[float | None]],
    waits_ms: Mapping[str, Sequence[float | None]],
    markers: Sequence[tuple[float, str]],
    drain_from: float | None,
    end: float,
    subtitle: str,
    headline: str,
) -> Path:
    """Draw the three panels and save the PNG at ``path``; returns it.

    ``busy`` (worker-seconds per second), ``share`` and ``fair`` (fractions of the work done) are per
    bucket (``metrics.work_per_bucket``), stacked in the order of ``busy``; ``processes`` is the pool's
    size; ``markers`` are events (seconds, label), and from ``drain_from`` on no new work came but the
    flood's.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slugs = list(busy)
    colors = [COLORS.get(s, "#888888") for s in slugs]
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(12, 11), sharex=True, height_ratios=(3, 2.6, 2))
    fig.suptitle("Ductor demo: weighted fair sharing under a noisy neighbour", fontsize=15, fontweight="bold",
                 y=0.995)
    fig.text(0.5, 0.962, headline, ha="center", fontsize=10)
    fig.text(0.5, 0.945, subtitle, ha="center", fontsize=8.5, color="#555555")
    _busy(top, times, busy, processes, labels, colors)
    _shares(middle, times, share, fair, slugs, colors)
    _waits(bottom, times, waits_ms, slugs, colors, end)
    _phases((top, middle, bottom), markers, drain_from, end)
    handles, names = top.get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", ncol=len(names), fontsize=9, frameon=False,
               bbox_to_anchor=(0.5, 0.94))
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _busy(axis: Axes, times: Sequence[float], busy: Mapping[str, Sequence[float]], processes: int,
          labels: Mapping[str, str], colors: list[str]) -> None:
    """The top panel: worker processes busy with each tenant's items, stacked, under the pool's size."""
    slugs = list(busy)
    axis.stackplot(times, *(busy[s] for s in slugs), labels=[labels[s] for s in slugs], colors=colors, alpha=0.85)
    axis.axhline(processes, color="black", linewidth=1, linestyle=":")
    axis.set_ylabel("busy worker processes, stacked\n(worker-seconds per second)")
    axis.set_title(f"Worker time per tenant (dotted: the pool's {processes} processes)", fontsize=9.5, loc="left")
    axis.set_ylim(0, processes * 1.32)
    axis.grid(alpha=0.3)


def _shares(axis: Axes, times: Sequence[float], share: Mapping[str, Sequence[float | None]],
            fair: Mapping[str, Sequence[float | None]], slugs: list[str], colors: list[str]) -> None:
    """The middle panel: each tenant's share of the worker time (bands) against its fair share (dashed)."""
    percent = {s: [100 * (v or 0.0) for v in share[s]] for s in slugs}
    axis.stackplot(times, *(percent[s] for s in slugs), colors=colors, alpha=0.75)
    below = [0.0] * len(times)
    for slug in slugs[:-1]:  # the last boundary is 100%
        below = [b + 100 * (f if f is not None else math.nan) for b, f in zip(below, fair[slug], strict=True)]
        axis.plot(times, below, color="black", linestyle=(0, (4, 2)), linewidth=1.3)
    axis.set_ylim(0, 100)
    axis.set_ylabel("share of worker time\n(%, stacked)")
    axis.set_title("Each tenant's share of worker time (bands) against its weighted-fair share (dashed: "
                   "weight ÷ Σ weights of the tenants with work waiting)", fontsize=9.5, loc="left")
    axis.grid(alpha=0.3)


def _waits(axis: Axes, times: Sequence[float], waits_ms: Mapping[str, Sequence[float | None]], slugs: list[str],
           colors: list[str], end: float) -> None:
    """The bottom panel: the median wait of each tenant's dispatched items, log scale."""
    for slug, color in zip(slugs, colors, strict=True):
        points = [(t, w) for t, w in zip(times, waits_ms[slug], strict=True) if w is not None]
        if points:
            axis.plot([t for t, _ in points], [max(w, 1.0) for _, w in points], marker="o", markersize=3,
                      color=color, linewidth=1.5)
    axis.set_yscale("log")
    axis.set_ylabel("median wait, due → dispatched\n(ms, log scale)")
    axis.set_title("How long each tenant's due work waited for a worker", fontsize=9.5, loc="left")
    axis.set_xlabel("seconds since the workload started")
    axis.grid(alpha=0.3, which="both")
    axis.set_xlim(0, end)


def _phases(axes: Sequence[Axes], markers: Sequence[tuple[float, str]], drain_from: float | None,
            end: float) -> None:
    """The phases on every panel: the drain shaded, each event a dashed line, labelled on the top panel."""
    for axis in axes:
        if drain_from is not None:
            axis.axvspan(drain_from, end, color="#000000", alpha=0.06, linewidth=0)
        for at, _ in markers:
            axis.axvline(at, color="#555555", linestyle="--", linewidth=1)
    for index, (at, text) in enumerate(sorted(markers)):
        right = at > 0.6 * end  # late labels go left of their line, so that they stay inside the panel
        axes[0].annotate(text, xy=(at, 1.0), xycoords=("data", "axes fraction"),
                         xytext=(-3 if right else 3, -12 - 11 * (index % 3)), textcoords="offset points",
                         ha="right" if right else "left", fontsize=8.5, color="#222222",
                         bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none",
                               "alpha": 0.8})
