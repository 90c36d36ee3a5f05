"""The router runs the producers: failures never fail a request, dependants are skipped, a
client's mistake is the client's error, and dry runs leave no trace.

Follows ``llm-d/llm-d-router: pkg/epp/requestcontrol/director.go`` (``runDataProducerPlugins``:
a producer error or timeout is logged and the request is scheduled anyway) with ppc-extproc's
refinement: producers that do not depend on the failed one still run.
"""

from __future__ import annotations

import asyncio

import fw_plugins
import pytest
import structlog
from epp_helpers import extproc_request, load, router_for

from ppc_extproc.errors import BadRequestError
from ppc_extproc.framework import Endpoint, LLMRequest, ResponseInfo
from ppc_extproc.plugins.producers.approx_prefix_cache import ApproxPrefixCacheProducer
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

A, B = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000)


def test_a_failing_producer_skips_its_dependants_and_nothing_else() -> None:
    loaded = load("plugins: [{type: random-picker}, {type: fwtests-f}, {type: fwtests-g}, {type: fwtests-h}, {type: fwtests-i}]\n")
    router = router_for(loaded, [A])
    with structlog.testing.capture_logs() as logs:
        decision = asyncio.run(router.route(LLMRequest("r", "m")))
    assert decision.primary == A  # the request is routed
    assert fw_plugins.ran(decision.ctx) == ["fwtests-f", "fwtests-i"]  # g reads f's data, h reads g's
    (failure,) = [e for e in logs if e["event"] == "producer_failed"]
    assert failure["producer"] == "fwtests-f" and failure["log_level"] == "error"


def test_a_timed_out_producer_is_a_failed_one() -> None:
    loaded = load("plugins: [{type: random-picker}, {type: fwtests-hang}, {type: fwtests-j}, {type: fwtests-i}]\n")
    router = router_for(loaded, [A])
    decision = asyncio.run(router.route(LLMRequest("r", "m")))
    assert fw_plugins.ran(decision.ctx) == ["fwtests-hang", "fwtests-i"]


def test_a_request_error_from_a_producer_is_the_clients_error() -> None:
    loaded = load("plugins: [{type: random-picker}, {type: fwtests-bad-request}, {type: fwtests-i}]\n")
    router = router_for(loaded, [A])
    with pytest.raises(BadRequestError, match=r"messages\[0\]\.content: expected a string"):
        asyncio.run(router.route(LLMRequest("r", "m")))
    assert len(router.inflight) == 0
    (reply,) = asyncio.run(extproc_request(router, "/v1/completions", b'{"model": "m", "prompt": [1, 2]}'))
    assert reply.immediate_response.status.code == 400
    assert reply.immediate_response.body == b"inference error: BadRequest - messages[0].content: expected a string"


APPROX = """
plugins:
- {type: approx-prefix-cache-producer, parameters: {autoTune: false, blockSizeTokens: 64}}
- {type: prefix-cache-scorer}
- {type: active-request-scorer}
"""


def _request(request_id: str) -> LLMRequest:
    return LLMRequest(request_id, "m", TokenizedPrompt("m", (tokens_to_le32(range(256)),)))


def test_a_dry_run_calls_no_pre_request_hook_and_counts_nothing_in_flight() -> None:
    loaded = load(APPROX)
    approx = loaded.plugins["approx-prefix-cache-producer"]
    assert isinstance(approx, ApproxPrefixCacheProducer) and approx in loaded.pipeline.pre_request
    router = router_for(loaded, [A, B])
    dry = asyncio.run(router.route(_request("dry"), dry_run=True))
    assert dry.ctx.dry_run and dry.primary in (A, B)
    assert approx.blocks_per_endpoint() == {}  # pre_request would record the blocks
    assert len(router.inflight) == 0
    real = asyncio.run(router.route(_request("real")))
    assert approx.blocks_per_endpoint() == {real.primary.id: 4}
    assert len(router.inflight) == 1 and router.inflight.requests(real.primary.id) == 1
    router.response_complete(real.ctx, ResponseInfo("real", real.primary.id))
    assert len(router.inflight) == 0
