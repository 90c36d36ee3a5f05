"""The demo run: each policy on a fresh local cluster, the same seeded workload, one table.

Defaults (≈ 2 minutes on 2 cores): 4 mock engines of 160 blocks × 64 tokens (10,240 tokens:
room for the contexts of 5 of the 8 tenants, minus what running requests pin), a serial prefill
lane of 3,000 tokens/s, 10 ms decode steps, 8 sequences per engine; 8 tenants × a 2,048-token
context, 4 users each, 256-token questions, 32-token answers, 3-turn sessions; Poisson arrivals
at 10 req/s for 40 s per policy. Round-robin spreads every tenant over every engine, so each
engine's cache churns and most prompts are prefilled in full — the prefill lanes saturate, queues
and TTFT grow; precise-prefix routing keeps each tenant where its context is cached.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ppc_extproc.tokenizer.local import LocalTokenizer
from ppc_extproc_lab.demo.defaults import (
    DEFAULT_DRAIN_S,
    DEFAULT_DURATION_S,
    DEFAULT_ENGINES,
    DEFAULT_FORM,
    DEFAULT_NUM_BLOCKS,
    DEFAULT_POLICIES,
    DEFAULT_RATE_PER_S,
)
from ppc_extproc_lab.tiny_tokenizer import build_tiny_tokenizer
from ppc_extproc_lab.workload import (
    ClusterPlan,
    EngineProfile,
    PolicyRun,
    ProgressLine,
    Stage,
    Workload,
    WorkloadSpec,
    arrivals,
    format_table,
    policy,
    run_policy,
)
from ppc_extproc_lab.workload.clients import EngineTokens, Form, RequestClient, client_for
from ppc_extproc_lab.workload.probes import machine_info
from ppc_extproc_lab.workload.report import UNFINISHED, Summary
from ppc_extproc_lab.workload.runner import Conversations
from ppc_extproc_lab.workload.table import DEFAULT_COLUMNS
from ppc_extproc_lab.workload.text import TextWorkload, chars_per_token

__all__ = ["DEFAULT_POLICIES", "MIN_COMPLETED", "DemoOptions", "DemoResult", "failures", "run_demo", "verdict"]

#: Policy name → the name shown in the table.
_DISPLAY = {"default": "precise-prefix"}
#: A policy that completes less of its schedule than this fails the demo: its figures say little.
MIN_COMPLETED = 0.9


@dataclass(frozen=True, slots=True)
class DemoOptions:
    engines: int = DEFAULT_ENGINES
    rate_per_s: float = DEFAULT_RATE_PER_S
    duration_s: float = DEFAULT_DURATION_S
    seed: int = 0
    policies: tuple[str, ...] = DEFAULT_POLICIES
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    profile: EngineProfile = field(default_factory=lambda: EngineProfile(num_blocks=DEFAULT_NUM_BLOCKS))
    #: Seconds after the last arrival before open requests are cut off (counted "unfinished").
    drain_s: float = DEFAULT_DRAIN_S
    max_requests: int | None = None
    keep_logs: bool = False
    #: ``chat``, ``text`` or ``tokens`` (see ``defaults.FORMS``).
    form: str = DEFAULT_FORM
    #: Prefill engines of a P/D policy (0: half of ``engines``).
    prefill_engines: int = 0


@dataclass(slots=True)
class DemoResult:
    options: DemoOptions
    runs: list[PolicyRun]
    machine: dict[str, str | int]

    @property
    def summaries(self) -> list[Summary]:
        return [r.summary for r in self.runs]

    def to_json(self) -> dict[str, Any]:
        o = self.options
        return {
            "machine": self.machine,
            "options": {
                "engines": o.engines, "rate_per_s": o.rate_per_s, "duration_s": o.duration_s,
                "seed": o.seed, "policies": list(o.policies), "drain_s": o.drain_s, "form": o.form,
                "workload": dataclasses.asdict(o.workload), "engine": dataclasses.asdict(o.profile),
            },
            "results": [_run_json(r) for r in self.runs],
        }  # fmt: skip


def _nan_none(v: Any) -> Any:
    return None if isinstance(v, float) and math.isnan(v) else v


def _run_json(run: PolicyRun) -> dict[str, Any]:
    out: dict[str, Any] = {
        "policy": run.policy.name,
        "description": run.policy.description,
        "summary": {k: _nan_none(v) for k, v in run.summary.as_dict().items()},
        "loop_lag_p99_s": _nan_none(run.result.loop_lag_p99_s),
        "send_lag_p99_s": _nan_none(run.result.send_lag_p99_s),
    }
    if run.cpu is not None:
        out["cpu"] = dataclasses.asdict(run.cpu)
    if run.decisions is not None:
        out["decisions"] = {k: _nan_none(v) for k, v in dataclasses.asdict(run.decisions).items()}
    return out


def verdict(summaries: Sequence[Summary]) -> str:
    """One honest sentence comparing the first policy with the second."""
    if len(summaries) < 2:
        return ""
    a, b = summaries[0], summaries[1]

    def ratio(x: float, y: float) -> str:
        return "n/a" if math.isnan(x) or math.isnan(y) or y == 0 else f"{x / y:.1f}x"

    ttft = ratio(b.ttft_p90_s, a.ttft_p90_s) + " lower"
    if a.ttft_p90_s > b.ttft_p90_s > 0:
        ttft = ratio(a.ttft_p90_s, b.ttft_p90_s) + " higher"
    return (
        f"{a.policy} vs {b.policy}: hit rate {100 * a.hit_rate:.0f}% vs {100 * b.hit_rate:.0f}%, "
        f"TTFT p90 {ttft}, "
        f"throughput {ratio(a.output_tokens_per_s, b.output_tokens_per_s)}."
    )


def _first_error(run: PolicyRun) -> str | None:
    return next((r.error for r in run.result.records if r.error is not None and r.error not in UNFINISHED), None)


def failures(runs: Sequence[PolicyRun], *, check: bool = False) -> list[str]:
    """Why the run does not show what it should, one sentence each (empty: it does).

    Always: a policy completed less than ``MIN_COMPLETED`` of its schedule. With ``check`` (what
    CI asks): also any failed request, and the first policy not beating the second on hit rate —
    or, when the first is a P/D policy (which the lab's time model does not favour), no request of
    it disaggregated.
    """
    problems: list[str] = []
    for run in runs:
        s = run.summary
        first = _first_error(run)
        because = f"; first error: {first}" if first is not None else ""
        if s.completed < MIN_COMPLETED * s.scheduled:
            problems.append(
                f"{s.policy} completed {s.completed} of {s.scheduled} scheduled requests (less than "
                f"{MIN_COMPLETED:.0%}; {s.errors} failed, {s.unfinished} unfinished){because}"
            )
        elif check and s.errors:
            problems.append(f"{s.policy}: {s.errors} requests failed{because}")
    if check and runs and runs[0].policy.pd:
        if not runs[0].summary.disaggregated:
            problems.append(f"{runs[0].summary.policy}: no request was disaggregated")
    elif check and len(runs) >= 2:
        a, b = runs[0].summary, runs[1].summary
        if not (a.hit_rate > b.hit_rate):  # NaN (nothing completed) fails too
            problems.append(f"{a.policy} does not beat {b.policy} on hit rate "
                            f"({100 * a.hit_rate:.1f}% vs {100 * b.hit_rate:.1f}%)")  # fmt: skip
    return problems


def describe(options: DemoOptions) -> str:
    w, p = options.workload, options.profile
    return (
        f"{options.engines} mock engines: {p.num_blocks} blocks x {p.block_size} tokens of KV cache, "
        f"prefill {p.prefill_tokens_per_s:,.0f} tok/s, decode {p.decode_ms_per_token:g} ms/token, "
        f"max {p.max_num_seqs} seqs\n"
        f"workload: {w.tenants} tenants x {w.context_tokens}-token context, {w.users_per_tenant} users "
        f"each, {w.question_tokens}-token questions, {w.output_tokens}-token answers, "
        f"{w.turns_per_session}-turn sessions (working set {w.working_set_tokens:,} tokens; "
        f"cluster cache {options.engines * p.capacity_tokens:,})\n"
        f"arrivals: Poisson {options.rate_per_s:g} req/s for {options.duration_s:g} s per policy, "
        f"seed {options.seed}; requests: {_FORM_TEXT[options.form]}"
        + (_pd_text(options) if "pd" in options.policies else "")
    )


def _pd_text(options: DemoOptions) -> str:
    prefill = options.prefill_engines or max(1, options.engines // 2)
    return (f"\nP/D policies: {prefill} prefill engines + {options.engines - prefill} decode pods (llm-d's "
            f"nixlv2 sidecar in front of each); the other policies: the same {options.engines} engines aggregated")


_FORM_TEXT = {
    "chat": "chat completions (openai client; tiny tokenizer built at run time)",
    "text": "string-prompt completions (tiny tokenizer built at run time)",
    "tokens": "token-id completions",
}


def _request_side(options: DemoOptions, spec: WorkloadSpec, scratch: Path) -> tuple[Conversations, RequestClient | None, str | None]:
    """The conversations, the client sending them and the engines' tokenizer, for ``options.form``."""
    if options.form == "tokens":
        return Workload(spec), None, None
    build_tiny_tokenizer(scratch)
    tokens = EngineTokens(LocalTokenizer.from_dir(scratch))
    form: Form = "chat" if options.form == "chat" else "text"
    client = client_for(form, model=ClusterPlan().model, max_tokens=spec.output_tokens, tokens=tokens)
    return TextWorkload(spec, chars_per_token=chars_per_token(tokens.text)), client, str(scratch)


def run_demo(options: DemoOptions, stream: TextIO | None = None) -> DemoResult:
    """Run every policy of ``options`` in turn; progress and notes go to ``stream`` (stderr)."""
    err = stream if stream is not None else sys.stderr
    spec = dataclasses.replace(options.workload, seed=options.seed)
    stages = [Stage(options.rate_per_s, options.duration_s)]
    schedule = arrivals(spec, stages, options.max_requests)
    runs: list[PolicyRun] = []
    with tempfile.TemporaryDirectory(prefix="ppc-demo-tokenizer-") as scratch:
        conversations, client, tokenizer = _request_side(options, spec, Path(scratch))
        plan = ClusterPlan(engines=options.engines, profile=options.profile, keep_logs=options.keep_logs,
                           tokenizer=tokenizer, prefill_engines=options.prefill_engines)  # fmt: skip
        for name in options.policies:
            chosen = policy(name, block_size=options.profile.block_size)
            chosen = dataclasses.replace(chosen, name=_DISPLAY.get(name, name))
            progress = ProgressLine(chosen.name, err)
            try:
                run = run_policy(
                    chosen, conversations, schedule, stages, plan,
                    drain_s=options.drain_s, on_progress=progress, client=client,
                )  # fmt: skip
            finally:
                progress.close()
            runs.append(run)
    return DemoResult(options, runs, machine_info())


def render(result: DemoResult) -> str:
    """The table and the one-line verdict."""
    line = verdict(result.summaries)
    columns = list(DEFAULT_COLUMNS)
    if any(r.policy.pd for r in result.runs):
        columns.insert(columns.index("output_tps"), "pd")
    return format_table(result.summaries, columns) + (f"\n\n{line}" if line else "")
