"""Routing quality: ppc-extproc next to vllm-router and sglang-router.

Each policy gets a fresh, cold local cluster — mock vLLM engines with bounded caches — behind its
router (ours: Envoy + the service; a peer: its own process; several replicas: behind one load
balancer), and the same seeded schedule: Poisson arrivals, tenants with a long shared context,
users in multi-turn sessions. The oracle routes client-side from the engines' real caches
(``/mock/match``). Scenarios (``--scenarios``, all by default), one row group each:

single    (a) one router replica
replicas  (b) ``--replicas`` router replicas behind one load balancer
restart   (c) the engine holding the most tenants restarts ``--restart-at`` s in
outside   (d) ``--outside-share`` of the arrivals go straight to the engines (round-robin)
pressure  (e) the working set is ``--pressure`` × the cluster's cache
long      (f) ``--long-tenants`` tenants have ``--long-context-tokens`` agentic contexts

Request form (``--form``): ``chat`` (default: the ``openai`` client, /v1/chat/completions, the
context as system message and the session's turns), ``text`` (string prompts, /v1/completions)
or ``tokens`` (the engine's token ids of that text; sglang-router, which rejects them, gets the
text). The engines tokenise with ``--tokenizer`` (default ``tiny``: the tiny byte-level BPE built
at run time; ppc-extproc's service gets a local ``token-producer`` on the same directory, so it
routes chat and text by the engines' own ids); ``--tokenizer none`` keeps the mock's UTF-8-byte
tokenisation (text and tokens only; ppc-extproc is then sent token ids for text). Lengths are in
tokens: the text is scaled by the tokenizer's characters per token. Prints the tables with the
command, machine and versions, writes Markdown (``benchmarks/out/routing_quality.md``), JSON and a
PNG per scenario (``docs/``).

    python benchmarks/routing_quality.py                          # everything, ≈ 10 min on 2 cores
    python benchmarks/routing_quality.py --list                   # scenarios and expected duration
    python benchmarks/routing_quality.py --scenarios single,replicas --policies precise+load,vllm-router
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from ppc_extproc.observability.logging import configure_logging
from ppc_extproc_lab.workload import (
    ClusterPlan,
    EngineRestart,
    PolicyRun,
    ProgressLine,
    arrivals,
    policy,
    run_policy,
    staircase,
)
from ppc_extproc_lab.workload.clients import EngineTokens, client_for
from ppc_extproc_lab.workload.peers import PEERS
from ppc_extproc_lab.workload.scenarios import SCENARIOS, BaseSetup, Scenario, build_scenario, expected_seconds
from ppc_extproc_lab.workload.spec import from_flags
from ppc_extproc_lab.workload.text import TextWorkload, chars_per_token

sys.path.insert(0, str(Path(__file__).parent))
from routing_report import ScenarioResult, aims_of, markdown, results_table, scenario_details

ROOT = Path(__file__).resolve().parent.parent
TITLE = "Routing quality: ppc-extproc and peer routers on a shared-prefix multi-turn workload"
#: The request form of the default run: what users send.
DEFAULT_FORM = "chat"
KEY_POLICIES = ("round-robin", "approximate", "precise+load", "vllm-router", "sglang-router", "oracle")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    p.add_argument("--policies", default=",".join(KEY_POLICIES), help="comma-separated policy names")
    p.add_argument("--form", choices=("chat", "text", "tokens"), default=DEFAULT_FORM, help="request form")
    p.add_argument("--tokenizer", default="tiny",
                   help="HF tokenizer directory of the engines (and our token-producer); 'tiny': built at run time; "
                        "'none': UTF-8 bytes")  # fmt: skip
    p.add_argument("--list", action="store_true", help="print the scenarios and the expected duration, run nothing")
    g = p.add_argument_group("cluster and time model")
    g.add_argument("--engines", type=int, default=4)
    g.add_argument("--block-size", type=int, default=64)
    g.add_argument("--num-blocks", type=int, default=240)
    g.add_argument("--max-num-seqs", type=int, default=8)
    g.add_argument("--prefill-tokens-per-s", type=float, default=3000.0)
    g.add_argument("--decode-ms-per-token", type=float, default=10.0)
    g = p.add_argument_group("workload and schedule")
    g.add_argument("--rates", default="10", help="Poisson rates, req/s, one stage each")
    g.add_argument("--stage-seconds", type=float, default=13.0)
    g.add_argument("--warmup", type=float, default=4.0, help="seconds of arrivals sent but not counted (cold start)")
    g.add_argument("--drain", type=float, default=8.0, help="seconds after the last arrival before cut-off")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--tenants", type=int, default=8)
    g.add_argument("--users-per-tenant", type=int, default=4)
    g.add_argument("--context-tokens", type=int, default=2048)
    g.add_argument("--question-tokens", type=int, default=256)
    g.add_argument("--output-tokens", type=int, default=32)
    g.add_argument("--turns", type=int, default=3)
    g.add_argument("--chars-per-token", type=float, default=0.0,
                   help="text characters per token; 0: measured with the tokenizer (1 for UTF-8 bytes)")  # fmt: skip
    g = p.add_argument_group("scenario knobs")
    g.add_argument("--replicas", type=int, default=3)
    g.add_argument("--restart-at", type=float, default=7.0, metavar="SECONDS")
    g.add_argument("--restart-mode", choices=("mock", "process"), default="mock")
    g.add_argument("--restart-window", type=float, default=6.0, help="seconds after the restart its table covers")
    g.add_argument("--outside-share", type=float, default=0.3)
    g.add_argument("--pressure", type=float, default=1.5, help="working set / cluster cache in (e)")
    g.add_argument("--long-tenants", type=int, default=2)
    g.add_argument("--long-context-tokens", type=int, default=32_768)
    g.add_argument("--long-prefill-tokens-per-s", type=float, default=16_000.0)
    g.add_argument("--long-rate-factor", type=float, default=0.6)
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "routing_quality.md")
    g.add_argument("--json-out", type=Path, default=ROOT / "benchmarks" / "out" / "routing_quality.json")
    g.add_argument("--charts-dir", default=str(ROOT / "docs"), help="PNG directory; '' to skip")
    g.add_argument("--keep-logs", action="store_true")
    return p.parse_args()


def base_setup(args: argparse.Namespace) -> BaseSetup:
    spec, profile = from_flags(args)
    return BaseSetup(
        engines=args.engines, spec=spec, profile=profile,
        stages=tuple(staircase([float(r) for r in args.rates.split(",")], args.stage_seconds)), warmup_s=args.warmup,
        replicas=args.replicas, restart=EngineRestart(args.restart_at, args.restart_mode),
        outside_share=args.outside_share, pressure=args.pressure, long_tenants=args.long_tenants,
        long_context_tokens=args.long_context_tokens, long_prefill_tokens_per_s=args.long_prefill_tokens_per_s,
        long_rate_factor=args.long_rate_factor,
    )  # fmt: skip


def setup_lines(todo: list[Scenario], policies: list[str], args: argparse.Namespace) -> list[str]:
    base = todo[0]
    spec, prof = base.spec, base.profile
    out = [
        f"- engines: {base.engines} mock vLLM, {prof.block_size}-token blocks, prefill lane "
        f"{prof.prefill_tokens_per_s:,.0f} tok/s, decode {prof.decode_ms_per_token:g} ms/token, max "
        f"{prof.max_num_seqs} seqs; every policy on a fresh (cold) cluster, same seed ({spec.seed}) and arrivals",
        f"- workload: {spec.tenants} tenants × {spec.context_tokens}-token context, {spec.users_per_tenant} users "
        f"each, {spec.question_tokens}-token questions, {spec.output_tokens}-token answers, "
        f"{spec.turns_per_session}-turn sessions (lengths in tokens; text at {args.chars_per_token:.2f} characters "
        f"per token); request form `{args.form}`; engines tokenise with {args.tokenizer_label}"
        + ("" if args.tokenizer_dir or args.form != "text" else " (ppc-extproc: the engine's token ids of the text)"),
        "- routers: ours = Envoy (1 worker) + the service; vllm-router / sglang-router `--policy cache_aware`; "
        "several replicas behind one Envoy (ours: its ext_proc cluster; peers: a round-robin HTTP balancer)",
        f"- policies: {', '.join(policies)}",
        "- scenarios:",
    ]
    for sc in todo:
        out.append(
            f"  - {sc.title}: {sc.profile.num_blocks} blocks per engine (working set "
            f"{100 * sc.cache_ratio:.0f}% of the cluster's cache), Poisson "
            f"{' → '.join(f'{s.rate_per_s:g}' for s in sc.stages)} req/s for {sc.schedule_s:g} s (the first "
            f"{sc.warmup_s:g} s not counted), cut-off {args.drain:g} s after"
        )
    return out


def _clean(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


def _run_json(r: PolicyRun) -> dict[str, Any]:
    return {
        "policy": r.policy.name, "kind": r.policy.kind, "form": r.form, "replicas": r.replicas,
        "summary": r.summary.as_dict(), "stages": [s.as_dict() for s in r.stages],
        "outside": r.outside.as_dict() if r.outside else None,
        "restart": r.restart.as_dict() if r.restart else None,
        "cpu": dataclasses.asdict(r.cpu) if r.cpu else None, "router_processes": list(r.router_processes),
        "router_cpu_s_per_1k": r.router_cpu_s_per_1k,
        "decisions": dataclasses.asdict(r.decisions) if r.decisions else None,
        "loop_lag_p99_s": r.result.loop_lag_p99_s, "send_lag_p99_s": r.result.send_lag_p99_s,
        "evictions": [s.get("evictions") for s in r.engine_states],
    }  # fmt: skip


def to_json(done: list[ScenarioResult], args: argparse.Namespace, versions: list[str]) -> dict[str, Any]:
    return _clean({  # type: ignore[no-any-return]
        "args": {k: str(v) for k, v in vars(args).items()}, "versions": versions,
        "scenarios": [{"scenario": sc.key, "title": sc.title, "replicas": sc.scenario.replicas,
                       "workload": dataclasses.asdict(sc.scenario.spec), "engine": dataclasses.asdict(sc.scenario.profile),
                       "aims": [dataclasses.asdict(a) | {"met": a.met} for a in aims_of(sc)],
                       "runs": [_run_json(r) for r in sc.runs]} for sc in done],
    })  # fmt: skip


def versions() -> list[str]:
    from importlib.metadata import version

    peers = {p.distribution: p.version() for p in PEERS.values()}
    return [f"ppc-extproc {version('ppc-extproc')}", *(f"{d} {v}" for d, v in peers.items())]


def engine_tokens(args: argparse.Namespace, scratch: Path) -> EngineTokens:
    """Resolve ``--tokenizer`` (building the tiny one into ``scratch``) and ``--chars-per-token``."""
    args.tokenizer_dir = None
    args.tokenizer_label = "UTF-8 bytes (the mock without --tokenizer)"
    tokens = EngineTokens()
    if args.tokenizer != "none":
        from ppc_extproc.tokenizer.local import LocalTokenizer

        if args.tokenizer == "tiny":
            from ppc_extproc_lab.tiny_tokenizer import build_tiny_tokenizer

            build_tiny_tokenizer(scratch)
            args.tokenizer_dir, args.tokenizer_label = str(scratch), "the tiny byte-level BPE (built at run time)"
        else:
            args.tokenizer_dir, args.tokenizer_label = args.tokenizer, f"`{args.tokenizer}`"
        tokens = EngineTokens(LocalTokenizer.from_dir(args.tokenizer_dir))
    elif args.form == "chat":
        raise SystemExit("--form chat needs a tokenizer (the engines render chat with its template)")
    if not args.chars_per_token:
        args.chars_per_token = chars_per_token(tokens.text)
    return tokens


def main() -> int:
    args = parse_args()
    configure_logging("console", "error")
    with tempfile.TemporaryDirectory(prefix="routing-quality-") as scratch:
        return run(args, engine_tokens(args, Path(scratch)))


def run(args: argparse.Namespace, tokens: EngineTokens) -> int:
    base = base_setup(args)
    todo = [build_scenario(k.strip(), base) for k in args.scenarios.split(",") if k.strip()]
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    chosen = [policy(n, block_size=args.block_size) for n in names]  # unknown names fail here
    missing = [c.peer.name for c in chosen if c.peer is not None and not c.peer.available()]
    if missing:
        raise SystemExit(f"peer router(s) not installed: {', '.join(missing)} — pip install -e '.[bench]'")
    if not todo:
        raise SystemExit("no scenario to run")
    expected = expected_seconds(todo, len(chosen))
    worst = expected_seconds(todo, len(chosen), drain_s=args.drain)
    lines = setup_lines(todo, names, args)
    print(f"# {TITLE}", "", *lines, "", f"versions: {', '.join(versions())}",
          f"expected duration: ≈ {expected / 60:.0f} min ({len(todo) * len(chosen)} runs; at most "
          f"≈ {worst / 60:.0f} min if every run waits for its cut-off)", "", sep="\n", flush=True)  # fmt: skip
    if args.list:
        return 0
    done: list[ScenarioResult] = []
    try:
        for sc in todo:
            runs: list[PolicyRun] = []
            done.append(ScenarioResult(sc, runs))
            plan = ClusterPlan(engines=sc.engines, profile=sc.profile, service_replicas=sc.replicas,
                               keep_logs=args.keep_logs, tokenizer=args.tokenizer_dir)  # fmt: skip
            schedule = arrivals(sc.spec, sc.stages)
            for c in chosen:
                form = c.wire_form(args.form, service_reads_text=args.tokenizer_dir is not None)
                client = client_for(form, model=plan.model, max_tokens=sc.spec.output_tokens, tokens=tokens)
                progress = ProgressLine(f"({sc.letter}) {c.name}")
                try:
                    runs.append(run_policy(
                        c, TextWorkload(sc.spec, chars_per_token=args.chars_per_token), schedule, sc.stages, plan,
                        drain_s=args.drain, on_progress=progress, restart=sc.restart, client=client,
                        outside=sc.outside, warmup_s=sc.warmup_s,
                    ))  # fmt: skip
                finally:
                    progress.close()
    except KeyboardInterrupt:
        print("\ninterrupted; every process was stopped", file=sys.stderr)
        done = [result for result in done if result.runs]
        if not done:
            return 130
    print(results_table(done, markdown=False), "", sep="\n")
    for result in done:
        print(f"== {result.title}", *scenario_details(result, markdown=False, restart_window_s=args.restart_window),
              sep="\n")  # fmt: skip
    written: list[str] = []
    charts: list[str] = []
    if args.charts_dir:
        from routing_chart import write_charts

        paths = write_charts(done, Path(args.charts_dir), TITLE)
        written += [str(p) for p in paths]
        charts = [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in paths]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(TITLE, versions(), lines, done, charts=charts, restart_window_s=args.restart_window),
                        encoding="utf-8")  # fmt: skip
    args.json_out.write_text(json.dumps(to_json(done, args, versions()), indent=1), encoding="utf-8")
    print("\nwrote " + ", ".join([str(args.out), str(args.json_out), *written]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
