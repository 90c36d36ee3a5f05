"""``burst-prefix-cache-producer``: batch windows, their seal, refusals and parameters.

Ports ``llm-d/llm-d-router: pkg/epp/framework/plugins/requestcontrol/dataproducer/burstprefix/plugin_test.go``
(``TestNew_RejectsInvalidConfig``, ``TestProduce_ColocatesIdenticalPromptBurst``,
``TestProduce_SingletonHasNoAffinity``, ``TestProduce_CancelledContextBeforeSeal``,
``TestProduce_SecondWindowAfterSeal``) and the ``maxBatchSize`` refusal of ``plugin.go``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from epp_helpers import load, router_for, until

from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Endpoint, LLMRequest, SchedulingContext
from ppc_extproc.framework.params import Section
from ppc_extproc.matchinfo import PrefixCacheMatchInfo
from ppc_extproc.plugins.producers.burst_prefix_cache import BurstPrefixCacheProducer
from ppc_extproc.plugins.registry import Services
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

PODS = [Endpoint(f"10.0.0.{i}", 8000) for i in range(1, 5)]


def producer(**params: object) -> BurstPrefixCacheProducer:
    section = Section({"blockSizeTokens": 4, **params}, "plugins[0].parameters", "burst-prefix-cache-producer")
    made = BurstPrefixCacheProducer.from_parameters("burst", section, Services())
    section.finish()
    return made


def context(tokens: Sequence[int], candidates: Sequence[Endpoint] = PODS, request_id: str = "r") -> SchedulingContext:
    tokenized = TokenizedPrompt("m", (tokens_to_le32(tokens),))
    return SchedulingContext(LLMRequest(request_id, "m", tokenized), list(candidates))


def infos(p: BurstPrefixCacheProducer, ctx: SchedulingContext) -> dict[str, PrefixCacheMatchInfo]:
    return {e.id: ctx.endpoint_value(e.id, p.match_key) for e in ctx.candidates if ctx.endpoint_value(e.id, p.match_key)}


def assigned(p: BurstPrefixCacheProducer, ctx: SchedulingContext) -> str:
    """The endpoint this request was steered to ("" for none); every candidate carries match info."""
    found = infos(p, ctx)
    assert set(found) == {e.id for e in ctx.candidates}
    steered = [ep for ep, info in found.items() if info.match_blocks > 0]
    assert len(steered) <= 1
    return steered[0] if steered else ""


async def window(p: BurstPrefixCacheProducer, prompts: Sequence[Sequence[int]]) -> list[SchedulingContext]:
    contexts = [context(tokens, request_id=f"r{i}") for i, tokens in enumerate(prompts)]
    await asyncio.gather(*(p.produce_async(ctx) for ctx in contexts))
    return contexts


PROMPT = list(range(1, 9))  # two blocks of 4


def test_an_identical_prompt_burst_colocates() -> None:
    p = producer(windowDurationMs=20, maxBatchSize=-1)
    contexts = asyncio.run(window(p, [PROMPT] * 8))
    names = {assigned(p, ctx) for ctx in contexts}
    assert len(names) == 1 and names != {""}
    info = infos(p, contexts[0])[names.pop()]
    assert (info.match_blocks, info.total_blocks, info.block_size_tokens) == (2, 2, 4)


def test_a_lone_request_gets_no_affinity() -> None:
    p = producer(windowDurationMs=10)
    (ctx,) = asyncio.run(window(p, [[1, 2, 3, 4]]))
    assert assigned(p, ctx) == ""
    assert {info.total_blocks for info in infos(p, ctx).values()} == {1}


def test_the_trailing_partial_block_counts() -> None:
    p = producer(windowDurationMs=10)
    contexts = asyncio.run(window(p, [list(range(10))] * 2))  # 2 full blocks + 2 tokens
    assert {info.total_blocks for info in infos(p, contexts[0]).values()} == {3}


def test_a_request_after_the_seal_opens_the_next_window() -> None:
    """Two groups in one window spread over two pods; in two windows each starts from a fresh load."""
    p = producer(windowDurationMs=20)

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        together = await window(p, [PROMPT, PROMPT, [9, 10, 11, 12], [9, 10, 11, 12]])
        assert p._batch is None  # the seal detached the batch
        first = await window(p, [PROMPT] * 4)
        second = await window(p, [[9, 10, 11, 12]] * 4)
        return ([assigned(p, c) for c in together], [assigned(p, c) for c in first], [assigned(p, c) for c in second])

    together, first, second = asyncio.run(scenario())
    assert together[0] == together[1] != together[2] == together[3]
    assert len(set(first)) == 1 and set(first) == set(second) == {PODS[0].id}


def test_a_full_batch_refuses_the_next_request() -> None:
    p = producer(windowDurationMs=50, maxBatchSize=2)

    async def scenario() -> list[object]:
        contexts = [context(PROMPT, request_id=f"r{i}") for i in range(3)]
        return [*await asyncio.gather(*(p.produce_async(c) for c in contexts), return_exceptions=True), contexts]

    *results, contexts = asyncio.run(scenario())
    assert results[:2] == [None, None]
    assert isinstance(results[2], RuntimeError) and str(results[2]) == "burst prefix batch full: maxBatchSize 2 reached"
    assert p.batch_full == 1
    assert assigned(p, contexts[0]) == assigned(p, contexts[1]) != ""  # type: ignore[index]
    assert infos(p, contexts[2]) == {}  # type: ignore[index]


def test_a_request_cancelled_before_the_seal_gets_no_match_info() -> None:
    p = producer(windowDurationMs=10000)

    async def scenario() -> SchedulingContext:
        ctx = context(PROMPT)
        task = asyncio.create_task(p.produce_async(ctx))
        await until(lambda: p._batch is not None and len(p._batch.entries) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return ctx

    assert infos(p, asyncio.run(scenario())) == {}


def test_the_produce_timeout_is_the_window_plus_a_margin() -> None:
    assert producer(windowDurationMs=250).produce_timeout_seconds == pytest.approx(0.55)


def test_dry_runs_and_requests_without_tokens_do_not_join_a_batch() -> None:
    p = producer(windowDurationMs=10000)

    async def scenario() -> None:
        dry = context(PROMPT)
        dry.dry_run = True
        await p.produce_async(dry)
        await p.produce_async(SchedulingContext(LLMRequest("r", "m"), PODS))
        assert p._batch is None and infos(p, dry) == {}

    asyncio.run(scenario())


def test_through_the_router_a_burst_lands_on_one_pod() -> None:
    loaded = load("""
plugins:
- {type: burst-prefix-cache-producer, parameters: {windowDurationMs: 30, blockSizeTokens: 4}}
- {type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: burst-prefix-cache-producer}}
- {type: max-score-picker}
""")
    assert [w for w in loaded.warnings if "Alpha" in w]  # llm-d would want --allow-experimental-plugins
    router = router_for(loaded, PODS)

    async def burst() -> set[str]:
        requests = [LLMRequest(f"r{i}", "m", TokenizedPrompt("m", (tokens_to_le32(PROMPT),))) for i in range(6)]
        decisions = await asyncio.gather(*(router.route(r) for r in requests))
        return {d.destination for d in decisions}

    assert len(asyncio.run(burst())) == 1


@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        ("windowDurationMs", 0, "> 0 and <= 10000"),
        ("windowDurationMs", 10001, "> 0 and <= 10000"),
        ("maxPerReplica", 0, "-1 (unlimited) or >= 1"),
        ("maxPerReplica", -2, "-1 (unlimited) or >= 1"),
        ("blockSizeTokens", 0, "> 0"),
        ("maxPrefixTokensToMatch", 3, "0 or >= blockSizeTokens (4)"),
        ("maxPrefixTokensToMatch", -1, "0 or >= blockSizeTokens (4)"),
        ("minColocateBlocks", -1, ">= 0"),
        ("maxBatchSize", 0, "-1 (unlimited) or >= 1"),
        ("balanceBy", "bogus", '"requests" or "tokens"'),
    ],
)
def test_invalid_parameters_are_llm_d_s_errors(key: str, value: object, rule: str) -> None:
    with pytest.raises(ConfigError) as info:
        producer(**{key: value})
    assert info.value.path == f"plugins[0].parameters.{key}"
    assert info.value.message.startswith(f"invalid configuration: {key} must be {rule} (current value: ")


def test_defaults_and_block_caps() -> None:
    section = Section({}, "p", "burst-prefix-cache-producer")
    config = BurstPrefixCacheProducer.from_parameters("b", section, Services()).config
    assert (config.window_seconds, config.max_per_replica, config.block_size_tokens, config.max_prefix_blocks,
            config.min_colocate_blocks, config.max_batch_size, config.balance_by_tokens) == (
        0.1, -1, 64, 2048, 0, 1000, False)  # fmt: skip
    assert producer(maxPrefixTokensToMatch=10).config.max_prefix_blocks == 2
    with pytest.raises(ConfigError, match="unknown key 'windowMs'"):
        producer(windowMs=5)
