"""The markdown table and SVG regret curves of ``bench_search_lcbench.py``'s JSON results.

Per worker count W, one row per method:
- ``reached``: runs (task x seed) whose trace reached the task's target within the budget;
- ``epochs to target``: the median over tasks of the per-task median over seeds (a run
  that did not reach it counts as +inf, so a median can be "> budget");
- ``vs random``: the median over tasks of (the method's per-task median / random
  search's exact expected epochs to the target, from the reference's configurations:
  ``TaskReference.random_epochs``, never censored); a method beyond the budget as +inf;
- GPU-hours and wall hours to target: medians as for epochs;
- ``regret at budget``: the mean over runs of the normalised regret at the budget, and
  ``regret at N`` at each of :data:`REGRET_BUDGETS` below it that the runs recorded;
- ``real s / run``, ``CPU s / run``: the median real and CPU seconds one run took
  (simulation cost, not a result; a run reuses the curves its seed's earlier runs drew).
The SVG draws the mean normalised regret over runs against the epochs spent (log-log).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from _lcbench_measures import median_inf, ratio

REGRET_BUDGETS = (300, 1000, 3000, 10000)  # epochs: early to late regret
COLORS = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#aec7e8", "#ff9896", "#98df8a",
)  # fmt: skip


def _fmt(v: float, digits: str = ".3g") -> str:
    return "> budget" if math.isinf(v) else format(v, digits)


def _per_task(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    by_task: dict[str, list[float | None]] = defaultdict(list)
    for r in runs:
        hit = r["to_target"]
        by_task[r["task"]].append(None if hit is None else hit[key])
    return {t: median_inf(v) for t, v in by_task.items()}


def table(result: dict[str, Any], workers: int) -> str:
    """The markdown table of the runs with ``workers`` workers."""
    budget = result["args"]["budget"]
    runs = [r for r in result["runs"] if r["workers"] == workers]
    methods = list(dict.fromkeys(r["method"] for r in runs))
    random_epochs = {t: ref["random_epochs"] for t, ref in result["references"].items()}
    marks = [
        b
        for b in REGRET_BUDGETS
        if b < budget and all(str(b) in r.get("regret_at", {}) for r in runs)
    ]
    head = ["regret at budget", *(f"regret at {b}" for b in marks), "real s / run", "CPU s / run"]
    lines = [
        f"W = {workers}, budget {budget} epochs, target = best of"
        f" {result['args']['reference_samples']} random configurations - "
        f"{result['args']['points']:g} point(s)",
        "",
        "| method | reached | epochs to target | vs random | GPU-h to target | wall h to target | "
        + " | ".join(head)
        + " |",
        "|---" * (6 + len(head)) + "|",
    ]
    for m in methods:
        rs = [r for r in runs if r["method"] == m]
        epochs = _per_task(rs, "epochs")
        ratios = [
            ratio(e, random_epochs[t], budget) for t, e in epochs.items() if t in random_epochs
        ]
        hit = sum(r["to_target"] is not None for r in rs)
        lines.append(
            f"| {m} | {hit}/{len(rs)} | {_fmt(statistics.median(epochs.values()), 'g')}"
            f" | {_fmt(statistics.median(ratios), '.2f') if ratios else 'n/a'}"
            f" | {_fmt(statistics.median(_per_task(rs, 'gpu_hours').values()))}"
            f" | {_fmt(statistics.median(_per_task(rs, 'wall_hours').values()))}"
            f" | {statistics.fmean(r['regret'][-1] for r in rs):.4f}"
            + "".join(
                f" | {statistics.fmean(r['regret_at'][str(b)] for r in rs):.4f}" for b in marks
            )
            + f" | {statistics.median(r['real_s'] for r in rs):.1f}"
            f" | {_fmt(statistics.median(r.get('cpu_s', math.nan) for r in rs), '.1f')} |"
        )
    return "\n".join(lines)


def mean_curves(result: dict[str, Any], workers: int) -> dict[str, list[float]]:
    """Method -> mean normalised regret over runs at each checkpoint."""
    out: dict[str, list[float]] = {}
    runs = [r for r in result["runs"] if r["workers"] == workers]
    for m in dict.fromkeys(r["method"] for r in runs):
        curves = [r["regret"] for r in runs if r["method"] == m]
        out[m] = [statistics.fmean(c[i] for c in curves) for i in range(len(curves[0]))]
    return out


def svg(result: dict[str, Any], workers: int, width: int = 720, height: int = 440) -> str:
    """The regret curves at ``workers`` as a standalone SVG (no network, no fonts)."""
    xs = result["checkpoints"]
    curves = mean_curves(result, workers)
    ys = [y for c in curves.values() for y in c if y > 0]
    lo_y = 10 ** math.floor(math.log10(min(ys))) if ys else 1e-3
    hi_y = 10 ** math.ceil(math.log10(max(ys))) if ys else 1.0
    left, right, top, bottom = 70, 200, 30, 50
    pw, ph = width - left - right, height - top - bottom
    lx0, lx1 = math.log10(xs[0]), math.log10(max(xs[-1], xs[0] + 1))
    ly0, ly1 = math.log10(lo_y), math.log10(hi_y if hi_y > lo_y else lo_y * 10)

    def px(x: float) -> float:
        return left + pw * (math.log10(x) - lx0) / (lx1 - lx0)

    def py(y: float) -> float:
        return top + ph * (1 - (math.log10(max(y, lo_y)) - ly0) / (ly1 - ly0))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        ' font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18">mean normalised regret vs epochs, W = {workers}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="black"/>',
    ]
    for k in range(math.floor(lx0), math.ceil(lx1) + 1):
        if lx0 <= k <= lx1:
            parts.append(f'<text x="{px(10**k):.1f}" y="{top + ph + 18}">1e{k}</text>')
    for k in range(round(ly0), round(ly1) + 1):
        parts.append(f'<text x="{left - 40}" y="{py(10**k) + 4:.1f}">1e{k}</text>')
    parts.append(f'<text x="{left + pw / 2 - 20:.0f}" y="{height - 10}">epochs</text>')
    for i, (m, c) in enumerate(curves.items()):
        color = COLORS[i % len(COLORS)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, c, strict=True))
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        ly = top + 14 * i + 10
        parts.append(
            f'<line x1="{left + pw + 10}" y1="{ly}" x2="{left + pw + 30}" y2="{ly}"'
            f' stroke="{color}" stroke-width="2"/>'
        )
        parts.append(f'<text x="{left + pw + 35}" y="{ly + 4}">{m}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def is_peer(method: str) -> bool:
    """Optuna's and Syne Tune's methods (``topk`` is the counter-anchor, not a peer)."""
    return method.startswith(("optuna-", "syne-"))


def verdicts(result: dict[str, Any], workers: int) -> list[str]:
    """The targets per dlhpc method at ``workers``: its median epochs to target against
    random's expectation and the best peer's, and the share of the regret checkpoints
    where its mean curve is at or below every peer's."""
    runs = [r for r in result["runs"] if r["workers"] == workers]
    methods = list(dict.fromkeys(r["method"] for r in runs))
    peers = [m for m in methods if is_peer(m)]
    med = {
        m: statistics.median(_per_task([r for r in runs if r["method"] == m], "epochs").values())
        for m in methods
    }
    curves = mean_curves(result, workers)
    best_peer = min(peers, key=lambda m: med[m]) if peers else None
    out = []
    for m in methods:
        if is_peer(m) or m in ("topk", "random"):
            continue
        line = f"W={workers} {m}: median epochs to target {_fmt(med[m], 'g')}"
        tasks = {r["task"] for r in runs}
        expected = [result["references"][t]["random_epochs"] for t in sorted(tasks)]
        line += f" (random's expectation {_fmt(statistics.median(expected), '.4g')})"
        if best_peer is not None:
            below = sum(
                all(c <= curves[p][i] + 1e-12 for p in peers) for i, c in enumerate(curves[m])
            )
            line += (
                f"; best peer {best_peer} {_fmt(med[best_peer], 'g')};"
                f" regret at or below every peer's at {below}/{len(curves[m])} checkpoints"
            )
        out.append(line)
    return out


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Shards of one run (the same arguments but ``--shard``), or runs of other methods
    on the same tasks and budget, as one result (the first one's arguments)."""
    first = dict(results[0])
    first["runs"] = [r for res in results for r in res["runs"]]
    first["references"] = {k: v for res in results for k, v in res["references"].items()}
    first["skipped"] = {k: v for res in results for k, v in res.get("skipped", {}).items()}
    first["runtime_s"] = sum(res.get("runtime_s", 0.0) for res in results)
    first["shards_runtime_s"] = [res.get("runtime_s") for res in results]
    if all("tasks_done" in res for res in results):
        first["tasks_done"] = [t for res in results for t in res["tasks_done"]]
    return first


def write_report(result: dict[str, Any], svg_dir: Path | None, stem: str) -> str:
    """Every W's table (returned as markdown); with ``svg_dir``, ``<stem>-w<W>.svg`` and
    ``<stem>-w<W>.csv`` (the curves' data) there."""
    texts = []
    for w in sorted({r["workers"] for r in result["runs"]}):
        texts.append(table(result, w))
        texts.append("\n".join(verdicts(result, w)))
        if svg_dir is not None:
            svg_dir.mkdir(parents=True, exist_ok=True)
            (svg_dir / f"{stem}-w{w}.svg").write_text(svg(result, w))
            rows = ["method," + ",".join(map(str, result["checkpoints"]))]
            for m, c in mean_curves(result, w).items():
                rows.append(m + "," + ",".join(f"{y:.6g}" for y in c))
            (svg_dir / f"{stem}-w{w}.csv").write_text("\n".join(rows) + "\n")
    for name, why in result.get("skipped", {}).items():
        texts.append(f"skipped {name}: {why}")
    return "\n\n".join(texts)
