"""Summaries as a plain-text table (for the terminal) or a Markdown table (for files)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ppc_extproc_lab.workload.report import Summary

__all__ = ["COLUMNS", "format_table", "ms", "num", "pct"]


def pct(v: float) -> str:
    """A fraction as a percentage (``-`` for NaN)."""
    return "-" if math.isnan(v) else f"{100 * v:.1f}%"


def ms(v: float) -> str:
    """Seconds as whole milliseconds (``-`` for NaN)."""
    return "-" if math.isnan(v) else f"{1000 * v:,.0f}"


def num(v: float, digits: int = 1) -> str:
    """A number with ``digits`` decimals (``-`` for NaN)."""
    return "-" if math.isnan(v) else f"{v:,.{digits}f}"


#: (header, right-aligned, formatter)
COLUMNS: dict[str, tuple[str, bool, Callable[[Summary], str]]] = {
    "policy": ("policy", False, lambda s: s.policy),
    "label": ("rate", False, lambda s: s.label),
    "hit_rate": ("hit rate", True, lambda s: pct(s.hit_rate)),
    "ttft_p50": ("TTFT p50 ms", True, lambda s: ms(s.ttft_p50_s)),
    "ttft_p90": ("TTFT p90 ms", True, lambda s: ms(s.ttft_p90_s)),
    "output_tps": ("out tok/s", True, lambda s: num(s.output_tokens_per_s)),
    "rps": ("req/s", True, lambda s: num(s.requests_per_s, 2)),
    "imbalance": ("max/mean", True, lambda s: num(s.imbalance_max_mean, 2)),
    "cv": ("CV", True, lambda s: num(s.imbalance_cv, 2)),
    "completed": ("done", True, lambda s: str(s.completed)),
    "pd": ("P/D", True, lambda s: pct(s.disaggregated / s.completed if s.completed else math.nan)),
    "errors": ("errors", True, lambda s: str(s.errors)),
    "unfinished": ("unfinished", True, lambda s: str(s.unfinished)),
}
DEFAULT_COLUMNS = (
    "policy", "hit_rate", "ttft_p50", "ttft_p90", "output_tps", "rps", "imbalance", "errors", "unfinished",
)  # fmt: skip


def format_table(
    summaries: Sequence[Summary],
    columns: Sequence[str] = DEFAULT_COLUMNS,
    *,
    markdown: bool = False,
) -> str:
    """Render ``summaries`` one per row with the given ``COLUMNS`` keys."""
    specs = [COLUMNS[c] for c in columns]
    header = [h for h, _, _ in specs]
    rows = [[fmt(s) for _, _, fmt in specs] for s in summaries]
    widths = [max([len(header[i]), *(len(r[i]) for r in rows)]) for i in range(len(specs))]

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(w) if right else c.ljust(w) for c, w, (_, right, _) in zip(cells, widths, specs, strict=True)]
        return ("| " + " | ".join(out) + " |") if markdown else "  ".join(out).rstrip()

    if markdown:
        cells = [
            ("-" * (w + 1) + ":") if right else "-" * (w + 2) for w, (_, right, _) in zip(widths, specs, strict=True)
        ]
        rule = "|" + "|".join(cells) + "|"
    else:
        rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])
