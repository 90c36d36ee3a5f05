"""Admin HTTP endpoints, gRPC health, readiness before discovery, and graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import orjson
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import Client, body, headers, response_body, response_headers, running_service, set_headers

from ppc_extproc.index import PodEntry
from ppc_extproc.scheduling.pool import parse_endpoint_list
from ppc_extproc.tokens import TokenizedPrompt
from ppc_extproc.tokens.le32 import tokens_to_le32
from ppc_extproc_lab.localcluster import wait_for

pytestmark = pytest.mark.integration

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters: {speculativeIndexing: true, kvEventsConfig: {discoverPods: false}}
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
- type: active-request-scorer
schedulingProfiles:
- name: default
  plugins: [{pluginRef: prefix-cache-scorer, weight: 3}, {pluginRef: active-request-scorer, weight: 2}]
"""
PODS = "10.2.0.1:8000,10.2.0.2:8000"


def http(method: str, url: str, data: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def health(port: int, service: str) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
        except grpc.RpcError as error:
            return -1 if error.code() == grpc.StatusCode.NOT_FOUND else -2


def test_admin_endpoints(tmp_path: Path) -> None:
    with running_service(tmp_path, CONFIG, endpoints=PODS) as svc:
        base = f"http://127.0.0.1:{svc.admin_port}"
        assert http("GET", base + "/healthz")[0] == 200
        assert http("GET", base + "/readyz")[0] == 200
        producer = svc.loaded.roles.producers[0]
        tokens = list(range(640))
        keys = producer.block_keys(TokenizedPrompt("m", (tokens_to_le32(tokens),)))[0]
        producer.index.add(None, keys[:30], [PodEntry("10.2.0.2:8000", "gpu")])
        size = len(producer.index)

        status, answer = http("POST", base + "/debug/score", orjson.dumps({"model": "m", "prompt": tokens}))
        assert status == 200
        result = orjson.loads(answer)
        assert result["picked"] == "10.2.0.2:8000"
        best = result["endpoints"][0]
        assert best["endpoint"] == "10.2.0.2:8000"
        assert (best["matchBlocks"], best["totalBlocks"], best["blockSizeTokens"]) == (30, 40, 16)
        assert best["cachedBlocksByTier"] == {"gpu": 30}
        assert best["scores"] == {"prefix-cache-scorer": 0.75, "active-request-scorer": 1.0}
        assert best["total"] == pytest.approx(3 * 0.75 + 2 * 1.0)
        assert len(producer.index) == size  # no speculative seeding
        assert svc.router.inflight.snapshot() == {}  # no in-flight count

        status, answer = http("POST", base + "/debug/score", b'{"prompt":[1]}')
        assert status == 400 and b"model not found" in answer

        Client(svc.grpc_port).run([
            headers(), body(orjson.dumps({"model": "m", "prompt": tokens})),
            response_headers(200, upstream=True), response_body(b"{}", eos=True),
        ])
        status, metrics = http("GET", base + "/metrics")
        text = metrics.decode()
        # counted when the response ends, with the status the engine answered
        assert 'ppc_extproc_requests_total{code="200",outcome="routed"} 1.0' in text
        assert "ppc_extproc_decision_duration_seconds_count 1.0" in text
        assert 'ppc_extproc_index_request_keys{producer="precise-prefix-cache-producer"} 40.0' in text

        decisions = json.loads(http("GET", base + "/debug/decisions")[1])["decisions"]
        assert len(decisions) == 1 and decisions[0]["destination"] == "10.2.0.2:8000"
        assert (decisions[0]["matchBlocks"], decisions[0]["totalBlocks"]) == (30, 40)
        rid = decisions[0]["requestId"]
        assert json.loads(http("GET", base + f"/debug/decisions?request_id={rid}")[1])["decisions"] == decisions
        assert json.loads(http("GET", base + "/debug/decisions?request_id=nope")[1])["decisions"] == []

        state = json.loads(http("GET", base + "/debug/state")[1])
        assert [e["endpoint"] for e in state["endpoints"]] == ["10.2.0.1:8000", "10.2.0.2:8000"]
        index = state["plugins"]["precise-prefix-cache-producer"]["index"]
        assert index["entriesPerEndpoint"]["10.2.0.2:8000"] == 40  # 30 confirmed + speculative on the other 10
        assert state["plugins"]["precise-prefix-cache-producer"]["speculativePendingRequests"] == 1


def test_health_services(tmp_path: Path) -> None:
    with running_service(tmp_path, CONFIG, endpoints=PODS) as svc:
        serving = health_pb2.HealthCheckResponse.SERVING
        for name in ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            assert health(svc.grpc_port, name) == serving
        assert health(svc.grpc_port, "something-else") == -1


class GatedDiscovery:
    """Produces its endpoint list only when told to."""

    name = "gated"

    def __init__(self) -> None:
        self.release = threading.Event()

    async def run(self, pool, stop) -> None:
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        pool.replace(parse_endpoint_list(PODS))
        await stop.wait()


def test_not_ready_until_discovery_produces_endpoints(tmp_path: Path) -> None:
    from ppc_extproc.server.app import ServeOptions, serve

    gate = GatedDiscovery()
    state: dict = {}

    def run() -> None:
        options = ServeOptions(grpc_address="127.0.0.1", grpc_port=0, admin_port=0, endpoints=None, discovery=gate)
        asyncio.run(serve(options, install_signal_handlers=False,
                          on_started=lambda s: state.update(service=s), on_ready=lambda s: state.update(ready=True)))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: "service" in state, what="the service to start")
        svc = state["service"]
        assert health(svc.grpc_port, "readiness") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert health(svc.grpc_port, "") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert health(svc.grpc_port, "liveness") == health_pb2.HealthCheckResponse.SERVING
        assert http("GET", f"http://127.0.0.1:{svc.admin_port}/readyz")[0] == 503
        gate.release.set()
        wait_for(lambda: "ready" in state, what="readiness")
        assert health(svc.grpc_port, "readiness") == health_pb2.HealthCheckResponse.SERVING
    finally:
        if "service" in state:
            state["service"].request_stop()
        thread.join(30)
        assert not thread.is_alive()


def test_shutdown_drains_open_streams(tmp_path: Path) -> None:
    """On stop: health goes NOT_SERVING at once, an open stream still completes, then exit."""
    with running_service(tmp_path, CONFIG, endpoints=PODS) as svc:
        finish = threading.Event()

        def messages():
            yield headers()
            yield body(b'{"model":"m","prompt":[1,2', eos=False)
            finish.wait(10)
            yield body(b",3]}")

        client = Client(svc.grpc_port)
        call = client.stub.Process(messages(), timeout=20)
        wait_for(lambda: svc.extproc.active == 1, what="the stream to open")
        svc.request_stop()
        wait_for(lambda: not svc.health.ready, what="health to go NOT_SERVING")
        finish.set()
        replies = list(call)
        assert set_headers(replies[0])["x-gateway-destination-endpoint"] in PODS.split(",")
        client.close()


def test_sigterm_exits_zero(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "src")}
    process = subprocess.Popen(
        [sys.executable, "-m", "ppc_extproc", "serve", "--grpc-port", "0", "--admin-port", "0",
         "--endpoints", PODS, "--log-format", "json"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, start_new_session=True,
    )
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 30
        for line in process.stderr:
            if b"service_ready" in line or time.monotonic() > deadline:
                break
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
