"""Memory stays flat while the index evicts (issue #11 F2): ~1M blocks in 64-block events through
the real decode and apply path into a 20,000-key index. The 10M-block figure comes from
``benchmarks/bench_eviction_soak.py``; the test asserts the property, not a speed."""

from __future__ import annotations

import fault_tally as tally

from ppc_extproc_lab.soak import soak

INDEX_SIZE = 20_000
BLOCKS = 1_000_000 * tally.SCALE
TOLERANCE = 0.05


def test_resident_memory_is_flat_while_the_index_evicts() -> None:
    result = soak(index_size=INDEX_SIZE, blocks=BLOCKS, samples=20)
    assert result.blocks_evicted >= result.blocks_stored - 2 * INDEX_SIZE
    # Warm-up: the first quarter fills the index and the allocator's pools; then the peak of
    # the second quarter is the reference for everything after it.
    rss = [r for _, r in result.samples]
    quarter = len(rss) // 4
    reference = max(rss[quarter : 2 * quarter])
    late = max(rss[2 * quarter :])
    assert late <= reference * (1 + TOLERANCE), f"RSS grew {late / reference - 1:+.1%}: {rss}"
    tally.add("soak: blocks evicted", result.blocks_evicted)
    tally.add(f"soak: RSS growth after warm-up, % (limit {TOLERANCE:.0%})", round(100 * max(0.0, late / reference - 1)))
