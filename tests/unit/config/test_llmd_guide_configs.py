"""The llm-d guides' configs that list ``inflight-load-producer`` explicitly (llm-d/llm-d
``guides/optimized-baseline`` and ``guides/precise-prefix-cache-aware``, restated in flow style)
load, and the producer writes the in-flight load under its data key."""

from __future__ import annotations

import asyncio

from epp_helpers import epp, pipeline, router_for

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.framework import Endpoint, LLMRequest, SchedulingContext
from ppc_extproc.plugins.producers.inflight_load import InflightLoadProducer, in_flight_load
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

OPTIMIZED_BASELINE = """
plugins:
- type: approx-prefix-cache-producer
- type: inflight-load-producer
- type: prefix-cache-affinity-filter
- type: token-load-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: token-load-scorer
"""

PRECISE_ROUTING = """
plugins:
- type: precise-prefix-cache-producer
  name: precise-prefix-cache-producer
  parameters:
    speculativeIndexing: false
    indexerConfig:
      kvBlockIndexConfig: {inMemoryConfig: {podCacheSize: 128}}
      kvCacheBackendConfigs: [{name: gpu, weight: 1.0}, {name: cpu, weight: 0.0}]
    tokenProcessorConfig: {blockSize: 64}
    kvEventsConfig: {topicFilter: "kv@", discoverPods: true, podDiscoveryConfig: {socketPort: 5557}}
- type: inflight-load-producer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
- type: prefix-cache-affinity-filter
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
    inFlightLoadProducerName: inflight-load-producer
    affinityThreshold: 0.80
    explorationProbability: 0.0
    maxTTFTPenaltyMs: 18000
    ttftSource: prefillThroughput
    peakPrefillThroughput: 3585
- type: token-load-scorer
- type: max-score-picker
"""


def test_optimized_baseline_loads_with_the_producer() -> None:
    loaded = load_config_text(epp(OPTIMIZED_BASELINE), "optimized-baseline")
    resolved = pipeline(loaded)
    assert resolved["profiles"]["default"]["filters"] == ["prefix-cache-affinity-filter"]
    assert resolved["profiles"]["default"]["scorers"] == [("token-load-scorer", 1.0)]
    assert "inflight-load-producer" in resolved["producers"]
    # token ids before it: it counts prompt tokens
    assert resolved["producers"].index("token-producer[estimate]") < resolved["producers"].index("inflight-load-producer")
    assert not [w for w in loaded.warnings if "inflight" in w]


def test_precise_routing_loads_and_orders_the_producer_after_the_match_info_it_reads() -> None:
    loaded = load_config_text(epp(PRECISE_ROUTING), "precise-routing")
    producers = pipeline(loaded)["producers"]
    assert producers.index("precise-prefix-cache-producer") < producers.index("inflight-load-producer")


def test_the_producer_writes_the_live_in_flight_load() -> None:
    loaded = load_config_text(epp(OPTIMIZED_BASELINE), "optimized-baseline")
    producer = loaded.plugins["inflight-load-producer"]
    assert isinstance(producer, InflightLoadProducer)
    endpoints = [Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000)]
    router = router_for(loaded, endpoints)
    tokens = tokens_to_le32(list(range(64)))
    first = LLMRequest("r1", "m", TokenizedPrompt("m", (tokens,)), "/v1/completions", {})
    decision = asyncio.run(router.route(first))
    view = in_flight_load(decision.ctx)
    assert view is not None and view.requests(decision.primary.id) == 1 and view.tokens(decision.primary.id) == 64
    ctx = SchedulingContext(first, endpoints)
    producer.produce(ctx)
    assert in_flight_load(ctx) is view  # one reference per request, read live
    router.response_started("r1")
    assert view.tokens(decision.primary.id) == 0 and view.requests(decision.primary.id) == 1


def test_parameters_as_llm_d() -> None:
    loaded = load_config_text(epp("""
plugins:
- type: inflight-load-producer
  parameters: {addEstimatedOutputTokens: true, outputRatio: 0.2, maxEstimatedOutputTokens: 1000,
               syncCrossReplicaState: false}
- type: token-load-scorer
  parameters: {queueThresholdTokens: 11264000}
- type: max-score-picker
"""))
    assert any("addEstimatedOutputTokens: output tokens are not estimated" in w for w in loaded.warnings)
