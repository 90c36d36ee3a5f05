"""InferenceModelRewrite under llm-d's chart arguments: the installed entrypoint against the fake API
server, which serves an InferenceModelRewrite (``llm-d.ai/v1alpha2``) mapping the client's model
``assistant`` to the engines' ``qwen``. Each engine is warmed directly (not through ext_proc) with its
own prompt under ``qwen``; requests naming ``assistant`` then reach the engine holding their prompt
(the index is keyed by the target model), the engine accepts the body (a mock engine answers 404 to
a model it does not serve), and llm-d's metrics carry ``target_model_name="qwen"``."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from k8s_harness import NAMESPACE, fake_api
from test_llmd_chart_args import (
    CONFIG,
    HARNESS,
    SERVING,
    _is,
    chart_args,
    engines,
    free_port,
    pool_of_pods,
    scrape,
    tls_channel,
    until,
)

pytestmark = pytest.mark.integration

REWRITES = ("llm-d.ai", "v1alpha2", "inferencemodelrewrites")


def rewrite_object() -> dict[str, Any]:
    return {"apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceModelRewrite",
            "metadata": {"name": "assistant-alias", "creationTimestamp": "2026-08-01T00:00:00Z"},
            "spec": {"poolRef": {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "qwen"},
                     "rules": [{"matches": [{"model": {"type": "Exact", "value": "assistant"}}],
                                "targets": [{"modelRewrite": "qwen", "weight": 100}]}]}}


async def route(grpc_port: int, model: str, prompt: list[int]) -> tuple[str, int, dict[str, Any], dict[str, Any]]:
    """One request through ext_proc (TLS, FULL_DUPLEX_STREAMED) with the body ext_proc forwards sent
    to the destination it picked: (destination, engine status, engine reply, the reply the client gets)."""
    if str(HARNESS) not in sys.path:
        sys.path.insert(0, str(HARNESS))
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
    from harness import body, headers, metadata_destination, response_body, response_headers

    payload = json.dumps({"model": model, "prompt": prompt, "max_tokens": 4}).encode()
    async with await tls_channel(grpc_port) as channel:
        call = external_processor_pb2_grpc.ExternalProcessorStub(channel).Process(timeout=20)
        await call.write(headers())
        await call.write(body(payload))
        reply = await call.read()
        destination = metadata_destination(reply)
        forwarded = b""
        while True:  # the (rewritten) body ext_proc streams back
            message = await call.read()
            chunk = message.request_body.response.body_mutation.streamed_response
            forwarded += chunk.body
            if chunk.end_of_stream:
                break
        async with aiohttp.ClientSession() as http, http.post(
                f"http://{destination}/v1/completions", data=forwarded, headers={"content-type": "application/json"}) as resp:
            answer, status = await resp.read(), resp.status
        await call.write(response_headers(status, served=destination))
        await call.write(response_body(answer, eos=True))
        await call.done_writing()
        back = b""  # the response body as ext_proc hands it on to the client
        while (message := await call.read()) is not grpc.aio.EOF:
            if message.HasField("response_body"):
                mutation = message.response_body.response.body_mutation
                back += mutation.streamed_response.body if mutation.HasField("streamed_response") else mutation.body
    return destination, status, json.loads(answer), json.loads(back)


async def warm(destination: str, prompt: list[int]) -> None:
    async with aiohttp.ClientSession() as http, http.post(
            f"http://{destination}/v1/completions", json={"model": "qwen", "prompt": prompt, "max_tokens": 1}) as resp:
        assert resp.status == 200


@pytest.mark.skipif(shutil.which("ppc-extproc") is None, reason="needs the installed ppc-extproc entrypoint")
def test_model_rewrite_routes_by_the_targets_cache(tmp_path: Path) -> None:
    base = random.randint(2, 250)
    hosts = [f"127.0.{base}.{i}" for i in (31, 32)]
    http_port, kv_port = free_port(*hosts), free_port(*hosts)
    config = tmp_path / "default-plugins.yaml"
    config.write_text(CONFIG.format(kv_port=kv_port))
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()

    async def scenario() -> None:
        fleet = engines(hosts, http_port, kv_port)
        epp: subprocess.Popen[bytes] | None = None
        try:
            async with fake_api() as fake:
                env = pool_of_pods(fake, tmp_path, hosts, http_port)
                fake.put(REWRITES, NAMESPACE, rewrite_object())
                args = chart_args(replicas=1, config_file=config, grpc_port=grpc_port, health_port=health_port,
                                  metrics_port=metrics_port)
                with (tmp_path / "epp.log").open("wb") as log_file:
                    epp = subprocess.Popen(["ppc-extproc", *args], env=env, stdout=subprocess.DEVNULL,
                                           stderr=log_file, start_new_session=True)
                await until(lambda: _is(health_port, "inference-extension", SERVING), "inference-extension SERVING")

                async def rewrites_listed() -> bool:
                    return bool(fake.calls("inferencemodelrewrites", "watch"))  # a watch follows the list

                await until(rewrites_listed, "the rewrites listed")
                prompts = {f"{h}:{http_port}": list(range(1000 + 100 * i, 1064 + 100 * i)) for i, h in enumerate(hosts)}
                for destination, prompt in prompts.items():
                    await until(lambda d=destination: _engine_up(d), f"engine {destination}")
                    await warm(destination, prompt)

                async def admitted() -> bool:
                    return (await scrape(metrics_port)).get("llm_d_epp_kv_cache_index_admissions_total", 0) >= 8

                await until(admitted, "both engines' KV events applied")
                for destination, prompt in prompts.items():
                    routed, status, reply, client_reply = await route(grpc_port, "assistant", prompt)
                    assert status == 200, reply  # the engine got model qwen
                    assert routed == destination and reply["model"] == "qwen"
                    assert client_reply["model"] == "assistant"  # and the client gets its own name back
                samples = await scrape(metrics_port)
                assert samples['inference_objective_request_total{model_name="assistant",priority="0",'
                               'target_model_name="qwen"}'] == 2
                assert epp.poll() is None
        finally:
            for process in (epp, fleet):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait(10)
            if fleet.stdout is not None:
                fleet.stdout.close()

    asyncio.run(asyncio.wait_for(scenario(), 150))


async def _engine_up(destination: str) -> bool:
    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://{destination}/health") as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False
