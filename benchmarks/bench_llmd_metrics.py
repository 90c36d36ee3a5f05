"""Per-request cost of llm-d's and GIE's metric families next to the ``ppc_extproc_*`` recording,
and the cost of a scrape. In-process, no sockets: what one request adds to the service's CPU.

The llm-d recording includes ``plugin_duration_seconds`` per plugin as the request path takes it:
one ``perf_counter`` read and one ``SchedulingContext.plugin_time`` per plugin call (the default
configuration's nine: parse, two producers, two scorers, picker, profile picker, process results,
pre-request), then one histogram observation each.

    python benchmarks/bench_llmd_metrics.py [--requests 200000] [--rounds 7]

Rounds alternate the two recordings; the minimum per round is reported (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import timeit

from prometheus_client import CollectorRegistry, generate_latest

from ppc_extproc.framework import LLMRequest, SchedulingContext
from ppc_extproc.observability.metrics import Metrics

PLUGINS = (("DataProducer", "token-producer", "token-producer"),
           ("DataProducer", "precise-prefix-cache-producer", "precise-prefix-cache-producer"),
           ("Scorer", "prefix-cache-scorer", "prefix-cache-scorer"),
           ("Scorer", "active-request-scorer", "active-request-scorer"),
           ("Picker", "max-score-picker", "max-score-picker"),
           ("ProfilePicker", "single-profile-handler", "single-profile-handler"),
           ("ProcessProfilesResults", "single-profile-handler", "single-profile-handler"),
           ("PreRequest", "active-request-scorer", "active-request-scorer"),
           ("RequestParsing", "request-assembly", "request-assembly"))
OUR_STAGES = {"parse": 1e-4, "keys": 1e-4, "lookup": 1e-4, "score": 2e-4, "pre_request": 1e-5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    metrics = Metrics(CollectorRegistry())
    llmd = metrics.llmd

    ctx = SchedulingContext(LLMRequest("r", "qwen"), [])
    clock = time.perf_counter

    def llmd_request() -> None:  # what the request path records for one routed request with usage
        ctx.plugin_timings.clear()
        now = clock()
        for point, type_name, name in PLUGINS:  # the router's, profile's and scheduler's timing
            done = clock()  # one clock read per plugin call: each call ends where the next starts
            ctx.plugin_time(point, type_name, name, done - now)
            now = done
        series = llmd.series("qwen", "qwen")
        llmd.scheduled(series, 2000, "qwen", "qwen-0-rank-0", 8000, 3e-4, ctx.plugin_timings)
        llmd.completed(series, 0.8, 1500, 512, 64, 256)

    def ours() -> None:  # the ppc_extproc_* recording of the same request
        metrics.count_request("routed", 200)
        metrics.observe_decision(5e-4, OUR_STAGES)
        metrics.match_ratio.observe(0.9)
        metrics.observe_cached_tokens(256, 256)

    new, old = [], []
    for _ in range(args.rounds):
        new.append(timeit.timeit(llmd_request, number=args.requests) / args.requests)
        old.append(timeit.timeit(ours, number=args.requests) / args.requests)
    scrape = min(timeit.repeat(lambda: generate_latest(metrics.registry), number=50, repeat=5)) / 50
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, CPython {platform.python_version()}")
    print(f"llm-d/GIE families per request: {min(new) * 1e6:.2f} us (median {sorted(new)[len(new) // 2] * 1e6:.2f})")
    print(f"ppc_extproc_* recording per request: {min(old) * 1e6:.2f} us (median {sorted(old)[len(old) // 2] * 1e6:.2f})")
    print(f"ratio llm-d / ppc_extproc: {min(new) / min(old):.2f}")
    print(f"one scrape of /metrics (1 model, 1 endpoint): {scrape * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
