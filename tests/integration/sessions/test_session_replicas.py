"""Session affinity through real Envoy and real service processes.

* Two replicas share bindings through a real Valkey: every turn of a session lands on one engine,
  whichever replica routes it (both replicas route turns of the same sessions).
* The default ``encoded_endpoint_header`` strategy: the response carries ``x-session-token``
  (base64 of the serving endpoint), and a request echoing it goes back to that engine.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.valkey import ValkeyServer

pytestmark = pytest.mark.integration

MODEL = "mock-model"
ENGINE_HEADER = "x-mock-vllm-endpoint"
FAST_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "1"]


def session_config(parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "session-affinity-scorer", "parameters": parameters},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "session-affinity-scorer", "weight": 10}, {"pluginRef": "max-score-picker"}]}],
    }  # fmt: skip


def complete(http: httpx.Client, cluster: LocalCluster, rid: str, headers: dict[str, str]) -> httpx.Response:
    resp = http.post(
        cluster.listener_url + "/v1/completions",
        json={"model": MODEL, "prompt": [1, 2, 3, 4], "max_tokens": 1},
        headers={"x-request-id": rid, **headers},
    )
    assert resp.status_code == 200, resp.text
    return resp


def routed_by(http: httpx.Client, cluster: LocalCluster) -> dict[str, int]:
    """Request id → the replica (index) that routed it."""
    out: dict[str, int] = {}
    for i, url in enumerate(cluster.service_admin_urls):
        for d in http.get(url + "/debug/decisions").json()["decisions"]:
            out[d["requestId"]] = i
    return out


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30.0, trust_env=False) as client:
        yield client


def test_two_replicas_share_bindings_through_valkey(valkey_server: ValkeyServer, http: httpx.Client) -> None:
    config = session_config({"strategy": "session_id",
                             "sessionIdConfig": {"sharedStore": {"address": valkey_server.url, "timeoutMs": 500}}})  # fmt: skip
    with LocalCluster(num_engines=3, service_replicas=2, model=MODEL, engine_args=FAST_ENGINES,
                      service_config=config) as cluster:  # fmt: skip
        served: dict[str, set[str]] = {}
        for turn in range(8):
            for s in range(12):
                resp = complete(http, cluster, f"s{s}-t{turn}", {"x-session-id": f"session-{s}"})
                served.setdefault(f"session-{s}", set()).add(resp.headers[ENGINE_HEADER])
        by_replica = routed_by(http, cluster)
        crossed = [s for s in range(12) if len({by_replica[f"s{s}-t{t}"] for t in range(8)}) == 2]
        assert len(crossed) >= 6, "Envoy should spread a session's turns over both replicas"
        assert {s: len(engines) for s, engines in served.items()} == {f"session-{s}": 1 for s in range(12)}
        assert len(set().union(*served.values())) > 1  # sessions are not all on one engine
        for url in cluster.service_admin_urls:
            state = http.get(url + "/debug/state").json()
            plugin = state["plugins"]["session-affinity-scorer"]
            assert plugin["storeUp"] is True and plugin["storeErrors"] == 0 and plugin["storeHits"] > 0


def test_the_store_killed_mid_run_fails_no_request(valkey_server: ValkeyServer, http: httpx.Client) -> None:
    config = session_config({"strategy": "session_id",
                             "sessionIdConfig": {"sharedStore": {"address": valkey_server.url, "timeoutMs": 100,
                                                                 "retrySeconds": 0.2}}})  # fmt: skip
    with LocalCluster(num_engines=3, service_replicas=2, model=MODEL, engine_args=FAST_ENGINES,
                      service_config=config) as cluster:  # fmt: skip
        def turns(first: int, last: int) -> dict[int, set[str]]:
            """Per session, the engines that served turns ``first`` to ``last - 1`` (all 200)."""
            served: dict[int, set[str]] = {}
            for turn in range(first, last):
                for s in range(6):
                    resp = complete(http, cluster, f"s{s}-t{turn}", {"x-session-id": f"session-{s}"})
                    served.setdefault(s, set()).add(resp.headers[ENGINE_HEADER])
            return served

        assert all(len(e) == 1 for e in turns(0, 4).values())
        valkey_server.kill()
        turns(4, 8)  # complete() asserts 200: the local bindings answer (a replica that never saw a
        # session places it on its own meanwhile: the store is what made them agree)
        def store_use() -> list[tuple[int, int, int]]:
            """Per replica: store reads, store errors, lookups answered locally."""
            states = [http.get(url + "/debug/state").json()["plugins"]["session-affinity-scorer"]
                      for url in cluster.service_admin_urls]  # fmt: skip
            return [(s["storeReads"], s["storeErrors"], s["localFallbacks"]) for s in states]

        use = store_use()
        assert sum(errors for _, errors, _ in use) >= 1 and sum(fallbacks for *_, fallbacks in use) >= 1
        valkey_server.restart()  # empty: the next turn writes each replica's binding, the first wins
        # A replica tries the store again once its skip (retrySeconds) ends, and its first call may
        # meet the dropped connection: re-convergence starts after the first turn in which every
        # replica read the store and none answered locally. Turns before it may differ.
        turn, deadline = 8, time.monotonic() + 30
        while True:
            before = store_use()
            turns(turn, turn + 1)
            turn += 1
            after = store_use()
            if all(a[0] > b[0] and a[1:] == b[1:] for a, b in zip(after, before, strict=True)):
                break
            assert time.monotonic() < deadline, "a replica never used the restarted store"
        assert all(len(e) == 1 for e in turns(turn, turn + 5).values()), "replicas did not re-converge"


def test_the_session_token_on_the_response_brings_the_client_back(http: httpx.Client) -> None:
    with LocalCluster(num_engines=3, service_replicas=1, model=MODEL, engine_args=FAST_ENGINES,
                      service_config=session_config({})) as cluster:  # fmt: skip
        first = complete(http, cluster, "t0", {})
        engine = first.headers[ENGINE_HEADER]
        token = first.headers["x-session-token"]
        assert base64.b64decode(token).decode() == engine  # static endpoints: named by ip:port
        for i in range(10):
            again = complete(http, cluster, f"t{i + 1}", {"x-session-token": token})
            assert again.headers[ENGINE_HEADER] == engine and again.headers["x-session-token"] == token
