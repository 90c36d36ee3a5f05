from __future__ import annotations

import pytest

from ppc_extproc.events.wire import AllBlocksCleared, BlockStored, EventBatch
from ppc_extproc.framework import (
    PREFIX_CACHE_MATCH_INFO,
    Endpoint,
    EndpointEvent,
    EndpointEventKind,
    LLMRequest,
    ResponseInfo,
    SchedulingContext,
    SchedulingResult,
    StreamedKeys,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.ids import RequestKey
from ppc_extproc.index import PodEntry
from ppc_extproc.matchinfo import PrefixCacheMatchInfo
from ppc_extproc.plugins.producers import PrecisePrefixCacheProducer
from ppc_extproc.plugins.registry import Services
from ppc_extproc.tokens import MultimodalFeature, TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

A, B, C = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000), Endpoint("10.0.0.3", 8000)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def producer(params: dict | None = None, clock: FakeClock | None = None) -> PrecisePrefixCacheProducer:
    base = {"tokenProcessorConfig": {"blockSizeTokens": 16}}
    base.update(params or {})
    return PrecisePrefixCacheProducer.from_parameters(
        "precise", Section(base, "parameters"), Services(clock=clock or FakeClock())
    )


def request(*prompts: list[int], salt: str | None = None, features=()) -> LLMRequest:
    tokenized = TokenizedPrompt("m", tuple(tokens_to_le32(p) for p in prompts), tuple(features), salt)
    return LLMRequest("req-1", "m", tokenized)


def store(p: PrecisePrefixCacheProducer, endpoint: Endpoint, tokens: list[int], medium: str = "GPU", extra_keys=None) -> None:
    n = len(tokens) // 16
    event = BlockStored(list(range(1000, 1000 + n)), None, list(tokens), 16, medium=medium, extra_keys=extra_keys)
    p.applier.apply_batch(endpoint.id, "m", EventBatch(0.0, [event]))


def produce(p: PrecisePrefixCacheProducer, req: LLMRequest, *endpoints: Endpoint) -> SchedulingContext:
    ctx = SchedulingContext(req, list(endpoints or (A, B, C)))
    p.produce(ctx)
    return ctx


def info(ctx: SchedulingContext, endpoint: Endpoint) -> PrefixCacheMatchInfo | None:
    return ctx.endpoint_value(endpoint.id, PREFIX_CACHE_MATCH_INFO.of("precise"))


def test_match_info_for_every_candidate() -> None:
    p = producer()
    store(p, A, list(range(64)))
    store(p, B, list(range(32)), medium="CPU")
    ctx = produce(p, request(list(range(70))))
    assert info(ctx, A) == PrefixCacheMatchInfo(4, 4, 16, 4, {"gpu": 4})
    assert info(ctx, B) == PrefixCacheMatchInfo(1, 4, 16, 2, {"cpu": 2})  # int(0.8 + 0.8)
    assert info(ctx, C) == PrefixCacheMatchInfo(0, 4, 16, 0, {})


def test_suspended_endpoints_match_nothing_until_their_stream_is_proven() -> None:
    """The ingestor suspends an endpoint whose subscriber lost its engine (it may come back
    restarted, empty): its entries stay, but no request is predicted on them."""
    p = producer()
    store(p, A, list(range(64)))
    store(p, B, list(range(64)))
    state = p.stats.source(A.id)
    p.stats.suspend(state, True)
    ctx = produce(p, request(list(range(70))))
    assert info(ctx, A) == PrefixCacheMatchInfo(0, 4, 16, 0, {})
    assert info(ctx, B).match_blocks == 4
    p.stats.suspend(state, False)
    assert info(produce(p, request(list(range(70)))), A).match_blocks == 4


def test_no_tokens_or_no_full_block_writes_nothing() -> None:
    p = producer()
    store(p, A, list(range(64)))
    assert produce(p, LLMRequest("r", "m", None)).endpoint_data == {}
    assert produce(p, request(list(range(15)))).endpoint_data == {}


def test_multi_prompt_requests_sum_blocks_and_scores() -> None:
    p = producer()
    store(p, A, list(range(32)))
    ctx = produce(p, request(list(range(32)), list(range(32)) + list(range(900, 932))))
    assert info(ctx, A) == PrefixCacheMatchInfo(4, 6, 16, 4, {"gpu": 4})


def test_cache_salt_changes_every_key_and_matches_salted_events() -> None:
    p = producer()
    store(p, A, list(range(32)))
    store(p, B, list(range(32)), extra_keys=[["tenant"], None])
    ctx = produce(p, request(list(range(32)), salt="tenant"))
    assert info(ctx, A).match_blocks == 0
    assert info(ctx, B).match_blocks == 2


def test_salt_goes_after_multimodal_ids_on_block_zero() -> None:
    p = producer()
    store(p, A, list(range(32)), extra_keys=[["img", "tenant"], None])
    req = request(list(range(32)), salt="tenant", features=[MultimodalFeature("img", 2, 4)])
    ctx = produce(p, req)
    assert info(ctx, A).match_blocks == 2
    assert info(ctx, A).mm_match_blocks == 1


def test_speculative_entries_for_the_pick_expire_after_ttl() -> None:
    clock = FakeClock()
    p = producer({"speculativeIndexing": True, "speculativeTTL": "2s"}, clock)
    ctx = produce(p, request(list(range(48))))
    p.pre_request(ctx, SchedulingResult.of([B, A]))
    follow_up = produce(p, request(list(range(48))))
    assert info(follow_up, B) == PrefixCacheMatchInfo(3, 3, 16, 3, {"speculative": 3})
    assert info(follow_up, A).match_blocks == 0  # only the first target is seeded
    clock.now += 1.9
    p.tick(clock.now)
    assert info(produce(p, request(list(range(48)))), B).match_blocks == 3
    clock.now += 0.2
    p.tick(clock.now)
    assert info(produce(p, request(list(range(48)))), B).match_blocks == 0
    assert len(p.index) == 0


def test_tick_says_when_the_next_speculative_expiry_is_due() -> None:
    clock = FakeClock()
    p = producer({"speculativeIndexing": True, "speculativeTTL": "2s"}, clock)
    assert p.tick(clock.now) == clock.now + 2.0  # nothing pending: nothing can expire sooner
    seeded_at = clock.now + 0.5
    clock.now = seeded_at
    ctx = produce(p, request(list(range(48))))
    p.pre_request(ctx, SchedulingResult.of([B]))
    clock.now += 0.3
    assert p.tick(clock.now) == seeded_at + 2.0
    clock.now = seeded_at + 2.0
    assert p.tick(clock.now) == clock.now + 2.0
    assert info(produce(p, request(list(range(48)))), B).match_blocks == 0


def test_a_prompt_sent_again_seeds_only_the_blocks_its_target_lacks() -> None:
    clock = FakeClock()
    p = producer({"speculativeIndexing": True, "speculativeTTL": "2s"}, clock)
    first = produce(p, request(list(range(48))))
    p.pre_request(first, SchedulingResult.of([B]))
    clock.now += 1.0
    again = produce(p, request(list(range(48))))
    p.pre_request(again, SchedulingResult.of([B]))
    assert p.speculative.pending() == 1  # nothing new to seed: the first seeding keeps its expiry
    longer = produce(p, request(list(range(80))))
    p.pre_request(longer, SchedulingResult.of([B]))
    longer_seeded = longer.get(p.seeded_key)
    assert longer_seeded is not None and [len(keys) for keys in longer_seeded.keys] == [2]  # the 2 new blocks
    elsewhere = produce(p, request(list(range(48))))
    p.pre_request(elsewhere, SchedulingResult.of([A]))  # another target gets every block
    elsewhere_seeded = elsewhere.get(p.seeded_key)
    assert elsewhere_seeded is not None and [len(keys) for keys in elsewhere_seeded.keys] == [3]
    clock.now += 1.5  # the first seeding (blocks 0-2 on B) has expired, the tail has not
    p.tick(clock.now)
    assert info(produce(p, request(list(range(80)))), B).match_blocks == 0
    assert info(produce(p, request(list(range(48)))), A).match_blocks == 3


def test_blocks_the_target_holds_confirmed_are_not_seeded_again() -> None:
    """A conversation's next turn on the engine that holds its history: only the new blocks get
    speculative entries (the confirmed ones already weigh as much); a CPU-only copy (0.8) does."""
    clock = FakeClock()
    p = producer({"speculativeIndexing": True, "speculativeTTL": "2s"}, clock)
    store(p, A, list(range(48)))
    store(p, B, list(range(32)), medium="CPU")
    turn = produce(p, request(list(range(80))))
    p.pre_request(turn, SchedulingResult.of([A]))
    seeded = turn.get(p.seeded_key)
    assert seeded is not None and [len(keys) for keys in seeded.keys] == [2]  # blocks 3 and 4
    assert info(produce(p, request(list(range(80)))), A).match_blocks == 5
    on_cpu = produce(p, request(list(range(48))))
    p.pre_request(on_cpu, SchedulingResult.of([B]))
    cpu_seeded = on_cpu.get(p.seeded_key)
    assert cpu_seeded is not None and [len(keys) for keys in cpu_seeded.keys] == [3]
    assert info(produce(p, request(list(range(48)))), B).match_blocks == 3
    clock.now += 2.5
    p.tick(clock.now)
    assert info(produce(p, request(list(range(80)))), A).match_blocks == 3
    assert info(produce(p, request(list(range(48)))), B).match_blocks == 1  # int(2 × 0.8)


def test_confirmed_entries_survive_speculative_expiry() -> None:
    clock = FakeClock()
    p = producer({"speculativeIndexing": True}, clock)
    ctx = produce(p, request(list(range(32))))
    p.pre_request(ctx, SchedulingResult.of([A]))
    store(p, A, list(range(32)))
    clock.now += 5
    p.tick(clock.now)
    assert info(produce(p, request(list(range(32)))), A) == PrefixCacheMatchInfo(2, 2, 16, 2, {"gpu": 2})


def test_a_confirming_store_replaces_the_speculative_entry() -> None:
    clock = FakeClock()
    p = producer({"speculativeIndexing": True}, clock)
    for target in (A, B):
        ctx = produce(p, request(list(range(32))))
        p.pre_request(ctx, SchedulingResult.of([target]))
    store(p, A, list(range(32)))
    store(p, B, list(range(32)), medium="CPU")  # weighs less than the guess: the guess stays
    assert info(produce(p, request(list(range(32)))), A).cached_blocks_by_tier == {"gpu": 2}
    assert info(produce(p, request(list(range(32)))), B).cached_blocks_by_tier == {"cpu": 2, "speculative": 2}
    clock.now += 5
    p.tick(clock.now)
    assert info(produce(p, request(list(range(32)))), A).match_blocks == 2
    assert info(produce(p, request(list(range(32)))), B).cached_blocks_by_tier == {"cpu": 2}


def test_no_speculation_when_disabled() -> None:
    p = producer({"speculativeIndexing": False})
    ctx = produce(p, request(list(range(32))))
    p.pre_request(ctx, SchedulingResult.of([A]))
    assert len(p.index) == 0


def test_speculative_state_is_bounded() -> None:
    clock = FakeClock()
    p = producer({"speculativeIndexing": True}, clock)
    p.speculative.max_pending = 3
    for i in range(10):
        ctx = produce(p, request(list(range(i * 100, i * 100 + 16))))
        p.pre_request(ctx, SchedulingResult.of([A]))
    assert p.speculative.pending() == 3 and p.speculative.expired_early == 7
    assert len(p.index) == 3


def test_endpoint_delete_clears_its_entries() -> None:
    p = producer()
    store(p, A, list(range(32)))
    store(p, B, list(range(32)))
    p.extract(EndpointEvent(EndpointEventKind.DELETED, A))
    ctx = produce(p, request(list(range(32))), B)
    assert info(ctx, B).match_blocks == 2
    assert p.index.lookup(p.block_keys(request(list(range(32))).tokenized)[0], [A.id]) == {}


def test_all_blocks_cleared_only_affects_its_endpoint() -> None:
    p = producer()
    store(p, A, list(range(32)))
    store(p, B, list(range(32)))
    p.applier.apply_batch(A.id, "m", EventBatch(0.0, [AllBlocksCleared()]))
    ctx = produce(p, request(list(range(32))))
    assert (info(ctx, A).match_blocks, info(ctx, B).match_blocks) == (0, 2)


def test_streamed_keys_are_used_when_they_are_this_producers() -> None:
    p = producer()
    store(p, A, list(range(32)))
    req = request(list(range(32)))
    req.streamed_keys = StreamedKeys("other", "m", [RequestKey(123), RequestKey(456)])
    assert info(produce(p, req), A).match_blocks == 2  # not ours: computed from the tokens
    req.streamed_keys = StreamedKeys("precise", "m", [RequestKey(123), RequestKey(456)])  # computed while streaming
    assert info(produce(p, req), A).match_blocks == 0
    p.index.add(None, [123, 456], [PodEntry(A.id, "gpu")])
    assert info(produce(p, req), A).match_blocks == 2


@pytest.mark.parametrize("algorithm", ["xxh64", "cbor-fnv"])
def test_both_hash_algorithms_route_events_to_requests(algorithm: str) -> None:
    p = producer({"tokenProcessorConfig": {"blockSizeTokens": 16, "hashAlgorithm": algorithm, "hashSeed": "s"}})
    store(p, A, list(range(48)))
    assert info(produce(p, request(list(range(48)))), A).match_blocks == 3


def test_predicted_cached_tokens_follow_vllms_last_token_rule() -> None:
    """vLLM recomputes the last prompt token (vllm/v1/core/kv_cache_manager.py get_computed_blocks):
    a fully cached 64-token prompt of 16-token blocks gets 48 tokens from the cache, not 64."""
    p = producer()
    store(p, A, list(range(64)))
    whole = info(produce(p, request(list(range(64)))), A)
    assert (whole.match_blocks, whole.cached_tokens) == (4, 48)  # the score still counts 4 blocks
    longer = info(produce(p, request(list(range(65)))), A)
    assert longer.cached_tokens == 64  # one more token: the fourth block is used
    partial = info(produce(p, request(list(range(40)))), A)
    assert partial.cached_tokens == 32


def test_batched_prompts_predict_per_prompt_and_report_the_last_as_vllm_does() -> None:
    p = producer()
    store(p, A, list(range(64)))
    batch = info(produce(p, request(list(range(64)), list(range(33)))), A)
    assert batch.cached_tokens_per_prompt == (48, 32)
    assert batch.cached_tokens == 80 and batch.reported_cached_tokens == 32


@pytest.mark.parametrize(("status", "cancelled", "undone"), [
    (400, False, True),   # the engine rejected it: it never cached the prompt
    (503, False, True),
    (0, True, True),      # the stream was reset before any response
    (200, False, False),
    (0, False, False),    # no response phase configured: nothing known, entries stay to expire
])
def test_speculative_entries_are_undone_when_the_request_failed(status: int, cancelled: bool, undone: bool) -> None:
    p = producer({"speculativeIndexing": True})
    ctx = produce(p, request(list(range(48))))
    p.pre_request(ctx, SchedulingResult.of([B]))
    assert info(produce(p, request(list(range(48)))), B).match_blocks == 3
    p.response_complete(ctx, ResponseInfo("req-1", B.id, status=status, reached=status != 503, cancelled=cancelled))
    assert info(produce(p, request(list(range(48)))), B).match_blocks == (0 if undone else 3)
    p.tick(1e9)  # expiry after an undo removes nothing twice
    assert len(p.index) == 0


def test_subscriber_connection_changes_reach_health_when_they_happen() -> None:
    p = producer()  # per-endpoint KV events (discoverPods, llm-d's default)
    health = p.health
    health.on_endpoint_event(EndpointEvent(EndpointEventKind.ADDED, A))
    state = p.stats.source(A.id)
    p.stats.set_connected(state, True)
    assert health.kv_disconnected() == []
    p.stats.set_connected(state, False)  # on the ingestion thread, no tick in between
    assert health.kv_disconnected() == [A.id]
    state.connected = True  # a change the listener missed: the reconciliation reports it
    p.stats.report_connections()
    assert health.kv_disconnected() == []
