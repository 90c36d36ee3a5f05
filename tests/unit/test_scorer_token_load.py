"""token-load-scorer: in-flight uncached tokens + this request's own uncached tokens."""

from __future__ import annotations

import pytest

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import (
    IN_FLIGHT_LOAD,
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    Consumes,
    Endpoint,
    LLMRequest,
    SchedulingContext,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.matchinfo import PrefixCacheMatchInfo
from ppc_extproc.plugins.producers.inflight_load import InflightLoadProducer
from ppc_extproc.plugins.registry import Services
from ppc_extproc.plugins.scorers import TokenLoadScorer
from ppc_extproc.plugins.scorers.token_load import request_token_load
from ppc_extproc.scheduling.inflight import InflightTracker
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

A, B, C = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000), Endpoint("10.0.0.3", 8000)
KEY = PREFIX_CACHE_MATCH_INFO.of("precise")


def ctx_with(prompt_tokens: int, cached_blocks: dict[Endpoint, int] | None = None) -> SchedulingContext:
    tokenized = TokenizedPrompt("m", (bytes(4 * prompt_tokens),)) if prompt_tokens else None
    ctx = SchedulingContext(LLMRequest("r", "m", tokenized), [A, B, C])
    for endpoint, blocks in (cached_blocks or {}).items():
        ctx.put_endpoint_value(endpoint.id, KEY, PrefixCacheMatchInfo(blocks, 10, 64, cached_block_count=blocks))
    return ctx


def scorer(threshold: int = 1000) -> TokenLoadScorer:
    return TokenLoadScorer("tl", threshold, producer_name="precise")


def score(s: TokenLoadScorer, inflight: InflightTracker, ctx: SchedulingContext, endpoints: list[Endpoint]) -> dict[str, float]:
    """Score as in a request: the in-flight load producer has written its view first."""
    InflightLoadProducer(s.load_key.producer, inflight).produce(ctx)
    return dict(s.score(ctx, endpoints))


def test_idle_endpoints_score_one_without_a_prompt() -> None:
    assert score(scorer(), InflightTracker(), ctx_with(0), [A, B]) == {A.id: 1.0, B.id: 1.0}


def test_formula_counts_inflight_plus_own_uncached_tokens() -> None:
    inflight = InflightTracker()
    inflight.start("x", A.id, 300)
    inflight.start("y", B.id, 1200)
    ctx = ctx_with(640, {A: 5, C: 10})  # A caches 320 tokens, B nothing, C the whole prompt
    scores = score(scorer(), inflight, ctx, [A, B, C])
    assert scores[A.id] == pytest.approx(1 - (300 + 320) / 1000)
    assert scores[B.id] == 0.0  # 1200 + 640 ≥ threshold
    assert scores[C.id] == 1.0  # nothing in flight, nothing to prefill


def test_own_load_never_negative_when_the_cache_covers_more_than_the_prompt() -> None:
    ctx = ctx_with(100, {A: 2})  # 128 cached tokens > 100 prompt tokens (partial last block)
    assert request_token_load(ctx, A.id, KEY) == 0
    assert request_token_load(ctx, B.id, KEY) == 100


def test_unnamed_producer_uses_the_best_cached_prefix_of_any_producer() -> None:
    ctx = ctx_with(640, {A: 2})
    ctx.put_endpoint_value(A.id, PREFIX_CACHE_MATCH_INFO.of("approx"), PrefixCacheMatchInfo(5, 10, 64, cached_block_count=5))
    assert request_token_load(ctx, A.id) == 640 - 320
    assert request_token_load(ctx, A.id, KEY) == 640 - 128
    assert request_token_load(ctx, B.id) == 640
    inflight = InflightTracker()
    unnamed = TokenLoadScorer("tl", 1000)
    assert score(unnamed, inflight, ctx, [A, B]) == {A.id: pytest.approx(1 - 320 / 1000), B.id: pytest.approx(1 - 640 / 1000)}


def test_prompt_tokens_fall_back_to_the_token_ids() -> None:
    tokenized = TokenizedPrompt("m", (tokens_to_le32(range(50)),))
    ctx = SchedulingContext(LLMRequest("r", "m", tokenized), [A])
    assert request_token_load(ctx, A.id, KEY) == 50


def test_parameters_defaults_and_validation() -> None:
    services = Services()
    s = TokenLoadScorer.from_parameters(
        "tl", Section({"inFlightLoadProducerName": "x", "nonTextTokenWeight": 2.0}, "p"), services
    )
    assert s.queue_threshold_tokens == 4194304
    assert s.match_key is None  # the best cached prefix of any producer
    assert s.consumes() == (  # the named in-flight load producer; optionally ids and any match info
        Consumes(IN_FLIGHT_LOAD, "x"), Consumes(TOKENIZED_PROMPT, required=False),
        Consumes(PREFIX_CACHE_MATCH_INFO, required=False),
    )
    for value in (0, -5):  # llm-d's token_load.go: ≤ 0 falls back to the default
        section = Section({"queueThresholdTokens": value}, "p")
        assert TokenLoadScorer.from_parameters("tl", section, Services()).queue_threshold_tokens == 4194304
        assert section.warnings == [f"p.queueThresholdTokens: {value} should be positive; using the default 4194304 (as llm-d)"]
    with pytest.raises(ConfigError, match="queueThresholdTokens"):
        TokenLoadScorer.from_parameters("tl", Section({"queueThresholdTokens": "many"}, "p"), Services())
