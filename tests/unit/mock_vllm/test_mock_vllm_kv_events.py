"""Byte-exact KV-event encodings against payloads captured from vLLM (fixtures/vectors/vllm_wire_vectors.json)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from vectors import load_vectors

from ppc_extproc_lab.mock_vllm.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventEncoder,
    KVEventBatch,
)

H0 = 0x137BB037547F4CAF
H1 = 0x16D077AD0843C577
TS = 1700000000.5
VECTORS = load_vectors("vllm_wire_vectors.json")["vllm_wire_vectors"]

# A full payload captured from vLLM 0.26.0's publisher (0.24 and 0.25 are byte-identical).
MAP_STORED_2_BLOCKS = bytes.fromhex(
    "93cb41d954fc40200000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
    "92cf137bb037547f4cafcf16d077ad0843c577b1706172656e745f626c6f636b5f68617368c0a9746f6b"
    "656e5f696473dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20aa"
    "626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0"
    "aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b69"
    "6e64ae66756c6c5f617474656e74696f6e00"
)


def stored_2_blocks(**overrides: Any) -> BlockStored:
    """The captured event: blocks h0, h1 of tokens 1..32, no parent, HMA group 0."""
    fields: dict[str, Any] = {
        "block_hashes": [H0, H1],
        "parent_block_hash": None,
        "token_ids": list(range(1, 33)),
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None, None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    fields.update(overrides)
    return BlockStored(**fields)


def encode_one(encoding: str, event: Any, ts: float = TS) -> bytes:
    return EventEncoder(encoding).encode(KVEventBatch(ts, [event], 0))  # type: ignore[arg-type]


def event_bytes(encoding: str, event: Any) -> bytes:
    """Only the event's bytes: strip the batch prefix ``93 cb<8> 91`` and the rank ``00``."""
    payload = encode_one(encoding, event)
    assert payload[:1] == b"\x93" and payload[10:11] == b"\x91" and payload[-1:] == b"\x00"
    return payload[11:-1]


@pytest.mark.parametrize(
    ("encoding", "hex_"),
    [
        ("map", "93cb41d954fc400000009181a474797065b0416c6c426c6f636b73436c656172656400"),
        ("map16", "93cb41d954fc400000009181a474797065b0416c6c426c6f636b73436c656172656400"),
        ("array", "93cb41d954fc400000009191b0416c6c426c6f636b73436c656172656400"),
    ],
)
def test_smallest_batch_matches_9_2(encoding: str, hex_: str) -> None:
    assert encode_one(encoding, AllBlocksCleared(), ts=1700000000.0).hex() == hex_


def test_map_block_stored_matches_9_3_full_payload() -> None:
    assert encode_one("map", stored_2_blocks()) == MAP_STORED_2_BLOCKS


def test_map_block_stored_decodes_to_9_3_form_with_11_entries() -> None:
    decoded = msgpack.unpackb(encode_one("map", stored_2_blocks()), raw=False)
    event = decoded[1][0]
    assert list(event) == [
        "type",
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
    ]
    assert event["block_hashes"] == [H0, H1] and event["extra_keys"] == [None, None]


def test_map16_differs_from_map_only_in_the_map16_header() -> None:
    map_payload = encode_one("map", stored_2_blocks())
    map16_payload = encode_one("map16", stored_2_blocks())
    # 93 cb<8> 91 | 8b … (fixmap 11) vs de 00 0b … (map16, count 11)
    assert map_payload[11:12] == b"\x8b"
    assert map16_payload[11:14] == b"\xde\x00\x0b"
    assert map16_payload[:11] + b"\x8b" + map16_payload[14:] == map_payload


def test_map_omits_defaults_but_keeps_required_nils() -> None:
    # "Custom emitter leaving extra_keys, group_idx and the spec fields None: 8 entries, header 88".
    event = stored_2_blocks(extra_keys=None, group_idx=None, kv_cache_spec_kind=None)
    body = event_bytes("map", event)
    assert body[:1] == b"\x88"
    assert msgpack.unpackb(body, raw=False)["lora_name"] is None


def test_map_drops_fields_newer_than_0_28_but_map16_keeps_them() -> None:
    event = stored_2_blocks(session_id="s1", locality="LOCAL")
    map_event = msgpack.unpackb(event_bytes("map", event), raw=False)
    map16_event = msgpack.unpackb(event_bytes("map16", event), raw=False)
    assert map_event["locality"] == "LOCAL" and "session_id" not in map_event
    assert map16_event["session_id"] == "s1"


def test_array_0_22_block_stored_matches_9_5_rules() -> None:
    # 9c ab"BlockStored" 92 <h0><h1> c0 dc0020… 10 c0 a3"GPU" c0 92c0c0 00 ae"full_attention" c0
    expected = (
        bytes.fromhex("9cab426c6f636b53746f72656492cf137bb037547f4cafcf16d077ad0843c577c0dc0020")
        + bytes(range(1, 33))
        + bytes.fromhex("10c0a3475055c092c0c000ae66756c6c5f617474656e74696f6ec0")
    )
    assert event_bytes("array", stored_2_blocks()) == expected


def test_array_ignores_omit_defaults_and_drops_map_only_fields() -> None:
    decoded = msgpack.unpackb(event_bytes("array", stored_2_blocks(locality="LOCAL")), raw=False)
    assert len(decoded) == 12 and decoded[0] == "BlockStored" and decoded[-1] is None


@pytest.mark.parametrize(
    ("encoding", "hex_"),
    [
        (
            "map",
            (
                "84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf137bb037547f4caf"
                "a66d656469756da3475055a967726f75705f69647800"
            ),
        ),
        ("array", "94ac426c6f636b52656d6f76656491cf137bb037547f4cafa347505500"),
    ],
)
def test_block_removed_matches_9_6(encoding: str, hex_: str) -> None:
    event = BlockRemoved(block_hashes=[H0], medium="GPU", group_idx=0)
    assert event_bytes(encoding, event).hex() == hex_


@pytest.mark.parametrize(
    ("encoding", "hex_"),
    [
        ("map", "81a474797065b0416c6c426c6f636b73436c6561726564"),
        ("map16", "81a474797065b0416c6c426c6f636b73436c6561726564"),
        ("array", "91b0416c6c426c6f636b73436c6561726564"),
    ],
)
def test_all_blocks_cleared_matches_9_7(encoding: str, hex_: str) -> None:
    assert event_bytes(encoding, AllBlocksCleared()).hex() == hex_


def test_salted_extra_keys_fragment_matches_9_4() -> None:
    event = stored_2_blocks(
        block_hashes=[0x21D3C263A7FC0A47], token_ids=list(range(1, 17)), extra_keys=[("s3cr3t",)]
    )
    body = event_bytes("map", event)
    assert bytes.fromhex("aa65787472615f6b6579739191a6733363723374") in body
    assert bytes.fromhex("cf21d3c263a7fc0a47") in body


def test_replay_capture_payload_from_9_9() -> None:
    assert (
        encode_one("map16", AllBlocksCleared(), ts=1700000002.0).hex()
        == "93cb41d954fc408000009181a474797065b0416c6c426c6f636b73436c656172656400"
    )


def _vector_events(encoding: str) -> list[Any]:
    h = 15760518052499183552
    return [
        stored_2_blocks(block_hashes=[h], token_ids=list(range(1, 17)), extra_keys=[None]),
        BlockRemoved(block_hashes=[h], medium="GPU", group_idx=0),
        AllBlocksCleared(),
    ]


@pytest.mark.parametrize(
    ("encoding", "key"),
    [("array", "array_like_events(vLLM<=~0.23)"), ("map", "map_events(vLLM>=#42892)")],
)
def test_wire_vector_file_payloads(encoding: str, key: str) -> None:
    vector = VECTORS[key]
    payload = EventEncoder(encoding).encode(  # type: ignore[arg-type]
        KVEventBatch(1789095808.5, _vector_events(encoding), 0)
    )
    assert payload.hex() == vector["payload_hex"]
    assert msgpack.unpackb(payload, raw=False) == vector["decoded"]


@pytest.mark.parametrize(
    ("encoding", "key"),
    [("array", "array_like_events(vLLM<=~0.23)"), ("map", "map_events(vLLM>=#42892)")],
)
def test_wire_vector_batch_with_nil_rank(encoding: str, key: str) -> None:
    payload = EventEncoder(encoding).encode(  # type: ignore[arg-type]
        KVEventBatch(1.0, [AllBlocksCleared()], None)
    )
    assert payload.hex() == VECTORS[key]["batch_without_dp_rank_hex"]


def test_integer_ts_is_encoded_as_float64() -> None:
    assert encode_one("map", AllBlocksCleared(), ts=1700000000)[1:2] == b"\xcb"


def test_unknown_encoding_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown event encoding"):
        EventEncoder("cbor")  # type: ignore[arg-type]
