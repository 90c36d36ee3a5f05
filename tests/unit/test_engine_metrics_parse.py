"""Parsing vLLM's Prometheus exposition: the four gauges routing reads, old and new names."""

from __future__ import annotations

import time

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ppc_extproc.enginemetrics import parse_vllm_metrics
from ppc_extproc_lab.mock_vllm.engine import EngineConfig, MockEngine
from ppc_extproc_lab.mock_vllm.metrics import engine_registry
from ppc_extproc_lab.mock_vllm.publisher import MemoryEventPublisher

# vLLM V1 (0.11-era) /metrics, trimmed: process metrics, the gauges, the look-alike
# num_requests_waiting_by_reason, counters with _created, a histogram, and cache_config_info.
VLLM_V1 = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12107.0
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 2.160644096e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 3.0
# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="Qwen/Qwen3-0.6B",reason="capacity"} 99.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="Qwen/Qwen3-0.6B",reason="deferred"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.4167
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 52736.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="Qwen/Qwen3-0.6B"} 1.7859669528940387e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-0.6B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.005",model_name="Qwen/Qwen3-0.6B"} 12.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-0.6B"} 40.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-0.6B"} 40.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.912
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{_block_size_resolved="True",block_size="16",cache_dtype="auto",calculate_kv_scales="False",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.92",is_attention_free="False",kv_cache_dtype_skip_layers="[]",kv_cache_max_concurrency="145.0625",kv_cache_memory_bytes="None",kv_cache_size_tokens="1188352",kv_offloading_backend="native",kv_offloading_size="None",mamba_block_size="None",num_cpu_blocks="None",num_gpu_blocks="74272",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",prefix_match_unit="None",sliding_window="None"} 1.0
"""

# vLLM V0 (≤ 0.9) names: gpu_cache_usage_perc, no engine label, num_gpu_blocks unknown yet.
VLLM_V0 = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0625
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",num_gpu_blocks="None"} 1.0
"""


def test_vllm_v1_exposition() -> None:
    m = parse_vllm_metrics(VLLM_V1.encode(), updated_at=12.5)
    assert (m.waiting, m.running, m.kv_usage) == (3, 7, 0.4167)  # not 99 from ..._by_reason
    assert (m.block_size, m.num_gpu_blocks, m.updated_at, m.stale) == (16, 74272, 12.5, False)


def test_vllm_v0_names() -> None:
    m = parse_vllm_metrics(VLLM_V0)
    assert (m.waiting, m.running, m.kv_usage, m.block_size, m.num_gpu_blocks) == (0, 2, 0.0625, 32, None)


def test_several_engines_on_one_endpoint_sum_queues_and_take_the_fullest_cache() -> None:
    two = VLLM_V1.replace(
        'vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 3.0\n',
        'vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 3.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-0.6B"} 4.0\n',
    ).replace(
        'vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.4167\n',
        'vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.4167\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-0.6B"} 0.9\n',
    )
    m = parse_vllm_metrics(two)
    assert (m.waiting, m.kv_usage) == (7, 0.9)


def test_mock_engine_exposition_from_prometheus_client() -> None:
    engine = MockEngine(EngineConfig(model="mock-model", block_size=16, num_blocks=512), MemoryEventPublisher())
    try:
        body = generate_latest(engine_registry(engine))
    finally:
        engine.close()
    m = parse_vllm_metrics(body)
    assert (m.waiting, m.running, m.kv_usage, m.block_size, m.num_gpu_blocks) == (0, 0, 0.0, 16, 512)


def test_edge_cases() -> None:
    empty = parse_vllm_metrics(b"")
    assert (empty.waiting, empty.running, empty.kv_usage, empty.block_size) == (None, None, None, None)
    m = parse_vllm_metrics(
        b"vllm:num_requests_waiting 5\n"  # first line of the body, no labels
        b'vllm:kv_cache_usage_perc{model_name="a}b\\"c"} NaN\n'  # quoted brace and quote; NaN ignored
        b"vllm:num_requests_running{} 2 1712345678000\n"  # empty labels, a timestamp
    )
    assert (m.waiting, m.running, m.kv_usage) == (5, 2, None)
    clamped = parse_vllm_metrics(b"vllm:kv_cache_usage_perc 1.5\nvllm:num_requests_waiting -3\n")
    assert (clamped.kv_usage, clamped.waiting) == (1.0, 0)
    assert parse_vllm_metrics(b"vllm:num_requests_waiting bogus\n").waiting is None


def _fleet_exposition(engines: int) -> str:
    """A vLLM-sized body: the sample above plus the histograms vLLM exports, per engine."""
    lines = [VLLM_V1]
    for e in range(engines):
        for h in ("e2e_request_latency_seconds", "inter_token_latency_seconds", "request_queue_time_seconds",
                  "request_prefill_time_seconds", "request_decode_time_seconds", "request_prompt_tokens",
                  "request_generation_tokens", "iteration_tokens_total", "request_params_max_tokens"):
            lines.append(f"# HELP vllm:{h} h\n# TYPE vllm:{h} histogram\n")
            for le in (*(str(2.0**k) for k in range(-10, 12)), "+Inf"):
                lines.append(f'vllm:{h}_bucket{{engine="{e}",le="{le}",model_name="Qwen/Qwen3-0.6B"}} 42.0\n')
            lines.append(f'vllm:{h}_count{{engine="{e}",model_name="Qwen/Qwen3-0.6B"}} 42.0\n')
    return "".join(lines)


def test_parser_is_much_cheaper_than_prometheus_client() -> None:
    text = _fleet_exposition(2)
    body = text.encode()
    assert len(body) > 30_000
    assert parse_vllm_metrics(body).waiting == 3

    def best_of(fn, repeat: int = 5, number: int = 5) -> float:  # type: ignore[no-untyped-def]
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                fn()
            best = min(best, (time.perf_counter() - start) / number)
        return best

    ours = best_of(lambda: parse_vllm_metrics(body))
    reference = best_of(lambda: list(text_string_to_metric_families(text)), repeat=3, number=1)
    assert ours * 10 < reference, (ours, reference)
