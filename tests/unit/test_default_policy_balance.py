"""The embedded default policy spreads new prefixes evenly and keeps each on its engine.

The routing benchmark's workload (tenants' shared contexts, BENCHMARKS §12 round 5): every tenant
stays on the engine its first request went to, so the balance is decided by where the cold
requests go. Placing them by the momentary in-flight count put up to 4 of 8 tenants on one of
4 engines (requests finish between tenants' first requests, so "idle now" says nothing about
the tenants an engine already serves); the ``no-hit-lru-scorer`` rotates them (llm-d's
``optimized-baseline`` configuration does the same).
"""

from __future__ import annotations

import asyncio
from collections import Counter

from epp_helpers import router_for

from ppc_extproc.config.epp import load_config
from ppc_extproc.framework import Endpoint, LLMRequest, ResponseInfo
from ppc_extproc.ids import EndpointId
from ppc_extproc.scheduling.router import Decision, Router
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

ENDPOINTS = [Endpoint(f"10.0.0.{i}", 8000) for i in range(1, 5)]
CONTEXT_TOKENS = 2048


def prompt(tenant: int, question: int) -> list[int]:
    """A tenant's context followed by one of its questions (256 tokens)."""
    base = 100_000 * (tenant + 1)
    return [*range(base, base + CONTEXT_TOKENS), *range(base + 50_000 + 256 * question, base + 50_256 + 256 * question)]


def route(router: Router, request_id: str, tokens: list[int]) -> Decision:
    request = LLMRequest(request_id, "m", TokenizedPrompt("m", (tokens_to_le32(tokens),)))
    return asyncio.run(router.route(request))


def finish(router: Router, decision: Decision) -> None:
    router.response_complete(decision.ctx, ResponseInfo(decision.ctx.request.request_id, decision.primary.id))


def test_cold_prefixes_that_arrive_one_at_a_time_are_spread_evenly_and_stay() -> None:
    router = router_for(load_config(None), ENDPOINTS)
    home: dict[int, EndpointId] = {}
    for tenant in range(8):  # each finishes before the next arrives: every engine is idle then
        decision = route(router, f"t{tenant}", prompt(tenant, 0))
        home[tenant] = decision.primary.id
        finish(router, decision)
        for question in range(1, 4):  # warm (the speculative entries): where its context is
            decision = route(router, f"t{tenant}q{question}", prompt(tenant, question))
            assert decision.primary.id == home[tenant]
            finish(router, decision)
    assert sorted(Counter(home.values()).values()) == [2, 2, 2, 2]
    assert len(router.inflight) == 0


def test_concurrent_cold_prefixes_are_spread_evenly() -> None:
    router = router_for(load_config(None), ENDPOINTS)
    decisions = [route(router, f"t{tenant}", prompt(tenant, 0)) for tenant in range(8)]  # none finishes
    assert sorted(Counter(d.primary.id for d in decisions).values()) == [2, 2, 2, 2]
    assert sorted(router.inflight.requests(e.id) for e in ENDPOINTS) == [2, 2, 2, 2]
