from __future__ import annotations

import pytest

from ppc_extproc.blockkeys import (
    MultimodalFeature,
    compute_block_extras,
    fold_cache_salt,
    parse_raw_extra_keys,
    realign_extras,
)


def test_multimodal_ids_go_to_every_block_their_placeholder_overlaps() -> None:
    features = [MultimodalFeature("img-b", 20, 8), MultimodalFeature("img-a", 2, 3)]
    # blocks of 8: [0,8) has img-a; [8,16) nothing; [16,24) and [24,32) have img-b (20..28)
    assert compute_block_extras(features, 8, 32) == [("img-a",), None, ("img-b",), ("img-b",)]


def test_items_sharing_a_block_keep_start_offset_order() -> None:
    features = [MultimodalFeature("late", 5, 1), MultimodalFeature("early", 1, 1), MultimodalFeature("tie", 5, 2)]
    assert compute_block_extras(features, 8, 8) == [("early", "late", "tie")]


def test_no_features_means_no_extras() -> None:
    assert compute_block_extras([], 16, 64) is None
    assert compute_block_extras([MultimodalFeature("x", 0, 4)], 16, 0) is None


def test_salt_is_appended_to_block_zero_after_multimodal_ids() -> None:
    extras = [("img",), None]
    assert fold_cache_salt(extras, "s3cr3t", 2) == [("img", "s3cr3t"), None]
    assert fold_cache_salt(None, "salt", 3) == [("salt",), None, None]
    assert fold_cache_salt(None, "", 3) is None
    assert fold_cache_salt(None, "salt", 0) is None


@pytest.mark.parametrize(
    ("raw", "lora", "expected"),
    [
        (None, None, None),
        ([None, None], None, [None, None]),
        ([["salt"]], None, [("salt",)]),
        ([[["img-1", 0], ["img-2", 8]]], None, [("img-1", "img-2")]),
        ([[7, "img"]], None, [("img",)]),  # int LoRA ids are skipped
        ([[b"\x01" * 32]], None, [None]),  # prompt-embeds digests are skipped
        ([[]], None, [None]),
        ([["my-lora", "img"], ["my-lora"]], "my-lora", [("img",), None]),  # LoRA strip (llm-d #2927)
        ([["img", "my-lora"]], "my-lora", [("img", "my-lora")]),  # only a *leading* lora name is LoRA
    ],
)
def test_parse_raw_extra_keys(raw, lora, expected) -> None:
    assert parse_raw_extra_keys(raw, lora) == expected


@pytest.mark.parametrize("raw", ["x", [5], [{"a": 1}]])
def test_parse_raw_extra_keys_rejects_wrong_shapes(raw) -> None:
    with pytest.raises(TypeError):
        parse_raw_extra_keys(raw, None)


def test_realign_engine_blocks_larger_than_canonical() -> None:
    # 2 engine blocks of 128 → 4 canonical blocks of 64
    assert realign_extras([("a",), ("b",)], 4) == [("a",), ("a",), ("b",), ("b",)]


def test_realign_engine_blocks_smaller_than_canonical_deduplicates() -> None:
    # 4 engine blocks of 16 → 1 canonical block of 64; "img" spans three engine blocks
    assert realign_extras([("salt", "img"), ("img",), None, ("img", "img2")], 1) == [("salt", "img", "img2")]


def test_realign_equal_and_empty() -> None:
    assert realign_extras([("a",), None], 2) == [("a",), None]
    assert realign_extras(None, 2) is None
    assert realign_extras([("a",)], 0) is None
