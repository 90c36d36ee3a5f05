"""Eviction soak: resident memory while the index evicts 10M blocks.

KV events of 64 new blocks each (16 tokens per block, 4 endpoints) go through the real decode and
apply path into an index far smaller than what is stored, so nearly every block is evicted again;
RSS (``/proc/self/statm``, after ``gc.collect()``) is sampled as it goes. The CI version of this is
``tests/reliability/test_eviction_soak.py`` (1M blocks).

    python benchmarks/bench_eviction_soak.py [--blocks 10000000] [--index-size 100000] [--samples 20]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, pin_to_one_core

from ppc_extproc_lab.soak import soak


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=10_000_000)
    parser.add_argument("--index-size", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    pin_to_one_core()
    gc.set_threshold(50_000, *gc.get_threshold()[1:])  # as `ppc-extproc serve` does
    header("Eviction soak: RSS while the index evicts")
    print(f"index size {args.index_size:,} keys; {args.blocks:,} blocks in 64-block events, 4 endpoints")
    print()
    print(f"{'blocks stored':>14} {'RSS MiB':>9}")
    started = time.perf_counter()
    result = soak(
        index_size=args.index_size,
        blocks=args.blocks,
        samples=args.samples,
        progress=lambda stored, rss: print(f"{stored:>14,} {rss / 2**20:>9.1f}", flush=True),
    )
    elapsed = time.perf_counter() - started
    rss = [r for _, r in result.samples]
    quarter = max(1, len(rss) // 4)
    reference = max(rss[quarter : 2 * quarter] or rss)
    late = max(rss[2 * quarter :] or rss)
    print()
    print(f"{result.blocks_stored:,} blocks stored, {result.blocks_evicted:,} evicted in {elapsed:.1f} s "
          f"({result.blocks_stored / elapsed:,.0f} blocks/s)")
    print(f"RSS after warm-up (peak of the 2nd quarter) {reference / 2**20:.1f} MiB, peak afterwards "
          f"{late / 2**20:.1f} MiB: {late / reference - 1:+.1%}; min {min(rss) / 2**20:.1f}, "
          f"max {max(rss) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
