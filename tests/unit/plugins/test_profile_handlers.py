"""``single-profile-handler`` and ``data-parallel-profile-handler``.

Ports ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/profilehandler/single/single_profile_handler_test.go``
and ``…/dataparallel/dp_profile_handler_test.go`` (``x-data-parallel-host-port`` from
``pkg/common/routing/common.go``), and checks ppc-extproc's fix of llm-d's speculative entries:
they are seeded under the rank's id, not the rewritten ``ip:primaryPort``.
"""

from __future__ import annotations

import asyncio

import pytest
from epp_helpers import config_error, epp, extproc_request, load, router_for
from integration.extproc.harness import metadata_destination, set_headers

from ppc_extproc.errors import SchedulingError
from ppc_extproc.framework import Endpoint, LLMRequest, ProfileResult, SchedulingContext
from ppc_extproc.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer
from ppc_extproc.plugins.profile_handlers import DataParallelProfileHandler, SingleProfileHandler
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

RANK0 = Endpoint("10.0.0.1", 8001, rank=0)
RANK1 = Endpoint("10.0.0.1", 8002, rank=1)
OTHER = Endpoint("10.0.0.2", 8001, rank=0)
CTX = SchedulingContext(LLMRequest("r", "m"), [RANK0, RANK1, OTHER])


# --- single-profile-handler ---------------------------------------------------------------------------


def test_single_handler_runs_every_profile_once() -> None:
    handler = SingleProfileHandler()
    assert handler.pick_profiles(CTX, ["default"], {}) == ["default"]
    assert handler.pick_profiles(CTX, ["default"], {"default": ProfileResult([RANK1])}) == []


def test_single_handler_result_is_the_profile_pick() -> None:
    result = SingleProfileHandler().process_results(CTX, {"default": ProfileResult([RANK1, RANK0])})
    assert result.primary_profile == "default"
    assert result.targets == [RANK1, RANK0] and result.destinations == [RANK1.id, RANK0.id]
    assert result.headers == []


def test_single_handler_refuses_several_results() -> None:
    with pytest.raises(SchedulingError, match="single profile handler is intended to be used with a single profile"):
        SingleProfileHandler().process_results(CTX, {"a": ProfileResult([RANK0]), "b": ProfileResult([RANK1])})


# --- data-parallel-profile-handler --------------------------------------------------------------------


@pytest.mark.parametrize("port", [-1, 65536])
def test_primary_port_out_of_range_is_an_error(port: int) -> None:
    error = config_error(epp(f"plugins: [{{type: data-parallel-profile-handler, parameters: {{primaryPort: {port}}}}}]\n"))
    assert error.path == "plugins[0].parameters.primaryPort"
    assert error.message == f"invalid primaryPort: must be between 1 and 65535, got {port}"


def test_primary_port_defaults_to_8000_and_the_handler_is_deprecated() -> None:
    loaded = load("plugins: [{type: data-parallel-profile-handler}, {type: random-picker}]\n")
    assert isinstance(loaded.handler, DataParallelProfileHandler) and loaded.handler.primary_port == 8000
    (warning,) = loaded.warnings
    assert "data-parallel-profile-handler is deprecated" in warning


def test_primary_port_zero_is_accepted_as_llm_d_accepts_it() -> None:
    loaded = load("plugins: [{type: data-parallel-profile-handler, parameters: {primaryPort: 0}}, {type: random-picker}]\n")
    assert isinstance(loaded.handler, DataParallelProfileHandler) and loaded.handler.primary_port == 8000
    assert any("primaryPort: 0 means the default 8000" in w for w in loaded.warnings)


def test_primary_port_must_be_an_integer() -> None:
    error = config_error(epp("plugins: [{type: data-parallel-profile-handler, parameters: {primaryPort: '80x'}}]\n"))
    assert error.path == "plugins[0].parameters.primaryPort" and "expected an integer" in error.message


def test_dp_handler_header_names_the_rank_and_destinations_the_primary_port() -> None:
    handler = DataParallelProfileHandler(primary_port=8000)
    assert handler.pick_profiles(CTX, ["default"], {}) == ["default"]
    assert handler.pick_profiles(CTX, ["default"], {"default": ProfileResult([RANK1])}) == []
    result = handler.process_results(CTX, {"default": ProfileResult([RANK1, OTHER])})
    assert result.headers == [("x-data-parallel-host-port", "10.0.0.1:8002")]
    assert result.destinations == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert result.targets == [RANK1, OTHER]  # match info and speculative entries use the rank ids


def test_dp_handler_brackets_ipv6_in_the_header() -> None:
    v6 = Endpoint("fd00::1", 8003, rank=3)
    result = DataParallelProfileHandler(primary_port=9000).process_results(CTX, {"default": ProfileResult([v6])})
    assert result.headers == [("x-data-parallel-host-port", "[fd00::1]:8003")]
    assert result.destinations == ["fd00::1:9000"]


def test_dp_handler_refuses_several_results() -> None:
    with pytest.raises(SchedulingError):
        DataParallelProfileHandler().process_results(CTX, {"a": ProfileResult([RANK0]), "b": ProfileResult([RANK1])})


DP_PRECISE = """
plugins:
- type: precise-prefix-cache-producer
  parameters: {tokenProcessorConfig: {blockSizeTokens: 16}, speculativeIndexing: true, kvEventsConfig: {discoverPods: false}}
- {type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- {type: data-parallel-profile-handler, parameters: {primaryPort: 8000}}
"""
PROMPT = [*range(64)]


def test_through_the_router_speculative_entries_are_seeded_under_the_rank_id() -> None:
    loaded = load(DP_PRECISE)
    precise = loaded.plugins["precise-prefix-cache-producer"]
    assert isinstance(precise, PrecisePrefixCacheProducer)
    router = router_for(loaded, [RANK0, RANK1, OTHER])
    request = LLMRequest("r1", "m", TokenizedPrompt("m", (tokens_to_le32(PROMPT),)))
    decision = asyncio.run(router.route(request))
    rank = decision.result.targets[0]
    assert decision.destination == f"{rank.address}:8000"
    assert decision.result.headers == [("x-data-parallel-host-port", rank.id)]
    assert precise.index.entries_per_endpoint() == {rank.id: 4}  # never "ip:8000"
    again = asyncio.run(router.route(LLMRequest("r2", "m", TokenizedPrompt("m", (tokens_to_le32(PROMPT),)))))
    assert again.result.targets[0] == rank  # the repeat follows the speculative entries of the rank
    assert again.ctx.match_info(rank.id).match_blocks == 4  # type: ignore[union-attr]


def test_through_ext_proc_the_header_and_the_primary_port_go_on_the_wire() -> None:
    loaded = load(DP_PRECISE)
    router = router_for(loaded, [RANK1])
    replies = asyncio.run(extproc_request(router, "/v1/completions", b'{"model": "m", "prompt": [1, 2, 3]}'))
    headers = set_headers(replies[0])
    assert headers["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    assert headers["x-data-parallel-host-port"] == "10.0.0.1:8002"
    assert metadata_destination(replies[0]) == "10.0.0.1:8000"
