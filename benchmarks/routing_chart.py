"""The routing-quality charts: one PNG per scenario (hit rate, TTFT p90, throughput per policy)
and an overview of every scenario (``bench`` extra: matplotlib)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from routing_report import ScenarioResult

from ppc_extproc_lab.workload import PolicyRun

__all__ = ["write_charts"]

# Ours in blues, peers in warm colours, the oracle in grey: the same in every chart.
_COLORS = {"round-robin": "#9ecae1", "approximate": "#6baed6", "precise": "#3182bd", "precise+spec": "#2171b5",
           "precise+load": "#08519c", "default": "#08306b", "vllm-router": "#fd8d3c", "sglang-router": "#e6550d",
           "oracle": "#969696"}  # fmt: skip


def _color(run: PolicyRun) -> str:
    return _COLORS.get(run.policy.name, "#bdbdbd")


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panel(ax: Any, runs: Sequence[PolicyRun], values: Sequence[float], title: str, fmt: str, log: bool = False) -> None:
    names = [r.policy.name for r in runs]
    shown = [0.0 if math.isnan(v) else v for v in values]
    bars = ax.bar(names, shown, color=[_color(r) for r in runs])
    for bar, v in zip(bars, values):
        label = "-" if math.isnan(v) else fmt.format(v)
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_title(title, fontsize=10)
    if log and any(v > 0 for v in shown):
        ax.set_yscale("log")
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    ax.grid(True, axis="y", alpha=0.3)


def write_scenario_chart(sc: ScenarioResult, path: Path, title: str) -> None:
    """Hit rate, TTFT p90 (log) and output tokens/s, one bar per policy."""
    plt = _plt()
    fig, (ax_hit, ax_ttft, ax_tput) = plt.subplots(1, 3, figsize=(15, 4.6), constrained_layout=True)
    runs = sc.runs
    _panel(ax_hit, runs, [100 * r.summary.hit_rate for r in runs], "prompt-cache hit rate (%)", "{:.1f}")
    ax_hit.set_ylim(0, 105)
    _panel(ax_ttft, runs, [1000 * r.summary.ttft_p90_s for r in runs], "TTFT p90 (ms, log)", "{:,.0f}", log=True)
    _panel(ax_tput, runs, [r.summary.output_tokens_per_s for r in runs], "output tokens/s", "{:.0f}")
    fig.suptitle(f"{title}\n{sc.title}", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_overview_chart(scenarios: Sequence[ScenarioResult], path: Path, title: str) -> None:
    """TTFT p90 (log) and hit rate per scenario, policies side by side."""
    plt = _plt()
    names: list[str] = []
    for sc in scenarios:
        names += [r.policy.name for r in sc.runs if r.policy.name not in names]
    fig, (ax_ttft, ax_hit) = plt.subplots(2, 1, figsize=(14, 8), constrained_layout=True)
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        xs, p90s, hits = [], [], []
        for i, sc in enumerate(scenarios):
            run = next((r for r in sc.runs if r.policy.name == name), None)
            if run is not None:
                xs.append(i + j * width)
                p90s.append(1000 * run.summary.ttft_p90_s)
                hits.append(100 * run.summary.hit_rate)
        color = _COLORS.get(name, "#bdbdbd")
        ax_ttft.bar(xs, [0 if math.isnan(v) else v for v in p90s], width, label=name, color=color)
        ax_hit.bar(xs, [0 if math.isnan(v) else v for v in hits], width, label=name, color=color)
    ticks = [i + 0.4 - width / 2 for i in range(len(scenarios))]
    for ax in (ax_ttft, ax_hit):
        ax.set_xticks(ticks, [sc.title.split(")")[0] + ") " + sc.key for sc in scenarios])
        ax.grid(True, axis="y", alpha=0.3)
    ax_ttft.set(title="TTFT p90 (ms, log)", yscale="log")
    ax_hit.set(title="prompt-cache hit rate (%)", ylim=(0, 100))
    ax_ttft.legend(fontsize=8, ncol=len(names))
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_charts(scenarios: Sequence[ScenarioResult], directory: Path, title: str, prefix: str = "routing_quality") -> list[Path]:
    """``<prefix>.png`` (overview) and ``<prefix>_<scenario>.png`` in ``directory``; the paths."""
    paths = [directory / f"{prefix}.png"]
    write_overview_chart(scenarios, paths[0], title)
    for sc in scenarios:
        paths.append(directory / f"{prefix}_{sc.key}.png")
        write_scenario_chart(sc, paths[-1], title)
    return paths
