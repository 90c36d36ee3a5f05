"""``LocalCluster(engines_per_process=k)``: engines share mock processes, yet each keeps its own
address, KV-event socket and cache, and the service routes to every one of them."""

from __future__ import annotations

import random

import httpx
import pytest

from ppc_extproc_lab.localcluster import LocalCluster, LocalClusterError, wait_for

pytestmark = pytest.mark.integration


def _producer(client: httpx.Client, cluster: LocalCluster) -> dict:  # type: ignore[type-arg]
    state = client.get(cluster.admin_url + "/debug/state").json()
    return state["plugins"]["precise-prefix-cache-producer"]  # type: ignore[no-any-return]


def test_engines_in_shared_processes_are_separate_endpoints() -> None:
    with LocalCluster(num_engines=5, engines_per_process=3, block_size=16,
                      engine_args=["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]) as cluster:  # fmt: skip
        assert len(cluster.engine_processes) == 2  # engines 0-2 and 3-4
        served = set()
        with httpx.Client(timeout=30, trust_env=False) as client:
            for seed in range(40):
                rng = random.Random(seed)
                body = {"model": "mock-model", "prompt": [rng.randrange(1, 50_000) for _ in range(64)], "max_tokens": 1}
                response = client.post(cluster.listener_url + "/v1/completions", json=body)
                assert response.status_code == 200
                served.add(response.headers["x-mock-vllm-endpoint"])
                if served == set(cluster.engine_endpoints):
                    break
            assert served == set(cluster.engine_endpoints)
            # Each engine's KV events come from its own socket and land on its own index entries.
            wait_for(lambda: set(_producer(client, cluster)["index"]["entriesPerEndpoint"]) == served,
                     what="every engine's blocks in the index", timeout=10)  # fmt: skip
            sources = _producer(client, cluster)["kvEvents"]
        assert {s["source"]["address"] for s in sources.values()} == set(cluster.kv_events_endpoints)
        with pytest.raises(LocalClusterError, match="share processes"):
            cluster.stop_engine(0)
