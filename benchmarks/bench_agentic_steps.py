"""What one agentic 100K/1K request makes the service do besides the gRPC messages, step by step,
in process (CPU time per request, by step).

    python benchmarks/bench_agentic_steps.py                      # the code on the path
    PYTHONPATH=/tmp/base/src python benchmarks/bench_agentic_steps.py   # another checkout's code

The workload of ``bench_scale.py``'s agentic rows, at block size 16 with 16 endpoints: 8 sessions
whose 95K-token prefixes are new in the first measured round (``bench_scale`` warms other
prefixes than it measures), then 2 rounds more of the same sessions with a new 5K tail each. Per
request: the block keys, the prefix lookup, the speculative seeding of the pick, the engine's
BlockStored for the prompt blocks it lacks (msgpack as vLLM 0.33 writes it, decoded and applied),
its 62 generated blocks one event each, and the expiry of the seeded entries. No sockets and no
gRPC: ``bench_scale`` measures those; this tells the steps apart.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import header

import ppc_extproc.plugins.producers.precise_prefix_cache as producer_module
from ppc_extproc.events.decode import decode_batch
from ppc_extproc.ids import EndpointId
from ppc_extproc.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer
from ppc_extproc.plugins.producers.precise_prefix_cache_config import PrecisePrefixCacheProducerConfig
from ppc_extproc.tokens.le32 import tokens_to_le32
from ppc_extproc_lab.mock_vllm.kv_events import BlockStored, EventEncoder

BLOCK = 16
MODEL = "mock-model"


def skip_for(runs: Any, endpoint: EndpointId) -> int:
    """The leading blocks the producer's ``pre_request`` would not seed (either version)."""
    held = getattr(producer_module, "_held_blocks", None)
    if held is not None:
        return int(held(runs, endpoint, 1.0))
    return int(producer_module._seeded_blocks(runs, endpoint))  # type: ignore[attr-defined]


def run(rounds: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    encoder = EventEncoder("map16")
    p = PrecisePrefixCacheProducer(config=PrecisePrefixCacheProducerConfig(speculative_indexing=True))
    endpoints = [EndpointId(f"10.0.0.{i + 1}:8000") for i in range(16)]
    times: dict[str, float] = defaultdict(float)
    engine_hash: dict[tuple[str, int], int] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        started = time.process_time()
        out = fn()
        times[name] += time.process_time() - started
        return out

    def store(endpoint: EndpointId, keys: list[int], tokens: list[int], first: int, last: int) -> None:
        hashes = [rng.getrandbits(64) for _ in range(first, last)]
        parent = engine_hash[(endpoint, keys[first - 1])] if first else None
        engine_hash.update(((endpoint, k), h) for k, h in zip(keys[first:last], hashes))
        event = BlockStored(
            block_hashes=hashes, parent_block_hash=parent, token_ids=tokens[first * BLOCK : last * BLOCK],
            block_size=BLOCK, lora_id=None, medium="GPU", lora_name=None, extra_keys=[None] * (last - first),
            group_idx=0, kv_cache_spec_kind="full_attention",
        )  # fmt: skip
        payload = encoder.encode_events([event])
        batch = timed("decode", lambda: decode_batch(payload))
        timed("apply", lambda: p.applier.apply_batch(endpoint, MODEL, batch))

    requests = 0
    prefixes: list[list[int]] = []
    for r in range(rounds + 1):  # round 0 warms other prefixes, not measured
        if r <= 1:
            prefixes = [[rng.randrange(1, 150_000) for _ in range(95_000)] for _ in range(8)]
        if r == 1:
            times.clear()
        for s in range(8):
            tokens = prefixes[s] + [rng.randrange(1, 150_000) for _ in range(5_000)]
            data = tokens_to_le32(tokens)
            endpoint = endpoints[s]
            keys = timed("keys", lambda: p.processor.keys(data, MODEL, recent=True))
            runs = timed("lookup", lambda: p.index.prefix_runs(keys, endpoints))
            skip = skip_for(runs, endpoint)
            timed("seed", lambda: p.speculative.seed(endpoint, [keys[skip:]]))
            held = sum(run.count for run in runs if endpoint in run.info.weights)
            store(endpoint, keys, tokens, held, len(keys))
            answer = tokens + [rng.randrange(1, 150_000) for _ in range(1000)]
            answer_keys = p.processor.keys(tokens_to_le32(answer), MODEL)
            for j in range(len(keys), len(answer_keys)):
                store(endpoint, answer_keys, answer, j, j + 1)
            requests += r > 0
        timed("expire", lambda: p.speculative.expire(time.monotonic() + 3600))
    return {name: t / requests * 1e3 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds of 8 requests")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best total is shown")
    args = parser.parse_args()
    header("bench_agentic_steps: one agentic 100K/1K request's steps in process")
    print(f"code: {Path(producer_module.__file__).parents[3]}")
    best: dict[str, float] | None = None
    for i in range(args.repeat):
        result = run(args.rounds, i)
        if best is None or sum(result.values()) < sum(best.values()):
            best = result
    assert best is not None
    print("CPU ms per request, best of", args.repeat, "runs:")
    print("  " + ", ".join(f"{k} {v:.2f}" for k, v in best.items()) + f"; total {sum(best.values()):.2f}")


if __name__ == "__main__":
    main()
