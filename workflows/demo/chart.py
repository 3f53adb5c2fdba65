"""The demo's PNG: per-tenant throughput over time (stacked), and the waiting time of steps (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

COLORS = {"floodco": "#d62728", "acme": "#1f77b4", "globex": "#2ca02c", "latecomer": "#9467bd"}


def write_chart(
    path: Path,
    *,
    labels: Mapping[str, str],
    times: Sequence[float],
    dispatches_per_s: Mapping[str, Sequence[float]],
    waits_ms: Mapping[str, Sequence[float | None]],
    markers: Sequence[tuple[float, str]],
    subtitle: str,
) -> Path:
    """Draw both panels and save the PNG at ``path``; returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True, height_ratios=(3, 2))
    fig.suptitle("Ductor demo: per-tenant throughput under a noisy neighbour", fontsize=14, fontweight="bold",
                 y=0.99)
    top.set_title(subtitle, fontsize=9, color="#444444")
    slugs = list(dispatches_per_s)
    top.stackplot(times, *(dispatches_per_s[s] for s in slugs), labels=[labels[s] for s in slugs],
                  colors=[COLORS.get(s, "#888888") for s in slugs], alpha=0.85)
    top.set_ylabel("dispatches per second, stacked\n(run ticks and steps)")
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    for slug, waits in waits_ms.items():
        points = [(t, w) for t, w in zip(times, waits, strict=True) if w is not None]
        if points:
            bottom.plot([t for t, _ in points], [max(w, 1.0) for _, w in points], marker="o", markersize=3,
                        label=labels[slug], color=COLORS.get(slug), linewidth=1.5)
    bottom.set_yscale("log")
    bottom.set_ylabel("median wait, due → dispatched\n(ms, log scale)")
    bottom.set_xlabel("seconds since the workload started")
    bottom.grid(alpha=0.3, which="both")
    for axis in (top, bottom):
        for at, _ in markers:
            axis.axvline(at, color="#777777", linestyle="--", linewidth=1)
    for index, (at, text) in enumerate(markers):
        top.annotate(text, xy=(at, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12 - 11 * index),
                     textcoords="offset points", fontsize=8, color="#333333")
    handles, names = top.get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", ncol=len(names), fontsize=9, frameon=False,
               bbox_to_anchor=(0.5, 0.945))
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
