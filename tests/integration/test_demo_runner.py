"""The workload runner and the oracle against in-process mock engines (no Envoy, no service).

Checks what the demo and the benchmark rely on: streamed records (TTFT before the end, the
serving endpoint, usage), multi-turn prompts that hit the cache with the engine's own answers,
and the oracle sending each tenant back to the engine that holds its context.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from ppc_extproc_lab.mock_vllm.server import MockVllmOptions, serve
from ppc_extproc_lab.workload.generator import Workload, arrivals
from ppc_extproc_lab.workload.oracle import OracleTarget
from ppc_extproc_lab.workload.report import summarize
from ppc_extproc_lab.workload.runner import RunResult, WorkloadRunner
from ppc_extproc_lab.workload.spec import Stage, WorkloadSpec

pytestmark = pytest.mark.integration

SPEC = WorkloadSpec(
    tenants=2, users_per_tenant=2, context_tokens=256, question_tokens=32, output_tokens=8,
    turns_per_session=3, seed=3,
)  # fmt: skip
ENGINES = MockVllmOptions(
    port=0,
    kv_events_endpoint="",
    block_size=16,
    num_blocks=512,
    prefill_tokens_per_s=100_000.0,
    decode_ms_per_token=2.0,
)


def run(options: MockVllmOptions, oracle: bool, stages: list[Stage], **runner_args: Any) -> tuple[RunResult, list[str]]:
    async def scenario() -> tuple[RunResult, list[str]]:
        async with serve(options) as fleet:
            urls = [e.url for e in fleet.engines]
            target = OracleTarget(urls, seed=1) if oracle else urls[0]
            runner = WorkloadRunner(
                Workload(SPEC),
                arrivals(SPEC, stages),
                target,
                schedule_s=sum(s.duration_s for s in stages),
                **runner_args,
            )
            return await runner.run(), [e.endpoint for e in fleet.engines]

    return asyncio.run(asyncio.wait_for(scenario(), 60))


def test_records_stream_usage_endpoint_and_multi_turn_hits() -> None:
    result, endpoints = run(ENGINES, oracle=False, stages=[Stage(40, 1.0)], deadline_s=30)
    records = result.records
    assert records and all(r.ok for r in records), [r.error for r in records if not r.ok]
    for r in records:
        assert r.endpoint == endpoints[0]
        assert r.output_tokens == SPEC.output_tokens
        assert r.prompt_tokens == SPEC.prompt_tokens(r.turn)
        assert r.ttft_s is not None and r.latency_s is not None and 0 < r.ttft_s <= r.latency_s
        assert r.sent_s is not None and r.sent_s >= r.scheduled_s
    # Every turn after the first re-sends the previous prompt + the engine's answer: with a
    # roomy cache the hit covers the previous turn's full blocks (the KV of the last answer
    # token is never computed, as in vLLM).
    later = [r for r in records if r.turn > 0]
    assert later
    for r in later:
        computed = SPEC.prompt_tokens(r.turn - 1) + SPEC.output_tokens - 1
        assert r.cached_tokens is not None and r.cached_tokens >= computed // 16 * 16
    s = summarize("one", records, endpoints=endpoints)
    assert s.completed == len(records) and s.errors == 0 and 0.5 < s.hit_rate < 1
    assert result.loop_lag_p99_s < 0.5


def test_deadline_cuts_off_and_counts_unfinished() -> None:
    slow = replace(ENGINES, decode_ms_per_token=200.0)  # 8 tokens ⇒ ≥ 1.6 s per request
    result, _ = run(slow, oracle=False, stages=[Stage(20, 1.0)], deadline_s=1.0)
    assert result.deadline_hit
    s = summarize("slow", result.records)
    assert s.unfinished > 0 and s.errors == 0
    assert s.completed + s.unfinished == len(result.records)


def test_oracle_follows_the_cache() -> None:
    two = replace(ENGINES, count=2)
    result, endpoints = run(two, oracle=True, stages=[Stage(15, 2.0)], deadline_s=30)
    records = [r for r in result.records if r.ok]
    assert len(records) == len(result.records) > 4
    # Once a tenant's first request is done, its context is cached on the engine that served it:
    # every later request of the tenant is routed to an engine holding it, and hits.
    first_done: dict[int, float] = {}
    for r in records:
        assert r.done_s is not None
        first_done[r.tenant] = min(first_done.get(r.tenant, r.done_s), r.done_s)
    later = [r for r in records if r.sent_s is not None and r.sent_s > first_done[r.tenant]]
    assert later
    assert all(r.cached_tokens is not None and r.cached_tokens >= SPEC.context_tokens for r in later)
    assert {r.endpoint for r in records} <= set(endpoints)
