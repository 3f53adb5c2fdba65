"""An SVG drawing of a run's DAG, each node coloured by its state (for the admin run page)."""

from __future__ import annotations

from html import escape
from typing import Any

COLOURS = {
    "succeeded": "#2e7d32", "failed": "#c62828", "running": "#1565c0", "queued": "#6a1b9a",
    "scheduled": "#ef6c00", "waiting": "#00838f", "skipped": "#9e9e9e", "cancelled": "#616161",
    "pending": "#bdbdbd",
}
BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 150, 40, 60, 20, 10


def _layers(nodes: list[dict[str, Any]]) -> dict[str, int]:
    depth: dict[str, int] = {}
    remaining = list(nodes)
    while remaining:
        progressed = False
        for node in list(remaining):
            deps = node.get("depends_on", [])
            if all(d in depth for d in deps):
                depth[node["id"]] = 1 + max((depth[d] for d in deps), default=-1)
                remaining.remove(node)
                progressed = True
        if not progressed:  # a cycle cannot be stored, but never loop forever
            for node in remaining:
                depth[node["id"]] = 0
            break
    return depth


def render_dag(spec: dict[str, Any], statuses: dict[str, str]) -> str:
    """The DAG of ``spec`` as an SVG string; ``statuses`` maps node id to its latest step status."""
    nodes = list(spec.get("nodes", []))
    depth = _layers(nodes)
    columns: dict[int, list[str]] = {}
    for node in nodes:
        columns.setdefault(depth[node["id"]], []).append(node["id"])
    pos: dict[str, tuple[int, int]] = {}
    for col, ids in columns.items():
        for row, node_id in enumerate(ids):
            pos[node_id] = (PAD + col * (BOX_W + GAP_X), PAD + row * (BOX_H + GAP_Y))
    width = PAD * 2 + max(columns, default=0) * (BOX_W + GAP_X) + BOX_W
    height = PAD * 2 + max((len(v) for v in columns.values()), default=1) * (BOX_H + GAP_Y)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">']
    for node in nodes:
        x2, y2 = pos[node["id"]]
        for dep in node.get("depends_on", []):
            if dep in pos:
                x1, y1 = pos[dep]
                parts.append(f'<line x1="{x1 + BOX_W}" y1="{y1 + BOX_H // 2}" x2="{x2}" y2="{y2 + BOX_H // 2}" '
                             'stroke="#888" stroke-width="1.5"/>')
    for node in nodes:
        x, y = pos[node["id"]]
        state = statuses.get(node["id"], "pending")
        colour = COLOURS.get(state, "#bdbdbd")
        label = escape(f'{node["id"]} ({node.get("type", "")})')
        parts.append(f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="{colour}"/>')
        parts.append(f'<text x="{x + 8}" y="{y + 16}" fill="white">{label}</text>')
        parts.append(f'<text x="{x + 8}" y="{y + 32}" fill="white">{escape(state)}</text>')
    parts.append("</svg>")
    return "".join(parts)
