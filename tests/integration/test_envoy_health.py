"""Endpoint health through a real Envoy (``envoy.yaml``: BUFFERED request bodies, no response
bodies, ``suppress_envoy_headers``) and mock engines with injected faults (``POST /mock/faults``):
soft signals and an engine's own errors never take an endpoint out of routing. Engine deaths, which
must, are ``tests/reliability/test_engine_faults.py``."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ppc_extproc_lab.localcluster import LocalCluster, default_service_config, wait_for

pytestmark = pytest.mark.integration

MODEL = "mock-model"
BLOCK = 16
FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]
#: Sequential requests with distinct prompts over three idle engines: ~1/3 each (ties are broken
#: at random). At least MIN_SHARE of them on one engine fails with probability < 1e-4 by chance.
REQUESTS = 45
MIN_SHARE = 5


def polling_config() -> dict[str, Any]:
    """The embedded default config, plus engine metrics polled every 50 ms and a queue scorer."""
    config = default_service_config(block_size=BLOCK)
    config["plugins"] += [
        {"type": "metrics-data-source", "parameters": {"interval": "50ms"}},
        {"type": "core-metrics-extractor"},
        {"type": "queue-scorer"},
    ]
    config["dataLayer"]["sources"].append(
        {"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "core-metrics-extractor"}]}
    )
    config["schedulingProfiles"][0]["plugins"].insert(0, {"pluginRef": "queue-scorer", "weight": 1})
    return config


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_engines=3, model=MODEL, block_size=BLOCK, num_blocks=2048, engine_args=FAST_ENGINES,
                      service_config=polling_config()) as c:  # fmt: skip
        yield c


def faults(cluster: LocalCluster, engine: int, **body: Any) -> None:
    response = httpx.post(f"{cluster.engine_urls[engine]}/mock/faults", json=body, timeout=10)
    response.raise_for_status()


def admin(cluster: LocalCluster, path: str) -> Any:
    response = httpx.get(cluster.admin_url + path, timeout=10)
    response.raise_for_status()
    return response.json()


def send(cluster: LocalCluster, n: int, seed: int) -> list[httpx.Response]:
    """``n`` sequential completions with distinct 40-token prompts through Envoy."""
    rng = random.Random(seed)
    bodies = [{"model": MODEL, "prompt": [rng.randrange(1, 150_000) for _ in range(40)], "max_tokens": 2} for _ in range(n)]
    with httpx.Client(base_url=cluster.listener_url, timeout=30) as client:
        return [client.post("/v1/completions", json=body) for body in bodies]


def served(responses: list[httpx.Response]) -> Counter[str]:
    return Counter(r.headers.get("x-mock-vllm-endpoint", "none") for r in responses)


def test_an_engine_answering_503_keeps_its_share_and_the_client_sees_its_503(cluster: LocalCluster) -> None:
    faulty = cluster.engine_endpoints[0]
    faults(cluster, 0, completions_status=503)
    try:
        responses = send(cluster, REQUESTS, seed=1)
    finally:
        faults(cluster, 0, completions_status=None)
    shares = served(responses)
    assert shares[faulty] >= MIN_SHARE, shares
    for r in responses:
        if r.headers.get("x-mock-vllm-endpoint") == faulty:
            assert r.status_code == 503 and "injected by POST /mock/faults" in r.text  # the engine's own body
        else:
            assert r.status_code == 200, r.text
    health = admin(cluster, "/debug/state")["health"]
    assert faulty not in health["down"]


def test_an_engine_whose_metrics_answer_404_keeps_receiving_traffic(cluster: LocalCluster) -> None:
    quiet = cluster.engine_endpoints[1]
    polled = httpx.get(f"{cluster.engine_urls[1]}/mock/state", timeout=10).json()["metrics_requests"]
    faults(cluster, 1, metrics_status=404)
    try:
        # the service polled it (and got 404) more often than the 3 failures that used to take it out
        wait_for(lambda: httpx.get(f"{cluster.engine_urls[1]}/mock/state", timeout=10).json()["metrics_requests"]
                 >= polled + 5, what="5 failed metric polls")  # fmt: skip
        responses = send(cluster, REQUESTS, seed=2)
    finally:
        faults(cluster, 1, metrics_status=None)
    assert all(r.status_code == 200 for r in responses), [r.status_code for r in responses]
    assert served(responses)[quiet] >= MIN_SHARE, served(responses)


def kv_connected(cluster: LocalCluster) -> dict[str, bool]:
    """Per endpoint, whether the service's KV-event subscriber is connected."""
    sources = admin(cluster, "/debug/state")["plugins"]["precise-prefix-cache-producer"]["kvEvents"]
    return {ep: bool(s["source"]["connected"]) for ep, s in sources.items() if "source" in s}


def test_with_every_kv_publisher_gone_requests_are_still_routed(cluster: LocalCluster) -> None:
    """Last in this module: the publishers stay closed."""
    wait_for(lambda: all(kv_connected(cluster).get(ep) for ep in cluster.engine_endpoints), what="subscribers connected")
    for engine in range(len(cluster.engine_endpoints)):
        faults(cluster, engine, kv_events=False)
    wait_for(lambda: not any(kv_connected(cluster).values()), what="every subscriber disconnected")
    responses = send(cluster, 20, seed=3)
    assert [r.status_code for r in responses] == [200] * 20
    assert len(served(responses)) >= 2, served(responses)  # still balanced, not pinned to one
    assert sorted(admin(cluster, "/debug/state")["health"]["kvDisconnected"]) == sorted(cluster.engine_endpoints)
