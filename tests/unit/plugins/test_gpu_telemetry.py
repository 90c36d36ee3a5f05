"""GPU telemetry as llm-d's ``sim-epp-gpu-config`` wires it: ``dcgm-data-source`` polls a (mock) DCGM
exporter over real HTTP, ``dcgm-extractor`` turns ``DCGM_FI_DEV_GPU_UTIL`` into
``GPUUtilization/dcgm-extractor``, and the generic ``endpoint-attribute-filter``/``-scorer`` route on it."""

from __future__ import annotations

import asyncio

import pytest
from epp_helpers import config_error, epp, load, router_for, until

from ppc_extproc.enginemetrics import AttributeStore, EngineMetrics, EngineMetricsStore
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Endpoint, LLMRequest, SchedulingContext
from ppc_extproc.plugins.datalayer.dcgm import DCGMDataSource, DCGMExtractor
from ppc_extproc.plugins.filters.endpoint_attribute import EndpointAttributeFilter
from ppc_extproc.plugins.registry import Services
from ppc_extproc.plugins.scorers.endpoint_attribute import EndpointAttributeScorer
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32
from ppc_extproc_lab.localcluster.ports import free_port
from ppc_extproc_lab.mock_dcgm import mock_dcgm

KEY = "GPUUtilization/dcgm-extractor"
EPS = [Endpoint(f"127.0.0.{i}", 8000, name=f"default/vllm-{i}-rank-0") for i in (2, 3, 4)]

GPU_CONFIG = """
plugins:
- {{type: dcgm-data-source, name: dcgm-source, parameters: {{port: {port}, interval: "1s"}}}}
- {{type: dcgm-extractor, name: dcgm-extractor}}
- type: endpoint-attribute-filter
  name: gpu-utilization-filter
  parameters:
    attribute: GPUUtilization
    producer: dcgm-extractor
    onMissing: Pass
    fallbackOnEmpty: true
    algorithm: {{type: threshold, threshold: {{operator: LessThanOrEqual, value: 0.90}}}}
- type: endpoint-attribute-scorer
  name: gpu-utilization-scorer
  parameters:
    attributeKey: GPUUtilization
    producer: dcgm-extractor
    algorithm: {{type: linear_lower_is_better, normalization: {{fixedRange: {{min: 0.0, max: 1.0}}}}}}
- {{type: kv-cache-utilization-scorer}}
- {{type: max-score-picker}}
- {{type: single-profile-handler}}
- {{type: decode-filter}}
dataLayer: {{sources: [{{pluginRef: dcgm-source, extractors: [{{pluginRef: dcgm-extractor}}]}}]}}
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: decode-filter}}, {{pluginRef: gpu-utilization-filter}},
            {{pluginRef: gpu-utilization-scorer, weight: 2.0}}, {{pluginRef: kv-cache-utilization-scorer, weight: 1.0}},
            {{pluginRef: max-score-picker}}]
"""


async def _route_over_exporters() -> None:
    port = free_port("127.0.0.2")
    loaded = load(GPU_CONFIG.format(port=port))
    source = loaded.data_layer.polling_sources[0]
    assert isinstance(source, DCGMDataSource) and source.options.port == port
    assert source.options.interval_seconds == 1.0
    attributes = loaded.services.attributes
    # The busiest of a pod's GPUs counts: 95 % (filtered out), 30 %, 60 %.
    async with (
        mock_dcgm("127.0.0.2", port, utils=[10.0, 95.0], pod="vllm-2"),
        mock_dcgm("127.0.0.3", port, utils=[30.0, 5.0], pod="vllm-3"),
        mock_dcgm("127.0.0.4", port, utils=[60.0], pod="vllm-4") as third,
    ):
        router = router_for(loaded, EPS)
        await source.start()
        try:
            await until(lambda: all(attributes.get(e.id, KEY) is not None for e in EPS))
            assert [attributes.get(e.id, KEY) for e in EPS] == [0.95, 0.30, 0.60]
            prompt = TokenizedPrompt("m", (tokens_to_le32(range(16)),))
            decision = await router.route(LLMRequest("r1", "m", prompt))
            scores = decision.result.primary.scores["gpu-utilization-scorer"]
            assert EPS[0].id not in scores and decision.primary == EPS[1]
            assert scores == pytest.approx({EPS[1].id: 0.7, EPS[2].id: 0.4})
            third.set(0, 1.0)
            assert await source.poll(EPS[2].id)
            assert attributes.get(EPS[2].id, KEY) == 0.01
            router.pool.replace(EPS[1:])  # a deleted endpoint's attribute goes with it
            assert attributes.get(EPS[0].id, KEY) is None
        finally:
            await source.stop()


def test_sim_epp_gpu_config_routes_on_polled_gpu_utilization() -> None:
    asyncio.run(_route_over_exporters())


def test_dcgm_extractor_keeps_the_endpoint_s_pod_and_unlabelled_series() -> None:
    store = AttributeStore()
    extractor = DCGMExtractor("dcgm-extractor", store)
    daemonset = (b'DCGM_FI_DEV_GPU_UTIL{gpu="0",pod="vllm-2"} 20\nDCGM_FI_DEV_GPU_UTIL{gpu="1",pod="other"} 99\n'
                 b'DCGM_FI_DEV_GPU_UTIL{gpu="2"} 40\n')  # fmt: skip
    extractor.extract_metrics(EPS[0], daemonset, 0.0)
    assert store.get(EPS[0].id, KEY) == 0.40
    with pytest.raises(ValueError, match="no samples for pod 'vllm-3'"):
        extractor.extract_metrics(EPS[1], b'DCGM_FI_DEV_GPU_UTIL{gpu="0",pod="vllm-9"} 20\n', 0.0)
    with pytest.raises(ValueError, match="not found in DCGM response"):
        extractor.extract_metrics(EPS[0], b"DCGM_FI_DEV_FB_USED 1\n", 0.0)
    assert store.get(EPS[0].id, KEY) is None  # a failed extract drops the old value
    unnamed = Endpoint("127.0.0.9", 8000)
    extractor.extract_metrics(unnamed, daemonset, 0.0)
    assert store.get(unnamed.id, KEY) == 0.99


@pytest.mark.parametrize(
    ("params", "path", "message"),
    [
        ("{port: 70000}", "plugins[0].parameters.port", "invalid port 70000"),
        ("{scheme: ftp}", "plugins[0].parameters.scheme", "unsupported scheme: ftp"),
        ("{useNodeAddress: true}", "plugins[0].parameters.useNodeAddress", "no node address"),
        ("{interval: soon}", "plugins[0].parameters.interval", ""),
    ],
)
def test_dcgm_source_parameters_are_checked(params: str, path: str, message: str) -> None:
    error = config_error(epp(f"""
plugins:
- {{type: dcgm-data-source, parameters: {params}}}
- {{type: dcgm-extractor}}
- {{type: queue-scorer}}
dataLayer: {{sources: [{{pluginRef: dcgm-data-source, extractors: [{{pluginRef: dcgm-extractor}}]}}]}}
"""))  # fmt: skip
    assert error.path == path and message in error.message


# --- endpoint-attribute-filter / -scorer -------------------------------------------------------------


def _services(values: dict[int, float], custom: dict[int, float] | None = None) -> Services:
    store = AttributeStore()
    for i, v in values.items():
        store.put(EPS[i].id, KEY, v)
    engine = EngineMetricsStore(stale_after_seconds=None)
    for i, v in (custom or {}).items():
        engine.set(EPS[i].id, EngineMetrics(0, 0, 0.0, None, None, 0.0, custom={"queue_depth": v}))
    return Services(engine_metrics=engine, attributes=store)


def _plugin(yaml_params: str, services: Services, type_name: str) -> object:
    loaded = load(f"""
plugins:
- {{type: {type_name}, name: p, parameters: {yaml_params}}}
""", services)  # fmt: skip
    return loaded.plugins["p"]


def _ctx() -> SchedulingContext:
    return SchedulingContext(LLMRequest("r", "m"), list(EPS))


DCGM_ATTR = "attribute: GPUUtilization, producer: dcgm-extractor"
DCGM_KEY = "attributeKey: GPUUtilization, producer: dcgm-extractor"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("onMissing: Pass, algorithm: {type: threshold, threshold: {operator: LessThan, value: 0.5}}", [0, 2]),
        ("onMissing: Fail, algorithm: {type: threshold, threshold: {operator: LessThan, value: 0.5}}", [0]),
        ("algorithm: {type: threshold, threshold: {operator: GreaterThanOrEqual, value: 0.9}}", [1, 2]),
        ("onMissing: Fail, algorithm: {type: threshold, threshold: {operator: Equal, value: 0.3}}", [0]),
        ("onMissing: Fail, algorithm: {type: threshold, threshold: {operator: NotEqual, value: 0.3}}", [1]),
        ("onMissing: Fail, algorithm: {type: threshold, threshold: {operator: GreaterThan, value: 2}}", []),
        ("onMissing: Fail, fallbackOnEmpty: true, algorithm: {type: threshold, threshold: {operator: GreaterThan, value: 2}}",
         [0, 1, 2]),
    ],
)
def test_attribute_filter_thresholds_missing_and_fallback(extra: str, expected: list[int]) -> None:
    flt = _plugin(f"{{{DCGM_ATTR}, {extra}}}", _services({0: 0.3, 1: 0.95}), "endpoint-attribute-filter")
    assert isinstance(flt, EndpointAttributeFilter)
    assert flt.filter(_ctx(), EPS) == [EPS[i] for i in expected]


def test_attribute_filter_default_producer_reads_core_extractor_custom_metrics() -> None:
    flt = _plugin("{attribute: queue_depth, onMissing: Fail, algorithm: {type: threshold, threshold: "
                  "{operator: LessThan, value: 10}}}", _services({}, {0: 3.0, 1: 12.0}), "endpoint-attribute-filter")  # fmt: skip
    assert isinstance(flt, EndpointAttributeFilter) and flt.producer == "core-metrics-extractor"
    assert flt.filter(_ctx(), EPS) == [EPS[0]]


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        ("{type: linear_lower_is_better}", {0: 1.0, 1: 0.0, 2: 0.0}),
        ("{type: linear_higher_is_better}", {0: 0.0, 1: 1.0, 2: 0.0}),
        ("{type: linear_lower_is_better, normalization: {adaptiveRange: {}}}", {0: 1.0, 1: 0.0, 2: 0.0}),
        ("{type: linear_higher_is_better, normalization: {fixedRange: {min: 0.5, max: 1.0}}}", {0: 0.0, 1: 0.9, 2: 0.0}),
    ],
)
def test_attribute_scorer_normalizations(algorithm: str, expected: dict[int, float]) -> None:
    scorer = _plugin(f"{{{DCGM_KEY}, algorithm: {algorithm}}}", _services({0: 0.3, 1: 0.95}), "endpoint-attribute-scorer")
    assert isinstance(scorer, EndpointAttributeScorer)
    assert scorer.score(_ctx(), EPS) == pytest.approx({EPS[i].id: v for i, v in expected.items()})


def test_attribute_scorer_equal_values_are_neutral() -> None:
    scorer = _plugin(f"{{{DCGM_KEY}, algorithm: {{type: linear_lower_is_better}}}}", _services({0: 0.4, 1: 0.4}),
                     "endpoint-attribute-scorer")  # fmt: skip
    assert isinstance(scorer, EndpointAttributeScorer)
    assert scorer.score(_ctx(), EPS) == {EPS[0].id: 1.0, EPS[1].id: 1.0, EPS[2].id: 0.0}


@pytest.mark.parametrize(
    ("type_name", "params", "message"),
    [
        ("endpoint-attribute-filter", "{attribute: GPUUtilization/dcgm-extractor, algorithm: {type: threshold, "
         "threshold: {operator: LessThan, value: 1}}}", "split it into attribute: 'GPUUtilization' and producer: 'dcgm-extractor'"),
        ("endpoint-attribute-filter", "{attribute: x, algorithm: {type: percentile}}", 'must be "threshold"'),
        ("endpoint-attribute-filter", "{attribute: x, algorithm: {type: threshold}}", "required when algorithm.type"),
        ("endpoint-attribute-filter", "{attribute: x, algorithm: {type: threshold, threshold: {operator: Above}}}",
         "must be one of LessThan"),
        ("endpoint-attribute-filter", "{attribute: x, onMissing: Skip, algorithm: {type: threshold}}", '"Pass" or "Fail"'),
        ("endpoint-attribute-filter", "{algorithm: {type: threshold}}", "non-empty attribute"),
        ("endpoint-attribute-scorer", "{attributeKey: x, algorithm: {type: linear}}", "linear_lower_is_better"),
        ("endpoint-attribute-scorer", "{attributeKey: x, algorithm: {type: linear_lower_is_better, normalization: "
         "{fixedRange: {min: 1, max: 1}}}}", "requires min < max"),
        ("endpoint-attribute-scorer", "{attributeKey: x, algorithm: {type: linear_lower_is_better, normalization: "
         "{fixedRange: {min: 0, max: 1}, adaptiveRange: {}}}}", "at most one normalization strategy"),
    ],
)
def test_attribute_plugin_errors_name_the_field(type_name: str, params: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _plugin(params, Services(), type_name)
    assert message in info.value.message and info.value.path.startswith("plugins[0].parameters")


def test_producer_set_to_empty_reads_a_producer_agnostic_attribute() -> None:
    services = _services({})
    services.attributes.put(EPS[0].id, "llm-d.ai/multicluster-queue-size", 2.0)
    flt = _plugin("{attribute: llm-d.ai/multicluster-queue-size, producer: '', onMissing: Fail, algorithm: "
                  "{type: threshold, threshold: {operator: LessThan, value: 5}}}", services, "endpoint-attribute-filter")  # fmt: skip
    assert isinstance(flt, EndpointAttributeFilter) and flt.filter(_ctx(), EPS) == [EPS[0]]
