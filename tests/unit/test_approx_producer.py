"""approx-prefix-cache-producer: llm-d's hashes, routing history, LRU bound, block-size clamp."""

from __future__ import annotations

import struct

import pytest
import xxhash

from ppc_extproc.blockkeys.prefixhash import prefix_block_hashes
from ppc_extproc.enginemetrics import EngineMetrics, EngineMetricsStore
from ppc_extproc.framework import (
    PREFIX_CACHE_MATCH_INFO,
    Endpoint,
    EndpointEvent,
    EndpointEventKind,
    LLMRequest,
    SchedulingContext,
    SchedulingResult,
)
from ppc_extproc.framework.params import Section
from ppc_extproc.matchinfo import PrefixCacheMatchInfo
from ppc_extproc.plugins.producers.approx_prefix_cache import (
    ApproxPrefixCacheProducer,
)
from ppc_extproc.plugins.registry import Services
from ppc_extproc.plugins.scorers import PrefixCacheScorer
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

A, B, C = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000), Endpoint("10.0.0.3", 8000)
KEY = PREFIX_CACHE_MATCH_INFO.of("approx")


def reference(model: str, salt: str, prompt: list[int], block: int, cap: int) -> list[int]:
    """llm-d's ``referenceBlockHashes`` (prefixhash/hashing_reference_test.go), restated."""
    prev = xxhash.xxh64_intdigest((model + salt).encode())
    out = []
    for start in range(0, len(prompt), block):
        if len(out) >= cap:
            break
        content = xxhash.xxh64_intdigest(struct.pack(f"<{len(prompt[start:start + block])}I", *prompt[start:start + block]))
        prev = xxhash.xxh64_intdigest(struct.pack("<QQ", content, prev))
        out.append(prev)
    return out


def producer(params: dict | None = None, metrics: EngineMetricsStore | None = None) -> ApproxPrefixCacheProducer:
    base = {"autoTune": False, "blockSizeTokens": 64}
    base.update(params or {})
    services = Services(engine_metrics=metrics)
    section = Section(base, "parameters")
    p = ApproxPrefixCacheProducer.from_parameters("approx", section, services)
    section.finish()
    return p


def request(*prompts: list[int], salt: str | None = None, rid: str = "r") -> LLMRequest:
    return LLMRequest(rid, "m", TokenizedPrompt("m", tuple(tokens_to_le32(p) for p in prompts), (), salt))


def route(p: ApproxPrefixCacheProducer, req: LLMRequest, target: Endpoint | None, *candidates: Endpoint) -> SchedulingContext:
    ctx = SchedulingContext(req, list(candidates or (A, B, C)))
    p.produce(ctx)
    if target is not None:
        p.pre_request(ctx, SchedulingResult.of([target]))
    return ctx


def info(ctx: SchedulingContext, endpoint: Endpoint) -> PrefixCacheMatchInfo | None:
    return ctx.endpoint_value(endpoint.id, KEY)


@pytest.mark.parametrize(("n", "block", "cap", "salt"), [(0, 64, 10, ""), (63, 64, 10, ""), (64, 64, 10, "s"),
                                                         (200, 64, 10, ""), (200, 64, 2, "x"), (1000, 128, 100, "")])
def test_hashes_match_llm_d_reference(n: int, block: int, cap: int, salt: str) -> None:
    prompt = [(i * 2654435761) % 2**32 for i in range(n)]
    assert prefix_block_hashes(tokens_to_le32(prompt), "model-1", salt or None, block, cap) == reference("model-1", salt, prompt, block, cap)


def test_routing_history_makes_a_repeated_prefix_match() -> None:
    p = producer()
    prompt = list(range(256))  # 4 blocks of 64
    first = route(p, request(prompt), A)
    assert info(first, A) == PrefixCacheMatchInfo(0, 4, 64, 0)
    again = route(p, request(prompt + list(range(1000, 1100))), None)  # same prefix + 100 tokens
    assert info(again, A) == PrefixCacheMatchInfo(4, 6, 64, 4)  # 4 shared blocks of 6 (last partial)
    assert info(again, B) == PrefixCacheMatchInfo(0, 6, 64, 0)
    scores = PrefixCacheScorer("s", producer_name="approx").score(again, [A, B])
    assert scores == {A.id: 4 / 6, B.id: 0.0}


def test_match_is_the_consecutive_prefix_per_endpoint() -> None:
    p = producer()
    route(p, request(list(range(128))), A)  # A: blocks 0, 1
    route(p, request(list(range(64)) + list(range(500, 564))), B)  # B: block 0 and another block 1
    ctx = route(p, request(list(range(192))), None)
    assert info(ctx, A).match_blocks == 2 and info(ctx, B).match_blocks == 1 and info(ctx, C).match_blocks == 0


def test_salt_model_and_multi_prompt() -> None:
    p = producer()
    route(p, request(list(range(128)), salt="a"), A)
    assert info(route(p, request(list(range(128)), salt="b"), None), A).match_blocks == 0
    assert info(route(p, request(list(range(128)), salt="a"), None), A).match_blocks == 2
    route(p, request(list(range(64)), list(range(64, 192))), B)  # two prompts, hashed separately
    ctx = route(p, request(list(range(64)), list(range(64, 192))), None)
    assert info(ctx, B) == PrefixCacheMatchInfo(3, 3, 64, 3)


def test_no_tokens_or_empty_prompt_produce_nothing() -> None:
    p = producer()
    ctx = route(p, LLMRequest("r", "m"), A)
    assert ctx.endpoint_data == {} and p.blocks_per_endpoint() == {}
    ctx = route(p, request([]), A)
    assert ctx.endpoint_data == {} and p.blocks_per_endpoint() == {}


def test_lru_bound_per_endpoint_evicts_tails_first() -> None:
    p = producer({"lruCapacityPerServer": 4})
    route(p, request(list(range(64 * 3))), A)  # 3 blocks
    route(p, request(list(range(10_000, 10_000 + 64 * 3))), A)  # 3 more: 2 evicted
    assert p.blocks_per_endpoint() == {A.id: 4}
    assert info(route(p, request(list(range(10_000, 10_000 + 64 * 3))), None), A).match_blocks == 3
    # the older prompt lost its tail blocks 2 and 1, not its head
    assert info(route(p, request(list(range(64 * 3))), None), A).match_blocks == 1


def test_prefix_length_is_capped() -> None:
    p = producer({"maxPrefixTokensToMatch": 128})
    ctx = route(p, request(list(range(1000))), A)
    assert info(ctx, A).total_blocks == 2
    p = producer({"maxPrefixTokensToMatch": 0, "maxPrefixBlocksToMatch": 3})
    assert info(route(p, request(list(range(1000))), A), A).total_blocks == 3
    p = producer({"maxPrefixTokensToMatch": 0, "maxPrefixBlocksToMatch": 0})
    assert info(route(p, request(list(range(1000))), A), A).total_blocks == 16


def test_block_size_is_clamped_to_64_with_a_warning() -> None:
    section = Section({"autoTune": False, "blockSizeTokens": 16}, "plugins[0].parameters")
    p = ApproxPrefixCacheProducer.from_parameters("approx", section, Services())
    assert p.block_size() == 64
    assert section.warnings == ["plugins[0].parameters.blockSizeTokens: 16 is raised to 64 (llm-d #1158 bounds "
                                "router memory the same way)"]
    quiet = Section({}, "plugins[0].parameters")  # the default: raised without a word
    ApproxPrefixCacheProducer.from_parameters("approx", quiet, Services())
    assert quiet.warnings == []
    assert producer({"blockSizeTokens": 0, "blockSize": 32}).block_size() == 64  # deprecated alias
    assert producer({"blockSizeTokens": 128}).block_size() == 128
    assert ApproxPrefixCacheProducer.from_parameters("a", Section({}, "p"), Services()).block_size() == 64


def test_auto_tune_reads_engine_block_size_and_capacity() -> None:
    metrics = EngineMetricsStore(stale_after_seconds=None)
    p = producer({"autoTune": True, "blockSizeTokens": 16, "lruCapacityPerServer": 2}, metrics)
    assert p.block_size([A]) == 64 and p.capacity(A.id, 64) == 2  # no metrics yet: configuration
    metrics.set(A.id, EngineMetrics(0, 0, 0.0, 128, 100, updated_at=0.0))
    assert p.block_size([B, A]) == 128  # from the first candidate with metrics, then kept
    metrics.set(A.id, EngineMetrics(0, 0, 0.0, 256, 100, updated_at=0.0))
    assert p.block_size([A]) == 128
    assert p.capacity(A.id, 128) == 200  # 100 engine blocks × 256 tokens ÷ 128


def test_deleted_endpoint_history_is_dropped() -> None:
    p = producer()
    route(p, request(list(range(128))), A)
    route(p, request(list(range(128))), B)
    p.extract(EndpointEvent(EndpointEventKind.DELETED, A))
    assert p.blocks_per_endpoint() == {B.id: 2}
