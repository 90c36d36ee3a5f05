"""The routing-quality chart: TTFT p90, throughput and hit rate per policy per offered rate."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from ppc_extproc.workload import PolicyRun

__all__ = ["write_chart"]


def write_chart(runs: Sequence[PolicyRun], path: Path, title: str) -> None:
    """Three panels, one line per policy, x = offered rate (``bench`` extra: matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8), constrained_layout=True)
    ax_ttft, ax_tput, ax_hit = axes
    for run in runs:
        rates = [float(s.label.split()[0]) for s in run.stages]
        style = {"marker": "o", "linewidth": 2 if "precise" in run.policy.name else 1.2}
        if run.policy.name == "oracle":
            style.update(linestyle="--", color="black")
        ax_ttft.plot(rates, [1000 * s.ttft_p90_s for s in run.stages], label=run.policy.name, **style)
        ax_tput.plot(rates, [s.output_tokens_per_s for s in run.stages], label=run.policy.name, **style)
        hits = [100 * s.hit_rate if not math.isnan(s.hit_rate) else math.nan for s in run.stages]
        ax_hit.plot(rates, hits, label=run.policy.name, **style)
    ax_ttft.set(title="TTFT p90 (ms, log)", xlabel="offered rate (req/s)", yscale="log")
    ax_tput.set(title="throughput (output tokens/s)", xlabel="offered rate (req/s)")
    ax_hit.set(title="prompt-cache hit rate (%)", xlabel="offered rate (req/s)", ylim=(0, 100))
    for ax in axes:
        ax.grid(True, alpha=0.3)
    ax_hit.legend(loc="lower left", fontsize=8)
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
