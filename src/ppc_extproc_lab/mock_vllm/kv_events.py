"""vLLM's KV-cache event structs and their msgpack encodings (``vllm-project/vllm: vllm/distributed/kv_events.py``).

The engine builds events with the public structs below, which carry the newest field set
(vLLM 0.33). :class:`EventEncoder` re-declares them per emulated vLLM era so that msgspec
produces the era's exact bytes:

=========  ===========================  ===================================================
encoding   emulated vLLM                event shape
=========  ===========================  ===================================================
``array``  0.22 – 0.23                  ``array_like``: 12-element BlockStored, 4-element
                                        BlockRemoved, ``["AllBlocksCleared"]``
``map``    0.26 – 0.28                  ``omit_defaults`` map, ``"type"`` first; BlockStored
                                        has 13 possible entries ⇒ fixmap header
``map16``  0.33                         same, 16 possible entries ⇒ map16 header
=========  ===========================  ===================================================

The batch is always ``[ts, events, data_parallel_rank]`` (msgpack array).
"""

from __future__ import annotations

import time
from typing import Any, Final, Literal, TypeAlias

import msgspec

__all__ = [
    "ENCODINGS",
    "MEDIUM_GPU",
    "SPEC_KIND_FULL_ATTENTION",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Encoding",
    "EventEncoder",
    "KVCacheEvent",
    "KVEventBatch",
    "vllm_version_for",
]

Encoding: TypeAlias = Literal["array", "map", "map16"]
#: Selectable encodings, in the order of the vLLM eras they emulate.
ENCODINGS: Final[tuple[Encoding, ...]] = ("array", "map", "map16")

MEDIUM_GPU: Final = "GPU"
SPEC_KIND_FULL_ATTENTION: Final = "full_attention"

_VLLM_VERSION: Final[dict[Encoding, str]] = {"array": "0.23.0", "map": "0.28.0", "map16": "0.33.0"}


def vllm_version_for(encoding: Encoding) -> str:
    """The vLLM release whose wire format ``encoding`` reproduces (served by ``GET /version``)."""
    return _VLLM_VERSION[encoding]


# --------------------------------------------------------------------------------------------
# Public structs: the newest field set (vLLM 0.33), encoded as-is by the ``map16`` encoding.
# --------------------------------------------------------------------------------------------


class KVCacheEvent(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Base class of every KV-cache event; the msgpack tag is the class name (vLLM 0.9.0)."""


class BlockStored(KVCacheEvent):
    """Newly full blocks were cached (``BlockPool.cache_full_blocks``)."""

    block_hashes: list[int]
    """Wire block hashes (last 8 bytes of the digest, big-endian) of the new blocks, in order (0.9.0)."""
    parent_block_hash: int | None
    """Hash of the block before ``block_hashes[0]``; None at block 0 of a sequence (0.9.0)."""
    token_ids: list[int]
    """Concatenated tokens of the new blocks: ``block_size * len(block_hashes)`` ids (0.9.0)."""
    block_size: int
    """Tokens per block of the KV-cache group (0.9.0)."""
    lora_id: int | None
    """Deprecated ``LoRARequest.lora_int_id``; use ``lora_name`` (0.9.0)."""
    medium: str | None
    """Where the blocks live: ``"GPU"`` here; ``"CPU"``/``"STORAGE"`` for offloading (0.10.2)."""
    lora_name: str | None
    """LoRA adapter name; replaces the model name when indexing (0.14)."""
    extra_keys: list[tuple[Any, ...] | None] | None = None
    """Per-block extra hash keys (untagged forms, e.g. ``("s3cr3t",)`` for a salted block 0) (0.17)."""
    group_idx: int | None = None
    """HMA KV-cache group id (0.20)."""
    kv_cache_spec_kind: str | None = None
    """KV-cache spec of the group, e.g. ``"full_attention"`` (0.22)."""
    kv_cache_spec_sliding_window: int | None = None
    """Sliding window of the group's spec, if any (0.22)."""
    locality: str | None = None
    """``"LOCAL"`` / ``"REMOTE"`` (0.26, map encoding only)."""
    ownership: str | None = None
    """Block ownership (0.29, map encoding only)."""
    session_id: str | None = None
    """Session id copied from the request (0.30, map encoding only)."""
    lookahead_token_ids: list[list[int]] | None = None
    """Speculative lookahead tokens (0.33, map encoding only)."""


class BlockRemoved(KVCacheEvent):
    """Cached blocks were evicted (``BlockPool._maybe_evict_cached_block``), one hash per event."""

    block_hashes: list[int]
    """Wire hashes of the evicted blocks (0.9.0)."""
    medium: str | None
    """Where the blocks lived (0.10.2)."""
    group_idx: int | None = None
    """HMA KV-cache group id (0.20)."""
    locality: str | None = None
    """``"LOCAL"`` / ``"REMOTE"`` (0.26, map encoding only)."""
    ownership: str | None = None
    """Block ownership (0.29, map encoding only)."""


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was reset (``POST /reset_prefix_cache``) (0.9.0)."""


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One ZMQ payload: the events of one engine step, ``[ts, events, data_parallel_rank]``."""

    ts: float
    """Wall-clock seconds when the batch was built (0.9.0)."""
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    """Events of the step, in emission order (0.9.0)."""
    data_parallel_rank: int | None = None
    """DP rank of the publishing engine core; the publisher fills it in (0.9.1)."""


# --------------------------------------------------------------------------------------------
# Era-specific declarations (private): same tags, field sets and options of the emulated era.
# --------------------------------------------------------------------------------------------


class _ArrayEvent(msgspec.Struct, tag=True, array_like=True, omit_defaults=True, gc=False):
    """vLLM ≤0.23 event base: positional arrays, every field present."""


class _ArrayBlockStored(_ArrayEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _ArrayBlockRemoved(_ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class _ArrayAllBlocksCleared(_ArrayEvent, tag="AllBlocksCleared"):
    pass


class _ArrayBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[_ArrayBlockStored | _ArrayBlockRemoved | _ArrayAllBlocksCleared]
    data_parallel_rank: int | None = None


class _MapEvent(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """vLLM 0.26–0.28 event base: maps with defaults omitted."""


class _MapBlockStored(_MapEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None


class _MapBlockRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None


class _MapAllBlocksCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


class _MapBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[_MapBlockStored | _MapBlockRemoved | _MapAllBlocksCleared]
    data_parallel_rank: int | None = None


def _to_array(event: KVCacheEvent) -> msgspec.Struct:
    if isinstance(event, BlockStored):
        return _ArrayBlockStored(
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            event.lora_id,
            event.medium,
            event.lora_name,
            event.extra_keys,
            event.group_idx,
            event.kv_cache_spec_kind,
            event.kv_cache_spec_sliding_window,
        )
    if isinstance(event, BlockRemoved):
        return _ArrayBlockRemoved(event.block_hashes, event.medium, event.group_idx)
    if isinstance(event, AllBlocksCleared):
        return _ArrayAllBlocksCleared()
    raise TypeError(f"not a KV-cache event: {type(event).__name__}")


def _to_map(event: KVCacheEvent) -> msgspec.Struct:
    if isinstance(event, BlockStored):
        return _MapBlockStored(
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            event.lora_id,
            event.medium,
            event.lora_name,
            event.extra_keys,
            event.group_idx,
            event.kv_cache_spec_kind,
            event.kv_cache_spec_sliding_window,
            event.locality,
        )
    if isinstance(event, BlockRemoved):
        return _MapBlockRemoved(event.block_hashes, event.medium, event.group_idx, event.locality)
    if isinstance(event, AllBlocksCleared):
        return _MapAllBlocksCleared()
    raise TypeError(f"not a KV-cache event: {type(event).__name__}")


class EventEncoder:
    """Encodes :class:`KVEventBatch` payloads byte-identically to one vLLM era.

    Fields the era does not have (e.g. ``locality`` for ``array``) are dropped.
    """

    def __init__(self, encoding: Encoding = "map") -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown event encoding {encoding!r}; expected one of {ENCODINGS}")
        self.encoding: Encoding = encoding
        self._encoder = msgspec.msgpack.Encoder()

    def encode(self, batch: KVEventBatch) -> bytes:
        """The msgpack payload (ZMQ frame 2) of ``batch``."""
        ts = float(batch.ts)
        if self.encoding == "map16":
            return self._encoder.encode(KVEventBatch(ts, batch.events, batch.data_parallel_rank))
        if self.encoding == "map":
            events_map = [_to_map(e) for e in batch.events]
            return self._encoder.encode(_MapBatch(ts, events_map, batch.data_parallel_rank))  # type: ignore[arg-type]
        events_arr = [_to_array(e) for e in batch.events]
        return self._encoder.encode(_ArrayBatch(ts, events_arr, batch.data_parallel_rank))  # type: ignore[arg-type]

    def encode_events(
        self,
        events: list[BlockStored | BlockRemoved | AllBlocksCleared],
        *,
        ts: float | None = None,
        data_parallel_rank: int | None = 0,
    ) -> bytes:
        """Shortcut: encode ``events`` as one batch stamped ``ts`` (default: now)."""
        stamp = time.time() if ts is None else ts
        return self.encode(KVEventBatch(stamp, events, data_parallel_rank))
