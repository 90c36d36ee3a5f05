"""Central mode with ZMQ CURVE: a publisher with an allowed key is indexed; one with another key,
or without CURVE, is refused at the handshake and counted; a central bind beyond loopback without
keys refuses to start. The publisher is a PUB that connects with the CURVE client options a vLLM
``ZmqEventPublisher`` would need (vLLM itself has none: see the README)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.auth
from integration.transport.kv_transport_helpers import FAST, Publisher, free_port, wait_until
from kv_rig import IP, MODEL, POD, TOPIC, chain

from ppc_extproc.blockkeys import TokenProcessor
from ppc_extproc.errors import ConfigError
from ppc_extproc.events.apply import EventApplier
from ppc_extproc.events.config import CurveConfig, KVEventsConfig
from ppc_extproc.events.stats import IngestStats
from ppc_extproc.events.transport import ZmqTransport
from ppc_extproc.framework import Endpoint
from ppc_extproc.index import InMemoryIndex

pytestmark = pytest.mark.integration


def _holds(applier: EventApplier, tokens: list[int]) -> bool:
    keys = applier.processor.keys(tokens, MODEL)
    return len(applier.index.lookup(keys, [POD])) == len(keys)


def test_a_curve_central_socket_admits_only_allowed_publishers(tmp_path: Path) -> None:
    server_public, server_secret = zmq.curve_keypair()
    allowed_public, allowed_secret = zmq.curve_keypair()
    wrong_public, wrong_secret = zmq.curve_keypair()
    # As Kubernetes mounts secrets: a file per key, plus its hidden bookkeeping entries.
    (tmp_path / "server.key_secret").write_bytes(server_secret + b"\n")
    keys = tmp_path / "publishers"
    (keys / "..data").mkdir(parents=True)
    (keys / "engine-a").write_bytes(allowed_public + b"\n")
    zmq.auth.create_certificates(str(keys), "engine-b")  # a ZMQ certificate works too
    (keys / "engine-b.key_secret").unlink()
    address = f"tcp://127.0.0.1:{free_port()}"
    config = KVEventsConfig(
        zmq_endpoint=address,
        topic_filter="",
        discover_pods=False,
        curve=CurveConfig(str(tmp_path / "server.key_secret"), str(keys)),
    )
    applier = EventApplier(InMemoryIndex(size=100_000), TokenProcessor(), IngestStats())
    transport = ZmqTransport(config, applier, applier.stats, FAST)
    context: zmq.Context[Any] = zmq.Context()
    publishers: list[Publisher] = []
    stats = applier.stats.transport
    try:
        transport.start()
        transport.add_endpoint(Endpoint(IP, 8000)).result(5)

        wrong = Publisher(context, IP, topic=TOPIC, connect=address, curve=(server_public, wrong_public, wrong_secret))
        plain = Publisher(context, IP, topic=TOPIC, connect=address)
        publishers += [wrong, plain]
        wait_until(lambda: stats.get(("unknown", "publishers_refused"), 0) >= 1, timeout=30,
                   what="the wrong key refused", context=lambda: dict(stats))
        wait_until(lambda: stats.get(("unknown", "handshakes_failed"), 0) >= 2, timeout=30,
                   what="both handshakes failed", context=lambda: dict(stats))
        assert not wrong.sock.poll(200), "a refused publisher saw a subscription"
        bad_payload, bad_tokens = chain(0x700, 7000)
        for seq in range(20):
            wrong.send(bad_payload, seq=seq)
            plain.send(bad_payload, seq=seq)

        good = Publisher(context, IP, topic=TOPIC, connect=address, curve=(server_public, allowed_public, allowed_secret))
        publishers.append(good)
        good.wait_subscribed(10)
        payload, tokens = chain(0x100, 1000)
        good.send(payload)
        wait_until(lambda: _holds(applier, tokens), timeout=30, what="the allowed publisher indexed",
                   context=lambda: dict(stats))
        assert transport.wait_idle(10)
        assert not _holds(applier, bad_tokens)
        assert stats[(POD, "messages")] == 1 and stats[("unknown", "publisher_handshakes")] == 1
    finally:
        transport.stop(5)
        assert not transport.running
        for pub in publishers:
            pub.close()
        context.destroy(linger=0)


def test_a_central_bind_beyond_loopback_without_keys_refuses_to_start() -> None:
    applier = EventApplier(InMemoryIndex(size=1000), TokenProcessor(), IngestStats())
    port = free_port()
    config = KVEventsConfig(zmq_endpoint=f"tcp://*:{port}", discover_pods=False)
    transport = ZmqTransport(config, applier, applier.stats, FAST)
    with pytest.raises(ConfigError) as err:
        transport.start()
    assert not transport.running
    assert "\n" not in str(err.value) and err.value.path == "kvEventsConfig.zmqEndpoint"
    assert "curveConfig" in str(err.value) and "allowUnauthenticatedPublishers" in str(err.value)
    opted_out = ZmqTransport(
        KVEventsConfig(zmq_endpoint=f"tcp://0.0.0.0:{port}", discover_pods=False, allow_unauthenticated_publishers=True),
        applier,
        applier.stats,
        FAST,
    )
    try:
        opted_out.start()
        assert opted_out.wait_idle(10)
    finally:
        opted_out.stop(5)
    assert not opted_out.running


def test_unreadable_or_malformed_keys_refuse_to_start_naming_the_field(tmp_path: Path) -> None:
    applier = EventApplier(InMemoryIndex(size=1000), TokenProcessor(), IngestStats())
    (tmp_path / "bad").write_text("not a key\n")
    _, secret = zmq.curve_keypair()
    (tmp_path / "secret").write_bytes(secret)
    cases = [
        (CurveConfig(str(tmp_path / "missing"), str(tmp_path / "bad")), "serverSecretKeyFile"),
        (CurveConfig(str(tmp_path / "bad"), str(tmp_path / "bad")), "serverSecretKeyFile"),
        (CurveConfig(str(tmp_path / "secret"), str(tmp_path / "bad")), "allowedPublisherKeys"),
    ]
    for curve, field in cases:
        config = KVEventsConfig(zmq_endpoint="tcp://127.0.0.1:1", discover_pods=False, curve=curve)
        with pytest.raises(ConfigError) as err:
            ZmqTransport(config, applier, applier.stats, FAST).start()
        assert err.value.path == f"kvEventsConfig.curveConfig.{field}"


def test_the_service_refuses_an_unauthenticated_non_loopback_central_bind_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"""
plugins:
- type: precise-prefix-cache-producer
  parameters: {{kvEventsConfig: {{zmqEndpoint: "tcp://*:{free_port()}"}}}}
- {{type: prefix-cache-scorer, parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}}}
- {{type: max-score-picker}}
- {{type: single-profile-handler}}
schedulingProfiles:
- {{name: default, plugins: [{{pluginRef: max-score-picker}}, {{pluginRef: prefix-cache-scorer, weight: 1}}]}}
""")
    proc = subprocess.run(
        [sys.executable, "-m", "ppc_extproc", "serve", "--config-file", str(config), "--grpc-port", "0",
         "--admin-port", "-1", "--endpoints", "127.0.0.1:8000", "--log-level", "error"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("ppc-extproc serve: configuration error: kvEventsConfig.zmqEndpoint: central mode binds")
