"""Each engine's own block size, learned from its BlockStored events, sets the alignment of the
cached tokens predicted for it and of the speculative entries it is given; the hashing unit stays
``blockSizeTokens`` (16 here)."""

from __future__ import annotations

import pytest
from test_precise_producer import A, B, FakeClock, info, produce, producer, request

from ppc_extproc.events.wire import BlockStored, EventBatch
from ppc_extproc.framework import SchedulingResult
from ppc_extproc.matchinfo import engine_cached_tokens
from ppc_extproc.plugins.producers import PrecisePrefixCacheProducer


@pytest.mark.parametrize(
    ("cached_blocks", "prompt_tokens", "engine_block", "expected"),
    [
        (6, 100, 64, 64),  # a 96-token cached prefix is one 64-token block on the engine
        (6, 100, 16, 96),
        (4, 64, 64, 0),  # the last prompt token is always recomputed: no whole 64-block before it
        (4, 64, 16, 48),
        (8, 129, 64, 128),
        (8, 129, None, 128),
        (2, 40, 32, 32),
    ],
)
def test_predicted_cached_tokens_follow_the_engines_block(
    cached_blocks: int, prompt_tokens: int, engine_block: int | None, expected: int
) -> None:
    assert engine_cached_tokens(cached_blocks, 16, prompt_tokens, engine_block) == expected


def _store(p: PrecisePrefixCacheProducer, endpoint_id: str, tokens: list[int], engine_block: int,
           group: int | None = 0, kind: str | None = "full_attention") -> None:  # fmt: skip
    n = len(tokens) // engine_block
    event = BlockStored(list(range(7000, 7000 + n)), None, tokens[: n * engine_block], engine_block,
                        medium="GPU", group_idx=group, kv_cache_spec_kind=kind)  # fmt: skip
    p.applier.apply_batch(endpoint_id, "m", EventBatch(0.0, [event]))


def test_block_sizes_are_learned_per_endpoint_from_the_full_attention_group_only() -> None:
    p = producer()
    _store(p, A.id, list(range(128)), 64)
    _store(p, A.id, list(range(500, 756)), 128, group=1, kind="sliding_window")  # not indexed
    _store(p, A.id, list(range(900, 1156)), 256, group=2, kind="mamba")
    _store(p, B.id, list(range(64)), 32)
    assert p.stats.block_sizes == {A.id: 64, B.id: 32}
    ctx = produce(p, request(list(range(100))), A, B)
    assert info(ctx, A).cached_tokens == 64 and info(ctx, B).cached_tokens == 64
    assert info(ctx, A).cached_block_count == 6  # the index still counts 16-token blocks
    p.applier.forget_endpoint(A.id)
    assert A.id not in p.stats.block_sizes


def test_speculative_entries_cover_only_the_engines_whole_blocks() -> None:
    p = producer({"speculativeIndexing": True}, FakeClock())
    _store(p, B.id, list(range(5000, 5064)), 64)  # B's engine uses 64-token blocks
    ctx = produce(p, request(list(range(100))), A, B)
    p.pre_request(ctx, SchedulingResult.of([B]))
    follow_up = produce(p, request(list(range(100))), A, B)
    assert info(follow_up, B).cached_block_count == 4  # tokens 0-63: what B will store


def test_the_polled_cache_config_block_size_is_used_until_events_teach_one() -> None:
    from ppc_extproc.enginemetrics import EngineMetrics
    from ppc_extproc.enginemetrics.types import EngineMetricsStore
    from ppc_extproc.framework.params import Section
    from ppc_extproc.plugins.registry import Services

    store = EngineMetricsStore()
    p = PrecisePrefixCacheProducer.from_parameters(
        "precise", Section({"tokenProcessorConfig": {"blockSizeTokens": 16}}, "parameters"),
        Services(clock=FakeClock(), engine_metrics=store),
    )
    _store(p, A.id, list(range(128)), 16)  # events say 16 …
    p.stats.block_sizes.clear()  # … but pretend they have not taught it yet
    store.set(A.id, EngineMetrics(0, 0, 0.0, 64, 100, 0.0))
    assert info(produce(p, request(list(range(100))), A), A).cached_tokens == 64
    _store(p, A.id, list(range(128)), 16)
    assert info(produce(p, request(list(range(100))), A), A).cached_tokens == 96  # the events win
