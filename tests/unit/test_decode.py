"""KV-event decoding over the spec's wire bytes (every vLLM era and SGLang) and malformed input."""

from __future__ import annotations

import msgpack
import msgspec
import pytest
from vectors import load_vectors

from ppc_extproc.errors import WireError
from ppc_extproc.events.decode import decode_batch, normalise_hash
from ppc_extproc.events.wire import AllBlocksCleared, BlockRemoved, BlockStored
from ppc_extproc.tokens.le32 import Le32Tokens, tokens_to_le32


def norm(events: list) -> list:
    """Events as (wire type, field values): the array-era decoder yields subclasses of the wire types."""
    out = []
    for event in events:
        base = next(t for t in (BlockStored, BlockRemoved, AllBlocksCleared) if isinstance(event, t))
        out.append((base.__name__, msgspec.structs.astuple(event)))
    return out


WIRE = load_vectors("vllm_wire_vectors.json")["vllm_wire_vectors"]
H0, H1 = 0x137BB037547F4CAF, 0x16D077AD0843C577
TOKENS_1_32 = list(range(1, 33))


@pytest.mark.parametrize("era", list(WIRE))
def test_wire_vectors_decode_to_the_documented_events(era: str) -> None:
    vector = WIRE[era]
    batch = decode_batch(bytes.fromhex(vector["payload_hex"]))
    assert batch.ts == 1789095808.5 and batch.data_parallel_rank == 0 and batch.skipped == []
    assert norm(batch.events) == norm([BlockStored(
        block_hashes=[15760518052499183552],
        parent_block_hash=None,
        token_ids=list(range(1, 17)),
        block_size=16,
        medium="GPU",
        extra_keys=[None],
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    ), BlockRemoved([15760518052499183552], "GPU", 0), AllBlocksCleared()])
    nil_rank = decode_batch(bytes.fromhex(vector["batch_without_dp_rank_hex"]))
    assert nil_rank.data_parallel_rank == 0 and norm(nil_rank.events) == norm([AllBlocksCleared()])


# kv_events_wire.md §9.3 (map, 0.24–0.32) and §9.5 (array, 0.10.2–0.13)
MAP_2_BLOCKS = (
    "93cb41d954fc40200000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf137bb037547f4caf"
    "cf16d077ad0843c577b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00200102030405060708090a0b"
    "0c0d0e0f101112131415161718191a1b1c1d1e1f20aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da34750"
    "55a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f"
    "6b696e64ae66756c6c5f617474656e74696f6e00"
)
ARRAY_7 = (
    "93cb41d954fc402000009197ab426c6f636b53746f72656492cf137bb037547f4cafcf16d077ad0843c577c0dc00200102030405"
    "060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2010c0a347505500"
)


def test_map_era_block_stored_from_the_hex_cheat_sheet() -> None:
    (event,) = decode_batch(bytes.fromhex(MAP_2_BLOCKS)).events
    assert isinstance(event, BlockStored)
    assert event.block_hashes == [H0, H1] and event.parent_block_hash is None
    assert event.token_ids == TOKENS_1_32 and event.extra_keys == [None, None] and event.group_idx == 0


def test_map16_header_of_vllm_033_decodes_the_same() -> None:
    payload = bytearray.fromhex(MAP_2_BLOCKS)
    i = payload.index(0x8B)  # fixmap(11) → map16 with the same count
    payload[i : i + 1] = b"\xde\x00\x0b"
    assert norm(decode_batch(bytes(payload)).events) == norm(decode_batch(bytes.fromhex(MAP_2_BLOCKS)).events)


def test_array_era_7_elements() -> None:
    (event,) = decode_batch(bytes.fromhex(ARRAY_7)).events
    assert isinstance(event, BlockStored)
    assert event.block_hashes == [H0, H1] and event.medium == "GPU" and event.lora_name is None
    assert event.extra_keys is None and event.group_idx is None


@pytest.mark.parametrize(
    ("hex_event", "expected"),
    [
        ("84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf137bb037547f4cafa66d656469756da3475055a967726f75705f69647800", BlockRemoved([H0], "GPU", 0)),
        ("94ac426c6f636b52656d6f76656491cf137bb037547f4cafa347505500", BlockRemoved([H0], "GPU", 0)),
        ("93ac426c6f636b52656d6f76656491cf137bb037547f4cafa3475055", BlockRemoved([H0], "GPU", None)),
        ("92ac426c6f636b52656d6f76656491cf137bb037547f4caf", BlockRemoved([H0], None, None)),
        ("81a474797065b0416c6c426c6f636b73436c6561726564", AllBlocksCleared()),
        ("91b0416c6c426c6f636b73436c6561726564", AllBlocksCleared()),
    ],
)
def test_removed_and_cleared_in_every_era(hex_event: str, expected) -> None:
    payload = b"\x93\xcb" + bytes.fromhex("41d954fc40000000") + b"\x91" + bytes.fromhex(hex_event) + b"\x00"
    assert norm(decode_batch(payload).events) == norm([expected])


def test_two_element_batch_of_vllm_090() -> None:
    payload = msgpack.packb([1.5, [["AllBlocksCleared"]]])
    batch = decode_batch(payload)
    assert norm(batch.events) == norm([AllBlocksCleared()]) and batch.data_parallel_rank == 0


def test_rank_extra_elements_and_int_timestamps() -> None:
    batch = decode_batch(msgpack.packb([1700000000, [["AllBlocksCleared"]], 3, "future-field"]))
    assert batch.ts == 1700000000.0 and batch.data_parallel_rank == 3


def test_sglang_array_payload_with_signed_hash() -> None:
    payload = bytes.fromhex(
        "93cb41d954fc402000009396ab426c6f636b53746f72656491d3d000000000000000c0940102030404c092ac426c6f636b52656d6f"
        "766564917b91b0416c6c426c6f636b73436c656172656400"
    )
    stored, removed, cleared = decode_batch(payload, "sglang").events
    assert stored.block_hashes == [0xD000000000000000] and stored.block_size == 4
    assert stored.token_ids == [1, 2, 3, 4]
    assert norm([removed, cleared]) == norm([BlockRemoved([123]), AllBlocksCleared()])


def test_sglang_trailing_metadata_map_carries_the_salt() -> None:
    event = ["BlockStored", [5], None, [1, 2, 3, 4], 4, None, "GPU", {"cache_salt": "tenant-a"}]
    (stored,) = decode_batch(msgpack.packb([0.0, [event], 0]), "sglang").events
    assert stored.cache_salt == "tenant-a" and stored.medium == "GPU"


def test_sglang_map_form_ignores_unknown_keys() -> None:
    event = {"type": "BlockStored", "block_hashes": [-1], "parent_block_hash": None, "token_ids": [1],
             "block_size": 1, "lora_id": None, "medium": "CPU_PINNED", "session_id": "abc", "new_field": 1}
    (stored,) = decode_batch(msgpack.packb([0.0, [event], 0]), "sglang").events
    assert stored.block_hashes == [2**64 - 1] and stored.medium == "CPU_PINNED"


def test_prepacked_bytes_events_are_unpacked() -> None:
    inner = msgpack.packb(["BlockRemoved", [9], "GPU"])
    assert norm(decode_batch(msgpack.packb([0.0, [inner], 0])).events) == norm([BlockRemoved([9], "GPU")])


@pytest.mark.parametrize(
    ("value", "expected"),
    [(5, 5), (-1, 2**64 - 1), (2**64 + 3, 3), (b"\x01" * 24 + bytes.fromhex("137bb037547f4caf"), H0), (b"\x07", 7)],
)
def test_hash_normalisation(value, expected) -> None:
    assert normalise_hash(value) == expected


def test_bad_events_are_skipped_and_the_rest_of_the_batch_survives() -> None:
    events = [
        ["BlockStored", [1], None, [1, 2.5], 16, None, "GPU"],  # float token
        ["BlockStored", "nope", None, [1], 16],  # hashes not a list
        ["BlockStored", [b""], None, [1], 16],  # empty bytes hash
        ["BlockStored", [1], None, [1], 16, None, 7],  # medium not a string
        ["BlockStored", [1], None, [True], 16],  # bool token
        ["BlockStored", [1], None, [1], 16, None, "GPU", None, None, -1],  # negative group
        ["Nope", 1],  # unknown tag
        42,  # not an event
        ["AllBlocksCleared"],
    ]
    batch = decode_batch(msgpack.packb([0.0, events, 0]))
    assert norm(batch.events) == norm([AllBlocksCleared()])
    assert sorted(batch.skipped) == sorted(
        ["bad_token_ids", "bad_hashes", "bad_hash", "bad_medium", "bad_token_ids", "bad_group_idx",
         "unknown_event_tag", "bad_event_shape"]
    )


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xc1garbage", "bad_msgpack"),
        (msgpack.packb({"ts": 1}), "bad_batch_shape"),
        (msgpack.packb([1.0]), "bad_batch_shape"),
        (msgpack.packb(["ts", []]), "bad_batch_shape"),
        (msgpack.packb([1.0, {}, 0]), "bad_batch_shape"),
        (msgpack.packb([1.0, [], -1]), "bad_batch_shape"),
    ],
)
def test_bad_batches_raise_wire_error_with_a_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(WireError) as info:
        decode_batch(payload)
    assert info.value.reason == reason


def _stored_map(tokens: object) -> dict:
    return {"type": "BlockStored", "block_hashes": [H0, H1], "parent_block_hash": None, "token_ids": tokens,
            "block_size": 16}  # fmt: skip


@pytest.mark.parametrize("era", ["map", "array"])
def test_fast_path_token_ids_are_le32_bytes_equal_to_the_ids(era: str) -> None:
    tokens = [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1] * 4
    event = _stored_map(tokens) if era == "map" else ["BlockStored", [H0, H1], None, tokens, 16]
    stored = decode_batch(msgspec.msgpack.encode([1.0, [event], None])).events[0]
    assert type(stored) is BlockStored and type(stored.token_ids) is Le32Tokens
    assert stored.token_ids.le32 == tokens_to_le32(tokens) and stored.token_ids == tokens
    assert len(stored.token_ids) == 32 and list(stored.token_ids) == tokens and stored.token_ids[-1] == 2**32 - 1
    assert stored.token_ids[8:16] == tokens[8:16] and stored.token_ids[::2] == tokens[::2]


def test_ids_in_other_int_encodings_or_beyond_uint32_decode_as_ints() -> None:
    # uint64 / signed heads for small ids (other encoders), and ids ingestion drops as bad_token_ids:
    # the typed path keeps them as ints, exactly as it decoded them before le32 conversion.
    for ids in ([5] * 31 + [2**40], [5] * 31 + [-1]):
        stored = decode_batch(msgspec.msgpack.encode([1.0, [_stored_map(ids)], None])).events[0]
        assert type(stored.token_ids) is list and stored.token_ids == ids
    packed = msgpack.packb([1.0, [_stored_map([7] * 32)], None])
    wide = packed.replace(b"\xa9token_ids\xdc\x00\x20" + b"\x07" * 32, b"\xa9token_ids\xdc\x00\x20" + b"\xcf" + bytes(7) + b"\x07" + b"\x07" * 31)
    assert wide != packed
    stored = decode_batch(wide).events[0]
    assert type(stored.token_ids) is list and stored.token_ids == [7] * 32


@pytest.mark.parametrize("tokens", [None, "abc", [1.5] * 32, [[1]] * 32, [True] * 32, {"a": 1}])
def test_token_ids_that_are_not_int_arrays_skip_only_that_event(tokens: object) -> None:
    good = {"type": "BlockRemoved", "block_hashes": [H0]}
    batch = decode_batch(msgspec.msgpack.encode([1.0, [_stored_map(tokens), good], None]))
    assert batch.skipped == ["bad_token_ids"] and batch.events == [BlockRemoved(block_hashes=[H0])]
