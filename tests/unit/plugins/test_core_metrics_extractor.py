"""``core-metrics-extractor``: engine load from a ``/metrics`` body, per endpoint and engine.

Ports ``llm-d/llm-d-router: pkg/epp/framework/plugins/datalayer/extractor/metrics/extractor_test.go``
(``TestExtractorMultiEngine``, ``TestBackwardCompatibility``, ``TestCacheInfoLabelAliasing``,
``TestDirectGaugeSpecExtraction``, ``TestCoreMetricsExtractorFactoryDefaultEngine``,
``TestGetEngineTypeFromEndpoint``) and ``metrics_extraction_from_config_test.go`` (default config,
LoRA disabled or absent, missing family, custom metrics), with the polling source in front.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ppc_extproc.enginemetrics import EngineMetrics, EngineMetricsStore
from ppc_extproc.errors import ConfigError
from ppc_extproc.framework import Endpoint, EndpointEvent, EndpointEventKind
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.datalayer import CoreMetricsExtractor, MetricsDataSource, PollOptions
from ppc_extproc.plugins.registry import Services

VLLM_BODY = b"""\
# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.55
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters="code"} 1.8e9
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="512"} 1.0
"""
SGLANG_BODY = b"""\
sglang:num_queue_reqs 20
sglang:num_running_reqs 2
sglang:token_usage 0.25
sglang:cache_config_info{num_pages="11147",page_size="64"} 1
"""
SGLANG_LABEL = ("llm-d.ai/engine-type", "sglang")
LEGACY_SGLANG_LABEL = ("inference.networking.k8s.io/engine-type", "sglang")


def extractor(params: dict[str, Any] | None = None) -> tuple[CoreMetricsExtractor, EngineMetricsStore]:
    store = EngineMetricsStore(stale_after_seconds=None)
    section = Section(params or {}, "plugins[0].parameters", "core-metrics-extractor")
    made = CoreMetricsExtractor.from_parameters("core-metrics-extractor", section, Services(engine_metrics=store))
    section.finish()
    return made, store


def extract(params: dict[str, Any] | None, body: bytes, *labels: tuple[str, str]) -> EngineMetrics:
    ex, store = extractor(params)
    endpoint = Endpoint("10.0.0.1", 8000, labels=tuple(sorted(labels)))
    ex.extract_metrics(endpoint, body, 5.0)
    snapshot = store.snapshot(endpoint.id)
    assert snapshot is not None
    return snapshot


def test_default_config_reads_every_vllm_field() -> None:
    m = extract(None, VLLM_BODY)
    assert (m.waiting, m.running, m.kv_usage, m.block_size, m.num_gpu_blocks) == (7, 3, 0.55, 16, 512)
    # LoRA: the series with the newest creation time wins
    assert (m.active_models, m.waiting_models, m.max_active_models) == (("sql", "chat"), ("code",), 4)
    assert m.updated_at == 5.0


def test_the_engine_label_selects_sglang() -> None:
    both = VLLM_BODY + SGLANG_BODY
    assert extract(None, both).waiting == 7
    sglang = extract(None, both, SGLANG_LABEL)
    assert (sglang.waiting, sglang.running, sglang.kv_usage) == (20, 2, 0.25)
    assert (sglang.block_size, sglang.num_gpu_blocks) == (64, 11147)  # page_size / num_pages


def test_the_legacy_engine_label_is_a_fallback() -> None:
    both = VLLM_BODY + SGLANG_BODY
    assert extract(None, both, LEGACY_SGLANG_LABEL).waiting == 20
    assert extract(None, both, ("llm-d.ai/engine-type", "vllm"), LEGACY_SGLANG_LABEL).waiting == 7  # new key wins


def test_an_unknown_engine_label_falls_back_to_the_default_engine() -> None:
    assert extract(None, VLLM_BODY, ("llm-d.ai/engine-type", "unknown-engine")).waiting == 7


def test_a_custom_engine_label_key() -> None:
    params = {"engineLabelKey": "example.com/engine"}
    assert extract(params, VLLM_BODY + SGLANG_BODY, ("example.com/engine", "sglang")).waiting == 20
    assert extract(params, VLLM_BODY + SGLANG_BODY, SGLANG_LABEL).waiting == 7  # the default key is not read
    assert extract({"engineLabelKey": ""}, VLLM_BODY + SGLANG_BODY, SGLANG_LABEL).waiting == 20  # "" ⇒ default key


def test_direct_gauge_specs_of_triton_tensorrt_llm() -> None:
    body = b"""\
nv_trt_llm_request_metrics{request_type="waiting"} 5
nv_trt_llm_request_metrics{request_type="scheduled"} 2
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max"} 6239
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"} 0.42
"""
    m = extract({"defaultEngine": "triton-tensorrt-llm"}, body)
    assert (m.waiting, m.running, m.kv_usage, m.block_size, m.num_gpu_blocks) == (5, 2, 0.42, 64, 6239)


def test_default_engine_applies_to_unlabelled_endpoints() -> None:
    assert extract({"defaultEngine": "sglang"}, VLLM_BODY + SGLANG_BODY).waiting == 20


def test_a_user_engine_config_replaces_the_built_in_of_its_name() -> None:
    """llm-d replaces the whole entry: specs the user leaves out are not read (and their absence is
    no error), so an engine that only exports its own names polls cleanly."""
    ex, store = extractor({"engineConfigs": [{"name": "vllm", "queuedRequestsSpec": "my_waiting"}]})
    endpoint = Endpoint("10.0.0.1", 8000)
    ex.extract_metrics(endpoint, b"my_waiting 9\n", 1.0)
    m = store.snapshot(endpoint.id)
    assert m is not None and (m.waiting, m.running, m.kv_usage) == (9, None, None)
    assert ex.extract_errors == 0
    assert sorted(ex.engines) == ["sglang", "triton", "triton-tensorrt-llm", "trtllm-serve", "vllm"]  # built-ins kept


def test_a_custom_engine_as_default() -> None:
    params = {"defaultEngine": "mine", "engineConfigs": [
        {"name": "mine", "queuedRequestsSpec": "q{pool=a}", "runningRequestsSpec": "r", "kvUsageSpec": "kv"}]}  # fmt: skip
    m = extract(params, b'q{pool="b"} 100\nq{pool="a"} 4\nr 1\nkv 0.5\n')
    assert (m.waiting, m.running, m.kv_usage) == (4, 1, 0.5)


@pytest.mark.parametrize(
    ("params", "path", "message"),
    [
        ({"engineConfigs": [{"queuedRequestsSpec": "q"}]}, "plugins[0].parameters.engineConfigs[0].name",
         "engine config name cannot be empty"),
        ({"engineConfigs": [{"name": "default"}]}, "plugins[0].parameters.engineConfigs[0].name",
         'engine config name cannot be "default" (reserved)'),
        ({"defaultEngine": "nope"}, "plugins[0].parameters.defaultEngine", "defaultEngine 'nope' not found in engineConfigs"),
        ({"engineConfigs": [{"name": "vllm", "queuedRequestsSpec": "a"}, {"name": "vllm", "queuedRequestsSpec": "b"}]},
         "plugins[0].parameters.engineConfigs[1].name", "engine config 'vllm' already exists"),
        ({"engineConfigs": [{"name": "e", "customMetrics": [{"metricSpec": "x"}]}]},
         "plugins[0].parameters.engineConfigs[0].customMetrics[0].attributeKey", "must not be empty"),
        ({"engineConfigs": [{"name": "e", "customMetrics": [{"attributeKey": "k"}]}]},
         "plugins[0].parameters.engineConfigs[0].customMetrics[0].metricSpec", "must not be empty"),
        ({"engineConfigs": [{"name": "e", "queuedRequestsSpec": "bad{spec"}]},
         "plugins[0].parameters.engineConfigs[0].queuedRequestsSpec", "invalid metric spec"),
        ({"engineConfigs": [{"name": "e", "bogus": 1}]}, "plugins[0].parameters.engineConfigs[0].bogus", "unknown key"),
    ],
)
def test_parameter_errors(params: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        extractor(params)
    assert info.value.path == path
    assert message in info.value.message


def test_missing_family_is_counted_while_the_other_fields_update() -> None:
    ex, store = extractor()
    endpoint = Endpoint("10.0.0.1", 8000)
    ex.extract_metrics(endpoint, b"vllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc 0.1\n", 1.0)
    m = store.snapshot(endpoint.id)
    assert m is not None and (m.waiting, m.running, m.kv_usage) == (2, None, 0.1)
    assert ex.extract_errors == 1
    assert ex.state().details["missingFamilies"] == {"vllm:num_requests_running": 1, "vllm:cache_config_info": 1}


def test_an_absent_lora_family_and_disabled_specs_are_no_error() -> None:
    body = VLLM_BODY.split(b"# TYPE vllm:lora_requests_info")[0]
    ex, _ = extractor()
    ex.extract_metrics(Endpoint("10.0.0.1", 8000), body + b'vllm:cache_config_info{block_size="16",num_gpu_blocks="9"} 1\n', 1.0)
    assert ex.extract_errors == 0  # vLLM without LoRA exports no lora_requests_info
    disabled, store = extractor({"engineConfigs": [{"name": "vllm", "queuedRequestsSpec": "vllm:num_requests_waiting",
                                                    "loraSpec": "", "cacheInfoSpec": ""}]})  # fmt: skip
    disabled.extract_metrics(Endpoint("10.0.0.1", 8000), b"vllm:num_requests_waiting 1\n", 1.0)
    assert disabled.extract_errors == 0 and store.snapshot("10.0.0.1:8000").waiting == 1  # type: ignore[union-attr]


def test_an_engine_config_with_every_spec_disabled_polls_without_errors() -> None:
    specs = ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec", "cacheInfoSpec")
    ex, store = extractor({"engineConfigs": [{"name": "vllm", **dict.fromkeys(specs, "")}]})
    ex.extract_metrics(Endpoint("10.0.0.1", 8000), b"", 1.0)
    assert ex.extract_errors == 0 and store.snapshot("10.0.0.1:8000") is not None


def test_a_body_without_any_load_family_is_refused() -> None:
    ex, store = extractor()
    with pytest.raises(ValueError, match="no vllm load metrics"):
        ex.extract_metrics(Endpoint("10.0.0.1", 8000), b"process_cpu_seconds_total 1\n", 1.0)
    assert ex.extract_errors == 1 and store.snapshot("10.0.0.1:8000") is None


def test_custom_metrics() -> None:
    params = {"engineConfigs": [{"name": "vllm", "queuedRequestsSpec": "vllm:num_requests_waiting", "customMetrics": [
        {"attributeKey": "custom.queue_depth", "metricSpec": "custom_queue_depth{tier=gold}"},
        {"attributeKey": "custom.total", "metricSpec": "custom_total_requests"},
        {"attributeKey": "custom.absent", "metricSpec": "not_exported"}]}]}  # fmt: skip
    body = b'vllm:num_requests_waiting 1\ncustom_queue_depth{tier="silver"} 3\ncustom_queue_depth{tier="gold"} 11\ncustom_total_requests 42\n'
    assert extract(params, body).custom == {"custom.queue_depth": 11.0, "custom.total": 42.0}


def test_through_the_polling_source_a_deleted_endpoint_is_forgotten() -> None:
    ex, store = extractor()

    async def fetch(url: str) -> bytes:
        return VLLM_BODY

    async def scenario() -> None:
        source = MetricsDataSource("metrics-data-source", PollOptions(), extractors=[ex], fetch=fetch)
        endpoint = Endpoint("10.0.0.1", 8000)
        source.on_endpoint_event(EndpointEvent(EndpointEventKind.ADDED, endpoint))
        await source.start()
        try:
            assert await source.poll(endpoint.id)
            assert store.snapshot(endpoint.id).waiting == 7  # type: ignore[union-attr]
            source.on_endpoint_event(EndpointEvent(EndpointEventKind.DELETED, endpoint))
            assert store.snapshot(endpoint.id) is None
        finally:
            await source.stop()

    asyncio.run(scenario())
