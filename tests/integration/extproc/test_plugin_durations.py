"""llm-d's ``plugin_duration_seconds`` per plugin: a request routed over a real gRPC channel adds one
observation for each configured plugin at its extension point, named by its type and name."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import orjson
import pytest
from harness import Client, body, headers, running_service, set_headers
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {blockSizeTokens: 4}
    kvEventsConfig: {podDiscoveryConfig: {socketPort: 5557}}
- {type: prefix-cache-scorer, name: prefix, parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- type: active-request-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: prefix, weight: 3}
  - {pluginRef: active-request-scorer, weight: 2}
  - {pluginRef: max-score-picker}
"""


def _plugin_counts(port: int, family: str) -> dict[tuple[str, str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    counts: dict[tuple[str, str, str], float] = {}
    for metric in text_string_to_metric_families(text):
        if metric.name != family:
            continue
        for sample in metric.samples:
            if sample.name == family + "_count":
                labels = sample.labels
                counts[(labels["extension_point"], labels["plugin_type"], labels["plugin_name"])] = sample.value
    return counts


def test_each_plugin_call_is_timed_under_its_type_and_name(tmp_path: Path) -> None:
    with running_service(tmp_path, CONFIG, endpoints="10.4.0.1:8000,10.4.0.2:8000") as service:
        client = Client(service.grpc_port)
        try:
            for _ in range(3):
                replies = client.run([headers(), body(orjson.dumps({"model": "m", "prompt": list(range(1, 33))}))])
                assert set_headers(replies[0])["x-gateway-destination-endpoint"] in ("10.4.0.1:8000", "10.4.0.2:8000")
        finally:
            client.close()
        for family in ("llm_d_epp_plugin_duration_seconds", "inference_extension_plugin_duration_seconds"):
            counts = _plugin_counts(service.admin_port, family)
            expected = {
                ("RequestParsing", "request-assembly", "request-assembly"),
                ("DataProducer", "precise-prefix-cache-producer", "precise-prefix-cache-producer"),
                ("Scorer", "prefix-cache-scorer", "prefix"),
                ("Scorer", "active-request-scorer", "active-request-scorer"),
                ("Picker", "max-score-picker", "max-score-picker"),
            }
            assert expected <= set(counts), sorted(counts)
            assert all(counts[key] == 3 for key in expected), counts
            points = {point for point, _, _ in counts}
            assert {"ProfilePicker", "ProcessProfilesResults"} <= points
            assert "all" not in {name for _, _, name in counts}
