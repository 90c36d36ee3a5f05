"""CURVE key files and the central-mode loopback rule (no sockets)."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq
import zmq.auth

from ppc_extproc.errors import ConfigError
from ppc_extproc.events.config import CurveConfig, KVEventsConfig
from ppc_extproc.events.transport.curve import central_curve_keys, is_loopback, load_curve_keys
from ppc_extproc.framework.params import Section
from ppc_extproc.plugins.producers.precise_prefix_cache_config import parse_producer_config


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("tcp://127.0.0.1:5557", True),
        ("tcp://127.3.2.1:5557", True),
        ("tcp://[::1]:5557", True),
        ("tcp://localhost:5557", True),
        ("ipc:///tmp/kv", True),
        ("inproc://kv", True),
        ("tcp://*:5557", False),
        ("tcp://0.0.0.0:5557", False),
        ("tcp://[::]:5557", False),
        ("tcp://10.0.0.5:5557", False),
        ("tcp://eth0:5557", False),
    ],
)
def test_loopback_addresses(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_keys_from_z85_files_certificates_and_a_secret_mount(tmp_path: Path) -> None:
    server_public, server_secret = zmq.curve_keypair()
    (tmp_path / "secret").write_bytes(b"\n" + server_secret + b"\n")
    mount = tmp_path / "publishers"
    (mount / "..2026_12_01").mkdir(parents=True)
    (mount / "..2026_12_01" / "hidden").write_text("garbage")
    keys = [zmq.curve_keypair()[0] for _ in range(3)]
    (mount / "engines").write_bytes(b"# engines of pool a\n" + keys[0] + b"\n\n" + keys[1] + b"\n")
    cert_public, _ = zmq.auth.load_certificate(zmq.auth.create_certificates(str(mount), "engine-c")[0])
    (mount / "engine-c.key_secret").unlink()
    loaded = load_curve_keys(str(tmp_path / "secret"), str(mount))
    assert loaded.server_secret == server_secret and loaded.server_public == server_public
    assert loaded.allowed == {keys[0], keys[1], cert_public}
    # One file works too, and a key may contain "#" (Z85's alphabet has it): not a comment.
    hashed = next(k for k in (zmq.curve_keypair()[0] for _ in range(5000)) if b"#" in k)
    (tmp_path / "one").write_bytes(b"# a comment\n" + hashed + b"\n")
    assert load_curve_keys(str(tmp_path / "secret"), str(tmp_path / "one")).allowed == {hashed}
    (tmp_path / "bad").write_bytes(b"~" * 40 + b"\n")
    with pytest.raises(ConfigError) as err:
        load_curve_keys(str(tmp_path / "secret"), str(tmp_path / "bad"))
    assert err.value.path == "kvEventsConfig.curveConfig.allowedPublisherKeys"


def test_a_non_loopback_central_bind_needs_keys_or_the_opt_out(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        central_curve_keys(KVEventsConfig(zmq_endpoint="tcp://*:5557"))
    assert err.value.path == "kvEventsConfig.zmqEndpoint"
    assert central_curve_keys(KVEventsConfig(zmq_endpoint="tcp://127.0.0.1:5557")) is None
    assert central_curve_keys(KVEventsConfig(zmq_endpoint="tcp://*:5557", allow_unauthenticated_publishers=True)) is None
    _, secret = zmq.curve_keypair()
    public, _ = zmq.curve_keypair()
    (tmp_path / "s").write_bytes(secret)
    (tmp_path / "p").write_bytes(public)
    keys = central_curve_keys(KVEventsConfig(zmq_endpoint="tcp://*:5557", curve=CurveConfig(str(tmp_path / "s"), str(tmp_path / "p"))))
    assert keys is not None and keys.allowed == {public}


def test_producer_parameters() -> None:
    params = {"kvEventsConfig": {"zmqEndpoint": "tcp://*:5557", "allowUnauthenticatedPublishers": True,
                                 "curveConfig": {"serverSecretKeyFile": "/k/s", "allowedPublisherKeys": "/k/p"}}}
    section = Section(params, "plugins[0].parameters", "precise-prefix-cache-producer")
    config = parse_producer_config(section).kv_events
    assert config.curve == CurveConfig("/k/s", "/k/p") and config.allow_unauthenticated_publishers
    for bad, path in [
        ({"curveConfig": {"serverSecretKeyFile": "/k/s"}}, "kvEventsConfig.curveConfig.allowedPublisherKeys"),
        ({"curveConfig": {"serverSecretKeyFile": "/k/s", "allowedPublisherKeys": "/k/p", "x": 1}},
         "kvEventsConfig.curveConfig"),
    ]:
        with pytest.raises(ConfigError) as err:
            parse_producer_config(Section({"kvEventsConfig": bad}, "p", "precise-prefix-cache-producer"))
        assert path in err.value.path
