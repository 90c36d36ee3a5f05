"""LocalCluster end to end with stand-ins: real Envoy (wheel), stub endpoint picker, stub engines.

These tests also pin down the Envoy behaviour the shipped configs document: where requests go in
each variant, that SSE streams through, large bodies, and what a client sees with the picker down.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from ppc_extproc_lab.localcluster import LocalCluster, ReadinessError

pytestmark = pytest.mark.integration

Factory = Callable[..., LocalCluster]
ENGINE_HEADER = "x-mock-vllm-endpoint"
REPO = Path(__file__).resolve().parents[3]


def _client() -> httpx.Client:
    return httpx.Client(timeout=30.0, trust_env=False)


def _complete(
    cluster: LocalCluster, route: str | None = None, body: bytes | None = None
) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if route is not None:
        headers["x-stub-route"] = route
    data = (
        body
        if body is not None
        else json.dumps({"model": "mock-model", "prompt": [1, 2, 3]}).encode()
    )
    with _client() as client:
        return client.post(cluster.listener_url + "/v1/completions", content=data, headers=headers)


def _big_body(n_tokens: int) -> bytes:
    return json.dumps(
        {"model": "mock-model", "prompt": list(range(100_000, 100_000 + n_tokens))}
    ).encode()


def _pids(cluster: LocalCluster) -> list[int]:
    procs = [*cluster.engine_processes, cluster.service_process, cluster.envoy_process]
    return [p.pid for p in procs if p is not None and p.pid is not None]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("variant", ["full-duplex", "buffered", "override-host"])
def test_requests_go_where_the_picker_says(stub_cluster: Factory, variant: str) -> None:
    cluster = stub_cluster(num_engines=3, envoy_variant=variant)
    for endpoint in reversed(cluster.engine_endpoints):
        resp = _complete(cluster, route=endpoint)
        assert resp.status_code == 200, resp.text
        assert resp.headers[ENGINE_HEADER] == endpoint
        assert resp.json()["served_by"] == endpoint
    # Without a hint the stub round-robins: every engine gets traffic.
    served = {_complete(cluster).headers[ENGINE_HEADER] for _ in range(6)}
    assert served == set(cluster.engine_endpoints)


@pytest.mark.parametrize("variant", ["full-duplex", "buffered"])
def test_sse_streams_through_unbuffered(stub_cluster: Factory, variant: str) -> None:
    cluster = stub_cluster(
        num_engines=1,
        envoy_variant=variant,
        engine_args=["--stream-events", "6", "--stream-interval", "0.25"],
    )
    arrivals: list[float] = []
    with (
        _client() as client,
        client.stream(
            "POST",
            cluster.listener_url + "/v1/completions",
            json={"model": "mock-model", "prompt": [1], "stream": True},
        ) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic())
    assert len(arrivals) == 7  # six events and [DONE]
    # Buffering would deliver everything at once; streaming keeps the engine's 0.25 s spacing.
    assert arrivals[-1] - arrivals[0] >= 0.8


@pytest.mark.parametrize("variant", ["full-duplex", "buffered"])
def test_large_prompts_pass(stub_cluster: Factory, variant: str) -> None:
    cluster = stub_cluster(num_engines=2, envoy_variant=variant)
    for n_tokens in (100_000, 400_000):  # 0.8 MB and 3.2 MB of JSON
        body = _big_body(n_tokens)
        resp = _complete(cluster, route=cluster.engine_endpoints[1], body=body)
        assert resp.status_code == 200
        assert resp.json() | {"headers": None} == {
            "served_by": cluster.engine_endpoints[1],
            "body_bytes": len(body),
            "headers": None,
        }


def test_buffered_rejects_bodies_over_the_buffer_limit(stub_cluster: Factory) -> None:
    cluster = stub_cluster(num_engines=1, envoy_variant="buffered")
    body = _big_body(1_200_000)  # 9.6 MB > request_body_buffer_limit (8 MiB)
    assert len(body) > 8 * 1024 * 1024
    assert _complete(cluster, body=body).status_code == 413


@pytest.mark.parametrize("variant", ["full-duplex", "buffered"])
def test_upstream_body_framing(stub_cluster: Factory, variant: str) -> None:
    """FULL_DUPLEX_STREAMED: Envoy drops the processor's content-length, the body goes chunked.
    BUFFERED: the client's content-length reaches the engine (both documented in the yaml files)."""
    cluster = stub_cluster(num_engines=1, envoy_variant=variant)
    body = json.dumps({"model": "mock-model", "prompt": [1, 2, 3]}).encode()
    upstream = {k.lower(): v for k, v in _complete(cluster, body=body).json()["headers"].items()}
    assert upstream["x-gateway-destination-endpoint"] == cluster.engine_endpoints[0]
    if variant == "full-duplex":
        assert upstream.get("transfer-encoding") == "chunked"
        assert "content-length" not in upstream
    else:
        assert upstream["content-length"] == str(len(body))


@pytest.mark.parametrize("variant", ["full-duplex", "buffered"])
def test_picker_down_means_503_then_recovers(stub_cluster: Factory, variant: str) -> None:
    cluster = stub_cluster(num_engines=2, envoy_variant=variant)
    assert _complete(cluster).status_code == 200
    cluster.stop_service()
    down = _complete(cluster)
    assert down.status_code == 503
    assert down.content == b""
    with _client() as client:
        assert client.get(cluster.listener_url + "/health").status_code == 503
    cluster.start_service()
    assert (
        _complete(cluster, route=cluster.engine_endpoints[1]).headers[ENGINE_HEADER]
        == cluster.engine_endpoints[1]
    )


def test_override_host_walks_the_fallback_list(stub_cluster: Factory) -> None:
    cluster = stub_cluster(num_engines=3, envoy_variant="override-host")
    a, b, c = cluster.engine_endpoints
    resp = _complete(cluster, route=f"{a},{b}")
    assert (resp.headers[ENGINE_HEADER], resp.headers["x-stub-served"]) == (a, a)
    # An address that is not a member of the cluster is skipped.
    resp = _complete(cluster, route=f"127.0.0.99:{cluster.engine_port},{c}")
    assert (resp.headers[ENGINE_HEADER], resp.headers["x-stub-served"]) == (c, c)
    # First choice down: Envoy retries on the next address; the served endpoint reaches the picker.
    cluster.stop_engine(0)
    for _ in range(3):
        resp = _complete(cluster, route=f"{a},{b}")
        assert resp.status_code == 200
        assert (resp.headers[ENGINE_HEADER], resp.headers["x-stub-served"]) == (b, b)
    # List exhausted: the retry goes to the fallback policy, which skips hosts already tried.
    for _ in range(3):
        resp = _complete(cluster, route=a)
        assert resp.status_code == 200
        assert resp.headers[ENGINE_HEADER] in (b, c)
    cluster.start_engine(0)
    assert _complete(cluster, route=a).headers[ENGINE_HEADER] == a


def test_override_host_picker_down(stub_cluster: Factory) -> None:
    cluster = stub_cluster(num_engines=3, envoy_variant="override-host")
    cluster.stop_service()
    with _client() as client:
        # Header-only requests fail open to round robin — and a client-sent destination is ignored.
        served = set()
        for _ in range(6):
            resp = client.get(
                cluster.listener_url + "/health",
                headers={"x-gateway-destination-endpoint": cluster.engine_endpoints[0]},
            )
            assert resp.status_code == 200
            served.add(resp.headers[ENGINE_HEADER])
        assert served == set(cluster.engine_endpoints)
    # Requests with a body race: Envoy fails open only until the first body chunk went to the
    # processor (FULL_DUPLEX_STREAMED), so each POST is either load-balanced or refused with 503.
    for _ in range(5):
        resp = _complete(cluster)
        assert resp.status_code in (200, 503)
        if resp.status_code == 200:
            assert resp.headers[ENGINE_HEADER] in cluster.engine_endpoints


def test_restart_engine_keeps_its_address(stub_cluster: Factory) -> None:
    cluster = stub_cluster(num_engines=2)
    old_pid = cluster.engine_processes[1].pid
    cluster.restart_engine(1)
    assert cluster.engine_processes[1].pid != old_pid
    resp = _complete(cluster, route=cluster.engine_endpoints[1])
    assert resp.headers[ENGINE_HEADER] == cluster.engine_endpoints[1]


def test_two_clusters_at_once_and_no_orphans(stub_cluster: Factory) -> None:
    first = stub_cluster(num_engines=1)
    second = stub_cluster(num_engines=1, first_engine_ip=10)
    assert first.listener_port != second.listener_port
    assert _complete(first).headers[ENGINE_HEADER] == first.engine_endpoints[0]
    assert (
        _complete(second).headers[ENGINE_HEADER]
        == second.engine_endpoints[0]
        == f"127.0.0.10:{second.engine_port}"
    )
    pids = _pids(first) + _pids(second)
    assert len(pids) == 6
    first.stop()
    second.stop()
    assert all(_gone(pid) for pid in pids)


def test_failed_start_cleans_up_and_reports_the_log(
    tmp_path: Path, stub_engine_command: list[str]
) -> None:
    cluster = LocalCluster(
        num_engines=2,
        engine_command=stub_engine_command,
        service_command=["sh", "-c", "echo service-exploded >&2; exit 7", "--"],
        log_dir=tmp_path,
        startup_timeout=20,
    )
    with pytest.raises(ReadinessError) as info:
        cluster.start()
    message = str(info.value)
    assert "service exited with status 7" in message and "service-exploded" in message
    assert cluster.engine_processes and all(not p.running() for p in cluster.engine_processes)
    assert all(_gone(p.pid) for p in cluster.engine_processes if p.pid is not None)


def test_temporary_log_dir_is_removed(
    stub_engine_command: list[str], stub_service_command: list[str]
) -> None:
    with LocalCluster(
        num_engines=1, engine_command=stub_engine_command, service_command=stub_service_command
    ) as cluster:
        log_dir = cluster.log_dir
        assert (log_dir / "envoy.log").exists() and (log_dir / "service-config.yaml").exists()
    assert not log_dir.exists()


def test_override_host_with_buffered_requests_fails_open_for_posts(
    stub_cluster: Factory, tmp_path: Path
) -> None:
    """What envoy-override-host.yaml says about request_body_mode: BUFFERED."""
    text = (REPO / "envoy" / "envoy-override-host.yaml").read_text()
    full_duplex = (
        "request_body_mode: FULL_DUPLEX_STREAMED\n"
        "                response_body_mode: FULL_DUPLEX_STREAMED\n"
        "                request_trailer_mode: SEND       # required by Envoy with FULL_DUPLEX_STREAMED\n"
        "                response_trailer_mode: SEND\n"
    )
    assert full_duplex in text
    variant = tmp_path / "override-host-buffered.yaml"
    variant.write_text(
        text.replace(
            full_duplex,
            "request_body_mode: BUFFERED\n                response_body_mode: STREAMED\n",
        )
    )
    cluster = stub_cluster(num_engines=2, envoy_variant=variant)
    assert (
        _complete(cluster, route=cluster.engine_endpoints[1]).headers[ENGINE_HEADER]
        == (cluster.engine_endpoints[1])
    )
    cluster.stop_service()
    served = set()
    for _ in range(6):
        resp = _complete(cluster)
        assert resp.status_code == 200
        served.add(resp.headers[ENGINE_HEADER])
    assert served == set(cluster.engine_endpoints)
