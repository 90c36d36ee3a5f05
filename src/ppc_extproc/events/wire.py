"""KV-cache events as ppc-extproc sees them after decoding, in vLLM's field order.

Every decoder (vLLM array era, vLLM map era, SGLang) returns these types; hashes are already
normalised to unsigned 64-bit ints and token ids to little-endian uint32 bytes. Spec:
``kv_events_wire.md`` §3–§5.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "EventBatch", "KVCacheEvent"]


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks became full and cached on the engine."""

    #: Engine keys of the new blocks, in order (vLLM 0.9.0).
    block_hashes: tuple[int, ...]
    #: Engine key of the block before ``block_hashes[0]``; None at block 0 (vLLM 0.9.0).
    parent_block_hash: int | None
    #: Tokens of all new blocks as little-endian uint32 bytes; empty for location-only events (0.9.0).
    tokens: bytes
    #: Engine (group) block size; 0 in some placeholder offload events (0.9.0).
    block_size: int
    #: Deprecated LoRA int id, ignored for hashing (0.9.0).
    lora_id: int | None = None
    #: "GPU", "CPU", "STORAGE", … (vLLM 0.10.2; SGLang 0.5.10).
    medium: str | None = None
    #: LoRA adapter name; replaces the model name in the root hash (vLLM 0.14).
    lora_name: str | None = None
    #: One entry per block hash: None or a list of identifiers, raw from the wire (vLLM 0.17).
    extra_keys: list[Any] | None = None
    #: HMA KV-cache group (vLLM 0.20).
    group_idx: int | None = None
    #: ``full_attention``, ``sliding_window``, ``mamba``, … (vLLM 0.22).
    kv_cache_spec_kind: str | None = None
    #: Sliding window of the group, if any (vLLM 0.22).
    kv_cache_spec_sliding_window: int | None = None
    #: SGLang 0.5.18+ only: the request's ``cache_salt`` (vLLM puts it into ``extra_keys``).
    cache_salt: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.tokens) // 4


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks were evicted from the engine's cache (vLLM 0.9.0)."""

    block_hashes: tuple[int, ...]
    #: (vLLM 0.10.2)
    medium: str | None = None
    #: (vLLM 0.20)
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine's prefix cache was reset (vLLM 0.9.0)."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One ZMQ message's payload: the events of one engine scheduler step."""

    ts: float
    events: list[KVCacheEvent]
    #: Data-parallel rank of the publishing engine core (0 when absent).
    data_parallel_rank: int = 0
    #: Reasons of the events that could not be decoded and were skipped (a metric label each).
    skipped: list[str] = field(default_factory=list)
