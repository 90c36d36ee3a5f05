"""Eviction soak: KV events of 64 new blocks each through the real decode and apply path into an
index far smaller than what is stored, so nearly every block is evicted again; resident memory
is sampled as it goes. Used by ``tests/reliability/test_eviction_soak.py`` (CI, ~1M blocks) and
``benchmarks/bench_eviction_soak.py`` (10M blocks)."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack

from ppc_extproc.blockkeys import TokenProcessor, TokenProcessorConfig
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.decode import decode_batch
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.index import InMemoryIndex

MODEL = "soak-model"
BLOCK_TOKENS = 16
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident set size of this process (``/proc/self/statm``), after a full collection."""
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


@dataclass
class SoakResult:
    blocks_stored: int
    blocks_evicted: int
    #: (blocks stored so far, RSS bytes) at each sample
    samples: list[tuple[int, int]] = field(default_factory=list)


def soak(
    *,
    index_size: int,
    blocks: int,
    blocks_per_event: int = 64,
    endpoints: int = 4,
    samples: int = 20,
    progress: Callable[[int, int], None] | None = None,
) -> SoakResult:
    """Store ``blocks`` new blocks (fresh chains of ``blocks_per_event``, round-robin over
    ``endpoints``) into an index of ``index_size`` keys; sample RSS ``samples`` times."""
    index = InMemoryIndex(size=index_size)
    applier = EventApplier(index, TokenProcessor(TokenProcessorConfig(block_size_tokens=BLOCK_TOKENS)), IngestStats())
    names = [f"10.9.0.{i + 1}:8000" for i in range(endpoints)]
    tokens = list(range(1, blocks_per_event * BLOCK_TOKENS + 1))
    events = blocks // blocks_per_event
    every = max(1, events // samples)
    result = SoakResult(0, 0)
    for i in range(events):
        tokens[0] = 100_000 + i  # a new first token: every key of the chain is new
        first_hash = (1 << 40) + i * blocks_per_event
        event = ["BlockStored", list(range(first_hash, first_hash + blocks_per_event)), None, tokens, BLOCK_TOKENS,
                 None, "GPU"]
        batch = decode_batch(msgpack.packb([1700000000.0 + i, [event], 0]))
        applier.apply_batch(names[i % endpoints], MODEL, batch)
        if (i + 1) % every == 0:
            stored = (i + 1) * blocks_per_event
            result.samples.append((stored, rss_bytes()))
            if progress is not None:
                progress(stored, result.samples[-1][1])
    stats = index.stats()
    result.blocks_stored = events * blocks_per_event
    result.blocks_evicted = stats.evicted_request_keys
    dropped = applier.stats.dropped_total()
    if dropped:
        raise AssertionError(f"the soak's events were dropped: {dict(applier.stats.dropped)}")
    return result
