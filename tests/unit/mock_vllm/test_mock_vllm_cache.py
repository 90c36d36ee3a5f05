"""Prefix-cache semantics: hits, pinning, LRU eviction, events, reset and drop."""

from __future__ import annotations

import pytest

from ppc_extproc_lab.mock_vllm.cache import Allocation, CapacityError, PrefixCache
from ppc_extproc_lab.mock_vllm.hashing import BlockHasher, wire_hash
from ppc_extproc_lab.mock_vllm.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

BS = 4


def hashes(tokens: list[int], salt: str | None = None) -> list[int]:
    return [wire_hash(d) for d in BlockHasher(BS).hash_blocks(tokens, salt)]


def run_prefill(
    cache: PrefixCache, tokens: list[int], max_tokens: int = 1, salt: str | None = None
) -> Allocation:
    """Admit ``tokens`` and complete its prefill (the engine's sequence of calls)."""
    alloc = cache.try_admit(
        cache.hasher.hash_blocks(tokens, salt), len(tokens), len(tokens) + max_tokens - 1, salt
    )
    assert alloc is not None
    cache.advance(alloc, tokens, len(tokens))
    return alloc


def finish(cache: PrefixCache, tokens: list[int], max_tokens: int = 1) -> None:
    cache.free(run_prefill(cache, tokens, max_tokens))


A = list(range(100, 108))
B = list(range(200, 208))
C = list(range(300, 308))


def test_prompt_full_blocks_are_stored_in_one_event() -> None:
    cache = PrefixCache(8, BS)
    alloc = run_prefill(cache, list(range(10)))
    (event,) = cache.take_events()
    assert isinstance(event, BlockStored)
    assert event.block_hashes == hashes(list(range(10)))
    assert event.parent_block_hash is None
    assert event.token_ids == list(range(8))
    assert event.block_size == BS and event.medium == "GPU" and event.group_idx == 0
    assert event.extra_keys == [None, None]
    assert event.kv_cache_spec_kind == "full_attention"
    assert len(alloc.blocks) == 3 and cache.stats().used == 3


def test_hit_is_capped_at_len_minus_one_and_last_block_restored_with_same_hash() -> None:
    cache = PrefixCache(8, BS)
    finish(cache, A)
    cache.take_events()
    again = run_prefill(cache, A)
    assert again.num_hit == 1 and again.cached_tokens == 4  # (8 - 1) // 4 blocks
    (event,) = cache.take_events()
    assert isinstance(event, BlockStored)
    h = hashes(A)
    assert event.block_hashes == [h[1]] and event.parent_block_hash == h[0]
    assert event.token_ids == A[4:]
    cache.free(again)
    longer = run_prefill(cache, [*A, 1])
    assert longer.cached_tokens == 8


def test_parent_is_last_hit_block() -> None:
    cache = PrefixCache(8, BS)
    finish(cache, A)
    cache.take_events()
    run_prefill(cache, A[:4] + B[:4])
    (event,) = cache.take_events()
    assert isinstance(event, BlockStored)
    assert event.parent_block_hash == hashes(A)[0]
    assert event.block_hashes == [hashes(A[:4] + B[:4])[1]]


def test_lru_eviction_order_tail_blocks_first_and_removals_precede_store() -> None:
    cache = PrefixCache(4, BS)
    finish(cache, A)
    finish(cache, B)
    cache.take_events()
    ha, hb = hashes(A), hashes(B)
    assert cache.lru_order() == [ha[1], ha[0], hb[1], hb[0]]
    run_prefill(cache, C)
    events = cache.take_events()
    assert events == [
        BlockRemoved(block_hashes=[ha[1]], medium="GPU", group_idx=0),
        BlockRemoved(block_hashes=[ha[0]], medium="GPU", group_idx=0),
        BlockStored(
            block_hashes=hashes(C),
            parent_block_hash=None,
            token_ids=C,
            block_size=BS,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            extra_keys=[None, None],
            group_idx=0,
            kv_cache_spec_kind="full_attention",
        ),
    ]
    assert cache.lru_order() == [hb[1], hb[0]]
    assert cache.stats().evictions == 2


def test_free_uncached_blocks_are_used_before_evicting() -> None:
    cache = PrefixCache(6, BS)
    finish(cache, A)
    cache.take_events()
    run_prefill(cache, B)
    assert not any(isinstance(e, BlockRemoved) for e in cache.take_events())
    assert cache.stats().free_cached == 2


def test_a_hit_refreshes_recency() -> None:
    cache = PrefixCache(4, BS)
    finish(cache, A)
    finish(cache, B)
    finish(cache, A[:4] + [1, 2, 3, 4, 5])  # hits A0: needs 2 more blocks, evicts A1 and B1
    cache.take_events()
    ha = hashes(A)
    order = cache.lru_order()
    assert ha[0] in order and ha[1] not in order
    assert order[-1] == ha[0]  # freed last (head block of the newest request) ⇒ evicted last


def test_pinned_blocks_are_not_evicted() -> None:
    cache = PrefixCache(4, BS)
    running = run_prefill(cache, A, max_tokens=5)  # 12 KV tokens: 3 blocks reserved/held
    cache.take_events()
    assert cache.try_admit(cache.hasher.hash_blocks(B), 8, 8) is None
    assert cache.take_events() == []
    cache.free(running)
    assert cache.try_admit(cache.hasher.hash_blocks(B), 8, 8) is not None


def test_reservation_counts_future_decode_blocks() -> None:
    cache = PrefixCache(4, BS)
    run_prefill(cache, A, max_tokens=9)  # 16 KV tokens ⇒ all 4 blocks reserved, 2 taken
    assert cache.stats().used == 2 and cache.stats().reserved == 2
    assert cache.try_admit(cache.hasher.hash_blocks([1, 2]), 2, 2) is None


def test_decode_blocks_are_stored_with_the_previous_block_as_parent() -> None:
    cache = PrefixCache(8, BS)
    tokens = list(range(6)) + [50, 51, 52, 53, 54, 55]  # 6 prompt + 6 "generated"
    alloc = cache.try_admit(cache.hasher.hash_blocks(tokens[:6]), 6, 12)
    assert alloc is not None
    cache.advance(alloc, tokens, 6)
    cache.advance(alloc, tokens, 8)
    cache.advance(alloc, tokens, 9)
    assert len(alloc.blocks) == 3
    cache.advance(alloc, tokens, 12)
    events = cache.take_events()
    h = hashes(tokens)
    assert [
        (e.block_hashes, e.parent_block_hash) for e in events if isinstance(e, BlockStored)
    ] == [
        ([h[0]], None),
        ([h[1]], h[0]),
        ([h[2]], h[1]),
    ]
    assert isinstance(events[1], BlockStored) and events[1].token_ids == tokens[4:8]


def test_identical_hash_can_be_cached_twice_and_removed_once() -> None:
    cache = PrefixCache(3, BS)
    finish(cache, A)  # blocks a0, a1
    finish(cache, A)  # hit a0, recompute a1 ⇒ second copy of a1 in the 3rd block
    cache.take_events()
    ha = hashes(A)
    assert cache.stats().cached == 3
    finish(cache, B)  # needs 2 blocks ⇒ evicts two of the cached ones
    removed = [e.block_hashes[0] for e in cache.take_events() if isinstance(e, BlockRemoved)]
    assert len(removed) == 2
    assert removed.count(ha[1]) >= 1


def test_salted_events_carry_the_salt_on_block_0_only() -> None:
    cache = PrefixCache(8, BS)
    run_prefill(cache, A, salt="s3cr3t")
    (event,) = cache.take_events()
    assert isinstance(event, BlockStored)
    assert event.extra_keys == [("s3cr3t",), None]
    assert event.block_hashes == hashes(A, "s3cr3t") != hashes(A)
    assert cache.match([*A, 1], "s3cr3t") == (8, 8)
    assert cache.match([*A, 1]) == (0, 0)


def test_match_is_side_effect_free_and_reports_capped_and_uncapped() -> None:
    cache = PrefixCache(4, BS)
    finish(cache, A)
    finish(cache, B)
    cache.take_events()
    order = cache.lru_order()
    assert cache.match(A) == (4, 8)
    assert cache.match(B + [9]) == (8, 8)
    assert cache.lru_order() == order and cache.take_events() == []


def test_capacity_error_when_request_can_never_fit() -> None:
    cache = PrefixCache(2, BS)
    with pytest.raises(CapacityError):
        cache.try_admit([], 9, 9)


def test_reset_refused_while_blocks_in_use_then_clears_all() -> None:
    cache = PrefixCache(4, BS)
    alloc = run_prefill(cache, A)
    cache.take_events()
    assert cache.reset() is False
    assert cache.take_events() == []
    cache.free(alloc)
    assert cache.reset() is True
    assert cache.take_events() == [AllBlocksCleared()]
    assert cache.match(A) == (0, 0)
    assert cache.stats().cached == 0 and cache.stats().free_uncached == 4


def test_drop_forgets_everything_silently() -> None:
    cache = PrefixCache(4, BS)
    finish(cache, A)
    cache.drop()
    assert cache.take_events() == []
    assert cache.match(A) == (0, 0)
    assert cache.stats().used == 0 and cache.stats().cached == 0


def test_extend_hit_picks_up_blocks_cached_after_admission() -> None:
    cache = PrefixCache(8, BS)
    digests = cache.hasher.hash_blocks(A)
    a = cache.try_admit(digests, 8, 8)
    b = cache.try_admit(digests, 9, 9)  # admitted before A stored anything: no hit yet
    assert a is not None and b is not None and b.num_hit == 0 and b.reserved == 3
    cache.advance(a, A, 8)
    assert cache.extend_hit(b, 9) == 2
    assert b.cached_tokens == 8 and b.reserved == 1
    cache.take_events()
    cache.advance(b, [*A, 1], 9)  # only the partial block is new: no event
    assert cache.take_events() == []
    assert cache.stats().reserved == 0 and cache.stats().used == 3


def test_a_hybrid_cache_publishes_sliding_window_and_mamba_groups_beside_full_attention() -> None:
    cache = PrefixCache(2, BS, hybrid=True)
    finish(cache, A)
    stored = cache.take_events()
    assert [(e.group_idx, e.kv_cache_spec_kind) for e in stored] == [
        (0, "full_attention"), (1, "sliding_window"), (2, "mamba"),
    ]
    assert all(isinstance(e, BlockStored) and e.token_ids == A and e.block_size == BS for e in stored)
    assert len({tuple(e.block_hashes) for e in stored if isinstance(e, BlockStored)}) == 3
    assert stored[1].kv_cache_spec_sliding_window == 4 * BS and stored[2].kv_cache_spec_sliding_window is None
    finish(cache, B)  # evicts A's two blocks: each group removes its own hashes
    removed = [e for e in cache.take_events() if isinstance(e, BlockRemoved)]
    assert sorted((e.group_idx, e.block_hashes[0]) for e in removed) == sorted(
        (g, h ^ g) for g in (0, 1, 2) for h in hashes(A)
    )
    assert cache.match(A)[0] == 0 and cache.match(B + [1])[0] == 8
