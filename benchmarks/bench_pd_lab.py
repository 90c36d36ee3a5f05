"""P/D in the lab: TTFT and throughput with P/D on vs off, and the decode-credit effect.

Part 1 (``onoff``): the demo's seeded multi-tenant workload (token-id prompts) under two policies,
each on a fresh cluster of ``--engines`` mock engines: ``pd`` (``--prefill-engines`` prefill
engines, the rest decode pods behind the nixlv2 sidecar; decode-first, prefix-based decider at
512 uncached tokens) and ``default`` (the same engines aggregated, the service's default config).

Part 2 (``credit``): multi-turn chats (:mod:`ppc_extproc_lab.workload.pd_chats`) through a P/D
cluster of 2 prefill engines and 2 decode pods, with the decode engines credited (this router's
``creditDecodeEngine``, default true) and llm-d's behaviour (``creditDecodeEngine: false``: the
decode engines' events after a transferred prompt are dropped as ``unknown_parent``), once with
``speculativeIndexing`` (the 2 s speculative entries of a decode pick are all the credit there is)
and once without it (never credited). Follow-up turns add fewer tokens than ``nonCachedTokens``.

Part 3 (``kill``): ``--kill-workers`` clients send long uncached prompts back to back through a
P/D cluster (2 prefill engines, 1 decode pod); one prefill engine is SIGKILLed mid-run, once per
sidecar fallback in ``--kill-fallbacks``: ``none`` (llm-d's sidecar: requests whose prefill leg
meets the dead engine before the router noticed get its 502) and ``local`` (the lab sidecar's
``--prefill-fallback local``: they are decoded locally). Counts client errors, disaggregated
requests and sidecar fallbacks per phase.

The mock's time model has one serial prefill lane per engine and decode steps that prefills do not
slow down, so P/D's benefit on real GPUs (decode free of prefill interference) is not modelled:
part 1 shows what P/D costs here (half the prefill lanes, the transfer, the sidecar hop) and the
cache effects. Figures are noisy on a shared machine; compare ratios within one run.

    python benchmarks/bench_pd_lab.py                    # every part, ≈ 4 min on 2 cores
    python benchmarks/bench_pd_lab.py --parts credit --conversations 24
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import header

from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.workload import (
    ClusterPlan,
    EngineProfile,
    Stage,
    Workload,
    WorkloadSpec,
    arrivals,
    format_table,
    policy,
    run_policy,
)
from ppc_extproc_lab.workload.pd import pd_config
from ppc_extproc_lab.workload.pd_chats import ChatPlan, ChatSummary, run_chats, summarize_chats
from ppc_extproc_lab.workload.table import DEFAULT_COLUMNS

NON_CACHED = 256


def onoff(args: argparse.Namespace) -> None:
    spec = WorkloadSpec(seed=args.seed)
    profile = EngineProfile(num_blocks=160)
    stages = [Stage(args.rate, args.duration)]
    schedule = arrivals(spec, stages)
    plan = ClusterPlan(engines=args.engines, profile=profile, prefill_engines=args.prefill_engines)
    runs = []
    for name in ("pd", "default"):
        chosen = policy(name, block_size=profile.block_size)
        runs.append(run_policy(chosen, Workload(spec), schedule, stages, plan, drain_s=30.0))
    columns = list(DEFAULT_COLUMNS)
    columns.insert(columns.index("output_tps"), "pd")
    print(f"## P/D on vs off: {args.engines} engines ({plan.pd_roles.count('prefill')} prefill under pd), "
          f"Poisson {args.rate:g} req/s for {args.duration:g} s, the demo's workload (token ids)")
    print(format_table([r.summary for r in runs], columns, markdown=True))
    print()


#: The arms: the producer's ``creditDecodeEngine`` and ``speculativeIndexing`` (speculativeTTL 2 s).
_ARMS = (
    ("credited (ppc-extproc)", True, True),
    ("llm-d, speculativeIndexing 2 s", False, True),
    ("never credited (llm-d, speculativeIndexing off)", False, False),
)


def _chat_arm(plan: ChatPlan, *, label: str, credit: bool, speculative: bool, block: int) -> ChatSummary:
    roles = ["prefill", "prefill", "decode", "decode"]
    config = pd_config(non_cached_tokens=NON_CACHED, speculative_indexing=speculative, credit_decode_engine=credit)
    engine = EngineProfile(block_size=block, num_blocks=4096)
    with LocalCluster(num_engines=len(roles), roles=roles, block_size=block, num_blocks=engine.num_blocks,
                      engine_args=engine.engine_args(), service_config=config) as cluster:
        records = asyncio.run(run_chats(cluster.listener_url, plan))
    return summarize_chats(label, records, NON_CACHED)


def credit(args: argparse.Namespace) -> None:
    plan = ChatPlan(conversations=args.conversations, turns=args.turns, context_tokens=args.context_tokens,
                    user_tokens=64, max_tokens=32, concurrency=args.concurrency, think_s=0.25, seed=args.seed)
    assert plan.new_tokens_per_turn < NON_CACHED
    rows = [_chat_arm(plan, label=label, credit=c, speculative=spec, block=64) for label, c, spec in _ARMS]
    print(f"## Decode credit on multi-turn chats: {plan.conversations} conversations x {plan.turns} turns, "
          f"{plan.context_tokens}-token context, +{plan.new_tokens_per_turn} tokens per turn "
          f"(nonCachedTokens {NON_CACHED}), {plan.concurrency} at a time, 250 ms think time")
    print("| decode engines | follow-ups decode-only | decode-only on the conversation's engine | P/D requests | "
          "TTFT p50 ms | follow-up TTFT p50 ms | TTFT p90 ms | out tok/s | hit rate | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in rows:
        print(f"| {s.label} | {100 * s.decode_only_fraction:.0f}% ({s.followups_decode_only}/{s.followups}) | "
              f"{100 * s.on_home_fraction:.0f}% | {s.disaggregated_total}/{s.turns} | {1e3 * s.ttft_p50_s:.0f} | "
              f"{1e3 * s.followup_ttft_p50_s:.0f} | {1e3 * s.ttft_p90_s:.0f} | {s.output_tokens_per_s:.0f} | "
              f"{100 * s.hit_rate:.1f}% | {s.errors} |")
    print()
    print("raw:", [dataclasses.asdict(s) for s in rows])


def kill(args: argparse.Namespace, fallback: str) -> None:
    import random
    import threading
    import time

    import httpx

    def tokens(seed: int) -> list[int]:
        rng = random.Random(seed)
        return [rng.randrange(1, 150_000) for _ in range(300)]

    engine = EngineProfile(block_size=16, num_blocks=8192, prefill_tokens_per_s=100_000.0, decode_ms_per_token=2.0)
    results: list[tuple[float, int, str | None, str | None]] = []
    stop = threading.Event()
    with LocalCluster(num_engines=3, roles=["prefill", "prefill", "decode"], block_size=16,
                      num_blocks=engine.num_blocks, engine_args=engine.engine_args(),
                      service_config=pd_config(non_cached_tokens=64),
                      sidecar_args=["--prefill-fallback", fallback]) as cluster:
        def worker(w: int) -> None:
            with httpx.Client(timeout=30) as http:
                for i in range(1_000_000):
                    if stop.is_set():
                        return
                    r = http.post(cluster.listener_url + "/v1/completions",
                                  json={"model": "mock-model", "prompt": tokens(w * 1_000_000 + i), "max_tokens": 4})
                    results.append((time.monotonic(), r.status_code, r.headers.get("x-mock-vllm-kv-transfer"),
                                    r.headers.get("x-prefill-fallback")))

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(args.kill_workers)]
        for t in threads:
            t.start()
        time.sleep(args.kill_after)
        killed_at = time.monotonic()
        cluster.kill_engine(0)
        dead = cluster.engine_endpoints[0]
        while dead not in httpx.get(cluster.admin_url + "/debug/state").json()["health"]["kvDisconnected"]:
            time.sleep(0.005)
        noticed_at = time.monotonic()
        time.sleep(args.kill_after)
        stop.set()
        for t in threads:
            t.join()
    phases = {"before the kill": (0.0, killed_at), "kill → router noticed": (killed_at, noticed_at),
              "after": (noticed_at, float("inf"))}
    print(f"## A prefill engine killed under load, sidecar --prefill-fallback {fallback}: {args.kill_workers} "
          f"clients back to back, 300-token uncached prompts; the router noticed "
          f"{1e3 * (noticed_at - killed_at):.0f} ms after the kill")
    print("| phase | requests | client errors | disaggregated | decoded locally by the sidecar |")
    print("|---|---:|---:|---:|---:|")
    for name, (lo, hi) in phases.items():
        rows = [r for r in results if lo <= r[0] < hi]
        print(f"| {name} | {len(rows)} | {sum(1 for r in rows if r[1] != 200)} | "
              f"{sum(1 for r in rows if r[2] == 'decode')} | {sum(1 for r in rows if r[3] is not None)} |")
    print("(a request is placed in the phase in which it completed)")
    print()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="onoff,credit,kill", help="comma-separated: onoff, credit, kill (default all)")
    p.add_argument("--kill-workers", type=int, default=3)
    p.add_argument("--kill-after", type=float, default=3.0, help="seconds of load before and after the kill")
    p.add_argument("--kill-fallbacks", default="none,local",
                   help="sidecar --prefill-fallback values to run the kill part with (default %(default)s)")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--prefill-engines", type=int, default=2)
    p.add_argument("--rate", type=float, default=8.0)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--conversations", type=int, default=16)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--context-tokens", type=int, default=2048)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    header("P/D lab: P/D on vs off, decode credit")
    parts = {part.strip() for part in args.parts.split(",")}
    if "onoff" in parts:
        onoff(args)
    if "credit" in parts:
        credit(args)
    if "kill" in parts:
        for fallback in args.kill_fallbacks.split(","):
            kill(args, fallback.strip())


if __name__ == "__main__":
    main()
