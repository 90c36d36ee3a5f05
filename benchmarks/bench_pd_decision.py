"""The P/D decision's added latency over the single-profile decision, in process.

Both pipelines read the same precise producer (block size 16, speculative indexing on) over 16
endpoints labelled ``llm-d.ai/role`` (8 decode, 8 prefill) and time ``Router.route`` (producers,
profiles, pre-request hooks) for token-id prompts:

* ``single``: ``decode-filter`` + ``prefix-cache-scorer`` + max-score picker, one profile;
* ``pd``: ``pd-epp-config``'s shape — decode and prefill profiles, ``prefix-based-pd-decider``
  (``nonCachedTokens`` 256) reading the precise producer, ``disagg-profile-handler``.

*cold*: every request a new prompt (P/D runs both profiles, sets the header, records the
transfer and credits the decode engine); *warm*: each prompt sent twice, the second timed (cached
on the decode engine, so P/D decides decode-only). The two pipelines alternate request by request,
so machine noise hits both alike; compare them as a ratio within one run.

    python benchmarks/bench_pd_decision.py [--requests 200] [--tokens 8192 102400]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import percentile

from ppc_extproc.config.epp import LoadedConfig, load_config_text
from ppc_extproc.framework import Endpoint, LLMRequest
from ppc_extproc.observability.logging import configure_logging
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Router
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

PRODUCER = """
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {blockSizeTokens: 16}
    speculativeIndexing: true
    kvEventsConfig: {discoverPods: false}
- {type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- {type: decode-filter}
- {type: max-score-picker}
"""
SINGLE = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:" + PRODUCER + """
schedulingProfiles:
- name: default
  plugins: [{pluginRef: decode-filter}, {pluginRef: prefix-cache-scorer, weight: 2}, {pluginRef: max-score-picker}]
"""
PD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:" + PRODUCER + """
- {type: prefill-filter}
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 256, prefixMatchInfoProducerName: precise-prefix-cache-producer}
- {type: disagg-profile-handler, parameters: {deciders: {prefill: prefix-based-pd-decider}}}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: prefix-cache-scorer, weight: 2}, {pluginRef: max-score-picker}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: prefix-cache-scorer, weight: 2}, {pluginRef: max-score-picker}]
"""
ENDPOINTS = [
    Endpoint(f"10.0.0.{i + 1}", 8000, labels=(("llm-d.ai/role", "decode" if i < 8 else "prefill"),))
    for i in range(16)
]


def router(loaded: LoadedConfig) -> Router:
    pool = EndpointPool()
    pool.subscribe(loaded.data_layer.notify)
    pool.replace(ENDPOINTS)
    return Router(pool, loaded.pipeline, loaded.services.inflight, loaded.services.health)


def prompt(rng: random.Random, n: int) -> TokenizedPrompt:
    return TokenizedPrompt("m", (tokens_to_le32(rng.randrange(1, 150_000) for _ in range(n)),))


def run(n_tokens: int, requests: int, warm: bool) -> dict[str, list[float]]:
    routers = {"single": router(load_config_text(SINGLE)), "pd": router(load_config_text(PD))}
    rng = random.Random(n_tokens)
    prompts = [prompt(rng, n_tokens) for _ in range(min(requests, 40))]
    loop = asyncio.new_event_loop()
    times: dict[str, list[float]] = {name: [] for name in routers}
    decisions: dict[str, set[str]] = {name: set() for name in routers}
    try:
        for i in range(requests + 10):  # the first 10 warm up
            for name, r in routers.items():
                p = prompts[i % len(prompts)]
                if not warm:  # a new prompt: a different first token changes every block key
                    p = TokenizedPrompt("m", (tokens_to_le32([i + 1]) + p.prompts[0][4:],))
                else:
                    loop.run_until_complete(r.route(LLMRequest(f"{name}-{i}-a", "m", p)))
                started = time.perf_counter()
                decision = loop.run_until_complete(r.route(LLMRequest(f"{name}-{i}", "m", p)))
                elapsed = time.perf_counter() - started
                if i >= 10:
                    times[name].append(elapsed)
                    decisions[name].add("pd" if decision.result.kv_source is not None else "decode-only")
    finally:
        loop.close()
    print(f"    decisions: single {sorted(decisions['single'])}, pd {sorted(decisions['pd'])}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 102400])
    args = parser.parse_args()
    configure_logging(level="warning")
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"command: python benchmarks/bench_pd_decision.py --requests {args.requests} --tokens "
          f"{' '.join(map(str, args.tokens))}")  # fmt: skip
    print(f"{'tokens':>7} {'index':>5} {'single p50':>11} {'pd p50':>9} {'added p50':>10} {'single p99':>11} "
          f"{'pd p99':>9}  (ms)")  # fmt: skip
    for n in args.tokens:
        for warm in (False, True):
            times = run(n, args.requests, warm)
            s50, p50 = (statistics.median(times[k]) * 1e3 for k in ("single", "pd"))
            s99, p99 = (percentile(times[k], 99) * 1e3 for k in ("single", "pd"))
            print(f"{n:>7} {'warm' if warm else 'cold':>5} {s50:>11.3f} {p50:>9.3f} {p50 - s50:>+10.3f} "
                  f"{s99:>11.3f} {p99:>9.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
