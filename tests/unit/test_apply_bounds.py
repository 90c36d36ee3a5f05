"""What engine events can make grow is bounded, and inconsistent stores are never indexed
(issue #11 F6, F7)."""

from __future__ import annotations

import msgpack
import pytest

from ppc_extproc.blockkeys import TokenProcessor, TokenProcessorConfig
from ppc_extproc.events.apply import MAX_ENTRIES_PER_ENDPOINT, MAX_GROUPS_PER_ENDPOINT, EventApplier
from ppc_extproc.events.decode import MAX_EVENT_TOKENS, decode_batch
from ppc_extproc.events.wire import BlockRemoved, BlockStored, EventBatch
from ppc_extproc.index import InMemoryIndex

POD = "10.0.0.1:8000"


def make(size: int = 100_000) -> EventApplier:
    return EventApplier(InMemoryIndex(size=size), TokenProcessor(TokenProcessorConfig(16)))


def apply(applier: EventApplier, *events: BlockStored | BlockRemoved, pod: str = POD) -> None:
    applier.apply_batch(pod, "m", EventBatch(0.0, list(events)))


def payload(*events: list[object] | dict[str, object]) -> bytes:
    return bytes(msgpack.packb([1.0, list(events), 0]))


def snapshot(applier: EventApplier) -> tuple[int, int, int]:
    stats = applier.index.stats()
    return stats.request_keys, stats.engine_keys, stats.entries


def test_every_new_medium_beyond_the_bound_is_dropped_and_counted() -> None:
    applier = make()
    for i in range(200):
        apply(applier, BlockStored([1000 + i], None, list(range(i, i + 16)), 16, medium=f"tier-{i}"))
    assert len(applier.index.registry) == MAX_ENTRIES_PER_ENDPOINT
    assert applier.stats.dropped[(POD, "too_many_entries")] == 200 - MAX_ENTRIES_PER_ENDPOINT
    # Known tiers keep working, and a removal in an unknown tier allocates nothing.
    apply(applier, BlockStored([1], None, list(range(16)), 16, medium="tier-0"))
    apply(applier, BlockRemoved([1], medium="never-seen"))
    assert len(applier.index.registry) == MAX_ENTRIES_PER_ENDPOINT
    assert applier.stats.transport[(POD, "removes_unmapped")] == 1


def test_every_new_group_beyond_the_bound_is_dropped_and_counted() -> None:
    applier = make()
    for g in range(500):
        kind = "full_attention" if g % 2 else "mamba"
        apply(applier, BlockStored([1000 + g], None, list(range(g, g + 16)), 16, group_idx=g, kv_cache_spec_kind=kind))
    assert len(applier._groups) == MAX_GROUPS_PER_ENDPOINT
    assert applier.stats.dropped[(POD, "too_many_groups")] == 500 - MAX_GROUPS_PER_ENDPOINT
    assert len(applier.index.registry) <= MAX_ENTRIES_PER_ENDPOINT
    # Forgetting the endpoint forgets its groups and entries: the bound is per endpoint.
    applier.forget_endpoint(POD)
    assert not applier._groups and len(applier.index.registry) == 0
    apply(applier, BlockStored([7], None, list(range(16)), 16, group_idx=600, kv_cache_spec_kind="full_attention"))
    assert len(applier.index) == 1


def test_entries_are_bounded_per_endpoint_not_globally() -> None:
    applier = make()
    for pod in ("10.0.0.1:8000", "10.0.0.2:8000"):
        for i in range(MAX_ENTRIES_PER_ENDPOINT):
            apply(applier, BlockStored([i + 1], None, list(range(16)), 16, medium=f"t{i}"), pod=pod)
    assert len(applier.index.registry) == 2 * MAX_ENTRIES_PER_ENDPOINT
    assert applier.stats.dropped_total() == 0


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        # 1.6M tokens over 100,000 hashes … plus one: does not split evenly.
        (["BlockStored", list(range(1, 100_001)), None, [5] * 1_600_001, 16, None, "GPU"], "tokens_not_divisible"),
        (["BlockStored", [1, 2, 3], None, list(range(32)), 16, None, "GPU"], "tokens_not_divisible"),
        (["BlockStored", [], None, list(range(32)), 16, None, "GPU"], "tokens_not_divisible"),
        (["BlockStored", [1, 2], None, list(range(32)), -1, None, "GPU"], "bad_block_size"),
        (["BlockStored", [1, 2], None, list(range(32)), 0, None, "GPU"], "bad_block_size"),
        ({"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": list(range(32)),
          "block_size": -16, "lora_id": None, "medium": "GPU", "lora_name": None}, "bad_block_size"),
        (["BlockStored", list(range(1, 2**18 + 1)), None, [1] * (MAX_EVENT_TOKENS + 2**18), 16, None, "GPU"],
         "too_many_tokens"),
    ],
    ids=["1.6M-tokens", "32-over-3", "no-hashes", "block-size--1", "block-size-0", "map-era-negative", "bound"],
)
@pytest.mark.parametrize("engine_type", ["vllm", "sglang"])
def test_inconsistent_block_stored_is_dropped_with_a_reason_on_both_decode_paths(
    event: list[object] | dict[str, object], reason: str, engine_type: str
) -> None:
    """vLLM payloads go through the typed decoders first; SGLang's always take the untyped path."""
    good = ["BlockStored", [77], None, list(range(100, 116)), 16, None, "GPU"]
    batch = decode_batch(payload(event, good), engine_type)
    assert batch.skipped == [reason]
    assert [e.block_hashes for e in batch.events] == [[77]]
    applier = make()
    applier.apply_batch(POD, "m", batch)
    assert len(applier.index) == 1 and applier.stats.dropped[(POD, reason)] == 1


def test_token_less_placeholders_with_block_size_0_still_update_tiers() -> None:
    """vLLM's offloading connectors send location-only stores with no tokens and block size 0."""
    applier = make()
    applier.apply_batch(POD, "m", decode_batch(payload(["BlockStored", [1], None, list(range(16)), 16, None, "GPU"])))
    applier.apply_batch(POD, "m", decode_batch(payload(["BlockStored", [1], None, [], 0, None, "CPU"])))
    assert applier.stats.dropped_total() == 0
    keys = applier.processor.keys(list(range(16)), "m")
    assert sorted(e.tier for e in applier.index.lookup(keys)[keys[0]]) == ["cpu", "gpu"]


def test_an_event_built_without_the_decoder_is_not_indexed_without_a_mapping() -> None:
    applier = make()
    apply(applier, BlockStored([1, 2, 3], None, list(range(32)), 16))
    assert snapshot(applier) == (0, 0, 0)
    assert applier.stats.dropped[(POD, "tokens_not_divisible")] == 1
