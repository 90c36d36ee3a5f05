"""llm-d's probe semantics (cmd/epp/runner/health.go) and the llm-d/GIE metric families."""

from __future__ import annotations

import pytest
from grpc_health.v1 import health_pb2
from prometheus_client import CollectorRegistry, generate_latest

from ppc_extproc.observability.llmd_metrics import PoolCollector, PoolSnapshot, error_code_for_status
from ppc_extproc.observability.metrics import Metrics
from ppc_extproc.server.health import EXTPROC_SERVICE, ProbeHealthServicer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


@pytest.mark.parametrize("service", ["", "liveness", "readiness", "inference-extension", EXTPROC_SERVICE])
def test_without_leader_election_every_name_answers_readiness(service: str) -> None:
    ready = {"v": False}
    probe = ProbeHealthServicer(lambda: ready["v"])
    assert probe.status(service) == NOT_SERVING
    ready["v"] = True
    assert probe.status(service) == SERVING
    probe.draining = True
    assert probe.status(service) == NOT_SERVING  # liveness too, as llm-d does without leader election


def test_with_leader_election_liveness_always_serves_and_unknown_names_are_unknown() -> None:
    leader = {"v": False}
    probe = ProbeHealthServicer(lambda: True, leader_election=True, is_leader=lambda: leader["v"])
    assert probe.status("liveness") == SERVING
    assert [probe.status(s) for s in ("", "readiness", EXTPROC_SERVICE)] == [NOT_SERVING] * 3
    leader["v"] = True
    assert [probe.status(s) for s in ("", "readiness", EXTPROC_SERVICE)] == [SERVING] * 3
    assert probe.status("inference-extension") == UNKNOWN
    probe.draining = True
    assert probe.status("liveness") == SERVING and probe.status("readiness") == NOT_SERVING


def test_request_families_carry_llmd_names_labels_and_buckets() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    series = metrics.llmd.series("client-model", "target-model")
    metrics.llmd.scheduled(series, 300, "target-model", "qwen-0-rank-0", 8000,
                           {"parse": 1e-4, "produce": 2e-4, "filter": 1e-5, "score": 3e-4, "pick": 1e-5})
    pair = {"model_name": "client-model", "target_model_name": "target-model"}
    flow = {**pair, "fairness_id": "default-flow", "priority": "0"}
    assert registry.get_sample_value("inference_objective_running_requests", {"model_name": "client-model"}) == 1
    metrics.llmd.completed(series, 0.3, 900, 64, 8, 48)
    get = registry.get_sample_value
    assert get("inference_objective_request_total", {**pair, "priority": "0"}) == 1
    assert get("llm_d_epp_request_total", flow) == 1
    assert get("inference_objective_running_requests", {"model_name": "client-model"}) == 0
    assert get("inference_objective_request_duration_seconds_bucket", {**pair, "le": "0.2"}) == 0
    assert get("inference_objective_request_duration_seconds_bucket", {**pair, "le": "0.4"}) == 1
    assert get("llm_d_epp_request_size_bytes_bucket", {**flow, "le": "512.0"}) == 1
    assert get("inference_objective_output_tokens_sum", pair) == 8
    assert get("llm_d_epp_request_ntpot_seconds_sum", flow) == pytest.approx(0.3 / 8)
    assert get("inference_objective_prompt_cached_tokens_bucket", {**pair, "le": "64.0"}) == 1
    assert get("inference_extension_scheduler_attempts_total", {
        "status": "success", "target_model_name": "target-model", "pod_name": "qwen-0-rank-0", "namespace": "",
        "port": "8000"}) == 1
    assert get("llm_d_epp_plugin_duration_seconds_count",
               {"extension_point": "Scorer", "plugin_type": "all", "plugin_name": "all"}) == 1
    assert get("inference_extension_scheduler_e2e_duration_seconds_bucket", {"le": "0.0005"}) == 1
    assert get("process_cpu_seconds_total") is not None and get("ppc_extproc_build_info", {
        "version": "0.1.0", "python": __import__("platform").python_version()}) == 1


def test_errors_use_llmds_codes_and_models_are_bounded() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.llmd.failed(metrics.llmd.series("", ""), error_code_for_status(429), running=False)
    assert registry.get_sample_value("inference_objective_request_error_total", {
        "model_name": "", "target_model_name": "", "error_code": "ResourceExhausted"}) == 1
    for i in range(1100):
        metrics.llmd.series(f"m{i}", f"m{i}")
    assert ("other", "other", 0, "default-flow") in metrics.llmd._series and len(metrics.llmd._series) <= 1002


def test_priority_labels_llmds_families_and_gies_histograms_merge_over_it() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    for priority in (0, -1, -1):
        series = metrics.llmd.series("chat", "qwen", priority)
        metrics.llmd.scheduled(series, 100, "qwen", "qwen-0-rank-0", 8000, {})
        metrics.llmd.completed(series, 0.5, 10, 5, 2, None)
    get = registry.get_sample_value
    pair = {"model_name": "chat", "target_model_name": "qwen"}
    assert get("inference_objective_request_total", {**pair, "priority": "-1"}) == 2
    assert get("inference_objective_request_total", {**pair, "priority": "0"}) == 1
    assert get("llm_d_epp_request_total", {**pair, "fairness_id": "default-flow", "priority": "-1"}) == 2
    assert get("inference_objective_request_duration_seconds_count", pair) == 3


def test_pool_gauges_average_the_engines_with_metrics() -> None:
    registry = CollectorRegistry()
    registry.register(PoolCollector(lambda: PoolSnapshot("qwen", {
        "qwen-0-rank-0": (2, 4, 0.5), "qwen-1-rank-0": (0, 2, 0.25), "qwen-2-rank-0": (None, None, None)}),
        ("", "0.1.0")))
    get = registry.get_sample_value
    assert get("inference_pool_ready_pods", {"name": "qwen"}) == 3
    assert get("inference_pool_average_kv_cache_utilization", {"name": "qwen"}) == 0.375
    assert get("llm_d_epp_average_queue_size", {"name": "qwen"}) == 1
    assert get("inference_pool_average_running_requests", {"name": "qwen"}) == 3
    assert get("inference_pool_per_pod_queue_size", {"name": "qwen", "model_server_pod": "qwen-0-rank-0"}) == 2
    assert get("inference_extension_info", {"commit": "", "build_ref": "0.1.0"}) == 1


def test_request_families_carry_the_fairness_id_bounded() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.llmd.scheduled(metrics.llmd.series("m", "m", 0, "tenant-a"), 10, "m", "pod", 8000, {})
    for i in range(1100):
        metrics.llmd.series("m", "m", 0, f"t{i}")
    assert ("m", "m", 0, "other") in metrics.llmd._series
    text = generate_latest(metrics.registry).decode()
    assert 'llm_d_epp_request_total{fairness_id="tenant-a",model_name="m",priority="0",target_model_name="m"} 1.0' in text
