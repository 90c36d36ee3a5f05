"""llm-d's 19 sample EndpointPickerConfigs (``llm-d/llm-d-router: deploy/config/*.yaml``),
restated here in flow style with the same plugin types, parameters, profiles and data layer.

All nineteen (P/D, flow control, GPU telemetry and the multimodal cache included) load, pass
``check-config``, and resolve to the pipeline asserted below (the estimate ``token-producer`` and
the ``approx-prefix-cache-producer`` that llm-d creates for unnamed prefix scorers and deciders
included).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from epp_helpers import check_config, epp, pipeline, router_for

from ppc_extproc.config.epp import load_config_text
from ppc_extproc.framework import Endpoint, LLMRequest
from ppc_extproc.plugins.producers.approx_prefix_cache import ApproxPrefixCacheProducer
from ppc_extproc.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32

DEPRECATED_API = "inference.networking.x-k8s.io/v1alpha1"
IMPLICIT = "(implicit) endpoint-notification-source"
METRICS = {"metrics-data-source": ["core-metrics-extractor"]}

# --- all nineteen load ----------------------------------------------------------------------

#: The prefill and decode profiles of the P/D samples.
PD_PROFILES = """\
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: max-score-picker}, {pluginRef: prefix-cache-scorer, weight: 2},
            {pluginRef: queue-scorer, weight: 1}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}, {pluginRef: prefix-cache-scorer, weight: 2},
            {pluginRef: queue-scorer, weight: 1}]
"""

LOADABLE: dict[str, str] = {
    "epp-config": """
plugins:
- {type: prefix-cache-scorer}
- {type: decode-filter}
- {type: max-score-picker}
- {type: single-profile-handler}
schedulingProfiles:
- {name: default, plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}, {pluginRef: prefix-cache-scorer, weight: 2}]}
""",
    "epp-estimate-prefix-cache-config": """
plugins:
- {type: single-profile-handler}
- {type: decode-filter}
- {type: prefix-cache-scorer}
- {type: load-aware-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: decode-filter}, {pluginRef: prefix-cache-scorer, weight: 1.0},
            {pluginRef: load-aware-scorer, weight: 1.0}, {pluginRef: max-score-picker}]
""",
    "epp-precise-prefix-cache-config": """
plugins:
- {type: token-producer, parameters: {modelName: hf-repo/model-name, vllm: {url: "http://localhost:8000"}}}
- {type: endpoint-notification-source}
- {type: metrics-data-source}
- {type: core-metrics-extractor}
- {type: single-profile-handler}
- {type: decode-filter}
- type: precise-prefix-cache-producer
  parameters: {tokenProcessorConfig: {blockSize: 64}, indexerConfig: {kvBlockIndexConfig: {enableMetrics: true}}}
- {type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- {type: kv-cache-utilization-scorer}
- {type: queue-scorer}
- {type: max-score-picker}
dataLayer:
  sources:
  - {pluginRef: metrics-data-source, extractors: [{pluginRef: core-metrics-extractor}]}
  - {pluginRef: endpoint-notification-source, extractors: [{pluginRef: precise-prefix-cache-producer}]}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: decode-filter}, {pluginRef: prefix-cache-scorer, weight: 2.0},
            {pluginRef: kv-cache-utilization-scorer, weight: 1.0}, {pluginRef: queue-scorer, weight: 1.0},
            {pluginRef: max-score-picker}]
""",
    "epp-burst-prefix-cache-config": """
plugins:
- type: token-producer
  parameters: {modelName: hf-repo/model-name, vllm: {url: "http://vllm.models.svc.cluster.local:8000"}}
- {type: single-profile-handler}
- {type: decode-filter}
- {type: burst-prefix-cache-producer, parameters: {windowDurationMs: 100, maxPerReplica: -1, minColocateBlocks: 0}}
- {type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: burst-prefix-cache-producer}}
- {type: load-aware-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: decode-filter}, {pluginRef: prefix-cache-scorer, weight: 2.0},
            {pluginRef: load-aware-scorer, weight: 1.0}, {pluginRef: max-score-picker}]
""",
    "dp-epp-config": """
plugins:
- {type: prefix-cache-scorer}
- {type: decode-filter}
- {type: max-score-picker}
- {type: data-parallel-profile-handler, parameters: {primaryPort: 8000}}
schedulingProfiles:
- {name: default, plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}, {pluginRef: prefix-cache-scorer, weight: 2}]}
""",
    "sim-epp-config": """
plugins:
- {type: approx-prefix-cache-producer, parameters: {maxPrefixTokensToMatch: 16384, lruCapacityPerServer: 31250}}
- {type: prefix-cache-scorer}
- {type: decode-filter}
- {type: max-score-picker}
- {type: single-profile-handler}
schedulingProfiles:
- {name: default, plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}, {pluginRef: prefix-cache-scorer, weight: 2}]}
""",
    "sim-epp-kvcache-config": """
plugins:
- {type: token-producer, parameters: {modelName: TinyLlama/TinyLlama-1.1B-Chat-v1.0, vllm: {url: "http://localhost:8000"}}}
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {blockSize: 16}
    kvEventsConfig: {zmqEndpoint: "tcp://0.0.0.0:5557"}
    indexerConfig: {kvBlockIndexConfig: {enableMetrics: false, metricsLoggingInterval: 60000000000}}
- {type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- {type: decode-filter}
- {type: max-score-picker}
- {type: single-profile-handler}
schedulingProfiles:
- {name: default, plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}, {pluginRef: prefix-cache-scorer, weight: 10}]}
""",
    "sim-epp-no-hit-lru": """
plugins:
- {type: precise-prefix-cache-producer, parameters: {tokenProcessorConfig: {blockSizeTokens: 5}}}
- {type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- {type: no-hit-lru-scorer, parameters: {lruSize: 2048}}
- {type: decode-filter}
- {type: max-score-picker}
- {type: single-profile-handler}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}, {pluginRef: prefix-cache-scorer, weight: 2},
            {pluginRef: no-hit-lru-scorer, weight: 1}]
""",
    "sim-epp-tokenizer-vllm-http-config": """
plugins:
- {type: token-producer, parameters: {modelName: "${MODEL_NAME}", vllm: {url: "http://localhost:8000"}}}
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {blockSize: 16, hashSeed: "42"}
    kvEventsConfig: {zmqEndpoint: "tcp://0.0.0.0:5557"}
    indexerConfig: {kvBlockIndexConfig: {enableMetrics: false}}
- {type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- {type: decode-filter}
- {type: max-score-picker}
- {type: single-profile-handler}
schedulingProfiles:
- {name: default, plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}, {pluginRef: prefix-cache-scorer, weight: 10}]}
""",
    "pd-epp-config": """
plugins:
- {type: approx-prefix-cache-producer, parameters: {maxPrefixTokensToMatch: 16384, lruCapacityPerServer: 31250}}
- {type: prefix-cache-scorer}
- {type: queue-scorer}
- {type: prefill-filter}
- {type: decode-filter}
- {type: max-score-picker}
- {type: disagg-profile-handler, parameters: {deciders: {prefill: prefix-based-pd-decider}}}
- {type: prefix-based-pd-decider, parameters: {nonCachedTokens: 16}}
""" + PD_PROFILES,
    "pd-topology-epp-config": """
plugins:
- {type: approx-prefix-cache-producer, parameters: {maxPrefixTokensToMatch: 16384, lruCapacityPerServer: 31250}}
- {type: prefix-cache-scorer}
- {type: queue-scorer}
- {type: prefill-filter}
- {type: decode-filter}
- {type: max-score-picker}
- {type: topology-extractor}
- {type: topology-affinity-filter}
- {type: topology-affinity-scorer}
- {type: disagg-profile-handler, parameters: {deciders: {prefill: prefix-based-pd-decider}}}
- {type: prefix-based-pd-decider, parameters: {nonCachedTokens: 16}}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: topology-affinity-filter}, {pluginRef: max-score-picker},
            {pluginRef: prefix-cache-scorer, weight: 2}, {pluginRef: queue-scorer, weight: 1},
            {pluginRef: topology-affinity-scorer, weight: 1}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}, {pluginRef: prefix-cache-scorer, weight: 2},
            {pluginRef: queue-scorer, weight: 1}]
""",
    "sim-e-p-d-epp-config": """
plugins:
- {type: queue-scorer}
- {type: encode-filter}
- {type: prefill-filter}
- {type: decode-filter}
- type: disagg-profile-handler
  parameters: {deciders: {encode: always-disagg-multimodal-decider, prefill: prefix-based-pd-decider}}
- {type: always-disagg-multimodal-decider}
- {type: prefix-based-pd-decider, parameters: {nonCachedTokens: 16}}
schedulingProfiles:
- {name: encode, plugins: [{pluginRef: encode-filter}]}
- {name: prefill, plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer, weight: 1}]}
- {name: decode, plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer, weight: 1}]}
""",
    "sim-e-pd-epp-config": """
plugins:
- {type: encode-filter}
- {type: decode-filter}
- {type: max-score-picker}
- {type: always-disagg-multimodal-decider}
- {type: disagg-profile-handler, parameters: {deciders: {encode: always-disagg-multimodal-decider}}}
schedulingProfiles:
- {name: encode, plugins: [{pluginRef: encode-filter}]}
- {name: decode, plugins: [{pluginRef: decode-filter}]}
""",
    "sim-pd-epp-config": """
plugins:
- type: approx-prefix-cache-producer
  parameters: {blockSizeTokens: 16, autoTune: false, maxPrefixTokensToMatch: 16384, lruCapacityPerServer: 31250}
- {type: prefix-cache-scorer}
- {type: queue-scorer}
- {type: prefill-filter}
- {type: decode-filter}
- {type: max-score-picker}
- {type: prefix-based-pd-decider, parameters: {nonCachedTokens: 16}}
- {type: disagg-profile-handler, parameters: {deciders: {prefill: prefix-based-pd-decider}}}
""" + PD_PROFILES,
    "probabilistic-admitter-epp-config": """
plugins:
- {type: probabilistic-admitter}
- {type: random-picker}
- {type: utilization-detector, parameters: {queueDepthThreshold: 999999999, kvCacheUtilThreshold: 1.0}}
flowControl: {saturationDetector: {pluginRef: utilization-detector}}
schedulingProfiles:
- {name: default, plugins: [{pluginRef: random-picker}]}
""",
    "sim-program-aware-config": """
plugins:
- {type: program-aware-fairness}
- {type: queue-scorer}
- {type: max-score-picker}
- {type: single-profile-handler}
featureGates: [flowControl]
flowControl: {defaultPriorityBand: {fairnessPolicyRef: program-aware-fairness}}
schedulingProfiles:
- {name: default, plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]}
""",
    "soft-reflective-ceiling-epp-config": """
featureGates: [flowControl]
plugins:
- {type: queue-scorer}
- {type: kv-cache-utilization-scorer}
- {type: prefix-cache-scorer}
- {type: soft-reflective-ceiling-policy}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer, weight: 2.0}, {pluginRef: kv-cache-utilization-scorer, weight: 2.0},
            {pluginRef: prefix-cache-scorer, weight: 3.0}]
flowControl: {usageLimitPolicyPluginRef: soft-reflective-ceiling-policy}
""",
    "sim-epp-gpu-config": """
plugins:
- {type: dcgm-data-source, name: dcgm-source, parameters: {port: 9400, interval: "1s"}}
- {type: dcgm-extractor, name: dcgm-extractor}
- type: endpoint-attribute-filter
  name: gpu-utilization-filter
  parameters:
    attribute: GPUUtilization
    producer: dcgm-extractor
    onMissing: Pass
    fallbackOnEmpty: true
    algorithm: {type: threshold, threshold: {operator: LessThanOrEqual, value: 0.90}}
- type: endpoint-attribute-scorer
  name: gpu-utilization-scorer
  parameters:
    attributeKey: GPUUtilization
    producer: dcgm-extractor
    algorithm: {type: linear_lower_is_better, normalization: {fixedRange: {min: 0.0, max: 1.0}}}
- {type: kv-cache-utilization-scorer}
- {type: max-score-picker}
- {type: single-profile-handler}
- {type: decode-filter}
dataLayer: {sources: [{pluginRef: dcgm-source, extractors: [{pluginRef: dcgm-extractor}]}]}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: decode-filter}, {pluginRef: gpu-utilization-filter},
            {pluginRef: gpu-utilization-scorer, weight: 2.0}, {pluginRef: kv-cache-utilization-scorer, weight: 1.0},
            {pluginRef: max-score-picker}]
""",
    "epp-mm-embeddings-cache-config": """
plugins:
- {type: token-producer, parameters: {modelName: hf-repo/model-name, vllm: {url: "http://localhost:8000"}}}
- {type: endpoint-notification-source}
- {type: metrics-data-source}
- {type: core-metrics-extractor}
- {type: mm-embeddings-cache-producer, parameters: {cacheSizeInMB: 2048}}
- {type: mm-embeddings-cache-scorer}
- type: precise-prefix-cache-producer
  parameters: {tokenProcessorConfig: {blockSize: 64}, indexerConfig: {kvBlockIndexConfig: {enableMetrics: true}}}
- {type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- {type: queue-scorer}
- {type: max-score-picker}
- {type: single-profile-handler}
- {type: decode-filter}
dataLayer:
  sources:
  - {pluginRef: metrics-data-source, extractors: [{pluginRef: core-metrics-extractor}]}
  - {pluginRef: endpoint-notification-source,
     extractors: [{pluginRef: mm-embeddings-cache-producer}, {pluginRef: precise-prefix-cache-producer}]}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: decode-filter}, {pluginRef: prefix-cache-scorer, weight: 10},
            {pluginRef: mm-embeddings-cache-scorer, weight: 4}, {pluginRef: queue-scorer, weight: 1},
            {pluginRef: max-score-picker}]
""",
}


def _profile(scorers: list[tuple[str, float]], filters: tuple[str, ...] = ("decode-filter",)) -> dict[str, Any]:
    return {"default": {"filters": list(filters), "scorers": scorers, "picker": "max-score-picker"}}


_APPROX_CHAIN = ["token-producer[estimate]", "approx-prefix-cache-producer"]
_PD_CHAIN = [*_APPROX_CHAIN, "inflight-load-producer"]  # for the metrics source
_PD_SOURCES = {IMPLICIT: ["approx-prefix-cache-producer"], **METRICS}
_PD_STAGE = {"scorers": [("prefix-cache-scorer", 2.0), ("queue-scorer", 1.0)], "picker": "max-score-picker"}
_PD = {"prefill": {"filters": ["prefill-filter"], **_PD_STAGE}, "decode": {"filters": ["decode-filter"], **_PD_STAGE}}

EXPECTED: dict[str, dict[str, Any]] = {
    "epp-config": {
        "handler": "single-profile-handler",
        "profiles": _profile([("prefix-cache-scorer", 2.0)]),
        "producers": _APPROX_CHAIN,
        "sources": {IMPLICIT: ["approx-prefix-cache-producer"]},
    },
    "epp-estimate-prefix-cache-config": {
        "handler": "single-profile-handler",
        "profiles": _profile([("prefix-cache-scorer", 1.0), ("load-aware-scorer", 1.0)]),
        "producers": [*_APPROX_CHAIN, "inflight-load-producer"],  # for the metrics source
        "sources": {IMPLICIT: ["approx-prefix-cache-producer"], **METRICS},
    },
    "epp-precise-prefix-cache-config": {
        "handler": "single-profile-handler",
        "profiles": _profile(
            [("prefix-cache-scorer", 2.0), ("kv-cache-utilization-scorer", 1.0), ("queue-scorer", 1.0)]
        ),
        "producers": ["token-producer[vllm]", "precise-prefix-cache-producer", "inflight-load-producer"],  # for the metrics source
        "sources": {"endpoint-notification-source": ["precise-prefix-cache-producer"], **METRICS},
    },
    "epp-burst-prefix-cache-config": {
        "handler": "single-profile-handler",
        "profiles": _profile([("prefix-cache-scorer", 2.0), ("load-aware-scorer", 1.0)]),
        "producers": ["token-producer[vllm]", "burst-prefix-cache-producer", "inflight-load-producer"],  # for the metrics source
        "sources": METRICS,
    },
    "dp-epp-config": {
        "handler": "data-parallel-profile-handler",
        "profiles": _profile([("prefix-cache-scorer", 2.0)]),
        "producers": _APPROX_CHAIN,
        "sources": {IMPLICIT: ["approx-prefix-cache-producer"]},
    },
    "sim-epp-config": {
        "handler": "single-profile-handler",
        "profiles": _profile([("prefix-cache-scorer", 2.0)]),
        "producers": _APPROX_CHAIN,
        "sources": {IMPLICIT: ["approx-prefix-cache-producer"]},
    },
    "sim-epp-kvcache-config": {
        "handler": "single-profile-handler",
        "profiles": _profile([("prefix-cache-scorer", 10.0)]),
        "producers": ["token-producer[vllm]", "precise-prefix-cache-producer"],
        "sources": {IMPLICIT: ["precise-prefix-cache-producer"]},
    },
    "sim-epp-no-hit-lru": {
        "handler": "single-profile-handler",
        "profiles": _profile([("prefix-cache-scorer", 2.0), ("no-hit-lru-scorer", 1.0)]),
        # the no-hit-lru scorer names no producer: it reads llm-d's default approximate one
        "producers": ["token-producer[estimate]", "precise-prefix-cache-producer", "approx-prefix-cache-producer"],
        "sources": {IMPLICIT: ["precise-prefix-cache-producer", "approx-prefix-cache-producer"]},
    },
    "sim-epp-tokenizer-vllm-http-config": {
        "handler": "single-profile-handler",
        "profiles": _profile([("prefix-cache-scorer", 10.0)]),
        "producers": ["token-producer[vllm]", "precise-prefix-cache-producer"],
        "sources": {IMPLICIT: ["precise-prefix-cache-producer"]},
    },
    "pd-epp-config": {"handler": "disagg-profile-handler", "profiles": _PD, "producers": _PD_CHAIN, "sources": _PD_SOURCES},
    "sim-pd-epp-config": {"handler": "disagg-profile-handler", "profiles": _PD, "producers": _PD_CHAIN,
                          "sources": _PD_SOURCES},
    "pd-topology-epp-config": {
        "handler": "disagg-profile-handler",
        "profiles": {
            "prefill": {"filters": ["prefill-filter", "topology-affinity-filter"], "picker": "max-score-picker",
                        "scorers": [("prefix-cache-scorer", 2.0), ("queue-scorer", 1.0), ("topology-affinity-scorer", 1.0)]},
            "decode": _PD["decode"],
        },
        "producers": ["topology-extractor", *_PD_CHAIN],
        "sources": _PD_SOURCES,
    },
    "sim-e-p-d-epp-config": {
        "handler": "disagg-profile-handler",
        "profiles": {
            "encode": {"filters": ["encode-filter"], "scorers": [], "picker": "max-score-picker"},
            "prefill": {"filters": ["prefill-filter"], "scorers": [("queue-scorer", 1.0)], "picker": "max-score-picker"},
            "decode": {"filters": ["decode-filter"], "scorers": [("queue-scorer", 1.0)], "picker": "max-score-picker"},
        },
        # the decider reads llm-d's default (approximate) match info: created, as llm-d does
        "producers": _PD_CHAIN,
        "sources": _PD_SOURCES,
    },
    "sim-e-pd-epp-config": {
        "handler": "disagg-profile-handler",
        "profiles": {
            "encode": {"filters": ["encode-filter"], "scorers": [], "picker": "max-score-picker"},
            "decode": {"filters": ["decode-filter"], "scorers": [], "picker": "max-score-picker"},
        },
        "producers": ["token-producer[estimate]"],  # the multimodal decider reads its items
        "sources": {},
    },
    # flow control: the detector and the admitter read engine metrics, so a metrics source is made
    "probabilistic-admitter-epp-config": {
        "handler": "single-profile-handler",
        "profiles": {"default": {"filters": [], "scorers": [], "picker": "random-picker"}},
        "producers": ["inflight-load-producer"],  # for the metrics source
        "sources": METRICS,
    },
    "sim-program-aware-config": {
        "handler": "single-profile-handler",
        "profiles": _profile([("queue-scorer", 1.0)], filters=()),
        "producers": ["inflight-load-producer"],
        "sources": METRICS,
    },
    "soft-reflective-ceiling-epp-config": {
        "handler": "single-profile-handler",
        "profiles": _profile([("queue-scorer", 2.0), ("kv-cache-utilization-scorer", 2.0), ("prefix-cache-scorer", 3.0)],
                             filters=()),
        "producers": [*_APPROX_CHAIN, "inflight-load-producer"],
        "sources": {IMPLICIT: ["approx-prefix-cache-producer"], **METRICS},
    },
    "sim-epp-gpu-config": {
        "handler": "single-profile-handler",
        "profiles": _profile(
            [("gpu-utilization-scorer", 2.0), ("kv-cache-utilization-scorer", 1.0)],
            filters=("decode-filter", "gpu-utilization-filter"),
        ),
        "producers": ["inflight-load-producer"],  # for the metrics source
        # the kv-cache scorer's engine metrics: llm-d injects the metrics source beside DCGM's too
        "sources": {"dcgm-source": ["dcgm-extractor"], **METRICS},
    },
    "epp-mm-embeddings-cache-config": {
        "handler": "single-profile-handler",
        "profiles": _profile(
            [("prefix-cache-scorer", 10.0), ("mm-embeddings-cache-scorer", 4.0), ("queue-scorer", 1.0)]
        ),
        "producers": ["token-producer[vllm]", "mm-embeddings-cache-producer", "precise-prefix-cache-producer",
                      "inflight-load-producer"],
        "sources": {"endpoint-notification-source": ["mm-embeddings-cache-producer", "precise-prefix-cache-producer"],
                    **METRICS},
    },
}

#: The two samples still written against the deprecated API group.
API_VERSIONS = {"probabilistic-admitter-epp-config": DEPRECATED_API, "sim-program-aware-config": DEPRECATED_API}


def document(name: str) -> str:
    return epp(LOADABLE[name], API_VERSIONS.get(name, "llm-d.ai/v1alpha1"))


def test_the_inventory_is_llm_d_s_nineteen_samples() -> None:
    assert len(LOADABLE) == 19
    assert set(EXPECTED) == set(LOADABLE)


@pytest.mark.parametrize("name", sorted(LOADABLE))
def test_loadable_sample_resolves_to_its_pipeline(name: str) -> None:
    loaded = load_config_text(document(name), name)
    assert pipeline(loaded) == EXPECTED[name]


def _write(tmp_path: Path, names: list[str]) -> list[Path]:
    files = []
    for name in names:
        file = tmp_path / f"{name}.yaml"
        file.write_text(document(name))
        files.append(file)
    return files


def test_check_config_accepts_every_loadable_sample(tmp_path: Path) -> None:
    result = check_config(*_write(tmp_path, sorted(LOADABLE)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "19 of 19 configurations are valid" in result.stdout


def test_deprecated_sample_parameters_are_honoured() -> None:
    """``blockSize`` (deprecated alias of ``blockSizeTokens``), the central ZMQ endpoint, the hash
    seed and the literal ``${MODEL_NAME}`` reach the plugins as written."""
    kv = load_config_text(document("sim-epp-tokenizer-vllm-http-config"))
    precise = kv.plugins["precise-prefix-cache-producer"]
    assert isinstance(precise, PrecisePrefixCacheProducer)
    assert precise.block_size == 16 and precise.config.token_processor.hash_seed == "42"
    assert precise.config.kv_events.zmq_endpoint == "tcp://0.0.0.0:5557"
    assert kv.plugins["token-producer"].config.model_name == "${MODEL_NAME}"  # type: ignore[attr-defined]
    sim = load_config_text(document("sim-epp-config")).plugins["approx-prefix-cache-producer"]
    assert isinstance(sim, ApproxPrefixCacheProducer)
    assert (sim.max_prefix_tokens, sim.lru_capacity_per_server) == (16384, 31250)
    dp = load_config_text(document("dp-epp-config")).handler
    assert dp.primary_port == 8000  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["epp-config", "dp-epp-config"])
def test_auto_created_approximate_producer_forgets_deleted_endpoints(name: str) -> None:
    """llm-d creates the approximate producer these samples read; it must see endpoint deletions
    like a configured one, or a recycled ``ip:port`` inherits a dead pod's routing history."""
    loaded = load_config_text(document(name))
    approx = loaded.plugins["approx-prefix-cache-producer"]
    assert isinstance(approx, ApproxPrefixCacheProducer) and loaded.paths[approx.name] == "(injected)"
    a, b = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 8000)
    router = router_for(loaded, [a, b])
    prompt = TokenizedPrompt("m", (tokens_to_le32(range(512)),))
    decision = asyncio.run(router.route(LLMRequest("r1", "m", prompt)))
    picked = decision.result.targets[0]
    assert approx.blocks_per_endpoint()[picked.id] > 0
    router.pool.replace([e for e in (a, b) if e != picked])
    assert picked.id not in approx.blocks_per_endpoint()
