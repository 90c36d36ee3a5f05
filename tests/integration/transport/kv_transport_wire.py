"""vLLM-format KV-event payloads for the transport tests, encoded the way vLLM encodes them.

msgspec structs re-declared per era as in ``vllm/distributed/kv_events.py``: the map era
(0.26–0.28: ``tag=True, omit_defaults=True``, 13 possible BlockStored entries ⇒ fixmap) and the
array era (0.22–0.23: ``array_like=True``). ``test_kv_transport_wire_fixture.py`` pins the bytes
against ``kv_events_wire.md`` §9. Also the spec's literal payloads (§9.2, §9.5, §9.8).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

H0, H1 = 0x137BB037547F4CAF, 0x16D077AD0843C577
TOKENS_1_32 = list(range(1, 33))

#: §9.3: BlockStored [h0, h1], tokens 1..32, map era (vLLM 0.24–0.32), ts 1700000000.5, rank 0.
MAP_STORED_H0_H1 = bytes.fromhex(
    "93cb41d954fc40200000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf137bb0"
    "37547f4cafcf16d077ad0843c577b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc0020"
    "0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20aa626c6f636b5f73697a6510a76c"
    "6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a96772"
    "6f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00"
)
#: §9.5: the same event in the 0.10.2–0.13 array form (7 elements).
ARRAY_STORED_H0_H1 = bytes.fromhex(
    "93cb41d954fc402000009197ab426c6f636b53746f72656492cf137bb037547f4cafcf16d077ad0843c577c0dc0020"
    "0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2010c0a347505500"
)
#: §9.2: one AllBlocksCleared, map era and array era.
MAP_CLEARED = bytes.fromhex("93cb41d954fc400000009181a474797065b0416c6c426c6f636b73436c656172656400")
ARRAY_CLEARED = bytes.fromhex("93cb41d954fc400000009191b0416c6c426c6f636b73436c656172656400")
#: §9.8: SGLang ≤0.5.8 batch: BlockStored([-0x3000…], tokens 1..4, page 4), BlockRemoved, Cleared.
SGLANG_BATCH = bytes.fromhex(
    "93cb41d954fc402000009396ab426c6f636b53746f72656491d3d000000000000000c0940102030404c092ac426c"
    "6f636b52656d6f766564917b91b0416c6c426c6f636b73436c656172656400"
)


class _MapEvent(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    pass


class _MapStored(_MapEvent, tag="BlockStored"):
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


class _MapRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None


class _MapCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


class _ArrayEvent(msgspec.Struct, tag=True, array_like=True, omit_defaults=True, gc=False):
    pass


class _ArrayStored(_ArrayEvent, tag="BlockStored"):
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


class _ArrayRemoved(_ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class _ArrayCleared(_ArrayEvent, tag="AllBlocksCleared"):
    pass


class _Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()


def stored(
    hashes: list[int],
    tokens: list[int],
    parent: int | None = None,
    *,
    era: str = "map",
    block_size: int = 16,
) -> msgspec.Struct:
    """A GPU BlockStored of HMA group 0 (``full_attention``), as vLLM ≥0.22 emits it."""
    cls = _MapStored if era == "map" else _ArrayStored
    return cls(
        hashes,
        parent,
        tokens,
        block_size,
        None,
        "GPU",
        None,
        [None] * len(hashes),
        0,
        "full_attention",
    )


def removed(hashes: list[int], *, era: str = "map") -> msgspec.Struct:
    cls = _MapRemoved if era == "map" else _ArrayRemoved
    return cls(hashes, "GPU", 0)


def cleared(*, era: str = "map") -> msgspec.Struct:
    return _MapCleared() if era == "map" else _ArrayCleared()


def batch(events: list[msgspec.Struct], *, ts: float | None = None, rank: int = 0) -> bytes:
    """One ``KVEventBatch`` payload (ZMQ frame 2)."""
    return _ENCODER.encode(_Batch(time.time() if ts is None else ts, events, rank))


def chain(
    first_hash: int,
    n_blocks: int,
    first_token: int,
    parent: int | None = None,
    *,
    era: str = "map",
    ts: float | None = None,
) -> tuple[bytes, list[int]]:
    """A batch storing ``n_blocks`` blocks with hashes ``first_hash …`` and tokens
    ``first_token …`` (16 per block); returns the payload and its tokens."""
    tokens = list(range(first_token, first_token + 16 * n_blocks))
    hashes = list(range(first_hash, first_hash + n_blocks))
    return batch([stored(hashes, tokens, parent, era=era)], ts=ts), tokens
