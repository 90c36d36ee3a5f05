"""vLLM sha256 block hashing against hashes vLLM computed (vllm/v1/core/kv_cache_utils.py)."""

from __future__ import annotations

import pytest

from ppc_extproc_lab.mock_vllm.hashing import (
    BlockHasher,
    block_extra_keys,
    event_extra_keys,
    wire_hash,
)


def wire(digests: list[bytes]) -> list[int]:
    return [wire_hash(d) for d in digests]


@pytest.mark.parametrize(
    ("seed", "block0", "block1"),
    [
        ("vllm-none-hash", 0x137BB037547F4CAF, 0x16D077AD0843C577),  # vLLM 0.29+ default
        ("42", 0x3E914F537A14A904, 0xB4C7B53BCE78F5B1),  # PYTHONHASHSEED=42
    ],
)
def test_table_tokens_1_to_32(seed: str, block0: int, block1: int) -> None:
    hasher = BlockHasher(16, seed)
    assert wire(hasher.hash_blocks(list(range(1, 33)))) == [block0, block1]


def test_default_seed_is_vllm_none_hash() -> None:
    assert BlockHasher(16).none_hash == BlockHasher(16, "vllm-none-hash").none_hash


def test_second_request_shares_block_0_and_chains_block_1_prime() -> None:
    hasher = BlockHasher(16)
    first = hasher.hash_blocks(list(range(1, 33)))
    second = hasher.hash_blocks(list(range(1, 17)) + list(range(101, 117)))
    assert second[0] == first[0]
    assert wire_hash(second[1]) == 0xD2D19D6B02AABFEF


def test_salted_block_0_matches_spec_and_differs_from_unsalted() -> None:
    hasher = BlockHasher(16)
    salted = hasher.hash_blocks(list(range(1, 33)), cache_salt="s3cr3t")
    plain = hasher.hash_blocks(list(range(1, 33)))
    assert wire_hash(salted[0]) == 0x21D3C263A7FC0A47
    # The salt changes block 0 and, through the chain, every later block.
    assert salted[1] != plain[1]


def test_partial_block_is_not_hashed() -> None:
    assert len(BlockHasher(16).hash_blocks(list(range(47)))) == 2


def test_hash_blocks_resumes_from_a_parent() -> None:
    hasher = BlockHasher(4)
    tokens = list(range(12))
    full = hasher.hash_blocks(tokens)
    assert hasher.hash_blocks(tokens, start_block=1, parent=full[0]) == full[1:]


def test_extra_keys_only_on_block_0_tagged_in_hash_untagged_in_event() -> None:
    assert block_extra_keys(0, "s3cr3t") == (("cache_salt", "s3cr3t"),)
    assert event_extra_keys(0, "s3cr3t") == ("s3cr3t",)
    assert block_extra_keys(1, "s3cr3t") is None and event_extra_keys(1, "s3cr3t") is None
    assert block_extra_keys(0, None) is None


def test_wire_hash_is_last_8_bytes_big_endian() -> None:
    assert wire_hash(bytes(24) + bytes.fromhex("0102030405060708")) == 0x0102030405060708
