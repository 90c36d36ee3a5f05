"""A prefill engine dies under P/D (real Envoy, the service, two prefill engines, a decode pod).

With llm-d's sidecar behaviour (it answers a prefill leg it cannot complete with the prefiller's
error, 502 when it cannot connect; upstream PR #1206 removed the local fallback) the router is
what keeps clients whole: once it has noticed (its KV-event subscriber lost the engine) every
request goes to the live prefiller, and with both prefillers gone every request is decoded
locally (no header), counted as a fallback.

With the lab sidecar's ``--prefill-fallback local`` there is no window either: a request whose
prefill leg meets the dying engine is decoded locally by the sidecar, so a kill under continuous
load costs 0 client errors; the sidecar's ``x-prefill-fallback`` answer also holds the prefiller
down in the router when the engine is alive but failing (its KV events still flowing).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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


@pytest.fixture()
def fallback_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(num_engines=3, roles=["prefill", "prefill", "decode"], block_size=16, num_blocks=8192,
                      engine_args=FAST_ENGINES, service_config=pd_config(non_cached_tokens=64),
                      sidecar_args=["--prefill-fallback", "local"]) as c:
        yield c


@dataclass(frozen=True)
class Sent:
    request_id: str
    started: float
    status: int


def sidecar_log(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    decode = cluster.indices("decode")[0]
    entries = httpx.get(cluster.engine_urls[decode] + "/sidecar/requests", timeout=10).json()
    return {e["x_request_id"]: e for e in entries}


def test_a_prefiller_killed_under_continuous_load_costs_no_client_errors(fallback_cluster: LocalCluster) -> None:
    cluster = fallback_cluster
    p0, p1 = (cluster.engine_endpoints[i] for i in cluster.indices("prefill"))
    sent: list[Sent] = []
    stop = threading.Event()

    def worker(w: int) -> None:
        with httpx.Client(timeout=30) as http:
            for i in range(10_000):
                if stop.is_set():
                    return
                rid, started = f"load-{w}-{i}", time.monotonic()
                r = http.post(cluster.listener_url + "/v1/completions", headers={"x-request-id": rid},
                              json={"model": MODEL, "prompt": prompt(w * 10_000 + i), "max_tokens": 4})
                sent.append(Sent(rid, started, r.status_code))

    workers = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
    for t in workers:
        t.start()
    try:
        wait_for(lambda: len(sent) >= 30, what="30 requests before the kill")
        cluster.kill_engine(cluster.indices("prefill")[0])
        killed = time.monotonic()  # the engine is reaped: nothing can reach it after this
        wait_for(lambda: p0 in state(cluster)["health"]["kvDisconnected"], what="the router noticing")
        noticed = len(sent)
        wait_for(lambda: len(sent) >= noticed + 30, what="30 requests after the router noticed")
    finally:
        stop.set()
        for t in workers:
            t.join(timeout=60)
    assert [s.status for s in sent if s.status != 200] == []  # 0 client errors, kill moment included
    log = sidecar_log(cluster)
    for s in sent:
        entry = log[s.request_id]
        if entry["fallback"] is not None:
            assert entry["prefiller"] == p0  # only the dead engine's legs failed: decoded locally
        elif entry["prefiller"] == p0:
            assert s.started < killed  # a leg completed on p0 was sent before it died
        else:
            assert entry["prefiller"] in (p1, None)  # the live prefiller, or local by the router
    assert all(log[s.request_id]["prefiller"] in (p1, None) for s in sent[noticed + 3:])


def test_a_failing_but_connected_prefiller_is_held_down_on_the_sidecars_word(fallback_cluster: LocalCluster) -> None:
    cluster = fallback_cluster
    i0 = cluster.indices("prefill")[0]
    p0, p1 = (cluster.engine_endpoints[i] for i in cluster.indices("prefill"))
    r = httpx.post(cluster.engine_urls[i0] + "/mock/faults", json={"completions_status": 503}, timeout=10)
    assert r.status_code == 200
    seed = iter(range(300, 10_000))

    def one() -> httpx.Response:
        n = next(seed)
        return httpx.post(cluster.listener_url + "/v1/completions", timeout=30, headers={"x-request-id": f"held-{n}"},
                          json={"model": MODEL, "prompt": prompt(n), "max_tokens": 4})

    answers: list[httpx.Response] = []
    wait_for(lambda: answers.append(one()) or any("x-prefill-fallback" in a.headers for a in answers),
             what="a request routed to the failing prefiller")
    assert [a.status_code for a in answers] == [200] * len(answers)
    assert answers[-1].headers["x-prefill-fallback"] == "status-503"
    assert p0 not in state(cluster)["health"]["kvDisconnected"]  # its KV events still flow
    wait_for(lambda: p0 in state(cluster)["health"]["down"], what="the router holding the prefiller down")
    after = [one() for _ in range(5)]
    assert [a.status_code for a in after] == [200] * 5
    assert all("x-prefill-fallback" not in a.headers for a in after)
    log = sidecar_log(cluster)
    assert [log[a.request.headers["x-request-id"]]["prefiller"] for a in after] == [p1] * 5
