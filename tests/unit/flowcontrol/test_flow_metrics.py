"""llm-d's flow-control metric families: names (both prefixes), types, labels, buckets
(``llm-d/llm-d-router: pkg/epp/metrics/metrics.go``, ``llm_d_router_metrics.go``)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_flow_controller import FixedSaturation, controller, item

from ppc_extproc.errors import RequestError
from ppc_extproc.flowcontrol.config import BandSpec, FlowControlSpec
from ppc_extproc.flowcontrol.stats import CYCLE_BUCKETS, QUEUE_BUCKETS, FlowStatsCollector

FAMILIES = {
    "flow_control_request_queue_duration_seconds": ("histogram", {"fairness_id", "priority", "outcome", "inference_pool",
                                                                  "model_name", "target_model_name"}),
    "flow_control_dispatch_cycle_duration_seconds": ("histogram", set()),
    "flow_control_request_enqueue_duration_seconds": ("histogram", {"fairness_id", "priority", "outcome"}),
    "flow_control_queue_size": ("gauge", {"fairness_id", "priority", "inference_pool", "model_name", "target_model_name"}),
    "flow_control_queue_bytes": ("gauge", {"fairness_id", "priority", "inference_pool", "model_name", "target_model_name"}),
    "flow_control_pool_saturation": ("gauge", {"inference_pool", "stage"}),
}
LLMD_ONLY = {
    "llm_d_epp_flow_control_stale_endpoints": ("gauge", {"detector"}),
    "llm_d_epp_flow_control_capacity_utilization_requests": ("gauge", {"priority", "inference_pool"}),
    "llm_d_epp_flow_control_capacity_utilization_bytes": ("gauge", {"priority", "inference_pool"}),
    "llm_d_epp_flow_control_global_capacity_utilization_requests": ("gauge", {"inference_pool"}),
    "llm_d_epp_flow_control_requests": ("counter", {"outcome", "priority", "inference_pool"}),
}


def test_families_names_types_labels_and_buckets() -> None:
    async def run() -> tuple[str, str]:
        detector = FixedSaturation(1.0)
        fc = controller(detector, FlowControlSpec(max_requests=10, default_band=BandSpec(max_requests=2)))
        registry = CollectorRegistry()
        registry.register(FlowStatsCollector(fc.stats, "pool-a", "fixed",
                                             lambda: (fc.band_usage(), (fc.queued, fc.queued_bytes)), (10, 0)))
        waiting = [asyncio.create_task(fc.admit(item(f"r{i}", flow="tenant"))) for i in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(RequestError):
            await fc.admit(item("full", flow="tenant"))
        fc.saturation()
        text = generate_latest(registry).decode()
        detector.value = 0.0
        await asyncio.wait_for(asyncio.gather(*waiting), 5)
        return text, generate_latest(registry).decode()

    queued, after = asyncio.run(run())
    families = {f.name: f for f in text_string_to_metric_families(after)}
    expected = {f"{p}{n}": v for n, v in FAMILIES.items() for p in ("inference_extension_", "llm_d_epp_")} | LLMD_ONLY
    for name, (kind, labels) in expected.items():
        family = families[name]
        assert family.type == kind, name
        samples = [s for s in family.samples if not s.name.endswith(("_sum", "_count", "_created"))]
        assert samples, name
        assert {k for s in samples for k in s.labels if k != "le"} == labels, name
    buckets = [s.labels["le"] for s in families["llm_d_epp_flow_control_request_queue_duration_seconds"].samples
               if s.name.endswith("_bucket")]
    assert buckets[: len(QUEUE_BUCKETS) + 1] == [repr(float(b)) for b in QUEUE_BUCKETS] + ["+Inf"]
    cycle = [s.labels["le"] for s in families["llm_d_epp_flow_control_dispatch_cycle_duration_seconds"].samples
             if s.name.endswith("_bucket")]
    assert cycle[: len(CYCLE_BUCKETS) + 1] == [repr(float(b)) for b in CYCLE_BUCKETS] + ["+Inf"]
    outcomes = {s.labels["outcome"] for s in families["llm_d_epp_flow_control_requests"].samples}
    assert {"RejectedCapacity", "Dispatched"} <= outcomes
    while_queued = {f.name: f for f in text_string_to_metric_families(queued)}
    (size,) = while_queued["llm_d_epp_flow_control_queue_size"].samples
    assert size.value == 2 and size.labels["fairness_id"] == "tenant" and size.labels["inference_pool"] == "pool-a"
    (used,) = while_queued["llm_d_epp_flow_control_capacity_utilization_requests"].samples
    assert used.value == 1.0  # 2 of the band's 2
    assert families["llm_d_epp_flow_control_queue_size"].samples[0].value == 0
