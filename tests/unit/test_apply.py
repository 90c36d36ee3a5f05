"""Event application semantics (llm-d's pool tests, plus the bugs we fix)."""

from __future__ import annotations

import msgpack

from ppc_extproc.blockkeys import TokenProcessor, TokenProcessorConfig
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.decode import decode_batch
from ppc_extproc.events.wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from ppc_extproc.index import InMemoryIndex

POD = "10.0.0.1:8000"
OTHER = "10.0.0.2:8000"
MODEL = "m"


def make(block_size: int = 16, size: int = 10_000) -> EventApplier:
    return EventApplier(InMemoryIndex(size=size), TokenProcessor(TokenProcessorConfig(block_size)))


def stored(hashes, tokens, parent=None, **kw) -> BlockStored:
    return BlockStored(list(hashes), parent, list(tokens), kw.pop("block_size", 16), **kw)


def apply(applier: EventApplier, *events, pod: str = POD, rank: int = 0) -> None:
    applier.apply_batch(pod, MODEL, EventBatch(0.0, list(events), rank))


def held(applier: EventApplier, tokens, model: str = MODEL, extras=None) -> dict[int, list[str]]:
    """Which endpoints/tiers hold each block of ``tokens``, by block index."""
    keys = applier.processor.keys(tokens, model, extras=extras)
    found = applier.index.lookup(keys)
    return {i: sorted(str(e) for e in found[k]) for i, k in enumerate(keys) if k in found}


def test_stored_blocks_become_visible_under_request_keys() -> None:
    applier = make()
    apply(applier, stored([11, 12], range(32)))
    assert held(applier, range(32)) == {0: [f"{POD}@gpu"], 1: [f"{POD}@gpu"]}
    assert applier.stats.events[(POD, "BlockStored")] == 1
    assert applier.stats.transport[(POD, "blocks_stored")] == 2


def test_parent_chaining_through_engine_keys() -> None:
    applier = make()
    apply(applier, stored([11], range(16)))
    apply(applier, stored([12], range(16, 32), parent=11))
    assert held(applier, range(32)) == {0: [f"{POD}@gpu"], 1: [f"{POD}@gpu"]}


def test_unknown_parent_drops_the_event_and_counts_it() -> None:
    applier = make()
    apply(applier, stored([12], range(16, 32), parent=999))
    assert len(applier.index) == 0
    assert applier.stats.dropped[(POD, "unknown_parent")] == 1


def test_parent_of_another_endpoint_is_not_used() -> None:
    applier = make()
    apply(applier, stored([11], range(16)), pod=OTHER)
    apply(applier, stored([12], range(16, 32), parent=11))
    assert applier.stats.dropped[(POD, "unknown_parent")] == 1


def test_one_to_many_write_path() -> None:
    """Engine blocks of 64, canonical 16: one engine key covers four request keys."""
    applier = make(block_size=16)
    apply(applier, stored([1, 2], range(128), block_size=64))
    assert len(held(applier, range(128))) == 8
    apply(applier, stored([3], range(128, 192), parent=2, block_size=64))
    assert len(held(applier, range(192))) == 12
    apply(applier, BlockRemoved([2]))
    assert sorted(held(applier, range(192))) == [0, 1, 2, 3, 8, 9, 10, 11]


def test_many_to_one_eviction_is_eager() -> None:
    """Engine blocks of 16, canonical 64: removing any engine block of R0 removes R0."""
    applier = make(block_size=64)
    apply(applier, stored([1, 2, 3, 4], range(64)))
    assert held(applier, range(64)) == {0: [f"{POD}@gpu"]}
    apply(applier, BlockRemoved([3]))
    assert held(applier, range(64)) == {}


def test_misaligned_span_maps_only_engine_blocks_inside_full_canonical_blocks() -> None:
    applier = make(block_size=64)
    apply(applier, stored([1, 2, 3, 4, 5], range(80)))  # 80 tokens: E4 covers tokens 64..79
    assert applier.index.get_request_key(4, _scope()) is not None
    assert applier.index.get_request_key(5, _scope()) is None  # llm-d would map E4 → R0 wrongly
    apply(applier, BlockRemoved([5]))
    assert held(applier, range(64)) == {0: [f"{POD}@gpu"]}


def _scope():
    from ppc_extproc.index import EngineScope

    return EngineScope(POD)


def test_sub_canonical_event_is_dropped() -> None:
    applier = make(block_size=64)
    apply(applier, stored([1], range(16)))
    assert len(applier.index) == 0
    assert applier.stats.dropped[(POD, "shorter_than_block")] == 1


def test_token_less_store_adds_a_tier_to_mapped_blocks() -> None:
    applier = make()
    apply(applier, stored([1, 2], range(32)))
    apply(applier, BlockStored([1, 2, 99], None, [], 0, medium="CPU"))
    assert held(applier, range(32)) == {0: [f"{POD}@cpu", f"{POD}@gpu"], 1: [f"{POD}@cpu", f"{POD}@gpu"]}
    apply(applier, BlockRemoved([1], medium="GPU"))
    assert held(applier, range(32))[0] == [f"{POD}@cpu"]


def test_duplicate_store_needs_two_removes() -> None:
    applier = make()
    apply(applier, stored([1], range(16)))
    apply(applier, stored([1], range(16)))  # vLLM recomputes and re-stores the last block
    apply(applier, BlockRemoved([1]))
    assert held(applier, range(16)) == {0: [f"{POD}@gpu"]}
    apply(applier, BlockRemoved([1]))
    assert held(applier, range(16)) == {}
    assert applier.stats.transport[(POD, "removes_suppressed")] == 1


def test_untracked_remove_is_harmless() -> None:
    applier = make()
    apply(applier, stored([1], range(16)))
    apply(applier, BlockRemoved([77]))
    assert held(applier, range(16)) == {0: [f"{POD}@gpu"]}
    assert applier.stats.transport[(POD, "removes_unmapped")] == 1


def test_all_blocks_cleared_clears_the_endpoint_and_its_dedup_counts() -> None:
    applier = make()
    apply(applier, stored([1], range(16)))
    apply(applier, stored([1], range(16)))
    apply(applier, stored([5], range(16)), pod=OTHER)
    apply(applier, AllBlocksCleared())
    assert held(applier, range(16)) == {0: [f"{OTHER}@gpu"]}
    apply(applier, stored([1], range(16)))
    apply(applier, BlockRemoved([1]))  # one remove suffices after the clear
    assert held(applier, range(16)) == {0: [f"{OTHER}@gpu"]}


def test_hma_sliding_window_groups_are_skipped_and_kinds_are_learned() -> None:
    applier = make()
    apply(applier, stored([1], range(16), group_idx=1, kv_cache_spec_kind="sliding_window"))
    assert len(applier.index) == 0
    apply(applier, stored([2], range(16), group_idx=0, kv_cache_spec_kind="full_attention"))
    apply(applier, stored([3], range(16, 32), parent=2, group_idx=0))  # kind from the catalog
    assert held(applier, range(32)) == {0: [f"{POD}@gpu[group=0]"], 1: [f"{POD}@gpu[group=0]"]}
    apply(applier, BlockRemoved([1], group_idx=1))
    assert applier.stats.dropped[(POD, "non_indexable_group")] == 2


def test_hma_non_dense_events_are_skipped() -> None:
    applier = make()
    apply(applier, stored([1], range(32), group_idx=0, kv_cache_spec_kind="full_attention"))
    assert len(applier.index) == 0
    assert applier.stats.dropped[(POD, "sparse_group_event")] == 1


def test_lora_name_roots_the_keys_and_is_stripped_from_extra_keys() -> None:
    applier = make()
    apply(applier, stored([1, 2], range(32), lora_name="sql-lora", extra_keys=[["sql-lora"], ["sql-lora"]]))
    assert len(held(applier, range(32), model="sql-lora")) == 2
    assert held(applier, range(32)) == {}


def test_cache_salt_in_extra_keys_matches_the_request_side() -> None:
    applier = make()
    apply(applier, stored([1, 2], range(32), extra_keys=[["s3cr3t"], None]))
    assert len(held(applier, range(32), extras=[("s3cr3t",), None])) == 2
    assert held(applier, range(32)) == {}


def test_sglang_salt_applies_to_the_first_block_of_a_root_event() -> None:
    applier = make()
    payload = msgpack.packb([0.0, [["BlockStored", [5], None, list(range(16)), 16, None, "GPU", {"cache_salt": "t"}]], 0])
    applier.apply_batch(POD, MODEL, decode_batch(payload, "sglang"))
    assert len(held(applier, range(16), extras=[("t",)])) == 1


def test_dp_rank_scopes_engine_keys() -> None:
    applier = make()
    apply(applier, stored([1], range(16)), rank=0)
    apply(applier, stored([2], range(16, 32), parent=1), rank=1)  # rank 1 never stored hash 1
    assert applier.stats.dropped[(POD, "unknown_parent")] == 1


def test_a_failing_event_does_not_stop_the_batch() -> None:
    applier = make()
    bad = stored([1], range(16), extra_keys=[5])  # an entry that is neither a list nor nil
    apply(applier, bad, stored([2], range(16)))
    assert held(applier, range(16)) == {0: [f"{POD}@gpu"]}
    assert applier.stats.dropped[(POD, "apply_error")] == 1


def test_out_of_range_token_ids_drop_the_event() -> None:
    applier = make()
    apply(applier, stored([1], [2**32] + list(range(15))), stored([2], range(16)))
    assert held(applier, range(16)) == {0: [f"{POD}@gpu"]}
    assert applier.stats.dropped[(POD, "bad_token_ids")] == 1


def test_forget_endpoint_clears_and_recycles() -> None:
    applier = make()
    apply(applier, stored([1], range(16)))
    applier.forget_endpoint(POD)
    assert len(applier.index) == 0 and len(applier.index.registry) == 0
