"""The LRU releases what it evicts as fast as it is written (issue #11 F2); the memory figure is
the eviction soak in ``tests/reliability``."""

from __future__ import annotations

from ppc_extproc.index.lru import TwoGenerationLRU


def test_lru_releases_an_evicted_generation_before_the_next_one_even_with_large_writes() -> None:
    """One call writing a whole generation (a 64-block event into a small index) used to release
    only 4 evicted items, so evicted generations piled up."""
    lru: TwoGenerationLRU[int, int] = TwoGenerationLRU(128)  # generations of 64 keys
    for start in range(0, 64 * 1000, 64):
        lru.or_bits(list(range(start, start + 64)), lambda mask: 1 if mask is None else mask)
        assert lru.retired_items() == 0  # each write released what it evicted
        assert len(lru) <= 128
    assert lru.evicted == 64 * 999
    for start in range(0, 64 * 100, 16):  # smaller writes: at most one generation pending
        lru.set_many(list(range(10**6 + start, 10**6 + start + 16)), [1] * 16)
        assert lru.retired_items() <= 64
