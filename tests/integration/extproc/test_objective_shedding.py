"""InferenceObjective priority without flow control (llm-d's legacy admission): a request whose
objective has a negative priority gets 429 with ``x-llm-d-request-dropped-reason:
rejected-saturated`` while the pool is saturated by llm-d's utilization detector (the engine's
polled ``vllm:num_requests_waiting`` above 5 or ``vllm:kv_cache_usage_perc`` above 0.8); priority 0
and above, and requests naming no objective, are routed. Once the engine's metrics drop, the
sheddable request is routed too. Real gRPC to the in-process service; the engine's ``/metrics`` is
a real HTTP server whose gauges the test sets."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import Client, body, headers, metadata_destination, running_service
from prometheus_client.parser import text_string_to_metric_families

from ppc_extproc.scheduling.objectives import Objectives

pytestmark = pytest.mark.integration

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: metrics-data-source
- type: core-metrics-extractor
- type: queue-scorer
- type: max-score-picker
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{pluginRef: core-metrics-extractor}]
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer, weight: 1}, {pluginRef: max-score-picker}]
"""


class Gauges:
    def __init__(self) -> None:
        self.waiting, self.kv = 0, 0.1

    def text(self) -> bytes:
        return (f'vllm:num_requests_waiting{{model_name="m"}} {self.waiting}\n'
                f'vllm:num_requests_running{{model_name="m"}} 1\n'
                f'vllm:kv_cache_usage_perc{{model_name="m"}} {self.kv}\n').encode()


@pytest.fixture
def engine() -> Iterator[tuple[Gauges, int]]:
    gauges = Gauges()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            payload = gauges.text()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield gauges, int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def request(client: Client, objective: str | None) -> Any:
    extra = {"x-gateway-inference-objective": objective} if objective else None
    payload = orjson.dumps({"model": "m", "prompt": "hello", "max_tokens": 4})
    return client.run([headers(extra=extra), body(payload)])[0]


def wait_for(check: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_negative_priority_is_shed_only_while_the_pool_is_saturated(tmp_path: Path, engine: tuple[Gauges, int]) -> None:
    gauges, port = engine
    objectives = Objectives()
    objectives.replace({"batch": -1, "interactive": 5})
    endpoint = f"127.0.0.1:{port}"
    gauges.waiting = 10  # 10 / 5 = 2.0: saturated
    with running_service(tmp_path, CONFIG, endpoints=endpoint, objectives=objectives) as service:
        store = service.loaded.services.engine_metrics

        def polled(waiting: int) -> bool:
            snapshot = store.snapshot(endpoint)
            return snapshot is not None and snapshot.waiting == waiting

        wait_for(lambda: polled(10), "the saturated metrics polled")
        client = Client(service.grpc_port)
        try:
            shed = request(client, "batch")
            imm = shed.immediate_response
            assert imm.status.code == 429 and b"sheddable request dropped" in imm.body
            assert {h.header.key: h.header.raw_value.decode() for h in imm.headers.set_headers}[
                "x-llm-d-request-dropped-reason"] == "rejected-saturated"
            for objective in ("interactive", None, "unknown-objective"):  # priority 5, 0, 0
                assert metadata_destination(request(client, objective)) == endpoint
            gauges.waiting, gauges.kv = 0, 0.9  # the KV cache alone: 0.9 / 0.8 ≥ 1
            wait_for(lambda: polled(0), "the next poll")
            assert request(client, "batch").immediate_response.status.code == 429
            gauges.kv = 0.2
            wait_for(lambda: (s := store.snapshot(endpoint)) is not None and s.kv_usage == 0.2, "the KV drop")
            assert metadata_destination(request(client, "batch")) == endpoint
        finally:
            client.close()
        families = {f.name: f for f in text_string_to_metric_families(_scrape(service))}
        errors = {tuple(sorted(s.labels.items())): s.value for s in families["llm_d_epp_request_error"].samples
                  if s.name.endswith("_total")}
        key = (("error_code", "ResourceExhausted"), ("fairness_id", "default-flow"), ("model_name", "m"),
               ("priority", "-1"), ("target_model_name", "m"))
        assert errors[key] == 2


def _scrape(service: Any) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{service.admin_port}/metrics", timeout=5) as response:
        return str(response.read().decode())
