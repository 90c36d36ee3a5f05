"""The routing-quality chart: TTFT p90, throughput and hit rate per policy per offered rate,
one row of panels per scenario."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from routing_report import ScenarioResult

from ppc_extproc.workload import ALL_POLICIES

__all__ = ["write_chart"]


def write_chart(scenarios: Sequence[ScenarioResult], path: Path, title: str) -> None:
    """Three panels per scenario, one line per policy, x = offered rate (``bench`` extra: matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    palette = plt.get_cmap("tab10").colors
    colors = {name: palette[i % len(palette)] for i, name in enumerate(ALL_POLICIES)}  # same in every row
    rows = max(1, len(scenarios))
    fig, grid = plt.subplots(rows, 3, figsize=(15, 4.4 * rows), constrained_layout=True, squeeze=False)
    for sc, axes in zip(scenarios, grid):
        ax_ttft, ax_tput, ax_hit = axes
        for run in sc.runs:
            rates = [float(s.label.split()[0]) for s in run.stages]
            style = {"marker": "o", "linewidth": 2 if "precise" in run.policy.name else 1.2,
                     "color": colors.get(run.policy.name, "grey")}  # fmt: skip
            if run.policy.name == "oracle":
                style.update(linestyle="--", color="black")
            ax_ttft.plot(rates, [1000 * s.ttft_p90_s for s in run.stages], label=run.policy.name, **style)
            ax_tput.plot(rates, [s.output_tokens_per_s for s in run.stages], label=run.policy.name, **style)
            hits = [100 * s.hit_rate if not math.isnan(s.hit_rate) else math.nan for s in run.stages]
            ax_hit.plot(rates, hits, label=run.policy.name, **style)
        ax_ttft.set(title=f"{sc.title}\nTTFT p90 (ms, log)", xlabel="offered rate (req/s)", yscale="log")
        ax_tput.set(title=f"{sc.title}\nthroughput (output tokens/s)", xlabel="offered rate (req/s)")
        ax_hit.set(title=f"{sc.title}\nprompt-cache hit rate (%)", xlabel="offered rate (req/s)", ylim=(0, 100))
        for ax in axes:
            ax.grid(True, alpha=0.3)
        ax_hit.legend(loc="lower left", fontsize=8)
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
