"""Core benchmark: block keys, event ingestion, lookup + score, index memory.

Run by hand on one core:  python benchmarks/bench_core.py [--entries 1000000]
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, ms, pin_to_one_core, time_calls

from ppc_extproc.blockkeys import TokenProcessor, TokenProcessorConfig
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.decode import decode_batch
from ppc_extproc.index import InMemoryIndex, PodEntry
from ppc_extproc.matchinfo import score_prefix_runs
from ppc_extproc.tokens.le32 import tokens_to_le32

ENDPOINTS = [f"10.0.{i // 250}.{i % 250 + 1}:8000" for i in range(16)]


def bench_block_keys() -> None:
    print("## Block keys (xxh64; tokens as little-endian uint32 bytes)")
    rng = random.Random(1)
    for n_tokens in (1_000, 8_000, 32_000, 100_000):
        tokens = tokens_to_le32([rng.randrange(150_000) for _ in range(n_tokens)])
        for bs in (16, 64):
            processor = TokenProcessor(TokenProcessorConfig(bs, "", "xxh64"))
            samples = time_calls(lambda: processor.keys(tokens, "m"), repeat=50)
            print(f"{n_tokens:>7} tokens  bs {bs:>2}: {ms(samples)}")
    tokens = tokens_to_le32([rng.randrange(150_000) for _ in range(8_000)])
    processor = TokenProcessor(TokenProcessorConfig(16, "", "cbor-fnv"))
    print(f"   8000 tokens  bs 16 cbor-fnv: {ms(time_calls(lambda: processor.keys(tokens, 'm'), repeat=5, warmup=1))}")
    print()


def make_batches(n_blocks: int, rng: random.Random) -> list[tuple[str, bytes]]:
    """Realistic traffic: per endpoint, chains of BlockStored with 1–8 blocks of 16 tokens."""
    batches = []
    heads: dict[str, int | None] = {ep: None for ep in ENDPOINTS}
    next_hash = 1
    produced = 0
    while produced < n_blocks:
        ep = rng.choice(ENDPOINTS)
        n = rng.randint(1, 8)
        hashes = list(range(next_hash, next_hash + n))
        next_hash += n
        parent = heads[ep] if rng.random() < 0.7 else None
        # vLLM 0.22+ map-era fields, as a real engine sends them
        event = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                 "token_ids": [rng.randrange(150_000) for _ in range(16 * n)], "block_size": 16,
                 "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [None] * n,
                 "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
        heads[ep] = hashes[-1]
        batches.append((ep, msgpack.packb([time.time(), [event], 0])))
        produced += n
    return batches


def bench_ingestion(n_blocks: int = 300_000, runs: int = 5) -> None:
    print("## Ingestion: msgpack bytes → decoded → applied to the index")
    rng = random.Random(2)
    batches = make_batches(n_blocks, rng)
    rates = []
    for _ in range(runs):
        applier = EventApplier(InMemoryIndex(size=10_000_000), TokenProcessor(TokenProcessorConfig(16)))
        gc.collect()
        start = time.perf_counter()
        for ep, payload in batches:
            applier.apply_batch(ep, "m", decode_batch(payload))
        rates.append(n_blocks / (time.perf_counter() - start))
    rates.sort()
    print(f"{n_blocks} blocks in {len(batches)} batches (1–8 blocks, 16 tokens each, 16 endpoints, vLLM 0.22+ "
          f"fields): median {rates[len(rates) // 2]:,.0f} blocks/s, best {rates[-1]:,.0f}, worst {rates[0]:,.0f} "
          f"({runs} runs; GC thresholds as the service sets them)")
    print()


def bench_lookup_score() -> None:
    print("## Lookup + score: 100K-token prompt, 16 endpoints, warm index")
    rng = random.Random(3)
    tokens = tokens_to_le32([rng.randrange(150_000) for _ in range(100_000)])
    for bs in (16, 64):
        processor = TokenProcessor(TokenProcessorConfig(bs))
        index = InMemoryIndex(size=10_000_000)
        keys = processor.keys(tokens, "m")
        # every endpoint holds a different share of the prefix; 4 hold it all
        for i, ep in enumerate(ENDPOINTS):
            held = len(keys) if i < 4 else len(keys) * i // 16
            if held:
                index.add(None, keys[:held], [PodEntry(ep, "gpu")])
        samples = time_calls(lambda: score_prefix_runs(index.prefix_runs(keys, ENDPOINTS)), repeat=100)
        both = time_calls(lambda: score_prefix_runs(index.prefix_runs(processor.keys(tokens, "m"), ENDPOINTS)), repeat=100)
        print(f"bs {bs:>2} ({len(keys)} keys): lookup+score {ms(samples)};  keys+lookup+score {ms(both)}")
    print()


def bench_memory(entries: int) -> None:
    print(f"## Memory: {entries:,} (block, endpoint) entries incl. the engine-key mapping")
    rng = random.Random(4)
    processor = TokenProcessor(TokenProcessorConfig(16))
    gc.collect()
    tracemalloc.start()
    applier = EventApplier(InMemoryIndex(size=entries * 2), processor)
    base = tracemalloc.get_traced_memory()[0]
    placed = 0
    next_hash = 1
    # chains of 64 blocks; each chain is stored on 1–3 endpoints (shared prefixes), 2 on average
    while placed < entries:
        tokens = [rng.randrange(150_000) for _ in range(16 * 64)]
        for ep in rng.sample(ENDPOINTS, rng.randint(1, 3)):
            hashes = list(range(next_hash, next_hash + 64))
            next_hash += 64
            event = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
                     "token_ids": tokens, "block_size": 16, "medium": "GPU"}
            applier.apply_batch(ep, "m", decode_batch(msgpack.packb([0.0, [event], 0])))
            placed += 64
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    stats = applier.index.stats()
    print(f"{placed:,} entries on {stats.request_keys:,} request keys, {stats.engine_keys:,} engine keys: "
          f"{used / placed:.1f} bytes per entry ({used / 2**20:.0f} MiB)")
    print()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=1_000_000)
    args = parser.parse_args()
    pin_to_one_core()
    gc.set_threshold(50_000, *gc.get_threshold()[1:])  # as `ppc-extproc serve` does
    header("ppc-extproc core benchmark (one core)")
    bench_block_keys()
    bench_lookup_score()
    bench_ingestion()
    bench_memory(args.entries)


if __name__ == "__main__":
    main()
