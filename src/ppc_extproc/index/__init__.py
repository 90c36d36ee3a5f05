"""The KV-block index: which endpoint holds which block, keyed by request keys (dual-key design)."""

from __future__ import annotations

from ppc_extproc.index.entries import (
    DEFAULT_TIER_WEIGHTS,
    SPECULATIVE_TIER,
    EntryRegistry,
    MaskInfo,
    PodEntry,
)
from ppc_extproc.index.mapping import engine_to_request_mapping
from ppc_extproc.index.memory import (
    DEFAULT_INDEX_SIZE,
    EngineScope,
    IndexSnapshot,
    IndexStats,
    InMemoryIndex,
    PrefixRun,
)
from ppc_extproc.index.speculative import SpeculativeIndexer

__all__ = [
    "DEFAULT_INDEX_SIZE",
    "DEFAULT_TIER_WEIGHTS",
    "SPECULATIVE_TIER",
    "EngineScope",
    "EntryRegistry",
    "InMemoryIndex",
    "IndexSnapshot",
    "IndexStats",
    "MaskInfo",
    "PodEntry",
    "PrefixRun",
    "SpeculativeIndexer",
    "engine_to_request_mapping",
]
