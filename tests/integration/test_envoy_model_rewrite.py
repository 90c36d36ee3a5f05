"""The model rewrite round trip through a real Envoy, per shipped config: the client asks for an
alias, the router rewrites it (model-rewrite header), the engine serves its own name (it answers
404 for any other), and the client gets its alias back in every JSON body and SSE event (llm-d
``pkg/epp/handlers/server.go`` ``rewriteModelName``). The default config sends no response bodies,
so a rewritten response asks Envoy for its body with ``mode_override``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from ppc_extproc_lab.localcluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration

MODEL = "mock-model"
ALIAS = "the-alias-clients-use"
REWRITE = {"x-gateway-model-name-rewrite": MODEL}


def _inflight(cluster: LocalCluster) -> int:
    state = httpx.get(cluster.admin_url + "/debug/state", timeout=10).json()
    return sum(v["requests"] for v in state["inflight"].values())


@pytest.fixture(scope="module", params=["buffered", "full-duplex"])
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with LocalCluster(num_engines=2, model=MODEL, envoy_variant=request.param,
                      service_args=["--usage-sample-rate", "0"]) as c:  # fmt: skip
        yield c


def test_a_json_response_carries_the_clients_model_name(cluster: LocalCluster) -> None:
    body = {"model": ALIAS, "prompt": [5, 6, 7, 8] * 8, "max_tokens": 4}
    response = httpx.post(cluster.listener_url + "/v1/completions", json=body, headers=REWRITE, timeout=30,
                          trust_env=False)  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.json()["model"] == ALIAS
    assert MODEL.encode() not in response.content
    length = response.headers.get("content-length")
    assert length is None or int(length) == len(response.content)


def test_every_sse_event_carries_the_clients_model_name(cluster: LocalCluster) -> None:
    body = {"model": ALIAS, "prompt": [9, 10, 11] * 8, "max_tokens": 12, "stream": True,
            "stream_options": {"include_usage": True}}
    models = []
    with httpx.Client(timeout=30, trust_env=False) as client, client.stream(
        "POST", cluster.listener_url + "/v1/completions", json=body, headers=REWRITE
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                models.append(json.loads(line[6:])["model"])
    assert len(models) == 13 and set(models) == {ALIAS}  # 12 tokens and the usage event
    wait_for(lambda: _inflight(cluster) == 0, what="in-flight accounting to end", timeout=10)


def test_a_response_without_rewrite_is_untouched(cluster: LocalCluster) -> None:
    body = {"model": MODEL, "prompt": [1, 2, 3, 4] * 8, "max_tokens": 4}
    response = httpx.post(cluster.listener_url + "/v1/completions", json=body, timeout=30, trust_env=False)
    assert response.status_code == 200 and response.json()["model"] == MODEL
    if cluster.envoy_variant == "buffered":  # the body never reaches the service: Envoy keeps the length
        assert int(response.headers["content-length"]) == len(response.content)
