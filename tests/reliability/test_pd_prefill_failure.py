"""A prefill engine dies under P/D (real Envoy, the service, two prefill engines, a decode pod):
once the router has noticed, no client sees an error — every request goes to the live prefiller,
and with both prefillers gone every request is decoded locally (no header), counted as a fallback.

llm-d's sidecar answers a prefill leg it cannot complete with the prefiller's error (502 when it
cannot connect; upstream PR #1206 removed the local fallback), so the router is what keeps
clients whole: it replaces a prefill pick whose KV-event subscriber lost its engine.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from ppc_extproc_lab.localcluster import LocalCluster, wait_for
from ppc_extproc_lab.workload.pd import pd_config

pytestmark = pytest.mark.integration

MODEL = "mock-model"
FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]


def prompt(seed: int, length: int = 300) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 150_000) for _ in range(length)]


@pytest.fixture()
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_engines=3, roles=["prefill", "prefill", "decode"], block_size=16, num_blocks=8192,
                      engine_args=FAST_ENGINES, service_config=pd_config(non_cached_tokens=64)) as c:
        yield c


def burst(cluster: LocalCluster, seeds: range) -> list[tuple[int, str | None, str | None]]:
    """Send one long uncached prompt per seed, 4 at a time: (status, P/D leg, prefiller named)."""
    decode = cluster.indices("decode")[0]

    def one(seed: int) -> tuple[int, str | None, str]:
        rid = f"kill-{seed}"
        r = httpx.post(cluster.listener_url + "/v1/completions", headers={"x-request-id": rid}, timeout=30,
                       json={"model": MODEL, "prompt": prompt(seed), "max_tokens": 4})
        return r.status_code, r.headers.get("x-mock-vllm-kv-transfer"), rid

    with ThreadPoolExecutor(4) as pool:
        sent = list(pool.map(one, seeds))
    log = {e["x_request_id"]: e for e in httpx.get(cluster.engine_urls[decode] + "/sidecar/requests").json()}
    return [(status, leg, log[rid]["header"] if rid in log else None) for status, leg, rid in sent]


def state(cluster: LocalCluster) -> dict[str, Any]:
    out: dict[str, Any] = httpx.get(cluster.admin_url + "/debug/state", timeout=10).json()
    return out


def fallbacks(cluster: LocalCluster) -> float:
    text = httpx.get(cluster.admin_url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ppc_extproc_pd_prefill_fallback_total{"))


def test_a_dead_prefiller_costs_no_client_errors(cluster: LocalCluster) -> None:
    p0, p1 = (cluster.engine_endpoints[i] for i in cluster.indices("prefill"))
    warm = burst(cluster, range(0, 40))
    assert all(status == 200 and leg == "decode" for status, leg, _ in warm)
    assert {header for _, _, header in warm} <= {p0, p1}

    cluster.kill_engine(cluster.indices("prefill")[0])
    wait_for(lambda: p0 in state(cluster)["health"]["kvDisconnected"], what="the router noticing the dead prefiller")
    after = burst(cluster, range(100, 160))
    assert [s for s, _, _ in after] == [200] * len(after)  # 0 client errors
    assert all(leg == "decode" and header == p1 for _, leg, header in after)  # the live prefiller

    cluster.kill_engine(cluster.indices("prefill")[1])
    wait_for(lambda: p1 in state(cluster)["health"]["kvDisconnected"], what="both prefillers gone")
    before = fallbacks(cluster)
    local = burst(cluster, range(200, 240))
    assert [s for s, _, _ in local] == [200] * len(local)
    assert all(leg is None and header is None for _, leg, header in local)  # decoded locally, no header
    assert fallbacks(cluster) - before == len(local)
