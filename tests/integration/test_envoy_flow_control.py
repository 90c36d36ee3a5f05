"""Flow control through a real Envoy: a request held on its ext_proc stream is dispatched when
capacity frees, a request that waits past its TTL gets 429 with its dropped-reason header, and a
client that goes away leaves the queue at once and never reaches an engine.

One mock engine; the pool's capacity is one request (``concurrency-detector``, maxConcurrency 1),
so a second request waits while the first decodes (20 ms a token); queue-wait TTL 5 s."""

from __future__ import annotations

import concurrent.futures
import random
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ppc_extproc_lab.localcluster import LocalCluster, default_service_config, wait_for

pytestmark = pytest.mark.integration

MODEL = "mock-model"
DECODE_MS = 20
TTL_SECONDS = 5.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    config = default_service_config(block_size=16)
    config["featureGates"] = ["flowControl"]
    config["plugins"].append({"type": "concurrency-detector", "parameters": {"maxConcurrency": 1}})
    config["flowControl"] = {"defaultRequestTTL": f"{int(TTL_SECONDS * 1000)}ms",
                             "saturationDetector": {"pluginRef": "concurrency-detector"}}
    engine = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", str(DECODE_MS)]
    with LocalCluster(num_engines=1, model=MODEL, block_size=16, num_blocks=2048, engine_args=engine,
                      service_config=config) as c:
        yield c


def prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 150_000) for _ in range(length)]


def post(cluster: LocalCluster, tokens: list[int], max_tokens: int, timeout: float = 30.0) -> httpx.Response:
    return httpx.post(cluster.listener_url + "/v1/completions", timeout=timeout,
                      json={"model": MODEL, "prompt": tokens, "max_tokens": max_tokens, "ignore_eos": True})


def sample(url: str, name: str, **labels: str) -> float:
    """The value of one series (summed over the labels not given); 0 when absent."""
    text = httpx.get(url + "/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def service_sample(cluster: LocalCluster, name: str, **labels: str) -> float:
    return sample(cluster.admin_url, name, **labels)


def engine_prompt_tokens(cluster: LocalCluster) -> float:
    return sample(cluster.engine_urls[0], "vllm:prompt_tokens_total")


def queued(cluster: LocalCluster) -> float:
    return service_sample(cluster, "llm_d_epp_flow_control_queue_size")


def test_a_queued_request_is_dispatched_when_capacity_frees(cluster: LocalCluster) -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, cluster, prompt(1, 40), 150)  # ~3 s of decode, within the TTL
        wait_for(lambda: service_sample(cluster, "llm_d_epp_flow_control_requests_total",
                                        outcome="Dispatched") >= 1, what="first dispatched")
        second = pool.submit(post, cluster, prompt(2, 41), 2)
        wait_for(lambda: queued(cluster) == 1, what="second request queued")
        assert not second.done()
        assert first.result().status_code == 200
        answer = second.result()
    assert answer.status_code == 200 and answer.json()["usage"]["prompt_tokens"] == 41
    assert queued(cluster) == 0
    waited = service_sample(cluster, "llm_d_epp_flow_control_request_queue_duration_seconds_sum", outcome="Dispatched")
    assert waited > 0.1  # it waited for the first one's decode


def test_ttl_expiry_gives_429_with_its_reason_header(cluster: LocalCluster) -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        long = pool.submit(post, cluster, prompt(3, 40), int(1.6 * TTL_SECONDS * 1000 / DECODE_MS))
        wait_for(lambda: service_sample(cluster, "ppc_extproc_inflight_requests") >= 1, what="long request in flight")
        started = time.monotonic()
        expired = post(cluster, prompt(4, 42), 2)
        waited = time.monotonic() - started
        assert long.result().status_code == 200
    assert expired.status_code == 429
    assert expired.headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"
    assert b"request timed out in queue" in expired.content
    assert waited >= TTL_SECONDS * 0.9
    assert service_sample(cluster, "llm_d_epp_flow_control_requests_total", outcome="EvictedTTL") >= 1


def test_a_cancelled_client_leaves_the_queue_and_costs_nothing_later(cluster: LocalCluster) -> None:
    before = engine_prompt_tokens(cluster)
    cancelled_before = service_sample(cluster, "llm_d_epp_flow_control_requests_total",
                                      outcome="EvictedContextCancelled")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        busy = pool.submit(post, cluster, prompt(5, 40), 300)  # several seconds
        wait_for(lambda: service_sample(cluster, "ppc_extproc_inflight_requests") >= 1, what="busy request in flight")
        with pytest.raises(httpx.ReadTimeout):
            post(cluster, prompt(6, 77), 2, timeout=0.4)  # the client gives up while queued
        wait_for(lambda: service_sample(cluster, "llm_d_epp_flow_control_requests_total",
                                        outcome="EvictedContextCancelled") >= cancelled_before + 1,
                 what="queue eviction on cancel")
        assert queued(cluster) == 0
        assert busy.result().status_code == 200
    after = post(cluster, prompt(7, 33), 2)
    assert after.status_code == 200
    # the engine prefilled the busy and the later request only: 40 + 33 tokens, never the 77
    assert engine_prompt_tokens(cluster) == before + 40 + 33
