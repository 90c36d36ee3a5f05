"""KV-cache events, declared as vLLM declares them (``vllm/distributed/kv_events.py``).

The types are msgspec structs in vLLM's field order, so the common vLLM payloads decode straight
into them in C (``decode.py`` tries the map era, then the array era, then a tolerant untyped path
for SGLang and anything unusual). Hashes are unsigned 64-bit ints once decoded; BlockStored token
ids are usually le32 bytes (``Le32Tokens``), never an int per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import msgspec

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "EventBatch", "KVCacheEvent"]

#: An engine block hash as it leaves the decoder: an unsigned 64-bit int.
Hash = Annotated[int, msgspec.Meta(ge=0)]
GroupIndex = Annotated[int, msgspec.Meta(ge=0)]
#: A negative block size fails the typed decoders; the untyped path then skips just that event.
BlockSize = Annotated[int, msgspec.Meta(ge=0)]


class _Event(msgspec.Struct, tag=True, tag_field="type", frozen=True, gc=False):
    """Base of the event types; the tag is the class name, as in vLLM."""


class BlockStored(_Event, frozen=True):
    """Blocks became full and cached on the engine."""

    #: Engine keys of the new blocks, in order (vLLM 0.9.0).
    block_hashes: list[Hash]
    #: Engine key of the block before ``block_hashes[0]``; None at block 0 (vLLM 0.9.0).
    parent_block_hash: Hash | None
    #: Tokens of all new blocks; empty for location-only (offload) events (vLLM 0.9.0). The
    #: decoder's fast path gives a ``tokens.le32.Le32Tokens`` (the ids as le32 bytes), else a list.
    token_ids: Sequence[int]
    #: Engine (group) block size; 0 in some placeholder offload events (vLLM 0.9.0).
    block_size: BlockSize
    #: Deprecated LoRA int id (``lora_int_id``); ignored for hashing (vLLM 0.9.0).
    lora_id: int | None = None
    #: "GPU", "CPU", "STORAGE", … (vLLM 0.10.2; SGLang 0.5.10).
    medium: str | None = None
    #: LoRA adapter name; replaces the model name in the root hash (vLLM 0.14).
    lora_name: str | None = None
    #: Per block hash: None or a list of identifiers (str or [str, offset]) (vLLM 0.17).
    extra_keys: list[list[Any] | None] | None = None
    #: HMA KV-cache group (vLLM 0.20).
    group_idx: GroupIndex | None = None
    #: ``full_attention``, ``sliding_window``, ``mamba``, … (vLLM 0.22).
    kv_cache_spec_kind: str | None = None
    #: Sliding window of the group, if any (vLLM 0.22).
    kv_cache_spec_sliding_window: int | None = None
    #: SGLang 0.5.18+: the request's ``cache_salt`` (vLLM carries it in ``extra_keys`` instead).
    cache_salt: str | None = None


class BlockRemoved(_Event, frozen=True):
    """Blocks were evicted from the engine's cache (vLLM 0.9.0)."""

    block_hashes: list[Hash]
    #: (vLLM 0.10.2)
    medium: str | None = None
    #: (vLLM 0.20)
    group_idx: GroupIndex | None = None


class AllBlocksCleared(_Event, frozen=True):
    """The engine's prefix cache was reset (vLLM 0.9.0)."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, frozen=True, gc=False):
    """One ZMQ message's payload: the events of one engine scheduler step (as decoded)."""

    ts: float
    events: list[KVCacheEvent]
    #: Data-parallel rank of the publishing engine core (0 when absent).
    data_parallel_rank: int = 0
    #: Reasons of the events that could not be decoded and were skipped (a metric label each).
    skipped: list[str] = msgspec.field(default_factory=list)
