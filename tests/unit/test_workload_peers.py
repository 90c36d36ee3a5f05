"""Peer routers: their command lines stay on loopback, and the balancer config in front of them."""

from __future__ import annotations

import pytest

from ppc_extproc_lab.localcluster.balancer import balancer_config
from ppc_extproc_lab.workload.peers import PEERS, KvEventSources, PeerDeployment, peer

WORKERS = ["http://127.0.0.2:80", "http://127.0.0.3:80"]
KV = KvEventSources(["tcp://127.0.0.2:5557", "tcp://127.0.0.3:5557"], ["tcp://127.0.0.2:5559", "tcp://127.0.0.3:5559"],
                    64, "m")  # fmt: skip


@pytest.mark.parametrize("name", sorted(PEERS))
def test_every_address_is_loopback(name: str) -> None:
    argv = peer(name).argv(port=1234, metrics_port=5678, worker_urls=WORKERS, kv=KV)
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "1234"
    assert pairs["--prometheus-host"] == "127.0.0.1" and pairs["--prometheus-port"] == "5678"
    assert pairs["--policy"] == ("kv_aware" if name == "vllm-router-kv" else "cache_aware")
    start = argv.index("--worker-urls") + 1
    assert argv[start : start + 2] == WORKERS


def test_the_precise_peer_reads_every_engines_kv_events() -> None:
    argv = peer("vllm-router-kv").argv(port=1, metrics_port=2, worker_urls=WORKERS, kv=KV)
    sources = [argv[i + 1] for i, a in enumerate(argv) if a == "--kv-event-source"]
    assert sources == ["http://127.0.0.2:80=tcp://127.0.0.2:5557", "http://127.0.0.3:80=tcp://127.0.0.3:5557"]
    replays = [argv[i + 1] for i, a in enumerate(argv) if a == "--kv-event-replay-source"]
    assert replays == ["http://127.0.0.2:80=tcp://127.0.0.2:5559", "http://127.0.0.3:80=tcp://127.0.0.3:5559"]
    pairs = dict(zip(argv, argv[1:]))
    assert (pairs["--kv-event-block-size"], pairs["--kv-event-model"]) == ("64", "m")
    assert "--kv-event-source" not in peer("vllm-router").argv(port=1, metrics_port=2, worker_urls=WORKERS, kv=KV)
    with pytest.raises(ValueError, match="KV-event endpoint"):
        peer("vllm-router-kv").argv(port=1, metrics_port=2, worker_urls=WORKERS)


def test_the_peers_and_what_they_accept() -> None:
    assert peer("sglang-router").command == ("sglang-router", "launch")
    assert not peer("sglang-router").accepts_token_ids and peer("vllm-router").accepts_token_ids
    with pytest.raises(ValueError, match="unknown peer"):
        peer("nope")
    with pytest.raises(ValueError):
        PeerDeployment(peer("vllm-router"), [], log_dir=".")
    with pytest.raises(ValueError):
        PeerDeployment(peer("vllm-router"), ["http://127.0.0.2:80"], log_dir=".", replicas=0)


def test_balancer_round_robins_over_every_upstream_on_loopback() -> None:
    config = balancer_config(8000, 8001, ["127.0.0.1:9000", "127.0.0.1:9001", "127.0.0.1:9002"])
    assert config["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 8001}
    (listener,) = config["static_resources"]["listeners"]
    assert listener["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 8000}
    (cluster,) = config["static_resources"]["clusters"]
    assert cluster["lb_policy"] == "ROUND_ROBIN"
    endpoints = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [e["endpoint"]["address"]["socket_address"]["port_value"] for e in endpoints] == [9000, 9001, 9002]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert route["timeout"] == "0s"  # long streams are never cut
    with pytest.raises(ValueError):
        balancer_config(8000, 8001, [])
