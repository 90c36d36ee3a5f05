"""The response path through a real Envoy, per shipped config: in-flight accounting lasts until the
streamed response has ended — with response bodies (full-duplex) and without them (the default,
where only a sample of responses is read for usage)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import httpx
import pytest

from ppc_extproc_lab.localcluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration

MODEL = "mock-model"
#: 40 tokens at 25 ms: the response streams for about a second.
SLOW_ENGINES = ["--prefill-tokens-per-s", "400000", "--decode-ms-per-token", "25", "--stream-interval-ms", "0"]


def _metric(cluster: LocalCluster, name: str, labels: str) -> float:
    text = httpx.get(cluster.admin_url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _inflight(cluster: LocalCluster) -> int:
    state = httpx.get(cluster.admin_url + "/debug/state", timeout=10).json()
    return sum(v["requests"] for v in state["inflight"].values())


def _stream(cluster: LocalCluster, seed: int, *, check_inflight: bool = False) -> int:
    """One streamed completion; with ``check_inflight`` the service must count it in flight while
    its tokens are still arriving. Returns the number of SSE events."""
    rng = random.Random(seed)
    body = {"model": MODEL, "prompt": [rng.randrange(1, 150_000) for _ in range(64)], "max_tokens": 40,
            "stream": True, "stream_options": {"include_usage": True}}
    events = 0
    with httpx.Client(timeout=30, trust_env=False) as client, client.stream(
        "POST", cluster.listener_url + "/v1/completions", json=body
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events += 1
            if check_inflight and events == 2:  # headers are long gone; the body is still streaming
                assert _inflight(cluster) == 1
    return events


@pytest.fixture(scope="module", params=["buffered", "full-duplex"])
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with LocalCluster(num_engines=2, model=MODEL, engine_args=SLOW_ENGINES, envoy_variant=request.param,
                      service_args=["--usage-sample-rate", "0.5"]) as c:  # fmt: skip
        yield c


def test_inflight_ends_when_the_streamed_response_ends(cluster: LocalCluster) -> None:
    before = _metric(cluster, "ppc_extproc_requests_total", 'code="200",outcome="routed"')
    assert _stream(cluster, 1, check_inflight=True) == 42  # 40 tokens, usage, [DONE]
    wait_for(lambda: _inflight(cluster) == 0, what="in-flight accounting to end", timeout=10)
    wait_for(lambda: _metric(cluster, "ppc_extproc_requests_total", 'code="200",outcome="routed"') == before + 1,
             what="the request to be counted", timeout=10)  # fmt: skip


def test_usage_is_read_from_every_response_or_the_sample(cluster: LocalCluster) -> None:
    before = _metric(cluster, "ppc_extproc_usage_tokens_total", 'kind="completion"')
    for seed in range(10, 14):
        _stream(cluster, seed)
    wait_for(lambda: _inflight(cluster) == 0, what="in-flight accounting to end", timeout=10)
    read = (_metric(cluster, "ppc_extproc_usage_tokens_total", 'kind="completion"') - before) / 40
    # full-duplex: Envoy sends every response body; default: the service asks for half of them
    assert read == (4 if cluster.envoy_variant == "full-duplex" else 2)
