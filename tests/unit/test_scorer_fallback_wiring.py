"""Match-info wiring through ``load_config_text``: unnamed consumers read the approximate
producer (llm-d's fallback), created when missing, with a warning when a precise producer is
configured; llm-d's precise-prefix example loads unchanged."""

from __future__ import annotations

import asyncio

import pytest
import structlog

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.enginemetrics import EngineMetrics, EngineMetricsStore
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import PREFIX_CACHE_MATCH_INFO, Endpoint, LLMRequest
from ppc_extproc.plugins.datalayer import MetricsDataSource
from ppc_extproc.plugins.filters import PrefixCacheAffinityFilter
from ppc_extproc.plugins.producers.approx_prefix_cache import ApproxPrefixCacheProducer
from ppc_extproc.plugins.producers.inflight_load import InflightLoadProducer
from ppc_extproc.plugins.registry import Services
from ppc_extproc.plugins.scorers import (
    NoHitLRUScorer,
    PrefixCacheScorer,
    QueueScorer,
    TokenLoadScorer,
)
from ppc_extproc.scheduling.pool import EndpointPool
from ppc_extproc.scheduling.router import Router
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

APPROX_KEY = PREFIX_CACHE_MATCH_INFO.of("approx-prefix-cache-producer")
A, B, C = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000), Endpoint("10.0.0.3", 8000)

# llm-d's precise-prefix EndpointPickerConfig example (llm-d-router docs), verbatim.
PRECISE_EXAMPLE = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: endpoint-notification-source
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {blockSizeTokens: 64}          # == vLLM --block-size
    speculativeIndexing: true                            # default false
    speculativeTTL: "2s"
    indexerConfig:
      kvBlockIndexConfig: {enableMetrics: true}
      kvCacheBackendConfigs: [{name: gpu, weight: 1.0}, {name: cpu, weight: 0.8}]
    kvEventsConfig:
      topicFilter: "kv@"
      concurrency: 8
      discoverPods: true
      podDiscoveryConfig: {socketPort: 5556, replaySocketPort: 5559}
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
- type: kv-cache-utilization-scorer
- type: queue-scorer
- type: no-hit-lru-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
- type: max-score-picker
dataLayer:
  sources:
  - pluginRef: endpoint-notification-source
    extractors: [{pluginRef: precise-prefix-cache-producer}]   # required when discoverPods: true
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: kv-cache-utilization-scorer, weight: 2.0}
  - {pluginRef: queue-scorer, weight: 2.0}
  - {pluginRef: prefix-cache-scorer, weight: 3.0}
  - {pluginRef: no-hit-lru-scorer, weight: 2.0}
  - {pluginRef: max-score-picker}
"""

HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def test_precise_example_loads_unchanged_without_warnings() -> None:
    with structlog.testing.capture_logs() as logs:
        loaded = load_config_text(PRECISE_EXAMPLE)
    assert [e for e in logs if e["event"] == "config_warning"] == [] and loaded.warnings == []
    assert "approx-prefix-cache-producer" not in loaded.plugins
    weights = {w.scorer.name: w.weight for w in loaded.profiles["default"].scorers}
    assert weights == {"kv-cache-utilization-scorer": 2.0, "queue-scorer": 2.0, "prefix-cache-scorer": 3.0,
                       "no-hit-lru-scorer": 2.0}
    precise = PREFIX_CACHE_MATCH_INFO.of("precise-prefix-cache-producer")
    assert loaded.plugins["prefix-cache-scorer"].match_key == precise
    assert loaded.plugins["no-hit-lru-scorer"].match_key == precise
    # Two scorers read engine metrics and no source is listed: llm-d's defaults are injected.
    source = loaded.plugins["metrics-data-source"]
    assert isinstance(source, MetricsDataSource) and not source.running  # the server starts it
    assert loaded.data_layer.polling_sources == [source]
    assert [e.name for e in source.extractors] == ["core-metrics-extractor"]
    store = loaded.services.engine_metrics
    assert loaded.plugins["queue-scorer"].metrics is store
    assert loaded.plugins["kv-cache-utilization-scorer"].metrics is store


def test_unnamed_scorer_reads_an_auto_created_approximate_producer() -> None:
    loaded = load_config_text(HEADER + "plugins:\n- type: prefix-cache-scorer\n")
    approx = loaded.plugins["approx-prefix-cache-producer"]
    assert isinstance(approx, ApproxPrefixCacheProducer) and approx in loaded.roles.producers
    assert loaded.plugins["prefix-cache-scorer"].match_key == APPROX_KEY == approx.match_key
    assert loaded.warnings == []


def test_every_unnamed_match_info_consumer_reads_the_default_approximate_producer() -> None:
    loaded = load_config_text(HEADER + """\
plugins:
- {type: approx-prefix-cache-producer, parameters: {autoTune: false, blockSizeTokens: 64}}
- type: prefix-cache-affinity-filter
- type: prefix-cache-scorer
- type: no-hit-lru-scorer
- type: token-load-scorer
""")
    for name in ("prefix-cache-affinity-filter", "prefix-cache-scorer", "no-hit-lru-scorer"):
        assert loaded.plugins[name].match_key == APPROX_KEY, name
    assert loaded.plugins["token-load-scorer"].match_key is None  # best of all producers
    assert isinstance(loaded.plugins["prefix-cache-affinity-filter"], PrefixCacheAffinityFilter)
    assert loaded.profiles["default"].filters == [loaded.plugins["prefix-cache-affinity-filter"]]
    assert isinstance(loaded.plugins["token-load-scorer"], TokenLoadScorer)
    assert loaded.paths["approx-prefix-cache-producer"] == "plugins[0]"  # the configured one, not a default
    producer = loaded.plugins["inflight-load-producer"]
    assert isinstance(producer, InflightLoadProducer) and producer.load is loaded.services.inflight
    assert loaded.plugins["token-load-scorer"].load_key == producer.key
    assert loaded.plugins["prefix-cache-affinity-filter"].load_key == producer.key


def test_an_approximate_producer_under_another_name_is_not_read_by_unnamed_consumers() -> None:
    loaded = load_config_text(HEADER + """\
plugins:
- {type: approx-prefix-cache-producer, name: history}
- type: prefix-cache-scorer
""")
    assert loaded.plugins["prefix-cache-scorer"].match_key == APPROX_KEY  # llm-d's key, as llm-d
    assert loaded.paths["approx-prefix-cache-producer"] == "(injected)"
    assert any("'history'" in w and "nothing reads" in w for w in loaded.warnings), loaded.warnings


def test_llm_d_token_load_guide_config_needs_no_approximate_producer() -> None:
    with structlog.testing.capture_logs() as logs:
        loaded = load_config_text(HEADER + """\
plugins:
- {type: precise-prefix-cache-producer, parameters: {tokenProcessorConfig: {blockSizeTokens: 64}}}
- type: prefix-cache-affinity-filter
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
- type: token-load-scorer
  parameters: {queueThresholdTokens: 4194304}
""")
    # The only warning: llm-d would give this unwired precise producer no KV events.
    assert [e["message"] for e in logs if e["event"] == "config_warning" and "discoverPods" not in e["message"]] == []
    assert "approx-prefix-cache-producer" not in loaded.plugins
    named = load_config_text(HEADER + """\
plugins:
- type: precise-prefix-cache-producer
- type: token-load-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
""")
    assert named.plugins["token-load-scorer"].match_key == PREFIX_CACHE_MATCH_INFO.of("precise-prefix-cache-producer")
    with pytest.raises(ConfigError, match="no producer named 'nope'"):
        load_config_text(HEADER + "plugins:\n- {type: token-load-scorer, parameters: {prefixMatchInfoProducerName: nope}}\n")


def test_warning_when_a_precise_producer_is_configured_but_not_named() -> None:
    text = HEADER + """\
plugins:
- type: precise-prefix-cache-producer
- type: prefix-cache-scorer
- type: no-hit-lru-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
"""
    with structlog.testing.capture_logs() as logs:
        loaded = load_config_text(text)
    warnings = [e for e in logs if e["event"] == "config_warning" and "discoverPods" not in e["message"]]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    assert "prefix-cache-scorer" in warnings[0]["message"]
    assert "prefixMatchInfoProducerName: precise-prefix-cache-producer" in warnings[0]["message"]
    assert loaded.plugins["prefix-cache-scorer"].match_key == APPROX_KEY
    assert loaded.plugins["no-hit-lru-scorer"].match_key == PREFIX_CACHE_MATCH_INFO.of("precise-prefix-cache-producer")


def test_routing_history_feeds_the_prefix_scorer_end_to_end() -> None:
    services = Services(engine_metrics=EngineMetricsStore(stale_after_seconds=None))
    loaded = load_config_text(HEADER + """\
plugins:
- {type: approx-prefix-cache-producer, parameters: {autoTune: false, blockSizeTokens: 64}}
- type: prefix-cache-scorer
- type: queue-scorer
- type: no-hit-lru-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: no-hit-lru-scorer, weight: 2}
""", services=services)
    for endpoint in (A, B, C):
        services.engine_metrics.set(endpoint.id, EngineMetrics(0, 0, 0.1, 16, 100, updated_at=0.0))  # type: ignore[union-attr]
    pool = EndpointPool()
    pool.replace([A, B, C])
    router = Router(pool, loaded.pipeline)
    assert isinstance(loaded.plugins["queue-scorer"], QueueScorer)
    assert isinstance(loaded.plugins["no-hit-lru-scorer"], NoHitLRUScorer)
    prompt = TokenizedPrompt("m", (tokens_to_le32(range(640)),))
    first = asyncio.run(router.route(LLMRequest("r1", "m", prompt)))
    second = asyncio.run(router.route(LLMRequest("r2", "m", prompt)))
    assert second.primary == first.primary  # the repeated prompt follows its history
    assert second.result.primary.scores["prefix-cache-scorer"][first.primary.id] == 1.0
    assert isinstance(loaded.plugins["prefix-cache-scorer"], PrefixCacheScorer)
