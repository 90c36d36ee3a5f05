"""Overload: a pool of mock engines at 2× its capacity, the router's flow control off, on, and
dispatching by llm-d's rule (in-flight credit off, a stale endpoint counts as saturated).

Per mode, on a fresh local cluster (Envoy → ppc-extproc → mock vLLM engines with ``max_num_seqs``
slots, a waiting queue and ``/metrics`` gauges that lag by one engine step):

* the engines' real waiting queue at every ``/metrics`` scrape vs ``queueDepthThreshold``;
* priority-0 TTFT p99, loaded vs unloaded (the priority-0 tenant alone), and its rejections;
* Jain's fairness index over the uncached prompt tokens prefilled, while arrivals last, for two
  equal-weight band −1 tenants offering 3:1 request rates (both above their fair share);
* 5xx (and unanswered requests) with every engine's ``/metrics`` stalled under the same load.

    python benchmarks/bench_overload.py                 # off, on, llmd: ~3 min each
    python benchmarks/bench_overload.py --modes holdback --holdback-ceiling 0.5   # slots kept for band 0
    python benchmarks/bench_overload.py --modes off --loaded-s 20 --unloaded-s 10 --stalled-s 10

The machine is shared: compare modes within one run, as ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import header

from ppc_extproc_lab.workload.overload import ALL_MODES, MODES, OverloadPlan, OverloadResult, run_overload


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f}"


def report(results: list[OverloadResult]) -> None:
    plan = results[0].plan
    print(f"pool: {plan.engines} engines × max_num_seqs {plan.max_num_seqs}, {plan.max_tokens} output tokens × "
          f"{plan.decode_ms_per_token:g} ms, {plan.prompt_tokens}-token prompts ⇒ capacity {plan.capacity:.1f} req/s; "
          f"offered {plan.load:g}× ({plan.capacity * plan.load:.1f} req/s): interactive (band 0) "
          f"{plan.interactive_share:g}×, batch-a : batch-b (band −1) 3 : 1")  # fmt: skip
    print(f"queueDepthThreshold {plan.queue_depth_threshold}, request TTL {plan.request_ttl_s:g} s, gauges lag "
          f"≤ {plan.metrics_update_ms:g} ms, scrapes every 50 ms")  # fmt: skip
    print()
    cols = ("mode", "max wait", "scrapes > thr", "p0 TTFT p99 unl/ld (ms)", "ratio", "p0 rej", "band−1 429",
            "Jain (−1)", "stalled 5xx", "stalled 429")  # fmt: skip
    print(" | ".join(cols))
    print(" | ".join("---" for _ in cols))
    for r in results:
        unloaded, loaded = r.phases["unloaded"], r.phases["loaded"]
        stalled = r.phases.get("stalled")
        base, under = unloaded.ttft_p99(), loaded.ttft_p99()
        over, total = loaded.scrapes_over(plan.queue_depth_threshold)
        ratio = f"{under / base:.2f}×" if base and under else "-"
        print(" | ".join([
            r.mode, str(loaded.max_waiting()), f"{over}/{total}", f"{_ms(base)} / {_ms(under)}", ratio,
            str(loaded.rejected(0)), str(loaded.rejected(-1)), f"{loaded.jain():.3f}",
            "-" if stalled is None else str(stalled.server_errors()),
            "-" if stalled is None else str(stalled.rejected()),
        ]))  # fmt: skip
    print()
    for r in results:
        loaded = r.phases["loaded"]
        served = loaded.service()
        sent = {t: sum(1 for x in loaded.records if x.tenant == t) for t in served}
        print(f"{r.mode}: requests sent {sent}; uncached tokens prefilled while arrivals lasted {served}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated among {','.join(ALL_MODES)} (default {','.join(MODES)})")
    d = OverloadPlan()
    for flag, attr in (("--engines", "engines"), ("--max-num-seqs", "max_num_seqs"),
                       ("--queue-depth-threshold", "queue_depth_threshold"), ("--seed", "seed")):  # fmt: skip
        parser.add_argument(flag, type=int, default=getattr(d, attr))
    for flag, attr in (("--load", "load"), ("--unloaded-s", "unloaded_s"), ("--loaded-s", "loaded_s"),
                       ("--stalled-s", "stalled_s"), ("--decode-ms", "decode_ms_per_token"),
                       ("--request-ttl-s", "request_ttl_s"), ("--holdback-ceiling", "holdback_ceiling")):  # fmt: skip
        parser.add_argument(flag, type=float, default=getattr(d, attr))
    parser.add_argument("--log-dir", type=Path, default=None, help="keep each mode's cluster logs here")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if bad := [m for m in modes if m not in ALL_MODES]:
        parser.error(f"--modes: unknown mode {bad[0]!r} (choose among {', '.join(ALL_MODES)})")
    plan = OverloadPlan(
        engines=args.engines, max_num_seqs=args.max_num_seqs, queue_depth_threshold=args.queue_depth_threshold,
        seed=args.seed, load=args.load, unloaded_s=args.unloaded_s, loaded_s=args.loaded_s, stalled_s=args.stalled_s,
        decode_ms_per_token=args.decode_ms, request_ttl_s=args.request_ttl_s, holdback_ceiling=args.holdback_ceiling,
    )  # fmt: skip
    header("overload: flow control off / on / llm-d's dispatch rule at 2× capacity")
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min)")
    results = []
    for mode in modes:
        log_dir = args.log_dir / mode if args.log_dir is not None else None
        results.append(run_overload(mode, plan, log_dir))
        print(f"  {mode} done; load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min)")
    print()
    report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
