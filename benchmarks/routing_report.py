"""Text, Markdown and the aims check for ``routing_quality.py``."""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc.workload import PolicyRun, format_table
from ppc_extproc.workload.probes import machine_info

__all__ = ["Aim", "aims", "header_lines", "machine_lines", "markdown"]

STAGE_COLUMNS = (
    "policy",
    "label",
    "hit_rate",
    "ttft_p50",
    "ttft_p90",
    "output_tps",
    "rps",
    "cv",
    "unfinished",
)
OVERALL_COLUMNS = (
    "policy", "hit_rate", "ttft_p50", "ttft_p90", "output_tps", "rps", "imbalance", "cv", "errors", "unfinished",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Aim:
    text: str
    value: float
    target: float
    #: True when higher is better (value ≥ target), False for "at most".
    at_least: bool = True

    @property
    def met(self) -> bool:
        if math.isnan(self.value):
            return False
        return self.value >= self.target if self.at_least else self.value <= self.target

    def line(self) -> str:
        verdict = "met" if self.met else "NOT met"
        return f"- {self.text}: {self.value:.2f} (target {'≥' if self.at_least else '≤'} {self.target:g}) — {verdict}"


def _by_name(runs: Sequence[PolicyRun]) -> dict[str, PolicyRun]:
    return {r.policy.name: r for r in runs}


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def aims(runs: Sequence[PolicyRun], best: str = "precise+load") -> list[Aim]:
    """Issue #6's aims, evaluated at the highest rate (the last stage) and over the run."""
    by = _by_name(runs)
    out: list[Aim] = []
    if best not in by:
        return out
    top = by[best].stages[-1]
    rate = top.label
    if "random" in by:
        value = _ratio(top.output_tokens_per_s, by["random"].stages[-1].output_tokens_per_s)
        out.append(Aim(f"{best} throughput / random at {rate}", value, 1.9))
    if "approximate" in by:
        value = _ratio(top.output_tokens_per_s, by["approximate"].stages[-1].output_tokens_per_s)
        out.append(Aim(f"{best} throughput / approximate at {rate}", value, 1.25))
    if "round-robin" in by:
        value = _ratio(by["round-robin"].stages[-1].ttft_p90_s, top.ttft_p90_s)
        out.append(Aim(f"round-robin TTFT p90 / {best} TTFT p90 at {rate}", value, 10.0))
    if "oracle" in by:
        gap = 100 * (by["oracle"].summary.hit_rate - by[best].summary.hit_rate)
        out.append(Aim(f"oracle hit rate − {best} hit rate (points, whole run)", gap, 5.0, at_least=False))
    return out


def header_lines(title: str) -> list[str]:
    m = machine_info()
    return [
        f"# {title}",
        "",
        f"command: `{shlex.join(['python', *sys.argv])}`",
        f"machine: {m['cpu']}, {m['cpus']} cores, {m['system']}, Python {m['python']}",
    ]


def machine_lines(runs: Sequence[PolicyRun]) -> list[str]:
    """Was the machine the bottleneck? CPU per process, decision latency, generator lag."""
    out = ["| policy | machine busy | service | envoy | engines (sum) | load generator | decision mean / p99 ≤ | loop lag p99 | send lag p99 |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in runs:
        cpu = r.cpu
        cores = cpu.cores_by_process if cpu else {}
        engines = sum(v for k, v in cores.items() if k.startswith("engine-"))

        def c(name: str, cores: dict[str, float] = cores) -> str:
            return f"{cores[name]:.2f}" if name in cores else "-"

        busy = f"{100 * cpu.machine_busy:.0f}%" if cpu and not math.isnan(cpu.machine_busy) else "-"
        d = r.decisions
        dec = f"{1000 * d.mean_s:.2f} / {1000 * d.p99_le_s:g} ms" if d and d.count else "-"
        out.append(
            f"| {r.policy.name} | {busy} | {c('service')} | {c('envoy')} | {engines:.2f} | {c('load-generator')} "
            f"| {dec} | {1000 * r.result.loop_lag_p99_s:.1f} ms | {1000 * r.result.send_lag_p99_s:.1f} ms |"
        )
    out.append("")
    out.append("CPU columns are average cores used during the run (the machine has "
               f"{runs[0].cpu.cpus if runs and runs[0].cpu else '?'}); \"machine busy\" counts every process on the host.")  # fmt: skip
    return out


def markdown(title: str, setup: Sequence[str], runs: Sequence[PolicyRun]) -> str:
    stages = [s for r in runs for s in r.stages]
    lines = [*header_lines(title), "", *setup, "", "## Per rate", "",
             format_table(stages, STAGE_COLUMNS, markdown=True), "", "## Whole run", "",
             format_table([r.summary for r in runs], OVERALL_COLUMNS, markdown=True), "",
             "## Aims", "", *(a.line() for a in aims(runs)), "",
             "## Is the machine the bottleneck?", "", *machine_lines(runs), ""]  # fmt: skip
    return "\n".join(lines)
