"""vLLM-format KV-event payloads for the transport tests, encoded the way vLLM encodes them.

Built with the mock engine's ``EventEncoder`` (map era 0.26–0.28, array era 0.22–0.23), whose bytes
``tests/unit/mock_vllm`` pins against ``kv_events_wire.md`` §9 — plus the spec's literal payloads
(§9.2, §9.5, §9.8).
"""

from __future__ import annotations

from ppc_extproc_lab.mock_vllm.kv_events import (
    MEDIUM_GPU,
    SPEC_KIND_FULL_ATTENTION,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Encoding,
    EventEncoder,
    KVCacheEvent,
)

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


def stored(
    hashes: list[int],
    tokens: list[int],
    parent: int | None = None,
    *,
    block_size: int = 16,
) -> BlockStored:
    """A GPU BlockStored of HMA group 0 (``full_attention``), as vLLM ≥0.22 emits it."""
    return BlockStored(
        hashes, parent, tokens, block_size, None, MEDIUM_GPU, None,
        extra_keys=[None] * len(hashes), group_idx=0, kv_cache_spec_kind=SPEC_KIND_FULL_ATTENTION,
    )


def removed(hashes: list[int]) -> BlockRemoved:
    return BlockRemoved(hashes, MEDIUM_GPU, group_idx=0)


def cleared() -> AllBlocksCleared:
    return AllBlocksCleared()


def batch(events: list[KVCacheEvent], *, era: Encoding = "map", ts: float | None = None, rank: int = 0) -> bytes:
    """One ``KVEventBatch`` payload (ZMQ frame 2), encoded as vLLM of ``era`` does (the mock
    engine's encoder, whose bytes are pinned against the spec)."""
    return _ENCODERS[era].encode_events(events, ts=ts, data_parallel_rank=rank)


def chain(
    first_hash: int,
    n_blocks: int,
    first_token: int,
    parent: int | None = None,
    *,
    era: Encoding = "map",
    ts: float | None = None,
) -> tuple[bytes, list[int]]:
    """A batch storing ``n_blocks`` blocks with hashes ``first_hash …`` and tokens
    ``first_token …`` (16 per block); returns the payload and its tokens."""
    tokens = list(range(first_token, first_token + 16 * n_blocks))
    hashes = list(range(first_hash, first_hash + n_blocks))
    return batch([stored(hashes, tokens, parent)], era=era, ts=ts), tokens


_ENCODERS: dict[Encoding, EventEncoder] = {era: EventEncoder(era) for era in ("map", "array", "map16")}
