"""Text and Markdown for ``routing_quality.py``: one row group per scenario, the aims, details."""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ppc_extproc_lab.workload import PolicyRun, format_table, summarize
from ppc_extproc_lab.workload.aims import Aim, PolicyNumbers, scenario_aims
from ppc_extproc_lab.workload.probes import machine_info
from ppc_extproc_lab.workload.report import UNFINISHED
from ppc_extproc_lab.workload.scenarios import Scenario
from ppc_extproc_lab.workload.table import ms as _ms
from ppc_extproc_lab.workload.table import num as _num
from ppc_extproc_lab.workload.table import pct as _pct

__all__ = [
    "ScenarioResult",
    "aims_of",
    "header_lines",
    "machine_lines",
    "markdown",
    "results_table",
    "scenario_details",
]

STAGE_COLUMNS = ("policy", "label", "hit_rate", "ttft_p50", "ttft_p90", "output_tps", "rps", "unfinished")


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    """One scenario's runs: every policy on the same schedule, cluster shape and disturbance."""

    scenario: Scenario
    runs: Sequence[PolicyRun]

    @property
    def key(self) -> str:
        return self.scenario.key

    @property
    def title(self) -> str:
        return self.scenario.title


def _oracle(sc: ScenarioResult) -> PolicyRun | None:
    return next((r for r in sc.runs if r.policy.oracle), None)


def aims_of(sc: ScenarioResult) -> list[Aim]:
    numbers = [PolicyNumbers(r.policy.name, r.policy.kind, r.summary.hit_rate, r.summary.ttft_p90_s) for r in sc.runs]
    return scenario_aims(sc.key, numbers)


def header_lines(title: str, versions: Sequence[str]) -> list[str]:
    m = machine_info()
    return [
        f"# {title}",
        "",
        f"command: `{shlex.join(['python', *sys.argv])}`",
        f"machine: {m['cpu']}, {m['cpus']} cores, {m['system']}, Python {m['python']}",
        f"versions: {', '.join(versions)}",
    ]


def results_table(scenarios: Sequence[ScenarioResult], *, markdown: bool) -> str:
    """Every scenario's policies, one row group per scenario (whole run, routed requests)."""
    header = ["scenario", "policy", "form", "hit rate", "oracle", "% of oracle", "TTFT p50 ms", "TTFT p90 ms",
              "out tok/s", "max/mean", "router CPU s/1k req", "errors/unfinished"]  # fmt: skip
    right = [False, False, False, *([True] * 9)]
    rows: list[list[str]] = []
    for sc in scenarios:
        oracle = _oracle(sc)
        oracle_hit = oracle.summary.hit_rate if oracle else math.nan
        for i, r in enumerate(sc.runs):
            s = r.summary
            share = s.hit_rate / oracle_hit if oracle_hit and not math.isnan(oracle_hit) else math.nan
            rows.append([
                sc.title if i == 0 else "", r.policy.name, r.form, _pct(s.hit_rate), _pct(oracle_hit),
                _pct(share), _ms(s.ttft_p50_s), _ms(s.ttft_p90_s), _num(s.output_tokens_per_s),
                _num(s.imbalance_max_mean, 2), _num(r.router_cpu_s_per_1k, 1), f"{s.errors}/{s.unfinished}",
            ])  # fmt: skip
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) if rows else len(header[i]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(w) if rj else c.ljust(w) for c, w, rj in zip(cells, widths, right)]
        return ("| " + " | ".join(out) + " |") if markdown else "  ".join(out).rstrip()

    rule = ("|" + "|".join(("-" * (w + 1) + ":") if rj else "-" * (w + 2) for w, rj in zip(widths, right)) + "|"
            if markdown else "  ".join("-" * w for w in widths))  # fmt: skip
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def aims_table(scenarios: Sequence[ScenarioResult]) -> list[str]:
    """One row per scenario: every aim with its number and ✓/✗."""
    out = ["| scenario | aims (✓ met, ✗ missed) |", "|---|---|"]
    for sc in scenarios:
        found = aims_of(sc)
        text = "; ".join(a.line() for a in found) if found else "(no ppc-extproc policy completed)"
        out.append(f"| {sc.title} | {text} |")
    return out


def outside_lines(runs: Sequence[PolicyRun]) -> list[str]:
    """The requests sent around the router, per policy (not in the main table)."""
    outside = [r.outside for r in runs if r.outside is not None]
    if not outside:
        return []
    return ["Outside requests (sent straight to an engine, round-robin; not counted above):", "",
            format_table(outside, ("policy", "completed", "hit_rate", "ttft_p50", "ttft_p90", "errors"), markdown=True),
            ""]  # fmt: skip


def restart_lines(runs: Sequence[PolicyRun], window_s: float) -> list[str]:
    """What the restart did to the tenants the restarted engine held, per policy."""
    out = [f"Requests of the tenants the restarted engine held, sent in the {window_s:g} s after the restart:",
           "",
           "| policy | restarted (tenants per engine) | requests | back to the restarted engine | hit rate "
           "| TTFT p50 ms | TTFT p90 ms | failed (whole run) |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in runs:
        rs = r.restart
        if rs is None:
            out.append(f"| {r.policy.name} | (run ended before the restart) | | | | | | |")
            continue
        held = set(rs.tenants)
        after = [x for x in r.result.records if not x.direct and x.tenant in held
                 and x.sent_s is not None and rs.at_s <= x.sent_s < rs.at_s + window_s]  # fmt: skip
        s = summarize(r.policy.name, after)
        back = sum(1 for x in after if x.ok and x.endpoint == rs.endpoint)
        share = f"{100 * back / s.completed:.0f}%" if s.completed else "-"
        failed = sum(1 for x in r.result.records if x.error is not None and x.error not in UNFINISHED)
        out.append(
            f"| {r.policy.name} | engine-{rs.engine} at {rs.at_s:.1f} s, {len(rs.tenants)} tenants "
            f"({'/'.join(map(str, rs.tenants_per_engine))}){' — ' + rs.error if rs.error else ''} "
            f"| {len(after)} | {share} | {_pct(s.hit_rate)} | {_ms(s.ttft_p50_s)} | {_ms(s.ttft_p90_s)} | {failed} |"
        )
    return out + [""]


def machine_lines(runs: Sequence[PolicyRun]) -> list[str]:
    """Was the machine the bottleneck? CPU per process, decision latency, generator lag."""
    out = ["| policy | machine busy | router (sum) | engines (sum) | load generator | decision mean / p99 ≤ "
           "| loop lag p99 | send lag p99 |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in runs:
        cores = r.cpu.cores_by_process if r.cpu else {}
        engines = sum(v for k, v in cores.items() if k.startswith("engine-"))
        router = sum(cores.get(n, 0.0) for n in r.router_processes)
        busy = _pct(r.cpu.machine_busy) if r.cpu else "-"
        gen = cores.get("load-generator", math.nan)
        d = r.decisions
        dec = f"{1000 * d.mean_s:.2f} / {1000 * d.p99_le_s:g} ms" if d and d.count else "-"
        rtr = f"{router:.2f}" if r.router_processes else "-"
        out.append(
            f"| {r.policy.name} | {busy} | {rtr} | {engines:.2f} | {_num(gen, 2)} "
            f"| {dec} | {1000 * r.result.loop_lag_p99_s:.1f} ms | {1000 * r.result.send_lag_p99_s:.1f} ms |"
        )
    cpus = runs[0].cpu.cpus if runs and runs[0].cpu else "?"
    out += ["", f"Average cores used during the run (the machine has {cpus}); \"machine busy\" counts every process "
            "on the host; \"router (sum)\" adds up Envoy and every service replica (ours) or every peer replica "
            "and its balancer.", ""]  # fmt: skip
    return out


def scenario_details(sc: ScenarioResult, *, markdown: bool, restart_window_s: float) -> list[str]:
    """Per-rate table (several rates only), restart and outside tables, aims, machine check."""
    lines: list[str] = []
    if len(sc.scenario.stages) > 1:
        stages = [s for r in sc.runs for s in r.stages]
        lines += [format_table(stages, STAGE_COLUMNS, markdown=markdown), ""]
    if sc.scenario.restart is not None:
        lines += restart_lines(sc.runs, restart_window_s)
    lines += outside_lines(sc.runs)
    lines += [("- " if markdown else "  ") + a.line() for a in aims_of(sc)] + [""]
    if markdown:
        lines += ["Is the machine the bottleneck?", "", *machine_lines(sc.runs)]
    return lines


def markdown(
    title: str,
    versions: Sequence[str],
    setup: Sequence[str],
    scenarios: Sequence[ScenarioResult],
    *,
    charts: Sequence[str] = (),
    restart_window_s: float = 6.0,
) -> str:
    lines = [*header_lines(title, versions), "", *setup, "", results_table(scenarios, markdown=True), "",
             "Aims (issue #14):", "", *aims_table(scenarios), ""]  # fmt: skip
    lines += [f"![{c}]({c})" for c in charts] + ([""] if charts else [])
    for sc in scenarios:
        lines += [f"## {sc.title}", "", *scenario_details(sc, markdown=True, restart_window_s=restart_window_s)]
    return "\n".join(lines)
