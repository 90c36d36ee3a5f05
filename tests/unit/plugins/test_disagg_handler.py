"""``disagg-profile-handler`` and its deciders, run through the router over labelled endpoints.

Ports the cases of ``llm-d/llm-d-router: pkg/epp/framework/plugins/scheduling/profilehandler/disagg/``
``disagg_profile_handler_test.go`` and ``prefix_based_pd_decider_test.go`` (decode first, decider
gating, legacy parameters, prefill-first), plus what llm-d lacks: a prompt shorter than one block
is decided, and an unhealthy prefill pick is replaced or dropped (local prefill) without failing.
"""

from __future__ import annotations

import pytest
from epp_helpers import config_error, epp, load
from pd_helpers import DECODERS, PREFILLERS, decide, pd_config, prompt, router
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from ppc_extproc.framework import DISAGG_PEER
from ppc_extproc.observability.llmd_metrics import disagg_families
from ppc_extproc.plugins.profile_handlers.disagg import DisaggProfileHandler
from ppc_extproc.plugins.profile_handlers.disagg_stages import ENCODER_HEADER, PREFILL_HEADER

DECODE_IDS = {e.id for e in DECODERS}
PREFILL_IDS = {e.id for e in PREFILLERS}


def header(decision: object, name: str = PREFILL_HEADER) -> str | None:
    return dict(decision.result.headers).get(name)  # type: ignore[attr-defined]


def counts(loaded: object) -> dict[tuple[str, str, str], int]:
    handler = loaded.handler  # type: ignore[attr-defined]
    assert isinstance(handler, DisaggProfileHandler)
    return dict(handler.counters.counts)


def test_a_long_uncached_prompt_is_disaggregated_decode_first() -> None:
    loaded = pd_config()
    decision = decide(router(loaded), prompt(300))
    assert decision.primary.id in DECODE_IDS  # the destination is the decode pick
    assert decision.destination == decision.primary.id
    prefiller = header(decision)
    assert prefiller in PREFILL_IDS
    assert decision.result.kv_source is not None and decision.result.kv_source.id == prefiller
    assert set(decision.result.remove_headers) >= {PREFILL_HEADER, ENCODER_HEADER}  # inbound values dropped
    assert decision.ctx.get(DISAGG_PEER) == decision.primary  # published for the prefill profile
    assert counts(loaded) == {("disagg", "m", "prefill-decode"): 1}


def test_a_prompt_below_non_cached_tokens_stays_on_the_decode_engine() -> None:
    loaded = pd_config()
    decision = decide(router(loaded), prompt(10))
    assert header(decision) is None and decision.result.kv_source is None
    assert decision.primary.id in DECODE_IDS
    assert counts(loaded) == {("disagg", "m", "decode-only"): 1}


def test_a_prompt_shorter_than_one_block_is_still_decided() -> None:
    """40 tokens, no full 64-token block, no match info: decided on its count (llm-d skips it)."""
    decision = decide(router(pd_config(threshold=32)), prompt(40))
    assert header(decision) in PREFILL_IDS


def test_a_well_cached_prompt_is_decided_decode_only_on_the_engine_holding_it() -> None:
    """The approximate producer counts the trailing partial block (5 blocks of 64 for 300 tokens)."""
    loaded = pd_config()
    r = router(loaded)
    first = decide(r, prompt(300), "r1")
    assert header(first) in PREFILL_IDS
    again = decide(r, prompt(400), "r2")  # 5 blocks (320 tokens) cached on the first decode pick
    assert again.primary == first.primary
    assert header(again) in PREFILL_IDS  # 400 − 320 = 80 ≥ 16
    cached = decide(r, prompt(330), "r3")  # 330 − 320 = 10 uncached < 16
    assert header(cached) is None and cached.primary == first.primary
    assert counts(loaded)[("disagg", "m", "decode-only")] == 1


def test_non_cached_tokens_zero_disables_the_decider() -> None:
    loaded = pd_config(threshold=0)
    assert any("nonCachedTokens" in w for w in loaded.warnings)
    assert header(decide(router(loaded), prompt(5000))) is None


def test_prompt_tokens_gates_short_prompts() -> None:
    loaded = load(epp_pd(decider="{nonCachedTokens: 16, promptTokens: 500}"))
    assert header(decide(router(loaded), prompt(400))) is None
    assert header(decide(router(loaded), prompt(600))) in PREFILL_IDS


def epp_pd(handler: str = "{deciders: {prefill: prefix-based-pd-decider}}", decider: str = "{nonCachedTokens: 16}") -> str:
    return f"""
plugins:
- {{type: prefill-filter}}
- {{type: decode-filter}}
- {{type: disagg-profile-handler, parameters: {handler}}}
- {{type: prefix-based-pd-decider, parameters: {decider}}}
schedulingProfiles:
- {{name: prefill, plugins: [{{pluginRef: prefill-filter}}]}}
- {{name: decode, plugins: [{{pluginRef: decode-filter}}]}}
"""


def test_the_decider_reads_the_named_match_info_producer() -> None:
    loaded = load("""
plugins:
- {type: precise-prefix-cache-producer, parameters: {tokenProcessorConfig: {blockSizeTokens: 16}}}
- {type: prefill-filter}
- {type: decode-filter}
- {type: disagg-profile-handler, parameters: {deciders: {prefill: pd}}}
- {type: prefix-based-pd-decider, name: pd,
   parameters: {nonCachedTokens: 16, prefixMatchInfoProducerName: precise-prefix-cache-producer}}
schedulingProfiles:
- {name: prefill, plugins: [{pluginRef: prefill-filter}]}
- {name: decode, plugins: [{pluginRef: decode-filter}]}
""")
    names = [p.name for p in loaded.roles.producers]
    assert "approx-prefix-cache-producer" not in names  # nothing reads the default producer
    decision = decide(router(loaded), prompt(100))
    assert header(decision) in PREFILL_IDS  # 100 uncached tokens on the precise producer's view


def test_without_a_decider_the_prefill_stage_never_runs() -> None:
    loaded = load(epp_pd(handler="{}"))
    assert header(decide(router(loaded), prompt(5000))) is None


def test_legacy_flat_parameters_load_with_warnings() -> None:
    loaded = load(epp_pd(handler="{decodeProfile: decode, deciderPluginName: prefix-based-pd-decider}"))
    assert any("flat parameter format" in w for w in loaded.warnings)
    assert any("deciderPluginName" in w and "deciders.prefill" in w for w in loaded.warnings)
    assert header(decide(router(loaded), prompt(300))) in PREFILL_IDS


def test_mixed_forms_and_unknown_deciders_are_errors_naming_the_field() -> None:
    mixed = config_error(epp(epp_pd(handler="{prefillProfile: p, deciders: {prefill: prefix-based-pd-decider}}")))
    assert mixed.path == "plugins[2].parameters.prefillProfile" and "one format exclusively" in mixed.message
    missing = config_error(epp(epp_pd(handler="{deciders: {prefill: nope}}")))
    assert missing.path == "plugins[2].parameters.deciders.prefill"
    assert "deciders.prefill plugin not found: nope" in missing.message
    wrong = config_error(epp(epp_pd(handler="{deciders: {prefill: decode-filter}}")))
    assert "does not implement" in wrong.message
    order = config_error(epp(epp_pd(handler="{stageOrder: bogus}")))
    assert order.path == "plugins[2].parameters.stageOrder"
    negative = config_error(epp(epp_pd(decider="{nonCachedTokens: -1}")))
    assert negative.path == "plugins[3].parameters.nonCachedTokens"


def test_prefill_first_runs_prefill_then_decode_with_the_prefill_pick_as_peer() -> None:
    loaded = load(epp_pd(handler="{stageOrder: Prefill_First}"))
    decision = decide(router(loaded), prompt(4))
    assert header(decision) in PREFILL_IDS and decision.primary.id in DECODE_IDS
    assert decision.ctx.get(DISAGG_PEER) is not None and decision.ctx.get(DISAGG_PEER).id == header(decision)
    error = config_error(epp(epp_pd(handler="{stageOrder: prefill-first, deciders: {prefill: prefix-based-pd-decider}}")))
    assert "prefill decider is not supported in prefill-first stage order" in error.message


def test_no_decode_endpoint_is_a_429_and_no_prefill_endpoint_is_local_prefill() -> None:
    from ppc_extproc.errors import SaturatedError

    loaded = pd_config()
    with pytest.raises(SaturatedError):
        decide(router(loaded, PREFILLERS), prompt(300))
    decision = decide(router(pd_config(), DECODERS), prompt(300))
    assert header(decision) is None and decision.primary.id in DECODE_IDS


# --- failure: the prefill pick is health-checked -------------------------------------------------


def test_a_held_down_prefiller_is_replaced_by_the_other() -> None:
    loaded = pd_config()
    r = router(loaded)
    first = header(decide(r, prompt(300), "r1"))
    loaded.services.health.upstream(first, False)  # type: ignore[arg-type]
    for i in range(5):
        assert header(decide(r, prompt(300, start=1000 * (i + 1)), f"r{i + 2}")) == (PREFILL_IDS - {first}).pop()


def test_a_prefiller_whose_kv_subscriber_lost_its_engine_is_replaced() -> None:
    loaded = pd_config()
    r = router(loaded)
    health = loaded.services.health
    first = header(decide(r, prompt(300), "r1"))
    assert first is not None
    health.kv_connection(first, True)
    health.kv_connection(first, False)  # soft signal: still routable, but not for a prefill leg
    for i in range(5):
        assert header(decide(r, prompt(300, start=5000 * (i + 1)), f"r{i + 2}")) == (PREFILL_IDS - {first}).pop()


def test_with_every_prefiller_down_the_decode_engine_prefills_locally_and_it_is_counted() -> None:
    loaded = pd_config()
    r = router(loaded)
    health = loaded.services.health
    for e in PREFILLERS:
        health.kv_connection(e.id, True)
        health.kv_connection(e.id, False)
    decision = decide(r, prompt(300), "r1")
    assert header(decision) is None and decision.result.kv_source is None
    assert decision.primary.id in DECODE_IDS
    for e in PREFILLERS:
        health.upstream(e.id, False)  # held down too: the router leaves them out, the filter finds none
    assert header(decide(r, prompt(300, start=5000), "r2")) is None
    c = counts(loaded)
    assert c[("prefill_fallback", "m", "prefill_unhealthy")] == 1
    assert c[("prefill_fallback", "m", "no_prefill_endpoint")] == 1
    assert c[("disagg", "m", "decode-only")] == 2


def test_a_gateway_error_of_a_disaggregated_request_holds_its_prefiller_down() -> None:
    from ppc_extproc.framework import ResponseInfo

    loaded = pd_config()
    r = router(loaded)
    decision = decide(r, prompt(300), "r1")
    prefiller = header(decision)
    r.response_complete(decision.ctx, ResponseInfo("r1", decision.primary.id, status=502))
    assert loaded.services.health.suspect(prefiller)  # type: ignore[arg-type]
    assert header(decide(r, prompt(300, start=5000), "r2")) == (PREFILL_IDS - {prefiller}).pop()


# --- encode, metrics -----------------------------------------------------------------------------


def test_e_pd_sends_multimodal_requests_to_an_encoder() -> None:
    from pd_helpers import pod

    from ppc_extproc.tokens import MultimodalFeature, TokenizedPrompt

    loaded = load("""
plugins:
- {type: encode-filter}
- {type: decode-filter}
- {type: max-score-picker}
- {type: always-disagg-multimodal-decider}
- {type: disagg-profile-handler, parameters: {deciders: {encode: always-disagg-multimodal-decider}}}
schedulingProfiles:
- {name: encode, plugins: [{pluginRef: encode-filter}]}
- {name: decode, plugins: [{pluginRef: decode-filter}]}
""")
    encoder = pod(21, "encode")
    r = router(loaded, [*DECODERS, encoder])
    text = decide(r, prompt(50), "t")
    assert header(text, ENCODER_HEADER) is None
    base = prompt(50)
    image = TokenizedPrompt("m", base.prompts, (MultimodalFeature("abc", 4, 8),))
    decision = decide(r, image, "i")
    assert header(decision, ENCODER_HEADER) == encoder.id and decision.primary.id in DECODE_IDS
    assert counts(loaded) == {("disagg", "m", "decode-only"): 1, ("disagg", "m", "encode-decode"): 1}


def test_decisions_are_exported_under_llm_d_s_names() -> None:
    loaded = pd_config()
    r = router(loaded)
    decide(r, prompt(300), "a")
    decide(r, prompt(5), "b")

    class _C(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            return disagg_families([p.state() for p in loaded.roles.state_reporters])

    registry = CollectorRegistry()
    registry.register(_C())
    labels = {"plugin_name": "disagg-profile-handler", "plugin_type": "disagg-profile-handler", "model_name": "m"}
    assert registry.get_sample_value("llm_d_epp_disagg_decision_total", {**labels, "decision_type": "prefill-decode"}) == 1
    assert registry.get_sample_value("llm_d_epp_disagg_decision_total", {**labels, "decision_type": "decode-only"}) == 1
    assert registry.get_sample_value(
        "llm_d_inference_scheduler_disagg_decision_total", {"model_name": "m", "decision_type": "decode-only"}) == 1


def test_a_dry_run_decides_without_counting() -> None:
    import asyncio

    from ppc_extproc.framework import LLMRequest

    loaded = pd_config()
    p = prompt(300)
    decision = asyncio.run(router(loaded).route(LLMRequest("d", "m", p), dry_run=True))
    assert decision.result.kv_source is not None  # the decision is the same
    assert counts(loaded) == {}


def test_the_approximate_producer_remembers_the_prefill_endpoint_too() -> None:
    from ppc_extproc.plugins.producers.approx_prefix_cache import ApproxPrefixCacheProducer

    loaded = pd_config()
    decision = decide(router(loaded), prompt(300))
    approx = loaded.plugins["approx-prefix-cache-producer"]
    assert isinstance(approx, ApproxPrefixCacheProducer)
    held = approx.blocks_per_endpoint()
    assert decision.result.kv_source is not None
    assert held[decision.primary.id] == held[decision.result.kv_source.id] == 5
