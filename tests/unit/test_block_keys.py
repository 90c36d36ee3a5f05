from __future__ import annotations

import struct

import cbor2
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from vectors import load_vectors, token_range

from ppc_extproc.blockkeys import TokenProcessor, TokenProcessorConfig
from ppc_extproc.blockkeys.hashing import CborFnvHasher, fnv1a64
from ppc_extproc.tokens.le32 import tokens_to_le32

VECTORS = load_vectors("llmd_hash_vectors.json")["hash_vectors"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_llmd_hash_vectors(vector: dict) -> None:
    processor = TokenProcessor(
        TokenProcessorConfig(vector["blockSize"], vector["hashSeed"], vector["algorithm"])
    )
    keys = processor.keys(
        token_range(vector["tokens"]),
        vector["model"],
        parent=int(vector["parent"]),
        extras=vector.get("extraPerBlock"),
    )
    assert [str(k) for k in keys] == vector["keys"]


def test_worked_cbor_bytes_root() -> None:
    # llm-d's root of ("", "test-model") = 0xf31309635ef2add0
    hasher = CborFnvHasher()
    assert hasher.root(hasher.init_hash(""), "test-model") == 0xF31309635EF2ADD0
    assert hasher.init_hash("") == 14695981039346656037


def test_xxh64_root_value() -> None:
    processor = TokenProcessor(TokenProcessorConfig(16, "", "xxh64"))
    assert processor.root("test-model") == 658786475292698776


def test_bytes_and_list_inputs_give_same_keys() -> None:
    processor = TokenProcessor(TokenProcessorConfig(16, "", "xxh64"))
    tokens = list(range(1000, 1100))
    assert processor.keys(tokens, "m") == processor.keys(tokens_to_le32(tokens), "m")
    assert processor.keys(memoryview(tokens_to_le32(tokens)), "m") == processor.keys(tokens, "m")


def test_partial_block_dropped_and_short_prompt_has_no_keys() -> None:
    processor = TokenProcessor(TokenProcessorConfig(16))
    assert len(processor.keys(list(range(47)), "m")) == 2
    assert processor.keys(list(range(15)), "m") == []


def test_parent_chaining_continues_the_chain() -> None:
    processor = TokenProcessor(TokenProcessorConfig(16))
    tokens = list(range(64))
    full = processor.keys(tokens, "m")
    tail = processor.keys(tokens[32:], "m", parent=full[1])
    assert tail == full[2:]


def test_lora_name_replaces_model_in_root() -> None:
    processor = TokenProcessor(TokenProcessorConfig(16))
    assert processor.keys(list(range(16)), "base") != processor.keys(list(range(16)), "adapter")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"block_size_tokens": 0}, "blockSizeTokens must be greater than 0, got 0"),
        ({"hash_algorithm": "sha1"}, "hashAlgorithm must be one of"),
    ],
)
def test_config_errors(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TokenProcessorConfig(**config)


def _reference_cbor_fnv(parent: int, blocks: list[list[int]], extras: list) -> list[int]:
    keys = []
    for block, extra in zip(blocks, extras):
        encoded_extra = None if extra is None else [{"Hash": s} for s in extra]
        parent = fnv1a64(cbor2.dumps([parent, block, encoded_extra], canonical=True))
        keys.append(parent)
    return keys


def _reference_xxh64(parent: int, blocks: list[list[int]], extras: list) -> list[int]:
    keys = []
    for block, extra in zip(blocks, extras):
        data = struct.pack("<Q", parent) + struct.pack(f"<{len(block)}I", *block)
        for s in extra or ():
            raw = s.encode()
            data += struct.pack("<Q", len(raw)) + raw
        parent = xxhash.xxh64_intdigest(data)
        keys.append(parent)
    return keys


token_ids = st.integers(min_value=0, max_value=2**32 - 1)
ident = st.text(min_size=0, max_size=12)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 16]),
    st.lists(token_ids, min_size=0, max_size=70),
    st.integers(min_value=1, max_value=2**64 - 1),
    st.data(),
)
def test_chains_match_reference_encoders(block_size: int, tokens: list[int], parent: int, data) -> None:
    n_blocks = len(tokens) // block_size
    extras = data.draw(st.lists(st.one_of(st.none(), st.lists(ident, max_size=3)), min_size=n_blocks, max_size=n_blocks))
    blocks = [tokens[i * block_size : (i + 1) * block_size] for i in range(n_blocks)]
    for algorithm, reference in (("cbor-fnv", _reference_cbor_fnv), ("xxh64", _reference_xxh64)):
        processor = TokenProcessor(TokenProcessorConfig(block_size, "", algorithm))
        assert processor.keys(tokens, "m", parent=parent, extras=extras) == reference(parent, blocks, extras)


@pytest.mark.parametrize("algorithm", ["xxh64", "cbor-fnv"])
def test_recent_prompts_lend_their_key_objects_to_a_shared_prefix(algorithm: str) -> None:
    processor = TokenProcessor(TokenProcessorConfig(4, "", algorithm))
    first = processor.keys(list(range(40)), "m", recent=True)
    extended = processor.keys([*range(32), 99, 98, 97, 96, 95], "m", recent=True)
    assert extended == processor.keys([*range(32), 99, 98, 97, 96, 95], "m")  # same values either way
    assert all(a is b for a, b in zip(extended[:8], first[:8]))
    assert extended[8] is not first[8]
    other_model = processor.keys(list(range(40)), "other", recent=True)
    assert other_model[0] != first[0]
    # The latest prompt of that first block is the one lent next.
    again = processor.keys(list(range(36)), "m", recent=True)
    assert all(a is b for a, b in zip(again[:8], extended[:8]))


def test_recent_key_lists_are_bounded() -> None:
    from ppc_extproc.blockkeys import processor as module

    processor = TokenProcessor(TokenProcessorConfig(1, "", "xxh64"))
    for first in range(module._RECENT_LISTS + 50):
        processor.keys([first, 1, 2, 3], "m", recent=True)
    assert len(processor._recent) == module._RECENT_LISTS
    big = module._RECENT_KEYS // 2 + 1
    processor.keys([10**6, *range(big)], "m", recent=True)
    processor.keys([10**6 + 1, *range(big)], "m", recent=True)
    # Two lists over half the key budget: everything older than the newest is dropped.
    assert len(processor._recent) == 1 and processor._recent_keys == big + 1


@settings(max_examples=200, deadline=None)
@given(
    algorithm=st.sampled_from(["xxh64", "cbor-fnv"]),
    block_size=st.sampled_from([1, 4, 16]),
    prompts=st.lists(
        st.tuples(st.integers(0, 80), st.lists(st.integers(0, 2**32 - 1), max_size=40)), min_size=1, max_size=6
    ),
    as_bytes=st.booleans(),
)
def test_recent_prompts_give_the_keys_of_a_fresh_hash(
    algorithm: str, block_size: int, prompts: list[tuple[int, list[int]]], as_bytes: bool
) -> None:
    """Each prompt keeps a prefix of the one before and adds its own tail (a conversation's turns,
    a retry, an edit): the keys with ``recent`` equal those hashed from scratch."""
    recent = TokenProcessor(TokenProcessorConfig(block_size, "", algorithm))
    fresh = TokenProcessor(TokenProcessorConfig(block_size, "", algorithm))
    tokens: list[int] = list(range(64))
    for keep, tail in prompts:
        tokens = tokens[:keep] + tail
        given_tokens = tokens_to_le32(tokens) if as_bytes else tokens
        assert recent.keys(given_tokens, "m", recent=True) == fresh.keys(tokens, "m")


def test_blocks_shared_with_the_recent_prompt_are_not_hashed_again() -> None:
    processor = TokenProcessor(TokenProcessorConfig(16, "", "xxh64"))
    hashed: list[int] = []
    chain = processor._hasher.chain

    def counting_chain(parent, tokens, block_size, n_blocks, extras, reuse=None):  # type: ignore[no-untyped-def]
        hashed.append(n_blocks)
        return chain(parent, tokens, block_size, n_blocks, extras, reuse)

    processor._hasher.chain = counting_chain  # type: ignore[method-assign]
    prompt = list(range(1600))  # 100 blocks
    processor.keys(prompt, "m", recent=True)
    processor.keys([*prompt, *range(5000, 5032)], "m", recent=True)  # the next turn: 2 blocks more
    processor.keys([*prompt[:800], 1, *prompt[801:]], "m", recent=True)  # an edit in block 50
    assert hashed == [100, 2, 50]


def test_a_prompt_sent_again_gets_the_list_it_got_before() -> None:
    processor = TokenProcessor(TokenProcessorConfig(16, "", "xxh64"))
    tokens = tokens_to_le32(list(range(1600)))
    first = processor.keys(tokens, "m", recent=True)
    again = processor.keys(tokens, "m", recent=True)  # the very bytes: the recent token arrays' reuse
    copy = processor.keys(bytes(bytearray(tokens)), "m", recent=True)  # equal bytes, another buffer
    assert again is first and copy is first
    assert first == processor.keys(tokens, "m")
    longer = processor.keys(tokens + tokens_to_le32(list(range(16))), "m", recent=True)
    assert longer is not first and longer[:100] == first and len(longer) == 101 and len(first) == 100
