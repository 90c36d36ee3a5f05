"""One peer router (vllm-router or sglang-router, the ``bench`` extra) in front of two mock
engines — string prompts on byte-tokenising engines, chat through the ``openai`` client on engines
with a tokenizer — and the round-robin balancer that fronts several replicas.

Skipped when the router's executable is not installed (CI installs only the ``test`` extra).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from ppc_extproc_lab.localcluster import LocalCluster, ProcessGroup, free_port
from ppc_extproc_lab.localcluster.balancer import start_balancer
from ppc_extproc_lab.tiny_tokenizer import build_tiny_tokenizer
from ppc_extproc_lab.workload.peers import PEERS, KvEventSources, PeerDeployment, peer
from ppc_extproc_lab.workload.text import words

pytestmark = pytest.mark.integration

ENGINE_HEADER = "x-mock-vllm-endpoint"
FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]


def stream(client: httpx.Client, url: str, prompt: object) -> tuple[int, str | None, int | None]:
    """(status, serving engine, cached tokens) of one streamed completion."""
    body = {"model": "mock-model", "prompt": prompt, "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    cached = None
    with client.stream("POST", url + "/v1/completions", json=body) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                usage = orjson.loads(line[6:]).get("usage")
                if usage:
                    cached = usage["prompt_tokens_details"]["cached_tokens"]
        return resp.status_code, resp.headers.get(ENGINE_HEADER), cached


@pytest.fixture(scope="module")
def engines() -> Iterator[LocalCluster]:
    with LocalCluster(num_engines=2, block_size=16, num_blocks=256, engine_args=FAST_ENGINES,
                      with_service=False) as cluster:  # fmt: skip
        yield cluster


@pytest.mark.peers
@pytest.mark.parametrize("name", sorted(PEERS))
def test_peer_router_routes_a_shared_prefix_to_one_engine(name: str, engines: LocalCluster, tmp_path: Path) -> None:
    router = peer(name)
    if not router.available():
        pytest.skip(f"{router.command[0]} not installed (pip install -e '.[bench]')")
    context = words(f"peer/{name}", 640)
    kv = KvEventSources(engines.kv_events_endpoints, [], 16, "mock-model")
    with PeerDeployment(router, engines.engine_urls, log_dir=tmp_path, kv=kv, startup_timeout=30) as dep, \
            httpx.Client(timeout=30, trust_env=False) as client:  # fmt: skip
        results = [stream(client, dep.url, context + words(f"q/{i}", 40)) for i in range(5)]
        assert all(status == 200 for status, _, _ in results), results
        served = {e for _, e, _ in results}
        assert served <= set(engines.engine_endpoints) and len(served) == 1  # cache_aware keeps the prefix
        assert all((cached or 0) >= 640 // 16 * 16 for _, _, cached in results[1:])
        status, _, _ = stream(client, dep.url, [1, 2, 3, 4])
        assert status == (200 if router.accepts_token_ids else 422)


@pytest.fixture(scope="module")
def chat_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    tiny = build_tiny_tokenizer(tmp_path_factory.mktemp("tiny"))
    with LocalCluster(num_engines=2, block_size=16, num_blocks=256, engine_args=FAST_ENGINES,
                      with_service=False, tokenizer=tiny) as cluster:  # fmt: skip
        yield cluster


@pytest.mark.peers
@pytest.mark.parametrize("name", ["vllm-router", "sglang-router"])
def test_peer_router_routes_chat_from_the_openai_client(name: str, chat_engines: LocalCluster, tmp_path: Path) -> None:
    router = peer(name)
    if not router.available():
        pytest.skip(f"{router.command[0]} not installed (pip install -e '.[bench]')")
    system = {"role": "system", "content": words(f"chat/{name}", 1500)}
    with PeerDeployment(router, chat_engines.engine_urls, log_dir=tmp_path, startup_timeout=30) as dep, \
            openai.OpenAI(base_url=dep.url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:  # fmt: skip
        served, cached = set(), []
        for i in range(4):
            raw = client.chat.completions.with_raw_response.create(
                model="mock-model", messages=[system, {"role": "user", "content": words(f"u/{i}", 60)}], max_tokens=2,  # type: ignore[list-item]
            )
            usage = raw.parse().usage
            assert usage is not None and usage.prompt_tokens_details is not None
            served.add(raw.headers[ENGINE_HEADER])
            cached.append(usage.prompt_tokens_details.cached_tokens or 0)
        assert len(served) == 1 and served <= set(chat_engines.engine_endpoints)
        assert cached[0] == 0 and all(c > 10 * 16 for c in cached[1:])  # the system prompt came from the cache


class _Named(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = self.server.name.encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_balancer_round_robins_over_its_upstreams(tmp_path: Path) -> None:
    servers = []
    for name in ("r0", "r1", "r2"):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Named)
        server.name = name  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    group = ProcessGroup(tmp_path)
    try:
        listener = free_port()
        start_balancer(group, [f"127.0.0.1:{s.server_address[1]}" for s in servers], listener_port=listener,
                       admin_port=free_port())  # fmt: skip
        with httpx.Client(trust_env=False, timeout=10) as client:
            seen = [client.get(f"http://127.0.0.1:{listener}/x").text for _ in range(9)]
        assert sorted(seen) == sorted(["r0", "r1", "r2"] * 3)
    finally:
        group.stop_all()
        for server in servers:
            server.shutdown()
            server.server_close()
