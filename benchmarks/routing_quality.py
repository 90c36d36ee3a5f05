"""Routing quality (issue #6 item 4): policies side by side on one seeded shared-prefix workload.

Each policy gets a fresh local cluster — 8 mock vLLM engines with bounded caches behind the real
Envoy and the service — and the same schedule: Poisson arrivals at a rising staircase of rates,
tenants with a long shared context, users in multi-turn sessions. The oracle routes client-side
from the engines' real caches (``/mock/match``). Scenarios (``--scenarios``):

single            one router replica sees every request (``--policies``, all eight by default)
replicas          ``--replicas`` router replicas behind Envoy, each routing the streams Envoy
                  gives it: an approximate replica remembers only its own share of the traffic,
                  every precise replica reads every engine's KV events
restart           one replica; ``--restart-engine-at`` seconds in, the engine holding the most
                  tenants restarts (``--restart-mode``: ``mock`` drops its cache and KV-event seq
                  with no downtime, ``process`` restarts the process)
replicas+restart  both

The scenarios other than ``single`` run ``--scenario-policies``. Prints the tables with the
command and machine, writes them as Markdown (``benchmarks/out/routing_quality.md``), the raw
numbers as JSON, and a chart (``docs/routing_quality.png``, needs the ``bench`` extra).

    python benchmarks/routing_quality.py                       # the eight policies, ≈ 5.5 min on 2 cores
    python benchmarks/routing_quality.py --scenarios single,replicas,restart   # + 3 replicas, restart: ≈ 10 min
    python benchmarks/routing_quality.py --scenarios replicas --replicas 4
    python benchmarks/routing_quality.py --scenarios single --policies precise+load,round-robin --rates 8,24
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
    EngineRestart,
    PolicyRun,
    ProgressLine,
    Workload,
    WorkloadSpec,
    arrivals,
    policy,
    run_policy,
    staircase,
)

sys.path.insert(0, str(Path(__file__).parent))
from routing_report import (  # a sibling script, like _common for bench_*.py
    ScenarioResult,
    header_lines,
    headline_lines,
    machine_lines,
    markdown,
    scenario_text,
)

ROOT = Path(__file__).resolve().parent.parent
TITLE = "Routing quality: shared-prefix multi-turn workload, 8 mock engines behind Envoy"
SCENARIOS = ("single", "replicas", "restart", "replicas+restart")
SCENARIO_POLICIES = ("round-robin", "approximate", "precise+load", "oracle")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--policies",
        default=",".join(BENCHMARK_POLICIES),
        help=f"comma-separated, of {', '.join(ALL_POLICIES)}",
    )
    p.add_argument("--scenarios", default="single", help=f"comma-separated, of {', '.join(SCENARIOS)}")
    p.add_argument("--scenario-policies", default=",".join(SCENARIO_POLICIES),
                   help="policies of every scenario but 'single'")  # fmt: skip
    p.add_argument("--replicas", type=int, default=3, help="router replicas in the 'replicas' scenarios")
    p.add_argument("--restart-engine-at", type=float, default=15.0, metavar="SECONDS",
                   help="when the 'restart' scenarios restart the engine holding the most tenants")  # fmt: skip
    p.add_argument("--restart-mode", choices=("mock", "process"), default="mock")
    p.add_argument("--restart-window", type=float, default=10.0, help="seconds after the restart the restart table covers")
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


def _run_json(r: PolicyRun) -> dict[str, Any]:
    return {
        "policy": r.policy.name,
        "description": r.policy.description,
        "replicas": r.replicas,
        "summary": r.summary.as_dict(),
        "stages": [s.as_dict() for s in r.stages],
        "restart": r.restart.as_dict() if r.restart else None,
        "cpu": dataclasses.asdict(r.cpu) if r.cpu else None,
        "decisions": dataclasses.asdict(r.decisions) if r.decisions else None,
        "loop_lag_p99_s": r.result.loop_lag_p99_s,
        "send_lag_p99_s": r.result.send_lag_p99_s,
        "evictions": [s.get("evictions") for s in r.engine_states],
    }


def to_json(scenarios: list[ScenarioResult], setup: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = _clean({
        "setup": setup,
        "scenarios": [
            {
                "scenario": sc.key, "title": sc.title, "replicas": sc.replicas,
                "restart": dataclasses.asdict(sc.restart) if sc.restart else None,
                "runs": [_run_json(r) for r in sc.runs],
            }
            for sc in scenarios
        ],
    })  # fmt: skip
    return data


@dataclasses.dataclass(frozen=True, slots=True)
class Scenario:
    key: str
    title: str
    replicas: int
    restart: EngineRestart | None
    policies: list[str]


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    """The scenarios to run, in the order given; unknown names and policies fail here."""
    main_policies = [n.strip() for n in args.policies.split(",") if n.strip()]
    extra_policies = [n.strip() for n in args.scenario_policies.split(",") if n.strip()]
    for n in (*main_policies, *extra_policies):
        policy(n)  # unknown names fail before anything starts
    out: list[Scenario] = []
    letters = "abcdefgh"
    for key in (k.strip() for k in args.scenarios.split(",") if k.strip()):
        if key not in SCENARIOS:
            raise SystemExit(f"unknown scenario {key!r}; choose from {', '.join(SCENARIOS)}")
        replicas = args.replicas if "replicas" in key else 1
        restart = EngineRestart(args.restart_engine_at, args.restart_mode) if "restart" in key else None
        parts = ["one router replica" if replicas == 1 else f"{replicas} router replicas"]
        if restart is not None:
            parts.append(f"engine restart at {restart.at_s:g} s ({restart.mode})")
        title = f"({letters[len(out)]}) {', '.join(parts)}"
        out.append(Scenario(key, title, replicas, restart, main_policies if key == "single" else extra_policies))
    if not out:
        raise SystemExit("no scenario to run")
    return out


def main() -> int:
    args = parse_args()
    configure_logging("console", "error")
    todo = scenarios(args)
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
        "- scenarios: " + "; ".join(f"{sc.title}: {', '.join(sc.policies)}" for sc in todo),
        "- router replicas: Envoy's ext_proc cluster lists every replica (LEAST_REQUEST over the gRPC streams, "
        "one stream per request); every replica subscribes to every engine's KV events",
    ]
    print("\n".join(header_lines(TITLE)), "", *setup_lines, "", sep="\n", flush=True)
    done: list[ScenarioResult] = []
    try:
        for sc in todo:
            plan = ClusterPlan(engines=args.engines, profile=profile, keep_logs=args.keep_logs,
                               service_replicas=sc.replicas)  # fmt: skip
            runs: list[PolicyRun] = []
            done.append(ScenarioResult(sc.key, sc.title, sc.replicas, sc.restart, runs))
            for n in sc.policies:
                progress = ProgressLine(f"{sc.title[:3]} {n}")
                try:
                    runs.append(run_policy(policy(n, block_size=profile.block_size), Workload(spec), schedule,
                                           stages, plan, drain_s=args.drain, on_progress=progress,
                                           restart=sc.restart))  # fmt: skip
                finally:
                    progress.close()
    except KeyboardInterrupt:
        print("\ninterrupted; every process was stopped", file=sys.stderr)
        done = [result for result in done if result.runs]
        if not done:
            return 130
    print("\n".join(headline_lines(done)), "", sep="\n")
    for result in done:
        print(f"== {result.title}", "", *scenario_text(result, markdown=False, restart_window_s=args.restart_window),
              *machine_lines(result.runs), "", sep="\n")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(TITLE, setup_lines, done, restart_window_s=args.restart_window), encoding="utf-8")
    setup = {"args": {k: str(v) for k, v in vars(args).items()}, "workload": dataclasses.asdict(spec),
             "engine": dataclasses.asdict(profile)}  # fmt: skip
    args.json_out.write_text(json.dumps(to_json(done, setup), indent=1), encoding="utf-8")
    written = [str(args.out), str(args.json_out)]
    if args.chart:
        from routing_chart import write_chart

        write_chart(done, Path(args.chart), TITLE)
        written.append(args.chart)
    print("\nwrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
