"""The installed ``ppc-extproc`` entrypoint given exactly the argument list llm-d's chart renders
(``llm-d/llm-d-router: config/charts/routerlib/templates/_deployment.yaml``), for one EPP replica
and for three, against the fake API server and mock vLLM engines: the process stays up, gRPC health
on the health port answers SERVING for the services the chart probes, a request routed over the
ext_proc port — TLS with a certificate made at start, as llm-d's default ``--secure-serving`` — is
served by an engine, and ``/metrics`` has llm-d's and GIE's dashboard families.

The chart's values set the ports here (``router.epp.grpcHealthPort`` and ``router.epp.flags``
``grpc-port``/``metrics-port``, rendered ``--key=value``), so parallel runs do not collide; the
config path is the test's, not ``/config/…``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml
from fake_apiserver import PODS, POOLS, inference_pool, pod
from grpc_health.v1 import health_pb2, health_pb2_grpc
from k8s_harness import NAMESPACE, fake_api, write_kubeconfig

pytestmark = pytest.mark.integration

HARNESS = Path(__file__).resolve().parents[1] / "extproc"  # its Envoy message builders
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: endpoint-notification-source
- type: metrics-data-source
- type: core-metrics-extractor
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSizeTokens: 16}}
    kvEventsConfig: {{podDiscoveryConfig: {{socketPort: {kv_port}}}}}
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- type: queue-scorer
- type: max-score-picker
dataLayer:
  sources:
  - pluginRef: endpoint-notification-source
    extractors: [{{pluginRef: precise-prefix-cache-producer}}]
  - pluginRef: metrics-data-source
    extractors: [{{pluginRef: core-metrics-extractor}}]
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: prefix-cache-scorer, weight: 3}}, {{pluginRef: queue-scorer, weight: 1}}, {{pluginRef: max-score-picker}}]
"""

#: What GIE's dashboard (tools/dashboards/inference_gateway.json) and llm-d's dashboards read,
#: among the families our features fill.
DASHBOARD_FAMILIES = [
    "inference_objective_request_total", "inference_objective_request_duration_seconds_bucket",
    "inference_objective_request_sizes_bucket", "inference_objective_response_sizes_bucket",
    "inference_objective_input_tokens_bucket", "inference_objective_output_tokens_bucket",
    "inference_objective_prompt_cached_tokens_bucket", "inference_objective_running_requests",
    "llm_d_epp_request_total", "llm_d_epp_request_duration_seconds_bucket", "llm_d_epp_request_input_tokens_bucket",
    "llm_d_epp_request_running",
    "inference_pool_average_kv_cache_utilization", "inference_pool_average_queue_size",
    "inference_pool_average_running_requests", "inference_pool_ready_pods", "inference_pool_per_pod_queue_size",
    "inference_extension_scheduler_e2e_duration_seconds_bucket", "inference_extension_scheduler_attempts_total",
    "inference_extension_plugin_duration_seconds_bucket", "inference_extension_info",
    "llm_d_epp_kv_cache_events_messages_received_total", "llm_d_epp_kv_cache_index_admissions_total",
    "process_cpu_seconds_total", "process_resident_memory_bytes", "python_info", "ppc_extproc_build_info",
]


def chart_args(*, replicas: int, config_file: Path, grpc_port: int, health_port: int, metrics_port: int,
               extra_flags: dict[str, str] | None = None) -> list[str]:
    """``_deployment.yaml``'s ``args:`` for a pool, with ``router.epp.flags`` rendered sorted
    (Helm ranges over a map in key order) as ``--key=value``."""
    args = ["--pool-name", "qwen", "--pool-namespace", NAMESPACE, "--pool-group", "inference.networking.k8s.io",
            "--zap-encoder", "json", "--config-file", str(config_file)]
    if replicas > 1:
        args.append("--ha-enable-leader-election")
    args += ["--grpc-health-port", str(health_port)]
    flags = {"grpc-port": str(grpc_port), "metrics-port": str(metrics_port), **(extra_flags or {})}
    args += [f"--{key}={value}" for key, value in sorted(flags.items())]
    args += ["--tracing=false"]
    return args


def free_port(host: str = "127.0.0.1", *also: str) -> int:
    """A port free on ``host`` and on every address in ``also``."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        try:
            for other in also:
                with socket.socket() as t:
                    t.bind((other, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no common free port")


async def until(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def health_status(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=2)
        except grpc.aio.AioRpcError:
            return -1
        return int(reply.status)


def pool_of_pods(fake: Any, tmp_path: Path, hosts: list[str], http_port: int, **env: str) -> dict[str, str]:
    """The fake API server holds InferencePool ``qwen`` and one Ready pod per host; returns the
    environment the chart gives the EPP (kubeconfig pointing at the fake, ``NAMESPACE``, ``env``)."""
    fake.put(POOLS, NAMESPACE, inference_pool("qwen", {"app": "qwen"}, [http_port]))
    for i, host in enumerate(hosts):
        fake.put(PODS, NAMESPACE, pod(f"qwen-{i}", host))
    return {**os.environ, "KUBECONFIG": write_kubeconfig(tmp_path, fake.url), "NAMESPACE": NAMESPACE, **env}


def engines(hosts: list[str], http_port: int, kv_port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "ppc_extproc_lab.mock_vllm", "--host", hosts[0], "--port", str(http_port),
         "--count", str(len(hosts)), "--distinct-hosts", "--kv-events-endpoint", f"tcp://{hosts[0]}:{kv_port}",
         "--block-size", "16", "--model", "qwen", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
    )


async def tls_channel(port: int) -> grpc.aio.Channel:
    """A TLS channel that trusts whatever certificate the server presents (as llm-d's gateway
    DestinationRule does: ``insecureSkipVerify``); grpc cannot skip verification, so the
    presented certificate becomes the root."""
    pem = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port), timeout=5)
    credentials = grpc.ssl_channel_credentials(root_certificates=pem.encode())
    return grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials,
                                   options=[("grpc.ssl_target_name_override", "localhost")])


def plaintext_refused(port: int) -> bool:
    """A plaintext HTTP/2 client gets no gRPC answer from a TLS port."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=3)
        except grpc.RpcError:
            return True
    return False


async def route_and_serve(grpc_port: int, prompt: list[int]) -> tuple[str, dict[str, Any]]:
    """One request through ext_proc over TLS as Envoy sends it (FULL_DUPLEX_STREAMED), forwarded to
    the destination ext_proc picked, and the engine's response fed back: the destination and the reply."""
    if str(HARNESS) not in sys.path:
        sys.path.insert(0, str(HARNESS))
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
    from harness import body, headers, metadata_destination, response_body, response_headers

    payload = json.dumps({"model": "qwen", "prompt": prompt, "max_tokens": 4}).encode()
    async with await tls_channel(grpc_port) as channel:
        call = external_processor_pb2_grpc.ExternalProcessorStub(channel).Process(timeout=20)
        await call.write(headers())
        await call.write(body(payload))
        reply = await call.read()
        destination = metadata_destination(reply)
        async with aiohttp.ClientSession() as http, http.post(
                f"http://{destination}/v1/completions", data=payload, headers={"content-type": "application/json"}) as resp:
            answer = await resp.read()
            status = resp.status
        await call.write(response_headers(status, served=destination))
        await call.write(response_body(answer, eos=True))
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:
            pass
    return destination, json.loads(answer)


async def metrics_status(port: int, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as resp:
        return resp.status


async def scrape(port: int, token: str = "prometheus-token") -> dict[str, float]:
    """``/metrics`` as {sample name with labels: value}, with a bearer token the fake API server's
    TokenReview and SubjectAccessReview admit (llm-d's ``--metrics-endpoint-auth`` is on)."""
    async with aiohttp.ClientSession() as http, http.get(
            f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status == 200, resp.status
        text = await resp.text()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def has_family(samples: dict[str, float], family: str) -> bool:
    return any(name == family or name.startswith(family + "{") for name in samples)


@pytest.mark.skipif(shutil.which("ppc-extproc") is None, reason="needs the installed ppc-extproc entrypoint")
@pytest.mark.parametrize("replicas", [1, 3])
def test_chart_argument_list_runs_as_llmd_epp(tmp_path: Path, replicas: int) -> None:
    base = random.randint(2, 250)
    hosts = [f"127.0.{base}.{i}" for i in (11, 12)]
    http_port = free_port(*hosts)
    kv_port = free_port(*hosts)
    config = tmp_path / "default-plugins.yaml"
    config.write_text(CONFIG.format(kv_port=kv_port))
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    probed = ["liveness", "readiness"] if replicas > 1 else ["inference-extension"]

    async def scenario() -> None:
        fleet = engines(hosts, http_port, kv_port)
        epp: subprocess.Popen[bytes] | None = None
        try:
            async with fake_api() as fake:
                env = pool_of_pods(fake, tmp_path, hosts, http_port, POD_NAME="qwen-epp-0")
                args = chart_args(replicas=replicas, config_file=config, grpc_port=grpc_port,
                                  health_port=health_port, metrics_port=metrics_port,
                                  extra_flags={"drain-timeout": "1s"} if replicas > 1 else None)
                with (tmp_path / "epp.log").open("wb") as log_file:  # the child keeps its own descriptor
                    epp = subprocess.Popen(["ppc-extproc", *args], env=env, stdout=subprocess.DEVNULL,
                                           stderr=log_file, start_new_session=True)
                for service in probed:
                    await until(lambda s=service: _is(health_port, s, SERVING), f"{service} SERVING")
                if replicas > 1:
                    assert await health_status(health_port, "inference-extension") == \
                        health_pb2.HealthCheckResponse.SERVICE_UNKNOWN  # llm-d's health.go, leader election on

                assert await asyncio.to_thread(plaintext_refused, grpc_port)  # llm-d's default: TLS
                prompt = list(range(100, 164))
                first, reply = await route_and_serve(grpc_port, prompt)
                assert first in {f"{h}:{http_port}" for h in hosts} and reply["usage"]["completion_tokens"] == 4

                async def kv_applied() -> bool:
                    samples = await scrape(metrics_port)
                    return samples.get("llm_d_epp_kv_cache_index_admissions_total", 0) > 0

                await until(kv_applied, "the engine's KV events applied")
                second, _ = await route_and_serve(grpc_port, prompt)
                assert second == first  # the prefix is cached there

                async def pool_gauges() -> dict[str, float] | None:
                    samples = await scrape(metrics_port)
                    kv = 'inference_pool_average_kv_cache_utilization{name="qwen"}'
                    return samples if kv in samples and samples.get(
                        'inference_pool_per_pod_queue_size{model_server_pod="qwen-0-rank-0",name="qwen"}') is not None else None

                samples = await until(pool_gauges, "pool gauges from the engines' metrics")
                missing = [f for f in DASHBOARD_FAMILIES if not has_family(samples, f)]
                assert not missing, missing
                assert samples['inference_pool_ready_pods{name="qwen"}'] == len(hosts)
                assert samples['llm_d_epp_ready_endpoints{name="qwen"}'] == len(hosts)
                labels = 'model_name="qwen",priority="0",target_model_name="qwen"'
                assert samples[f"inference_objective_request_total{{{labels}}}"] == 2
                assert samples['inference_objective_running_requests{model_name="qwen"}'] == 0
                assert samples['inference_objective_output_tokens_count{model_name="qwen",target_model_name="qwen"}'] == 2
                assert epp.poll() is None, "the service exited"

                log = (tmp_path / "epp.log").read_text()
                warned = [json.loads(line)["flag"] for line in log.splitlines()
                          if line.startswith("{") and '"llmd_flag_no_effect"' in line]
                # --metrics-endpoint-auth (llm-d's default true): no token 401, a token the
                # SubjectAccessReview refuses 403, Prometheus's 200 (above).
                assert await metrics_status(metrics_port, None) == 401
                assert await metrics_status(metrics_port, "stranger-token") == 403
                assert await metrics_status(metrics_port, "not-a-token") == 401
                expected: set[str] = set()
                assert sorted(warned) == sorted(expected)  # once each

                if replicas > 1:  # the drain window: readiness goes, ext_proc stays, then a clean exit
                    epp.send_signal(signal.SIGTERM)
                    await until(lambda: _is(health_port, "readiness", NOT_SERVING), "readiness NOT_SERVING")
                    assert await health_status(health_port, "liveness") == SERVING
                    third, _ = await route_and_serve(grpc_port, prompt)
                    assert third == first
                    assert await asyncio.to_thread(epp.wait, 30) == 0
        finally:
            for process in (epp, fleet):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait(10)
            if fleet.stdout is not None:
                fleet.stdout.close()

    asyncio.run(asyncio.wait_for(scenario(), 180))


async def _is(port: int, service: str, status: int) -> bool:
    return await health_status(port, service) == status


#: The chart's own default-plugins.yaml (routerlib templates/_config.yaml, vLLM over HTTP), so the
#: only change from llm-d's deployment is the image (deploy/llm-d-values.yaml).
LLMD_DEFAULT_PLUGINS = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
  parameters:
    scheme: "http"
    path: "/metrics"
    insecureSkipVerify: true
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""


@pytest.mark.skipif(shutil.which("ppc-extproc") is None, reason="needs the installed ppc-extproc entrypoint")
def test_image_swap_only_with_the_charts_default_plugins(tmp_path: Path) -> None:
    base = random.randint(2, 250)
    hosts = [f"127.0.{base}.{i}" for i in (21, 22)]
    http_port, kv_port = free_port(*hosts), free_port(*hosts)
    config = tmp_path / "default-plugins.yaml"
    config.write_text(LLMD_DEFAULT_PLUGINS)
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()

    async def scenario() -> None:
        fleet = engines(hosts, http_port, kv_port)
        epp: subprocess.Popen[bytes] | None = None
        try:
            async with fake_api() as fake:
                env = pool_of_pods(fake, tmp_path, hosts, http_port, POD_NAME="qwen-epp-0")
                # deploy/llm-d-values.yaml's settings: its router.epp.flags (none today) rendered as the chart does.
                values = yaml.safe_load((Path(__file__).resolve().parents[3] / "deploy" / "llm-d-values.yaml").read_text())
                flags = {str(k): str(v).lower() if isinstance(v, bool) else str(v)
                         for k, v in (values["router"]["epp"].get("flags") or {}).items()}
                args = chart_args(replicas=1, config_file=config, grpc_port=grpc_port, health_port=health_port,
                                  metrics_port=metrics_port, extra_flags=flags)
                epp = subprocess.Popen(["ppc-extproc", *args], env=env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
                await until(lambda: _is(health_port, "inference-extension", SERVING), "inference-extension SERVING")
                destination, reply = await route_and_serve(grpc_port, list(range(7, 71)))
                assert destination in {f"{h}:{http_port}" for h in hosts} and reply["usage"]["completion_tokens"] == 4
                samples = await scrape(metrics_port)
                assert samples['inference_pool_ready_pods{name="qwen"}'] == len(hosts)
                assert epp.poll() is None
        finally:
            for process in (epp, fleet):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait(10)
            if fleet.stdout is not None:
                fleet.stdout.close()

    asyncio.run(asyncio.wait_for(scenario(), 120))
