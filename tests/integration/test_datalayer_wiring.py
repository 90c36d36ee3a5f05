"""``dataLayer.sources`` end to end: the real service (a ``ppc-extproc serve`` process) and mock
vLLM engines on loopback.

With ``metrics-data-source → core-metrics-extractor`` and a ``queue-scorer``, the service polls
every engine's ``/metrics`` (its ``/debug/state`` poll counters and the engines' own request
counters grow) and routes around an engine whose queue is long. With the source removed and
``dataLayer.injectDefaults: false`` no metrics plugin exists and no engine is ever asked for
``/metrics`` — measured against a third engine polled at the same interval as a clock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from epp_helpers import until
from integration.extproc.harness import Client, body, headers, set_headers

from ppc_extproc.enginemetrics import EngineMetricsStore
from ppc_extproc.framework import Endpoint, EndpointEvent, EndpointEventKind
from ppc_extproc.plugins.datalayer import CoreMetricsExtractor, MetricsDataSource, PollOptions
from ppc_extproc_lab.localcluster import LocalCluster
from ppc_extproc_lab.mock_vllm.server import MockVllmOptions, start_fleet

pytestmark = pytest.mark.integration

HEADER = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}
PROFILE = [{"name": "default", "plugins": [{"pluginRef": "queue-scorer"}, {"pluginRef": "max-score-picker"}]}]
POLLED: dict[str, Any] = {
    **HEADER,
    "plugins": [
        {"type": "metrics-data-source", "parameters": {"interval": "50ms"}},
        {"type": "core-metrics-extractor"},
        {"type": "queue-scorer"},
        {"type": "max-score-picker"},
    ],
    "dataLayer": {"sources": [{"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "core-metrics-extractor"}]}]},
    "schedulingProfiles": PROFILE,
}
UNPOLLED: dict[str, Any] = {
    **HEADER,
    "plugins": [{"type": "queue-scorer"}, {"type": "max-score-picker"}],
    "dataLayer": {"injectDefaults": False},
    "schedulingProfiles": PROFILE,
}
#: One running request at a time and 50 ms per output token: a burst builds a waiting queue.
SLOW_ENGINES = ["--max-num-seqs", "1", "--decode-ms-per-token", "50"]
COMPLETION = b'{"model": "mock-model", "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 4}'


def wait(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    asyncio.run(until(condition, timeout, interval=0.05))


def get_json(url: str) -> Any:
    return httpx.get(url, timeout=10).json()


def plugins(cluster: LocalCluster) -> dict[str, Any]:
    return get_json(f"{cluster.service_admin_url}/debug/state")["plugins"]  # type: ignore[no-any-return]


def polls(cluster: LocalCluster) -> dict[str, int]:
    endpoints = plugins(cluster)["metrics-data-source"]["endpoints"]
    return {ep: state["polls"] for ep, state in endpoints.items()}


def metrics_requests(url: str) -> int:
    return int(get_json(f"{url}/mock/state")["metrics_requests"])


def route(cluster: LocalCluster, count: int) -> list[str]:
    """Destinations the service picks for ``count`` completions, over real ext_proc streams."""
    client = Client(cluster.grpc_port)
    try:
        picks = []
        for _ in range(count):
            replies = client.run([headers("/v1/completions"), body(COMPLETION)])
            picks.append(set_headers(replies[0])["x-gateway-destination-endpoint"])
        return picks
    finally:
        client.close()


def load(url: str, count: int, stop: threading.Event) -> list[threading.Thread]:
    """``count`` long completions sent straight to one engine (not through the service)."""

    def send(i: int) -> None:
        payload = {"model": "mock-model", "prompt": list(range(i * 50, i * 50 + 16)), "max_tokens": 400}
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json={**payload, "stream": True}, timeout=60) as r:
                for _ in r.iter_bytes():
                    if stop.is_set():
                        return  # closing the stream aborts the request in the engine
        except httpx.HTTPError:
            pass  # the engine was stopped under us

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads


@pytest.fixture
def polled() -> Iterator[LocalCluster]:
    with LocalCluster(num_engines=2, with_envoy=False, replay=False, service_config=POLLED, engine_args=SLOW_ENGINES) as c:
        yield c


def test_a_wired_metrics_source_polls_the_engines_and_queue_scoring_follows(polled: LocalCluster) -> None:
    engines = polled.engine_endpoints
    assert sorted(plugins(polled)) == ["core-metrics-extractor", "metrics-data-source"]
    assert plugins(polled)["metrics-data-source"]["extractors"] == ["core-metrics-extractor"]

    # every engine is polled, again and again, and sees those requests itself
    wait(lambda: sorted(polls(polled)) == sorted(engines) and min(polls(polled).values()) >= 1)
    first = polls(polled)
    wait(lambda: all(polls(polled)[ep] >= first[ep] + 5 for ep in engines))
    assert all(metrics_requests(url) >= 5 for url in polled.engine_urls)

    # a queue on engine 0: the service routes new requests to engine 1
    stop = threading.Event()
    threads = load(polled.engine_urls[0], 4, stop)
    try:
        wait(lambda: get_json(f"{polled.engine_urls[0]}/mock/state")["requests_waiting"] >= 2)

        def scored() -> dict[str, float]:
            answer = httpx.post(f"{polled.service_admin_url}/debug/score", content=COMPLETION, timeout=10).json()
            return {e["endpoint"]: e["scores"]["queue-scorer"] for e in answer["endpoints"]}

        wait(lambda: scored() == {engines[0]: 0.0, engines[1]: 1.0})
        assert route(polled, 6) == [engines[1]] * 6
    finally:
        stop.set()
        polled.stop()  # a queued request streams nothing until it runs: stopping the engines ends it
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads)


def test_without_a_source_and_without_injected_defaults_nothing_polls() -> None:
    """A witness engine outside the cluster is polled every 50 ms from the test: once it has been
    polled 20 times after the service was ready, a poller in the service would have called too."""

    async def witness(cluster: LocalCluster) -> list[int]:
        fleet = await start_fleet(MockVllmOptions(port=0, kv_events_endpoint=""))
        engine = fleet.engines[0]
        host, _, port = engine.endpoint.rpartition(":")
        target = Endpoint(host, int(port))
        extractor = CoreMetricsExtractor("extractor", EngineMetricsStore())
        source = MetricsDataSource("witness", PollOptions(interval_seconds=0.05), extractors=[extractor])
        source.on_endpoint_event(EndpointEvent(EndpointEventKind.ADDED, target))

        def witnessed() -> int:
            return int(source.state().details["endpoints"][target.id]["polls"])  # type: ignore[index]

        await source.start()
        try:
            await until(lambda: witnessed() >= 20, timeout=30, interval=0.05)
        finally:
            await source.stop()
            await fleet.stop()
        return [metrics_requests(url) for url in cluster.engine_urls]

    with LocalCluster(num_engines=2, with_envoy=False, replay=False, service_config=UNPOLLED) as cluster:
        assert plugins(cluster) == {}  # no metrics-data-source, no core-metrics-extractor
        assert set(route(cluster, 4)) <= set(cluster.engine_endpoints)  # it routes (every score is 0)
        assert asyncio.run(witness(cluster)) == [0, 0]
