"""Several service replicas behind one Envoy: real Envoy (wheel), mock vLLM engines, the service.

Envoy's ``ext_proc`` cluster lists every replica and spreads the gRPC streams (one per request)
over them; each replica subscribes to every engine's KV events, so each one's precise index also
learns the blocks of requests another replica routed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest

from ppc_extproc_lab.localcluster import LocalCluster

pytestmark = pytest.mark.integration

MODEL = "mock-model"
BLOCK = 16
FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]
ENGINE_HEADER = "x-mock-vllm-endpoint"
T = TypeVar("T")


def wait_until(predicate: Callable[[], T], *, timeout: float = 20.0, what: str) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


def tokens(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 150_000) for _ in range(length)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(
        num_engines=2,
        service_replicas=2,
        model=MODEL,
        block_size=BLOCK,
        num_blocks=2048,
        engine_args=FAST_ENGINES,
    ) as c:
        yield c


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30.0, trust_env=False) as client:
        yield client


def complete(http: httpx.Client, cluster: LocalCluster, prompt: list[int], request_id: str) -> str:
    """Send one completion through Envoy; the ``ip:port`` of the engine that served it."""
    resp = http.post(
        cluster.listener_url + "/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": 2},
        headers={"x-request-id": request_id},
    )
    assert resp.status_code == 200, resp.text
    return resp.headers[ENGINE_HEADER]


def decisions(http: httpx.Client, admin_url: str) -> dict[str, dict[str, Any]]:
    """A replica's recent routing decisions by request id."""
    answer = http.get(admin_url + "/debug/decisions").json()
    return {d["requestId"]: d for d in answer["decisions"]}


def test_every_replica_is_started_with_its_own_ports(cluster: LocalCluster) -> None:
    procs = cluster.service_processes
    assert [p.name for p in procs] == ["service-0", "service-1"]
    assert all(p.running() for p in procs)
    assert cluster.service_process is procs[0]
    assert len(set(cluster.grpc_ports + cluster.service_admin_ports)) == 4
    assert cluster.admin_url == cluster.service_admin_urls[0]


def test_requests_are_served_and_both_replicas_route_some(
    cluster: LocalCluster, http: httpx.Client
) -> None:
    served: dict[str, str] = {}
    for i in range(60):  # Envoy picks a replica per stream: both get some long before 60
        rid = f"replicas-{i}"
        served[rid] = complete(http, cluster, tokens(i, 40), rid)
        seen = [decisions(http, url) for url in cluster.service_admin_urls]
        if all(any(r in d for r in served) for d in seen):
            break
    else:
        raise AssertionError(f"{len(served)} requests and one replica routed none")
    seen = [decisions(http, url) for url in cluster.service_admin_urls]
    for rid, endpoint in served.items():
        deciders = [d[rid] for d in seen if rid in d]
        assert len(deciders) == 1, f"{rid} routed by {len(deciders)} replicas"
        assert deciders[0]["destination"] == endpoint
        assert endpoint in cluster.engine_endpoints


def test_each_replica_indexes_what_the_other_routed(
    cluster: LocalCluster, http: httpx.Client
) -> None:
    """KV events reach every replica: the one that did not route a request learns its blocks."""
    shared = tokens(4242, 10 * BLOCK)
    rid = "replicas-indexed"
    served = complete(http, cluster, shared + tokens(4243, 5), rid)
    (router,) = [r for r, url in enumerate(cluster.service_admin_urls) if rid in decisions(http, url)]
    other = cluster.service_admin_urls[1 - router]

    def indexed_on_other() -> bool:
        answer = http.post(other + "/debug/score", json={"model": MODEL, "prompt": shared}).json()
        held = {e["endpoint"]: int(e["cachedBlocksByTier"].get("gpu", 0)) for e in answer["endpoints"]}
        return held.get(served, 0) >= 10

    wait_until(indexed_on_other, what="the other replica's index to hold the blocks")


def test_stop_and_start_one_replica(cluster: LocalCluster, http: httpx.Client) -> None:
    first, second = cluster.service_processes
    cluster.stop_service(1)
    assert first.running() and not second.running()
    cluster.start_service(1)
    assert first.running() and second.running()
    assert http.get(cluster.service_admin_urls[1] + "/readyz").status_code == 200
    with pytest.raises(IndexError):
        cluster.stop_service(2)


def test_stop_reaps_every_replica() -> None:
    cluster = LocalCluster(num_engines=1, service_replicas=2, with_envoy=False)
    with cluster:
        pids = [p.pid for p in cluster.service_processes]
        assert all(pid is not None for pid in pids)
    for proc in cluster.service_processes:
        assert not proc.running() and proc.returncode is not None
