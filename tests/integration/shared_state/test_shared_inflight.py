"""Two service replicas behind one Envoy share in-flight load through a real Valkey, and route on
local state, with no failed request, while the store is gone; they re-converge when it is back."""

from __future__ import annotations

import concurrent.futures
import random
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest

from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.localcluster.service_config import default_service_config, with_redis_syncer
from ppc_extproc_lab.valkey import ValkeyServer

pytestmark = pytest.mark.integration

MODEL = "mock-model"
BLOCK = 16
# Slow decode: a request with max_tokens=150 stays in flight for about 1.5 s.
SLOW_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "10"]
T = TypeVar("T")


def wait_until(predicate: Callable[[], T], *, timeout: float = 20.0, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def cluster(valkey_server: ValkeyServer) -> Iterator[LocalCluster]:
    config = with_redis_syncer(default_service_config(block_size=BLOCK), valkey_server.url, sync_interval="100ms")
    with LocalCluster(num_engines=2, service_replicas=2, model=MODEL, block_size=BLOCK, num_blocks=2048,
                      engine_args=SLOW_ENGINES, service_config=config) as c:  # fmt: skip
        yield c


def state(http: httpx.Client, admin_url: str) -> dict[str, Any]:
    return http.get(admin_url + "/debug/state").json()  # type: ignore[no-any-return]


def views(http: httpx.Client, cluster: LocalCluster) -> list[tuple[int, int]]:
    """Per replica: (its own in-flight requests, its view of everyone's) summed over endpoints."""
    out = []
    for url in cluster.service_admin_urls:
        inflight = state(http, url)["inflight"]
        local = sum(v["requests"] for v in inflight.values())
        out.append((local, local + sum(v.get("peer_requests", 0) for v in inflight.values())))
    return out


def store_up(http: httpx.Client, cluster: LocalCluster) -> list[bool]:
    return [state(http, url)["plugins"]["redis-syncer"]["up"] for url in cluster.service_admin_urls]


def complete(http: httpx.Client, cluster: LocalCluster, seed: int, max_tokens: int) -> int:
    rng = random.Random(seed)
    prompt = [rng.randrange(1, 150_000) for _ in range(64)]
    resp = http.post(cluster.listener_url + "/v1/completions",
                     json={"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True})  # fmt: skip
    return resp.status_code


def test_each_replica_sees_the_other_replicas_in_flight_requests(cluster: LocalCluster) -> None:
    with httpx.Client(timeout=30.0, trust_env=False) as http:
        wait_until(lambda: all(store_up(http, cluster)), what="both replicas subscribed to the store")
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(complete, http, cluster, i, 150) for i in range(8)]

            def both_replicas_routed_and_agree() -> bool:
                seen = views(http, cluster)
                return all(local > 0 for local, _ in seen) and all(total == 8 for _, total in seen)

            wait_until(both_replicas_routed_and_agree, timeout=10, what="both replicas to count all 8 in flight")
            assert [f.result() for f in futures] == [200] * 8
        wait_until(lambda: views(http, cluster) == [(0, 0), (0, 0)], what="in-flight back to zero everywhere")


def test_store_killed_mid_run_fails_no_request_and_reconverges(cluster: LocalCluster, valkey_server: ValkeyServer) -> None:
    with httpx.Client(timeout=30.0, trust_env=False) as http:
        wait_until(lambda: all(store_up(http, cluster)), what="both replicas subscribed to the store")
        statuses: list[int] = []
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            first = [pool.submit(complete, http, cluster, i, 20) for i in range(12)]
            valkey_server.kill()
            wait_until(lambda: not any(store_up(http, cluster)), what="both replicas to notice the store is gone")
            down = [pool.submit(complete, http, cluster, 100 + i, 20) for i in range(12)]
            statuses += [f.result() for f in first + down]
            valkey_server.restart()
            restarted = time.monotonic()
            wait_until(lambda: all(store_up(http, cluster)), timeout=5, what="both replicas back on the store")
            converged_after = time.monotonic() - restarted
            slow = [pool.submit(complete, http, cluster, 200 + i, 150) for i in range(6)]

            def agree() -> bool:
                seen = views(http, cluster)
                return all(total == 6 for _, total in seen)

            wait_until(agree, timeout=10, what="both replicas to count all 6 in flight after the restart")
            statuses += [f.result() for f in slow]
        assert statuses == [200] * len(statuses)
        assert converged_after < 5.0  # re-convergence is measured in benchmarks/bench_replicas.py
