"""Routing quality (issue #6 item 4): policies side by side on one seeded shared-prefix workload.

Each policy gets a fresh local cluster — 8 mock vLLM engines with bounded caches behind the real
Envoy and the service — and the same schedule: Poisson arrivals at a rising staircase of rates,
tenants with a long shared context, users in multi-turn sessions. The oracle routes client-side
from the engines' real caches (``/mock/match``). Prints the tables with the command and machine,
writes them as Markdown (``benchmarks/out/routing_quality.md``), the raw numbers as JSON, and a
chart (``docs/routing_quality.png``, needs the ``bench`` extra).

    python benchmarks/routing_quality.py                       # ≈ 6 min on 2 cores
    python benchmarks/routing_quality.py --policies precise+load,round-robin --rates 8,24
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from ppc_extproc.observability.logging import configure_logging
from ppc_extproc.workload import (
    ALL_POLICIES,
    BENCHMARK_POLICIES,
    ClusterPlan,
    EngineProfile,
    PolicyRun,
    ProgressLine,
    Workload,
    WorkloadSpec,
    arrivals,
    format_table,
    policy,
    run_policy,
    staircase,
)

sys.path.insert(0, str(Path(__file__).parent))
from routing_report import (  # a sibling script, like _common for bench_*.py
    OVERALL_COLUMNS,
    STAGE_COLUMNS,
    aims,
    header_lines,
    machine_lines,
    markdown,
)

ROOT = Path(__file__).resolve().parent.parent
TITLE = "Routing quality: shared-prefix multi-turn workload, 8 mock engines behind Envoy"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--policies",
        default=",".join(BENCHMARK_POLICIES),
        help=f"comma-separated, of {', '.join(ALL_POLICIES)}",
    )
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--rates", default="8,16,24", help="staircase of Poisson rates, req/s")
    p.add_argument("--stage-seconds", type=float, default=10.0, help="seconds per rate")
    p.add_argument("--drain", type=float, default=20.0, help="seconds after the last arrival before cut-off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tenants", type=int, default=16)
    p.add_argument("--users-per-tenant", type=int, default=4)
    p.add_argument("--context-tokens", type=int, default=2048)
    p.add_argument("--question-tokens", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--num-blocks", type=int, default=240)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--prefill-tokens-per-s", type=float, default=3000.0)
    p.add_argument("--decode-ms-per-token", type=float, default=10.0)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "routing_quality.md")
    p.add_argument("--json-out", type=Path, default=ROOT / "benchmarks" / "out" / "routing_quality.json")
    p.add_argument("--chart", default=str(ROOT / "docs" / "routing_quality.png"), help="PNG path; '' to skip")
    p.add_argument("--keep-logs", action="store_true")
    return p.parse_args()


def _clean(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def to_json(runs: list[PolicyRun], setup: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = _clean({
        "setup": setup,
        "runs": [
            {
                "policy": r.policy.name,
                "description": r.policy.description,
                "summary": r.summary.as_dict(),
                "stages": [s.as_dict() for s in r.stages],
                "cpu": dataclasses.asdict(r.cpu) if r.cpu else None,
                "decisions": dataclasses.asdict(r.decisions) if r.decisions else None,
                "loop_lag_p99_s": r.result.loop_lag_p99_s,
                "send_lag_p99_s": r.result.send_lag_p99_s,
                "evictions": [s.get("evictions") for s in r.engine_states],
            }
            for r in runs
        ],
    })  # fmt: skip
    return data


def main() -> int:
    args = parse_args()
    configure_logging("console", "error")
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    for n in names:
        policy(n)  # unknown names fail before anything starts
    spec = WorkloadSpec(
        tenants=args.tenants, users_per_tenant=args.users_per_tenant, context_tokens=args.context_tokens,
        question_tokens=args.question_tokens, output_tokens=args.output_tokens,
        turns_per_session=args.turns, seed=args.seed,
    )  # fmt: skip
    profile = EngineProfile(
        block_size=args.block_size, num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
        prefill_tokens_per_s=args.prefill_tokens_per_s, decode_ms_per_token=args.decode_ms_per_token,
    )  # fmt: skip
    profile.check_fits(spec)
    stages = staircase([float(r) for r in args.rates.split(",")], args.stage_seconds)
    schedule = arrivals(spec, stages)
    plan = ClusterPlan(engines=args.engines, profile=profile, keep_logs=args.keep_logs)
    capacity = args.engines * profile.capacity_tokens
    setup_lines = [
        (
            f"- engines: {args.engines} mock vLLM, {profile.num_blocks} blocks × {profile.block_size} "
            f"tokens each (cluster {capacity:,} tokens); prefill lane "
            f"{profile.prefill_tokens_per_s:,.0f} tok/s, decode {profile.decode_ms_per_token:g} "
            f"ms/token, max {profile.max_num_seqs} seqs; Envoy 1 worker"
        ),
        (
            f"- workload: {spec.tenants} tenants × {spec.context_tokens}-token context, "
            f"{spec.users_per_tenant} users each, {spec.question_tokens}-token questions, "
            f"{spec.output_tokens}-token answers, {spec.turns_per_session}-turn sessions; working "
            f"set {spec.working_set_tokens:,} tokens = "
            f"{100 * spec.working_set_tokens / capacity:.0f}% of cluster cache"
        ),
        (
            f"- arrivals: Poisson, {' → '.join(f'{s.rate_per_s:g}' for s in stages)} req/s, "
            f"{args.stage_seconds:g} s each ({len(schedule)} requests), seed {spec.seed}; a user "
            f"sends a turn only after the previous one is answered; cut-off {args.drain:g} s "
            "after the last arrival; each policy on a fresh (cold) cluster"
        ),
        "- throughput per rate: output tokens of that stage's requests / (stage start → last done)",
    ]
    print("\n".join(header_lines(TITLE)), "", *setup_lines, "", sep="\n", flush=True)
    runs: list[PolicyRun] = []
    try:
        for n in names:
            progress = ProgressLine(n)
            try:
                runs.append(run_policy(policy(n, block_size=profile.block_size), Workload(spec), schedule,
                                       stages, plan, drain_s=args.drain, on_progress=progress))  # fmt: skip
            finally:
                progress.close()
    except KeyboardInterrupt:
        print("\ninterrupted; every process was stopped", file=sys.stderr)
        if not runs:
            return 130
    print(format_table([s for r in runs for s in r.stages], STAGE_COLUMNS), "", sep="\n")
    print(format_table([r.summary for r in runs], OVERALL_COLUMNS), "", sep="\n")
    print("\n".join(a.line() for a in aims(runs)), "", sep="\n")
    print("\n".join(machine_lines(runs)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(TITLE, setup_lines, runs), encoding="utf-8")
    setup = {"args": {k: str(v) for k, v in vars(args).items()}, "workload": dataclasses.asdict(spec),
             "engine": dataclasses.asdict(profile)}  # fmt: skip
    args.json_out.write_text(json.dumps(to_json(runs, setup), indent=1), encoding="utf-8")
    written = [str(args.out), str(args.json_out)]
    if args.chart:
        from routing_chart import write_chart

        write_chart(runs, Path(args.chart), TITLE)
        written.append(args.chart)
    print("\nwrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
