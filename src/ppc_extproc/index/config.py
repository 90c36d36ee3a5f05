"""``indexerConfig``: bounds of the index and tier weights."""

from __future__ import annotations

from dataclasses import dataclass, field

from ppc_extproc.index.entries import DEFAULT_TIER_WEIGHTS
from ppc_extproc.index.memory import DEFAULT_INDEX_SIZE

__all__ = ["IndexerConfig"]


@dataclass(frozen=True, slots=True)
class IndexerConfig:
    """``indexerConfig.kvBlockIndexConfig.inMemoryConfig`` and ``kvCacheBackendConfigs``."""

    #: Maximum request keys (and engine mappings) held; approximate-LRU eviction beyond.
    size: int = DEFAULT_INDEX_SIZE
    #: Maximum entries (endpoint × tier × group, speculative) per key (llm-d default 10).
    pod_cache_size: int = 10
    #: Device tier → weight in the longest-prefix score; unlisted tiers weigh 1.0.
    tier_weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TIER_WEIGHTS))
