"""Flow control over real gRPC to the in-process service, saturation read by the utilization
detector from an engine ``/metrics`` (a real HTTP server whose gauges the test sets):

* a request's InferenceObjective priority picks its band, and queued requests are dispatched once
  the engine's polled queue drains;
* a stalled ``/metrics`` does not halt dispatch (in-flight accounting takes over), while llm-d's
  fail-closed ``staleMetrics: saturated`` holds the request until its TTL (429)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import Client, body, headers, metadata_destination, running_service

from ppc_extproc.scheduling.objectives import Objectives

pytestmark = pytest.mark.integration

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: metrics-data-source
- type: core-metrics-extractor
- type: queue-scorer
- type: max-score-picker
- type: utilization-detector
  parameters: {{staleMetrics: {stale}}}
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{{pluginRef: core-metrics-extractor}}]
flowControl:
  defaultRequestTTL: 1500ms
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: queue-scorer, weight: 1}}, {{pluginRef: max-score-picker}}]
"""


class Engine:
    """An engine's ``/metrics``: gauges the test sets; ``stalled`` makes every scrape hang."""

    def __init__(self) -> None:
        self.waiting, self.kv = 0, 0.1
        self.stalled = threading.Event()

    def text(self) -> bytes:
        return (f'vllm:num_requests_waiting{{model_name="m"}} {self.waiting}\n'
                f'vllm:num_requests_running{{model_name="m"}} 4\n'
                f'vllm:kv_cache_usage_perc{{model_name="m"}} {self.kv}\n').encode()


@pytest.fixture
def engine() -> Iterator[tuple[Engine, int]]:
    state = Engine()
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if state.stalled.is_set():
                release.wait(10)
                return
            payload = state.text()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, int(server.server_address[1])
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def request(port: int, objective: str | None = None) -> Any:
    client = Client(port)
    try:
        extra = {"x-llm-d-inference-objective": objective} if objective else None
        payload = orjson.dumps({"model": "m", "prompt": "hello", "max_tokens": 4})
        return client.run([headers(extra=extra), body(payload)])[0]
    finally:
        client.close()


def wait_for(check: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_objective_priority_picks_the_band_and_a_drained_engine_dispatches(tmp_path: Path,
                                                                          engine: tuple[Engine, int]) -> None:
    state, port = engine
    endpoint = f"127.0.0.1:{port}"
    objectives = Objectives()
    objectives.replace({"batch": -1, "interactive": 5})
    state.waiting = 10  # 10 / 5: saturated
    with running_service(tmp_path, CONFIG.format(stale="inflight"), endpoints=endpoint,
                         objectives=objectives) as service:
        store = service.loaded.services.engine_metrics
        wait_for(lambda: (s := store.snapshot(endpoint)) is not None and s.waiting == 10, "saturated metrics")
        controller = service.flow_controller
        assert controller is not None
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = [pool.submit(request, service.grpc_port, o) for o in ("batch", "interactive", None)]
            wait_for(lambda: controller.queued == 3, "three requests queued")
            assert {p: n for p, (n, *_rest) in controller.band_usage().items() if n} == {-1: 1, 0: 1, 5: 1}
            state.waiting = 0
            for answer in answers:
                assert metadata_destination(answer.result(timeout=20)) == endpoint
        assert controller.queued == 0


@pytest.mark.parametrize(("stale", "dispatched"), [("inflight", True), ("saturated", False)])
def test_stalled_metrics_slow_dispatch_instead_of_halting_it(tmp_path: Path, engine: tuple[Engine, int],
                                                             stale: str, dispatched: bool) -> None:
    state, port = engine
    endpoint = f"127.0.0.1:{port}"
    with running_service(tmp_path, CONFIG.format(stale=stale), endpoints=endpoint) as service:
        store = service.loaded.services.engine_metrics
        wait_for(lambda: store.snapshot(endpoint) is not None, "first poll")
        assert metadata_destination(request(service.grpc_port)) == endpoint
        state.stalled.set()
        detector = service.loaded.flow_control.policies.detector  # type: ignore[union-attr]
        wait_for(lambda: (service.flow_controller.saturation(), detector.stale_endpoints())[1] == 1,  # type: ignore[union-attr]
                 "metrics stale")
        answer = request(service.grpc_port)
        if dispatched:
            assert metadata_destination(answer) == endpoint
        else:
            imm = answer.immediate_response
            assert imm.status.code == 429
            reasons = {h.header.key: h.header.raw_value.decode() for h in imm.headers.set_headers}
            assert reasons["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"


def test_shutdown_drops_queued_requests_with_503_shutting_down(tmp_path: Path, engine: tuple[Engine, int]) -> None:
    state, port = engine
    endpoint = f"127.0.0.1:{port}"
    state.waiting = 10
    with running_service(tmp_path, CONFIG.format(stale="inflight").replace("1500ms", "60s"),
                         endpoints=endpoint) as service:
        store = service.loaded.services.engine_metrics
        wait_for(lambda: (s := store.snapshot(endpoint)) is not None and s.waiting == 10, "saturated metrics")
        controller = service.flow_controller
        assert controller is not None
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(request, service.grpc_port)
            wait_for(lambda: controller.queued == 1, "request queued")
            service.request_stop()
            imm = answer.result(timeout=20).immediate_response
        assert imm.status.code == 503
        reasons = {h.header.key: h.header.raw_value.decode() for h in imm.headers.set_headers}
        assert reasons["x-llm-d-request-dropped-reason"] == "rejected-shutting-down"
